"""Seed-parallel ensembles: member k of an ensemble, in every layout, is the network
seed + k trains alone."""
import json
import re
import os
import shutil
import signal
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd, npx
from mxnet.gluon import nn

from gluon_gpu import DataParallel, ensemble, load_model
from gluon_gpu.core.loop.fit import train_epoch
from gluon_gpu.programs import evaluate, predict, train
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.run import optimizer_params
from gluon_gpu.data import DevicePipeline, make_pipeline
from gluon_gpu.models.fused_lenet import EnsembleLeNet, combine_members, extract_member
from gluon_gpu.models.fused_conv import is_fused
from gluon_gpu.models.fused_members import FusedMembers
from gluon_gpu.models.member_stack import MemberStack, pipeline_layout
from gluon_gpu.models import init_model
from gluon_gpu.core.platform import devices as devices_module
from gluon_gpu.core.platform.devices import cpu_contexts
from gluon_gpu.core.step.heads import Classification
from gluon_gpu.core.step.members import member_count
from gluon_gpu.models.init import ensemble_engine_workers, ensemble_layout

from conftest import fashion_transform, param_arrays, read_metrics, with_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_epochs(net, ctx, pipeline, optimizer, params, epochs=1, **options):
    """``epochs`` whole epochs of ``pipeline`` through DataParallel and the epoch loop;
    the last epoch's train figures."""
    dp = DataParallel(net, ctx, optimizer, dict(params), transform=fashion_transform(member_count(net)),
                      **options)
    return [train_epoch(dp, pipeline, e) for e in range(epochs)][-1]


def pipeline(x, y, net, ctx, seed, members=1):
    """Training batches where the network takes them (placed members: each group its
    members' columns; sequential: in turns)."""
    layout = pipeline_layout(net, ctx)
    return DevicePipeline(x, y, 128, layout.train_ctx, seed, members=members, member_groups=layout.member_groups,
                          in_turns=layout.in_turns)


@pytest.mark.parametrize("layout", ["fused", "devices", "separate", "sequential"])
@pytest.mark.parametrize("fused_conv", ["off", "on"], ids=["standard", "fused"])
@pytest.mark.parametrize("spec,optimizer,params", [
    ("cpu", "sgd", {"learning_rate": 0.1}),
    ("cpu", "sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}),
    ("cpu", "adam", {"learning_rate": 0.003}),
    ("cpu*2", "sgd", {"learning_rate": 0.05, "momentum": 0.9}),
])
def test_member_k_equals_lenet_trained_alone_with_seed_plus_k(train_slice, spec, optimizer, params, fused_conv,
                                                             layout):
    """In every layout; with the standard layers (fused layout: grouped convolutions
    against single ones) and with the fused operator (groups=K against one group).
    Three members on two devices: one device holds two."""
    ctx = [mx.cpu(i) for i in range(2 if spec == "cpu*2" else 1)]
    x, y = train_slice[0][:6 * 128], train_slice[1][:6 * 128]  # an epoch of 6 steps
    seed, k_members = 11, 3
    # Rounding grows over the steps: grouped kernels (fused layout), or a member's whole
    # batch on one device against its seed's batch split over two, add in other orders.
    atol = 5e-4 if layout == "fused" or spec == "cpu*2" else 2e-5
    ens = init_model("lenet", seed, ctx, members=k_members, fused_conv=fused_conv, layout=layout)
    assert isinstance(ens, EnsembleLeNet if layout == "fused" else MemberStack)
    train_epochs(ens, ctx, pipeline(x, y, ens, ctx, seed, k_members), optimizer, params)
    moved = 0.0
    for k in range(k_members):
        alone = init_model("lenet", seed + k, ctx, fused_conv=fused_conv)
        start = param_arrays(alone)
        train_epochs(alone, ctx, DevicePipeline(x, y, 128, ctx, seed + k), optimizer, params)
        want, got = param_arrays(alone), param_arrays(extract_member(ens, k))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=atol, err_msg=f"member {k} {name}")
            moved = max(moved, float(np.abs(want[name] - start[name]).max()))
    assert moved > 20 * atol  # training moved the parameters far beyond the rounding allowed


@pytest.mark.parametrize("layout", ["devices", "separate", "sequential"])
def test_members_accumulate_and_clip_as_their_seeds_alone(train_slice, layout):
    """--accumulate 2 and --clip-grad on placed members: each member's gradients summed
    over two batches (the epoch's fifth alone) and clipped by its own norm, exactly as
    that seed trains alone."""
    ctx, (x, y) = [mx.cpu(0), mx.cpu(1)], (train_slice[0][:5 * 128], train_slice[1][:5 * 128])
    options = {"accumulate": 2, "clip_grad": 0.05, "batch_size": 128}
    ens = init_model("lenet", 3, ctx, members=3, layout=layout)
    train_epochs(ens, ctx, pipeline(x, y, ens, ctx, 3, 3), "sgd", {"learning_rate": 0.5, "momentum": 0.9},
                 **options)
    for k in range(3):
        device = next(iter(extract_member(ens, k).collect_params().values())).list_ctx()
        alone = init_model("lenet", 3 + k, device)
        train_epochs(alone, device, DevicePipeline(x, y, 128, device, 3 + k), "sgd",
                     {"learning_rate": 0.5, "momentum": 0.9}, **options)
        want, got = param_arrays(alone), param_arrays(extract_member(ens, k))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"member {k} {name}")
    unclipped = init_model("lenet", 3, ctx[:1])
    train_epochs(unclipped, ctx[:1], DevicePipeline(x, y, 128, ctx[:1], 3), "sgd",
                 {"learning_rate": 0.5, "momentum": 0.9}, accumulate=2, batch_size=128)
    assert not np.allclose(param_arrays(unclipped)["0.weight"], param_arrays(extract_member(ens, 0))["0.weight"])


@pytest.mark.parametrize("layout", ["sequential", "devices"])
def test_members_follow_their_own_schedule_as_their_seeds_alone(train_slice, layout):
    """Two epochs of Adam under warmup then cosine decay, --accumulate 3 over 5 batches (a
    short last sum): members in turns update one at a time, yet each member's learning
    rates, updates and train figures are its seed's alone."""
    ctx, (x, y) = [mx.cpu(0), mx.cpu(1)], (train_slice[0][:5 * 128], train_slice[1][:5 * 128])
    config = RunConfig(optimizer="adam", lr=0.01, lr_mode="cosine", warmup_epochs=1, warmup_lr=0.001, epochs=2,
                       accumulate=3)
    options = {"accumulate": 3, "batch_size": 128}
    ens = init_model("lenet", 7, ctx, members=3, layout=layout)
    together = train_epochs(ens, ctx, pipeline(x, y, ens, ctx, 7, 3), "adam", optimizer_params(config, 2),
                            epochs=2, **options)
    assert together["samples"] == 5 * 128
    for k in range(3):
        device = next(iter(extract_member(ens, k).collect_params().values())).list_ctx()
        alone = init_model("lenet", 7 + k, device)
        figures = train_epochs(alone, device, DevicePipeline(x, y, 128, device, 7 + k), "adam",
                               optimizer_params(config, 2), epochs=2, **options)
        assert together["member_loss"][k] == pytest.approx(figures["loss"], rel=1e-5)
        want, got = param_arrays(alone), param_arrays(extract_member(ens, k))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"member {k} {name}")


def test_a_pipeline_in_turns_gives_each_member_its_seeds_epoch(train_slice):
    """Group k's turn is the batches seed + k draws alone, in order; a resumed epoch
    (start_batch inside the second turn) continues where it stopped."""
    x, y = train_slice[0][:300], train_slice[1][:300]
    ctx = [mx.cpu(0)] * 3
    turns = DevicePipeline(x, y, 64, ctx, seed=4, members=3, member_groups=[(0, 1), (1, 1), (2, 1)], in_turns=True)
    assert len(turns) == 3 * 5 and turns.turns == 3
    batches = list(turns.epoch(1))
    for k in range(3):
        mine = batches[5 * k:5 * (k + 1)]
        assert all(xs[g] is None for xs, _ in mine for g in range(3) if g != k)
        alone = [ys[0].asnumpy() for _, ys in DevicePipeline(x, y, 64, ctx[:1], seed=4 + k).epoch(1)]
        np.testing.assert_array_equal(np.concatenate([ys[k].asnumpy()[:, 0] for _, ys in mine]),
                                      np.concatenate(alone))
    resumed = list(turns.epoch(1, start_batch=7))
    assert len(resumed) == 8 and (resumed[0][1][1].asnumpy() == batches[7][1][1].asnumpy()).all()


def test_an_ensemble_in_turns_resumes_exactly_and_elsewhere_from_an_epochs_end(tmp_path, capsys, monkeypatch):
    """auto on one CPU context with one engine worker trains in turns: a run stopped by
    SIGINT inside epoch 2 resumes to the straight run's parameters and figures; its
    position inside an epoch means nothing to members trained together, so on cpu*2 it
    goes on from epoch 1's end."""
    from test_checkpoints import SMALL, assert_same_run, checkpoint_names, stopped_after
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "1")  # the trainer would take one per core
    args = SMALL + ["--ensemble", "3", "--epochs", "3"]
    straight, out = str(tmp_path / "straight"), str(tmp_path / "run")
    assert train.main(args + ["--out", straight]) == 0
    assert "(sequential layout)" in capsys.readouterr().out
    proc, _, err = stopped_after(args + ["--log-interval", "1", "--out", out], 65, signal.SIGINT,
                                 str(tmp_path / "held"))  # epoch 2: 60 steps an epoch, 20 for each member in turn
    assert proc.returncode == 130, err
    inside = checkpoint_names(out)[-1]
    assert inside.startswith("epoch-00001-batch-") and not inside.endswith("-0000000")
    elsewhere = str(tmp_path / "elsewhere")
    shutil.copytree(out, elsewhere)
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(straight, out)
    assert train.main(["--resume", elsewhere, "--devices", "cpu*2", "--quiet"]) == 0
    said = capsys.readouterr().err
    assert f"skipping checkpoint {elsewhere}/checkpoints/{inside}: it stopped inside epoch 2" in said
    assert_same_run(straight, elsewhere)  # each member on its own device trains as in its turn


def test_optimizer_state_follows_each_member_whatever_gluon_named_it(tmp_path, train_slice):
    """gluon.Trainer orders parameters by name, and names carry Gluon's process-wide
    counters: members named ..9_, ..10_, ..11_ sort otherwise than ..5_, ..6_, ..7_. The
    momentum one stack saved goes to the same members of a stack named otherwise."""
    from mxnet.gluon import nn
    from gluon_gpu.core.state.checkpoint import load_checkpoint, save_checkpoint
    from gluon_gpu.core.state.optimizer_state import parameter_keys
    ctx, (x, y) = [mx.cpu(0)], (train_slice[0][:256], train_slice[1][:256])

    def stack():
        ens = init_model("lenet", 0, ctx, members=3, layout="separate")
        return DataParallel(ens, ctx, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, transform=fashion_transform(3))

    def momentum(dp):
        keys = parameter_keys(dp.trainer, dp.net)
        return {keys[i]: state.asnumpy() for i, state in dp.trainer._updaters[0].states.items()}

    def member_order(dp):  # the members in the Trainer's order
        return list(dict.fromkeys(key.split(".")[0] for key in parameter_keys(dp.trainer, dp.net)))
    saved = stack()
    train_epoch(saved, pipeline(x, y, saved.net, ctx, 0, 3), 0)
    where = save_checkpoint(str(tmp_path), saved, {"epoch": 1, "batch": 0, "seconds": 0.0, "metrics": {},
                                                    "history": [], "config": {}})
    while True:  # the next stack's members cross a power of ten in their names
        n = int(nn.HybridSequential().name[len("hybridsequential"):]) + 1
        if len(str(n)) != len(str(n + 2)):
            break
    loaded = stack()
    assert member_order(loaded) != member_order(saved)
    load_checkpoint(where, loaded)
    want = momentum(saved)
    got = {key: state.asnumpy() for key, state in zip(parameter_keys(loaded.trainer, loaded.net),
                                                      (loaded.trainer._updaters[0].states[i]
                                                       for i in range(len(loaded.trainer._params))))}
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("fused_conv,layout", [("off", "fused"), ("on", "fused"), ("on", "devices")])
def test_ensembles_in_numpy_mode_train_as_in_legacy_mode(train_slice, fused_conv, layout):
    """After npx.set_np() the ensemble is built with numpy parameters, and trains to the
    same parameters as in legacy mode; its members come out as numpy-mode LeNets."""
    ctx = [mx.cpu(0), mx.cpu(1)]
    x, y = train_slice[0][:4 * 128], train_slice[1][:4 * 128]
    results = []
    for api in ("legacy", "numpy"):
        if api == "numpy":
            npx.set_np()
        try:
            ens = init_model("lenet", 5, ctx, members=2, fused_conv=fused_conv, layout=layout)
            train_epochs(ens, ctx, pipeline(x, y, ens, ctx, 5, 2), "sgd", {"learning_rate": 0.1})
            member = extract_member(ens, 1)
            where = next(iter(member.collect_params().values())).list_ctx()[0]  # devices: member 1 on cpu(1)
            zeros = mx.np.zeros((1, 1, 28, 28), ctx=where) if api == "numpy" else nd.zeros((1, 1, 28, 28), ctx=where)
            assert isinstance(member(zeros), mx.np.ndarray if api == "numpy" else nd.NDArray)
            results.append(param_arrays(ens))
        finally:
            npx.reset_np()
    for name, value in results[0].items():
        np.testing.assert_allclose(results[1][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("api", ["legacy", "numpy"])
def test_members_given_one_batch_of_one_column_share_it(train_slice, api):
    """``dp.step`` on host batches ``(B, 1, ...)``: every member trains on the one batch,
    as on ``(B, K, ...)`` batches of K equal columns, in either API."""
    ctx = [mx.cpu(0), mx.cpu(1)]
    x, y = train_slice[0][:4 * 128], train_slice[1][:4 * 128].astype(np.float32)
    results = []
    for columns in (4, 1):
        if api == "numpy":
            npx.set_np()
        try:
            ens = init_model("lenet", 5, ctx, members=4, layout="devices")
            dp = DataParallel(ens, ctx, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, transform=fashion_transform(4))
            for i in range(0, len(x), 128):
                data = np.repeat(x[i:i + 128, None], columns, axis=1)  # (B, columns, 1, 28, 28)
                dp.step(nd.array(data, dtype="uint8"), nd.array(np.repeat(y[i:i + 128, None], columns, axis=1)))
            results.append((param_arrays(ens), dp.read_metrics()["member_acc"]))
        finally:
            npx.reset_np()
    (want, want_acc), (got, got_acc) = results
    np.testing.assert_allclose(got_acc, want_acc)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("layout", ["fused", "separate"])
def test_members_are_initialized_as_their_seeds(layout):
    ctx = [mx.cpu()]
    ens = init_model("lenet", 3, ctx, members=2, layout=layout)
    for k in range(2):
        want, got = param_arrays(init_model("lenet", 3 + k, ctx)), param_arrays(extract_member(ens, k))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    a, b = param_arrays(extract_member(ens, 0)), param_arrays(extract_member(ens, 1))
    assert not np.array_equal(a["0.weight"], b["0.weight"])


def test_extract_combine_round_trip_preserves_predictions_exactly(train_slice):
    ctx = [mx.cpu()]
    ens = init_model("lenet", 0, ctx, members=4, layout="fused")
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


@pytest.mark.parametrize("layout,devices", [("fused", 1), ("devices", 2)])
def test_an_ensemble_counts_the_classes_its_vote_predicts(train_slice, layout, devices):
    """``predicted_classes`` of an ensemble's evaluation: the classes the members' mean
    softmax (the vote) predicts, as numpy counts them from each member alone."""
    ctx = [mx.cpu(i) for i in range(devices)]
    ens = init_model("lenet", 0, ctx, members=3, layout=layout)
    x, y = train_slice[0][:256], train_slice[1][:256]
    dp = DataParallel(ens, ctx, head=Classification(10), transform=fashion_transform(3))
    got = dp.evaluate(make_pipeline("device", x, y, 64, pipeline_layout(ens, ctx).eval_ctx, shuffle=False,
                                    members=3).epoch(0))
    normalized = fashion_transform()(nd.array(x, dtype="uint8"))
    members = [extract_member(ens, k) for k in range(3)]
    votes = np.mean([nd.softmax(net(normalized.as_in_context(net.collect_params().list_ctx()[0]))).asnumpy()
                     for net in members], axis=0)
    assert got["acc"] == pytest.approx(float((votes.argmax(1) == y).mean()))
    assert got["predicted_classes"] == len(set(votes.argmax(1))) > 1


def test_save_load_round_trip(tmp_path):
    ctx = [mx.cpu()]
    ens = init_model("lenet", 0, ctx, members=3, layout="fused")
    path = str(tmp_path / "ens.params")
    ens.save_parameters(path)
    loaded = load_model(path, mx.cpu(1), members=3)  # no run beside it: an ensemble file of before 0.3, fused
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
    assert isinstance(ens, MemberStack) and ens.members == 4  # auto on cpu*2: the devices layout
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
    from gluon_gpu.core.platform.errors import ParamsError
    with pytest.raises(ParamsError, match="ensemble of 2"):
        load_model(params, members=2)


def test_ensemble_run_resumes(ensemble_run, tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(ensemble_run, out)
    assert train.main(["--resume", out, "--epochs", "2", "--quiet"]) == 0
    epochs = read_metrics(out)["epochs"]
    assert len(epochs) == 2 and len(epochs[1]["member_val_acc"]) == 4


@pytest.mark.parametrize("args,message", [
    (["--ensemble", "0"], "--ensemble: must be a positive integer"),
    (["--ensemble", "-3"], "--ensemble: must be a positive integer"),
    (["--ensemble", "2", "--model", "resnet50_v1b_gn", "--ensemble-layout", "fused"],
     "resnet50_v1b_gn cannot be fused: its layer bn1 (GroupNorm) has no fused form"),
    (["--ensemble", "2", "--ensemble-layout", "grouped"], "invalid choice"),
    (["--ensemble", "2", "--pipeline", "loader"], "these members draw their own samples (an ensemble's seeds"),
    (["--ensemble", "2", "--devices", "cpu*4", "--batch-size", "3"], "smaller than the 4 devices"),
])
def test_bad_ensemble_flags(tmp_path, capsys, args, message):
    assert train.main(with_flags(["--out", str(tmp_path / "r"), "--devices", "cpu", "--limit", "64", "--quiet"],
                                 *args)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_sync_bn_with_members_on_whole_batches_is_refused_before_any_data_is_read(tmp_path, capsys, monkeypatch):
    from gluon_gpu.models.sync_bn import sync_bn_variables
    for name, value in sync_bn_variables(0).items():  # what --sync-bn makes the CLI re-execute itself with
        monkeypatch.setenv(name, value)
    assert train.main(["--out", str(tmp_path / "r"), "--ensemble", "2", "--devices", "cpu*2", "--sync-bn",
                       "--data-dir", str(tmp_path / "nothing"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()  # not the missing data: refused before it is read
    assert len(err.splitlines()) == 1
    assert "--sync-bn: with --ensemble-layout auto every member trains on whole batches on one device" in err


@pytest.mark.parametrize("layout,devices", [("devices", "cpu*2"), ("fused", "cpu")])
def test_a_zoo_ensemble_trains_each_member_as_its_seed_alone(tmp_path, layout, devices):
    """--ensemble 4 --model cifar_resnet20_v1: over two devices (members 0 and 1 on
    cpu(0), 2 and 3 on cpu(1)), or fused into one network (grouped convolutions,
    BatchNorm over the stacked channels, batched Dense). Members 0 and 3 end where
    --seed 7+k alone on one device ends, BatchNorm statistics included (every run also
    validates, on 512 test images)."""
    common = ["--model", "cifar_resnet20_v1", "--limit", "192", "--val-limit", "512", "--batch-size", "64",
              "--epochs", "1", "--quiet", "--momentum", "0.9", "--lr", "0.05"]
    ens_out = str(tmp_path / "ens")
    assert train.main(common + ["--devices", devices, "--ensemble", "4", "--ensemble-layout", layout, "--seed", "7",
                                "--out", ens_out]) == 0
    stack = load_model(os.path.join(ens_out, "net.params"))
    assert isinstance(stack, MemberStack if layout == "devices" else FusedMembers) and stack.members == 4
    epoch = read_metrics(ens_out)["epochs"][0]
    assert len(set(epoch["member_train_loss"])) == 4
    for k in (0, 3):
        out = str(tmp_path / f"alone-{k}")
        assert train.main(common + ["--devices", "cpu", "--seed", str(7 + k), "--out", out]) == 0
        alone = {n: a.asnumpy() for n, a in mx.nd.load(os.path.join(out, "net.params")).items()}
        member = param_arrays(extract_member(stack, k))
        assert set(member) == set(alone)
        if layout == "devices":  # the same kernels on the same batches
            for name, value in alone.items():
                np.testing.assert_allclose(member[name], value, rtol=1e-4, atol=1e-5, err_msg=f"member {k} {name}")
        # fused: float32 rounding drifts through BatchNorm (exact in float64: the test below)
        assert read_metrics(out)["epochs"][0]["train_loss"] == pytest.approx(epoch["member_train_loss"][k],
                                                                             rel=1e-4 if layout == "devices" else 2e-2)


def test_auto_lays_members_out_by_the_devices_and_their_engine_workers(monkeypatch):
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "1")
    assert ensemble_layout("auto", "lenet", [mx.cpu(0)]) == "sequential"
    assert ensemble_layout("auto", "lenet", [mx.cpu(0)], engine_threads=2) == "separate"
    assert ensemble_layout("auto", "lenet", [mx.cpu(0), mx.cpu(1)]) == "devices"
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "2")
    assert ensemble_layout("auto", "lenet", [mx.cpu(0)]) == "separate"
    assert ensemble_layout("auto", "lenet", [mx.gpu(0)]) == "sequential"  # not measured on a GPU: in turns
    net = ensemble("lenet", 3, [mx.cpu(0)], layout="separate")
    assert [len(group.nets) for _, _, group in net.groups] == [1, 1, 1] and not net.in_turns


def test_an_ensemble_on_one_context_gets_an_engine_worker_per_core_unless_told(monkeypatch):
    """One CPU context: one worker per core's worth of OpenMP threads, at most one per
    member; nothing for several contexts, in-turns or fused layouts, one member, a GPU, or
    when MXNET_CPU_WORKER_NTHREADS (--engine-threads) already says."""
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(devices_module, "usable_cpus", lambda: 4)
    cpu = [mx.cpu(0)]
    assert [ensemble_engine_workers(k, "auto", cpu) for k in (1, 2, 3, 8)] == [0, 2, 3, 4]
    assert ensemble_engine_workers(8, "separate", cpu) == 4
    for layout in ("sequential", "fused", "devices"):
        assert ensemble_engine_workers(8, layout, cpu) == 0
    assert ensemble_engine_workers(8, "auto", [mx.cpu(0), mx.cpu(1)]) == 0
    assert ensemble_engine_workers(8, "auto", [mx.gpu(0)]) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert ensemble_engine_workers(8, "auto", cpu) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert ensemble_engine_workers(8, "auto", cpu) == 0  # one context already takes every core
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "1")
    assert ensemble_engine_workers(8, "auto", cpu) == 0


@pytest.mark.skipif(cpu_contexts() < 2, reason="one core: an ensemble on one context keeps one engine worker")
def test_an_ensemble_on_one_context_trains_its_members_at_once_each_as_its_seed_alone(tmp_path):
    """On one CPU context the trainer gives an ensemble an engine worker per core
    (re-executing itself with the variable) and auto runs the members' graphs side by
    side, the workers taking them at once. Each member still ends exactly where its seed
    alone ends."""
    common = ["--devices", "cpu", "--limit", "512", "--epochs", "1", "--quiet", "--momentum", "0.9"]
    ens_out = str(tmp_path / "ens")
    env = {k: v for k, v in os.environ.items() if k != "MXNET_CPU_WORKER_NTHREADS"}
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--ensemble", "3", "--seed", "5",
                           "--out", ens_out] + common, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    assert "3 x lenet (separate layout)" in done.stdout and "2 engine workers per context" in done.stdout
    stack = load_model(os.path.join(ens_out, "net.params"))
    for k in (0, 2):
        out = str(tmp_path / f"alone-{k}")
        assert train.main(common + ["--seed", str(5 + k), "--out", out]) == 0
        alone = {n: a.asnumpy() for n, a in mx.nd.load(os.path.join(out, "net.params")).items()}
        member = param_arrays(extract_member(stack, k))
        for name, value in alone.items():
            np.testing.assert_allclose(member[name], value, rtol=1e-4, atol=1e-5, err_msg=f"member {k} {name}")


@pytest.mark.skipif(cpu_contexts() < 2, reason="one core: an ensemble on one context keeps one engine worker")
def test_members_side_by_side_on_one_context_resume_exactly_from_inside_an_epoch(tmp_path, monkeypatch):
    """The trainer's default for an ensemble on one CPU context (auto: separate, on an
    engine worker per core), stopped by SIGINT inside epoch 2 and resumed by the CLI,
    ends where a straight run of the same layout on one worker in this process ends."""
    from test_checkpoints import LONGER, assert_same_run, checkpoint_names, stopped_after
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    args = LONGER + ["--ensemble", "2", "--val-limit", "512"]
    straight, out = str(tmp_path / "straight"), str(tmp_path / "run")
    assert train.main(args + ["--ensemble-layout", "separate", "--out", straight]) == 0
    proc, said, err = stopped_after(args + ["--log-interval", "1", "--out", out], 210, signal.SIGINT,
                                    str(tmp_path / "held"))  # epoch 2's 10th batch of 200 (of two members)
    assert proc.returncode == 130, err
    assert "2 x lenet (separate layout)" in said and "2 engine workers per context" in said
    assert checkpoint_names(out)[-1] == "epoch-00001-batch-0000010"
    resumed = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--resume", out, "--quiet"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "skipping" not in resumed.stderr, resumed.stderr
    assert "2 engine workers per context" in resumed.stdout
    assert_same_run(straight, out)


def test_a_fused_resnet_computes_exactly_its_members_gradients_in_float64():
    """In float32 a fused member drifts from its seed alone: BatchNorm's backward
    subtracts nearly equal sums, which magnifies the rounding of grouped against single
    convolutions (a few percent of the first convolution's update after one step). In
    float64, where MXNet runs its own kernels, the fused network's output and every
    gradient are its members' exactly."""
    ctx = [mx.cpu()]
    ens = init_model("cifar_resnet20_v1", 7, ctx, members=2, layout="fused")
    alone = [init_model("cifar_resnet20_v1", 7 + k, ctx) for k in range(2)]
    for net in [ens] + alone:
        net.cast("float64")
    x = nd.array(np.random.default_rng(1).standard_normal((8, 2, 28, 28)), dtype="float64")
    with mx.autograd.record():
        out = ens(x)
        loss = (out * out).sum()
    loss.backward()
    fused = ens._collect_params_with_prefix()
    for k, net in enumerate(alone):
        with mx.autograd.record():
            mine = net(nd.slice_axis(x, axis=1, begin=k, end=k + 1))
            (mine * mine).sum().backward()
        np.testing.assert_array_equal(out[:, k].asnumpy(), mine.asnumpy())
        for key, param in net._collect_params_with_prefix().items():
            if param.grad_req == "null":
                continue
            grad = fused["net." + key].grad().asnumpy()
            n = param.shape[0]
            part = grad[k] if key.startswith("output.") else grad[k * n:(k + 1) * n]
            np.testing.assert_array_equal(part, param.grad().asnumpy(), err_msg=f"member {k} {key}")


@pytest.mark.parametrize("optimizer,params", [("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
                                              ("adam", {"learning_rate": 0.003})])
def test_a_fused_mlp_trains_each_member_as_its_seed_alone(train_slice, optimizer, params):
    """Dense layers only: one batched product per layer for the three members."""
    ctx, (x, y) = [mx.cpu(0)], (train_slice[0][:4 * 128], train_slice[1][:4 * 128])
    ens = init_model("mlp", 2, ctx, members=3, layout="fused")
    assert isinstance(ens, FusedMembers)
    train_epochs(ens, ctx, pipeline(x, y, ens, ctx, 2, 3), optimizer, params)
    for k in range(3):
        alone = init_model("mlp", 2 + k, ctx)
        start = param_arrays(alone)
        train_epochs(alone, ctx, DevicePipeline(x, y, 128, ctx, 2 + k), optimizer, params)
        want, got = param_arrays(alone), param_arrays(extract_member(ens, k))
        for name in want:
            assert_follows(got[name], want[name], start[name], f"member {k} {name}")


def assert_follows(got, want, start, what):
    """``got`` ends where ``want`` does, from ``start``, but for rounding: a batched product
    and Gluon's layers add in other orders, and a pre-activation at about 0 may land on
    either side of ReLU's kink, after which that member's later steps differ a little
    everywhere (and Adam turns tiny gradient differences into whole steps). A member on
    the wrong seed, data or state is off by its whole movement; this allows 5%."""
    moved = np.abs(want - start).mean()
    assert moved > 0 and np.abs(got - want).mean() < 0.05 * moved, f"{what}: {np.abs(got - want).mean() / moved:.3f}"


class _Concat(gluon.HybridBlock):
    """Two convolutions side by side, concatenated over channels (as Inception, DenseNet)."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.a, self.b = nn.Conv2D(4, 3), nn.Conv2D(4, 3)
            self.out = nn.Dense(10)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.out(F.concat(self.a(x), self.b(x), dim=1))


def _layer_norm_net():
    net = nn.HybridSequential()
    net.add(nn.Dense(16), nn.LayerNorm(), nn.Dense(10))
    return net


@pytest.mark.parametrize("make_net,message", [
    (_layer_norm_net, "your network cannot be fused: its layer 1 (LayerNorm) has no fused form"),
    (_Concat, "its forward mixes the members' channels"),
])
def test_a_network_the_fused_layout_cannot_express_is_refused_in_one_line(make_net, message):
    from gluon_gpu.core.platform.errors import UserError
    with pytest.raises(UserError, match=re.escape(message)):
        ensemble(make_net, 2, [mx.cpu()], layout="fused")


def test_an_ensemble_too_large_for_memory_is_refused_before_training(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert train.main(["--devices", "cpu", "--ensemble", "200000", "--limit", "64", "--quiet", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "200000 members (" in err and "GiB free" in err, err
    assert "train fewer members at once (--ensemble, or a --sweep of fewer configurations)" in err, err
    assert not os.path.exists(os.path.join(out, "checkpoints"))


@pytest.mark.parametrize("devices", ["all", "cpu"])
def test_the_heat_equation_example_trains_independent_seeds(tmp_path, devices):
    """examples/seed_parallel_heat.py on a slice: the members learn, end at different losses
    (independent seeds), and each equals its seed trained alone; over the devices, and on
    one device in turns through the example's own loop."""
    out = tmp_path / "heat"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "seed_parallel_heat.py"), "--seeds", "4",
                           "--epochs", "8", "--samples", "400", "--devices", devices, "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    assert "one after another" in proc.stdout
    with open(out / "heat.json") as f:
        report = json.load(f)
    curves = np.array(report["member_loss"])
    assert curves.shape == (8, 4) and (curves[-1] < 0.5 * curves[0]).all()
    assert len(set(np.round(curves[-1], 7))) == 4  # really independent seeds
    np.testing.assert_allclose(curves, np.array(report["alone_loss"]), rtol=1e-5)
    assert report["seconds_together"] > 0 and report["seconds_one_after_another"] > 0
    with open(out / "heat.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_fused_lenet_ensembles_ask_for_a_random_state_pool_that_grows_with_k(monkeypatch):
    from gluon_gpu.models.member_stack import ensemble_variables as cpu_settings
    monkeypatch.setenv("MXNET_CPU_PARALLEL_RAND_COPY", "8")
    assert cpu_settings(8) == {"MXNET_CPU_PARALLEL_RAND_COPY": "40"}
    assert cpu_settings(100) == {"MXNET_CPU_PARALLEL_RAND_COPY": "72"}  # bounded: ~5 MiB a state
    assert cpu_settings(1) == cpu_settings(8, "cifar_resnet20_v1") == cpu_settings(8, fused_conv="off") == {}
    monkeypatch.setenv("MXNET_CPU_PARALLEL_RAND_COPY", "128")
    assert cpu_settings(8) == {}  # a larger pool the user set stays


def test_the_trainer_re_executes_with_the_pool_an_ensemble_needs(tmp_path):
    probe = ("import os, runpy, sys; sys.argv = ['gluon_gpu.train'] + sys.argv[1:]; "
             "print('RAND', os.environ.get('MXNET_CPU_PARALLEL_RAND_COPY'), flush=True); "
             "runpy.run_module('gluon_gpu.train', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", probe, "--ensemble", "3", "--devices", "cpu*2", "--dry-run",
                           "--limit", "256", "--out", str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert [l for l in done.stdout.splitlines() if l.startswith("RAND")][-1] == "RAND 20"  # 4 x 3 + 8
    assert "3 x lenet (devices layout)" in done.stdout


def test_an_ensemble_run_of_0_2_resumes_as_the_fused_network_it_saved(tmp_path):
    """Before 0.3 every ensemble was fused and configs had no ensemble_layout: such a run
    continues as fused, from its fused checkpoint."""
    import json
    import shutil
    from gluon_gpu.programs.config import RunConfig
    assert RunConfig.from_dict({"ensemble": 3}).ensemble_layout == "fused"
    assert RunConfig.from_dict({"ensemble": 3, "ensemble_layout": "devices"}).ensemble_layout == "devices"
    fused = str(tmp_path / "fused")
    assert train.main(["--devices", "cpu", "--ensemble", "2", "--ensemble-layout", "fused", "--epochs", "1",
                       "--limit", "512", "--quiet", "--out", fused]) == 0
    old = str(tmp_path / "old")
    shutil.copytree(fused, old)
    for state_file in (tmp_path / "old" / "checkpoints").glob("*/state.json"):
        state = json.loads(state_file.read_text())
        del state["config"]["ensemble_layout"]  # as 0.2 wrote it
        state_file.write_text(json.dumps(state))
    assert train.main(["--resume", old, "--epochs", "2", "--quiet"]) == 0
    assert isinstance(load_model(os.path.join(old, "net.params")), EnsembleLeNet)
    assert len(read_metrics(old)["epochs"]) == 2
