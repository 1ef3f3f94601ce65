"""Seed-parallel ensembles: member k of a fused ensemble is the LeNet seed + k trains alone."""
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd, npx

from gluon_gpu import DataParallel, load_model
from gluon_gpu.programs import evaluate, predict, train
from gluon_gpu.data import DevicePipeline
from gluon_gpu.models.ensemble import EnsembleLeNet, combine_members, extract_member
from gluon_gpu.models.fused_conv import is_fused
from gluon_gpu.models import init_model

from conftest import fashion_transform, param_arrays, read_metrics


def train_steps(net, ctx, pipeline, optimizer, params, steps):
    dp = DataParallel(net, ctx, optimizer, dict(params), transform=fashion_transform(getattr(net, "members", 1)))
    batches = pipeline.epoch(0)
    for _ in range(steps):
        dp.step(*next(batches))
    return dp


@pytest.mark.parametrize("fused_conv", ["off", "on"], ids=["standard", "fused"])
@pytest.mark.parametrize("spec,optimizer,params", [
    ("cpu", "sgd", {"learning_rate": 0.1}),
    ("cpu", "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}),
    ("cpu", "adam", {"learning_rate": 0.003}),
    ("cpu*2", "sgd", {"learning_rate": 0.05, "momentum": 0.9}),
])
def test_member_k_equals_lenet_trained_alone_with_seed_plus_k(train_slice, spec, optimizer, params, fused_conv):
    """With the standard layers (grouped convolutions against single ones) and with the
    fused operator (groups=K against one group)."""
    ctx = [mx.cpu(i) for i in range(2 if spec == "cpu*2" else 1)]
    x, y = train_slice
    seed, k_members, steps = 11, 3, 6
    ens = init_model("lenet", seed, ctx, members=k_members, fused_conv=fused_conv)
    train_steps(ens, ctx, DevicePipeline(x, y, 128, ctx, seed, members=k_members), optimizer, params, steps)
    moved = 0.0
    for k in range(k_members):
        alone = init_model("lenet", seed + k, ctx, fused_conv=fused_conv)
        start = param_arrays(alone)
        train_steps(alone, ctx, DevicePipeline(x, y, 128, ctx, seed + k), optimizer, params, steps)
        want, got = param_arrays(alone), param_arrays(extract_member(ens, k))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=2e-5, err_msg=f"member {k} {name}")
            moved = max(moved, float(np.abs(want[name] - start[name]).max()))
    assert moved > 1e-3  # training really changed the parameters


@pytest.mark.parametrize("fused_conv", ["off", "on"], ids=["standard", "fused"])
def test_ensembles_in_numpy_mode_train_as_in_legacy_mode(train_slice, fused_conv):
    """After npx.set_np() the ensemble is built with numpy parameters, and trains to the
    same parameters as in legacy mode; its members come out as numpy-mode LeNets."""
    ctx = [mx.cpu(0), mx.cpu(1)]
    x, y = train_slice
    results = []
    for api in ("legacy", "numpy"):
        if api == "numpy":
            npx.set_np()
        try:
            ens = init_model("lenet", 5, ctx, members=2, fused_conv=fused_conv)
            train_steps(ens, ctx, DevicePipeline(x, y, 128, ctx, 5, members=2), "sgd", {"learning_rate": 0.1}, 4)
            member = extract_member(ens, 1)
            assert isinstance(member(mx.np.zeros((1, 1, 28, 28)) if api == "numpy" else nd.zeros((1, 1, 28, 28))),
                              mx.np.ndarray if api == "numpy" else nd.NDArray)
            results.append(param_arrays(ens))
        finally:
            npx.reset_np()
    for name, value in results[0].items():
        np.testing.assert_allclose(results[1][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_members_are_initialized_as_their_seeds():
    ctx = [mx.cpu()]
    ens = init_model("lenet", 3, ctx, members=2)
    for k in range(2):
        want, got = param_arrays(init_model("lenet", 3 + k, ctx)), param_arrays(extract_member(ens, k))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    a, b = param_arrays(extract_member(ens, 0)), param_arrays(extract_member(ens, 1))
    assert not np.array_equal(a["0.weight"], b["0.weight"])


def test_extract_combine_round_trip_preserves_predictions_exactly(train_slice):
    ctx = [mx.cpu()]
    ens = init_model("lenet", 0, ctx, members=4)
    x = nd.array((train_slice[0][:32].astype(np.float32) / 255 - 0.13) / 0.31)
    fused_input = x.broadcast_to((32, 4, 28, 28))
    out = ens(fused_input).asnumpy()
    assert out.shape == (32, 4, 10)
    members = [extract_member(ens, k) for k in range(4)]
    for k, net in enumerate(members):
        np.testing.assert_allclose(net(x).asnumpy(), out[:, k], rtol=1e-5, atol=1e-5)
    again = combine_members(members, fused=is_fused(ens))  # the same implementation: exactly
    np.testing.assert_array_equal(again(fused_input).asnumpy(), out)
    with pytest.raises(IndexError):
        extract_member(ens, 4)


def test_save_load_round_trip(tmp_path):
    ctx = [mx.cpu()]
    ens = init_model("lenet", 0, ctx, members=3)
    path = str(tmp_path / "ens.params")
    ens.save_parameters(path)
    loaded = load_model(path, mx.cpu(1), members=3)
    assert isinstance(loaded, EnsembleLeNet)
    x = nd.random.uniform(shape=(5, 3, 28, 28))
    np.testing.assert_array_equal(loaded(x.as_in_context(mx.cpu(1))).asnumpy(), ens(x).asnumpy())


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ens") / "run")
    assert train.main(["--devices", "cpu*2", "--ensemble", "4", "--epochs", "1", "--batch-size", "64",
                       "--limit", "12800", "--quiet", "--tensorboard", "--out", out]) == 0
    return out


def test_ensemble_training_learns_and_reports_every_member(ensemble_run, capsys):
    (epoch,) = read_metrics(ensemble_run)["epochs"]
    assert len(epoch["member_val_acc"]) == 4 and len(epoch["member_train_loss"]) == 4
    assert min(epoch["member_val_acc"]) > 0.6
    assert epoch["val_acc"] >= np.median(epoch["member_val_acc"]) - 0.01  # the vote helps
    assert len(set(epoch["member_train_loss"])) == 4  # members differ
    with open(os.path.join(ensemble_run, "curves.png"), "rb") as f:
        assert f.read(4) == b"\x89PNG"
    from test_training_features import read_events
    events = read_events(os.path.join(ensemble_run, "tb"))
    members = [events[f"member/val_acc/{k}"] for k in range(4)]  # one curve per member
    assert [[v for _, v in m] for m in members] == [[pytest.approx(a)] for a in epoch["member_val_acc"]]


def test_member_extracted_from_a_run_evaluates_with_the_normal_paths(ensemble_run, tmp_path, capsys):
    ens = load_model(os.path.join(ensemble_run, "net.params"))
    assert isinstance(ens, EnsembleLeNet) and ens.members == 4
    path = str(tmp_path / "member2.params")
    extract_member(ens, 2).save_parameters(path)
    assert evaluate.main(["--params", path, "--devices", "cpu"]) == 0
    acc = float(capsys.readouterr().out.split(" acc ")[1].split()[0])
    assert acc == pytest.approx(read_metrics(ensemble_run)["epochs"][0]["member_val_acc"][2], abs=1e-4)


def test_evaluate_and_predict_understand_ensemble_runs(ensemble_run, tmp_path, capsys):
    params = os.path.join(ensemble_run, "net.params")
    assert evaluate.main(["--params", params, "--devices", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "ensemble of 4 lenet" in printed
    assert float(printed.split(" acc ")[1].split()[0]) == pytest.approx(
        read_metrics(ensemble_run)["epochs"][0]["val_acc"], abs=1e-4)
    idx = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    assert predict.main(["--params", params, "--idx", idx, "--index", "0:3"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3
    alone = tmp_path / "net.params"  # without the run's metrics.json it is taken for one LeNet
    alone.write_bytes(open(params, "rb").read())
    assert evaluate.main(["--params", str(alone)]) == 2
    assert "cannot load" in capsys.readouterr().err
    from gluon_gpu.core.errors import ParamsError
    with pytest.raises(ParamsError, match="ensemble of 2"):
        load_model(params, members=2)


def test_ensemble_run_resumes(ensemble_run, tmp_path):
    import shutil
    out = str(tmp_path / "copy")
    shutil.copytree(ensemble_run, out)
    assert train.main(["--resume", out, "--epochs", "2", "--quiet"]) == 0
    epochs = read_metrics(out)["epochs"]
    assert len(epochs) == 2 and len(epochs[1]["member_val_acc"]) == 4


@pytest.mark.parametrize("args,message", [
    (["--ensemble", "0"], "--ensemble: must be a positive integer"),
    (["--ensemble", "-3"], "--ensemble: must be a positive integer"),
    (["--ensemble", "2", "--model", "cifar_resnet20_v1"], "supports lenet only"),
    (["--ensemble", "2", "--pipeline", "loader"], "needs --pipeline device"),
    (["--ensemble", "2", "--devices", "cpu*4", "--batch-size", "3"], "smaller than the 4 devices"),
])
def test_bad_ensemble_flags(tmp_path, capsys, args, message):
    assert train.main(["--out", str(tmp_path / "r"), "--devices", "cpu", "--limit", "64", "--quiet"] + args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
