"""Both MXNet APIs everywhere, and the tutorial's parameter files both ways.

The tutorial's definitions below are verbatim from MXNet's "Use GPUs" tutorial (numpy API)."""
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd, npx
from mxnet.gluon import nn

from gluon_gpu import DataParallel, load_model
from gluon_gpu.core.state.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from gluon_gpu.core.step.array_api import semantics
from gluon_gpu.core.step.params import save_parameters
from gluon_gpu.programs import evaluate, train
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.run import build_run

from conftest import fashion_transform, param_arrays, read_metrics

CTX2 = [mx.cpu(0), mx.cpu(1)]


def tutorial_net():
    """The tutorial's network, as it writes it."""
    net = nn.Sequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=3, activation='relu'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Dense(120, activation="relu"),
            nn.Dense(84, activation="relu"),
            nn.Dense(10))
    return net


@pytest.fixture
def numpy_api():
    npx.set_np()
    yield
    npx.reset_np()


@pytest.fixture(scope="module")
def our_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ours") / "run")
    assert train.main(["--devices", "cpu*2", "--epochs", "1", "--limit", "6400", "--quiet", "--out", out]) == 0
    return out


def images(train_slice, n=32):
    with semantics(False):
        return fashion_transform()(nd.array(train_slice[0][:n], dtype="uint8")).asnumpy()


def test_a_tutorial_numpy_lenet_trains_through_data_parallel_on_two_devices(numpy_api, train_slice):
    """The issue's first failure: _npi_split received a legacy ndarray. Now it learns."""
    net = tutorial_net()
    net.initialize(init=mx.init.Xavier(), ctx=CTX2)
    dp = DataParallel(net, CTX2, "sgd", {"learning_rate": 0.1}, batch_size=128)
    x, y = mx.np.array(images(train_slice, 2048)), mx.np.array(train_slice[1][:2048])
    first = None
    for epoch in range(3):
        for start in range(0, 2048, 128):
            dp.step(x[start:start + 128], y[start:start + 128], return_loss=False)
        m = dp.read_metrics()
        first = first or m["loss"]
    assert m["loss"] < 0.7 * first and m["acc"] > 0.5  # chance is 0.1
    assert isinstance(next(iter(net.collect_params().values())).data(CTX2[0]), mx.np.ndarray)


def test_tutorial_saved_parameters_evaluate_with_our_cli(tmp_path, numpy_api, train_slice, capsys):
    """net.save_parameters in numpy mode (np shape semantics, no Flatten) -> evaluate works."""
    net = tutorial_net()
    net.initialize(init=mx.init.Xavier(), ctx=mx.cpu())
    net(mx.np.zeros((1, 1, 28, 28)))
    path = str(tmp_path / "net.params")
    net.save_parameters(path)  # exactly the tutorial's call
    expected = net(mx.np.array(images(train_slice))).asnumpy()
    npx.reset_np()
    assert evaluate.main(["--params", path, "--devices", "cpu"]) == 0
    assert " acc 0." in capsys.readouterr().out
    loaded = load_model(path, mx.cpu())  # legacy mode: our LeNet, the tutorial's keys
    np.testing.assert_allclose(loaded(nd.array(images(train_slice))).asnumpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("api", ["numpy", "legacy"])
def test_our_parameters_load_into_the_tutorials_lenet(our_run, train_slice, api):
    """The tutorial's 'load the saved parameters into GPU 0 directly', on our net.params."""
    path = os.path.join(our_run, "net.params")
    ours = load_model(path, mx.cpu())
    expected = ours(nd.array(images(train_slice))).asnumpy()
    if api == "numpy":
        npx.set_np()
    try:
        net = tutorial_net()
        net.load_parameters(path, ctx=mx.cpu(1))
        x = images(train_slice)
        got = net(mx.np.array(x, ctx=mx.cpu(1)) if api == "numpy" else nd.array(x, ctx=mx.cpu(1))).asnumpy()
    finally:
        npx.reset_np()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_save_load_same_predictions_in_numpy_mode(numpy_api, train_slice, tmp_path):
    net = tutorial_net()
    net.initialize(init=mx.init.Xavier(), ctx=CTX2)
    dp = DataParallel(net, CTX2, "sgd", {"learning_rate": 0.1})
    x, y = mx.np.array(images(train_slice, 256)), mx.np.array(train_slice[1][:256])
    dp.step(x, y)
    path = str(tmp_path / "np.params")
    save_parameters(net, path)
    loaded = load_model(path, mx.cpu(1), fused_conv="off")  # built in the API in force: numpy
    assert isinstance(loaded(mx.np.zeros((1, 1, 28, 28), ctx=mx.cpu(1))), mx.np.ndarray)
    np.testing.assert_allclose(loaded(x.as_in_context(mx.cpu(1))).asnumpy(), net(x).asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("api", ["legacy", "numpy"])
def test_checkpoint_resume_is_exact_in_both_apis(train_slice, tmp_path, api):
    """Steps 1-4 straight == steps 1-2, checkpoint, a fresh process state loading it, steps 3-4."""
    if api == "numpy":
        npx.set_np()
    try:
        arr = mx.np.array if api == "numpy" else nd.array
        x, y = images(train_slice, 512), train_slice[1][:512]
        batches = [(arr(x[i:i + 128]), arr(y[i:i + 128])) for i in range(0, 512, 128)]

        def fresh():
            mx.random.seed(3)
            net = tutorial_net() if api == "numpy" else _legacy_lenet()
            net.initialize(init=mx.init.Xavier(), ctx=CTX2)
            net(arr(np.zeros((1, 1, 28, 28), dtype=np.float32)))
            return DataParallel(net, CTX2, "sgd", {"learning_rate": 0.05, "momentum": 0.9})
        straight = fresh()
        for xb, yb in batches:
            straight.step(xb, yb)
        first = fresh()
        initial = param_arrays(first.net)
        for xb, yb in batches[:2]:
            first.step(xb, yb)
        save_checkpoint(str(tmp_path), first, {"epoch": 0, "batch": 2, "seconds": 0.0, "metrics": {},
                                               "history": [], "config": {}}, keep=2)
        second = fresh()
        load_checkpoint(latest_checkpoint(str(tmp_path))[0], second)
        for xb, yb in batches[2:]:
            second.step(xb, yb)
        got, want = param_arrays(second.net), param_arrays(straight.net)
    finally:
        npx.reset_np()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert any(not np.array_equal(want[k], initial[k]) for k in want)


def _legacy_lenet():
    from gluon_gpu.models.lenet import lenet
    return lenet()


def test_a_run_of_the_previous_version_resumes(our_run, tmp_path):
    """A run written by 0.1 (explicit Flatten: dense keys 5-7; metric sums as loss and
    correct; a config without the data fields; the optimizer state pickled by MXNet)
    resumes and finishes like today's run."""
    import json
    import shutil
    out = str(tmp_path / "old")
    shutil.copytree(our_run, out)
    directory, state = latest_checkpoint(out)
    # 0.1 pickled the optimizer state with MXNet's Trainer.save_states
    config = RunConfig.from_dict(state["config"])
    run = build_run(config, [mx.cpu(0), mx.cpu(1)])
    load_checkpoint(directory, run.dp)
    run.dp.trainer.save_states(os.path.join(directory, "trainer.states"))
    for name in ("optimizer.json", "optimizer.params"):
        os.remove(os.path.join(directory, name))
    arrays = nd.load(os.path.join(directory, "net.params"))
    nd.save(os.path.join(directory, "net.params"),
            {str(int(k[0]) + 1) + k[1:] if k[0] in "456" else k: v for k, v in arrays.items()})
    k = 1
    state["metrics"] = {"loss": [s[:k] for s in state["metrics"]["sums"]],
                        "correct": [s[k:2 * k] for s in state["metrics"]["sums"]],
                        "samples": state["metrics"]["samples"]}
    del state["data"]
    for name in ("dataset", "image_size", "task"):
        del state["config"][name]
    state["config"]["model"] = "lenet"
    with open(os.path.join(directory, "state.json"), "w") as f:
        json.dump(state, f)
    straight = str(tmp_path / "straight")
    assert train.main(["--devices", "cpu*2", "--epochs", "2", "--limit", "6400", "--quiet", "--out", straight]) == 0
    assert train.main(["--resume", out, "--epochs", "2", "--quiet"]) == 0
    a, b = load_model(os.path.join(out, "net.params")), load_model(os.path.join(straight, "net.params"))
    for name, value in param_arrays(b).items():
        np.testing.assert_array_equal(param_arrays(a)[name], value, err_msg=name)
    assert read_metrics(out)["epochs"][1]["val_acc"] == read_metrics(straight)["epochs"][1]["val_acc"]


def test_a_plain_block_runs_unhybridized(train_slice):
    class Eager(gluon.Block):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(10)

        def forward(self, x):  # pylint: disable=arguments-differ
            return self.dense(x.reshape((x.shape[0], -1)))
    net = Eager()
    dp = DataParallel(net, CTX2, "sgd", {"learning_rate": 0.1}, transform=fashion_transform())
    x, y = nd.array(train_slice[0][:512], dtype="uint8"), nd.array(train_slice[1][:512])
    losses = [float(dp.step(x[i:i + 128], y[i:i + 128]).asscalar()) for i in range(0, 512, 128) for _ in range(3)]
    assert losses[-1] < losses[0]
