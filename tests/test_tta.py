"""Test-time augmentation (--tta, core/step/tta.py): the figures equal a hand computation
over the flipped and shifted views, in the evaluation graph, in evaluate and predict, and
in a run's validation, which records it."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from gluon_gpu import DataParallel
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.core.step.heads import Classification, Regression
from gluon_gpu.core.step.tta import parse_tta, tta_for
from gluon_gpu.data import load_dataset
from gluon_gpu.models import init_model
from gluon_gpu.programs import evaluate, predict, train

from conftest import read_metrics

CTX = [mx.cpu(0), mx.cpu(1)]


def _hand(net, transform, tta, x, y):
    """(mean loss, accuracy) of the mean of the views' log-probabilities, in numpy."""
    logps = []
    for view in tta.numpy_views(x):
        out = net(transform(nd.array(view))).asnumpy().astype(np.float64)
        logps.append(out - np.log(np.exp(out - out.max(1, keepdims=True)).sum(1, keepdims=True)) - out.max(1, keepdims=True))
    mean = np.mean(logps, axis=0)
    norm = mean - np.log(np.exp(mean).sum(1, keepdims=True))
    return float(-norm[np.arange(len(y)), y].mean()), float((mean.argmax(1) == y).mean())


@pytest.mark.parametrize("text,views", [("flip", 2), ("shift=2", 3), ("flip,shift=1", 6)])
def test_tta_figures_equal_a_hand_computation_over_the_views(text, views):
    data = load_dataset("fashion-mnist", limit=64)
    x, y = data.val_x[:40], data.val_y[:40].astype(np.int64)
    net = init_model("lenet", 3, [mx.cpu(0)], fused_conv="off")
    transform = data.spec.transform()
    transform.initialize(ctx=mx.cpu(0))
    tta = parse_tta(text)
    assert tta.views == views and len(tta.numpy_views(x)) == views
    loss, acc = _hand(net, transform, tta, x, y)
    dp = DataParallel(net, CTX, head=Classification(10), transform=data.spec.transform(), tta=text)
    figures = dp.evaluate([(nd.array(x, dtype=x.dtype), nd.array(y))])
    assert figures["samples"] == 40 and figures["acc"] == pytest.approx(acc, abs=1e-6)
    assert figures["loss"] == pytest.approx(loss, rel=1e-4)
    plain = DataParallel(net, CTX, head=Classification(10), transform=data.spec.transform()).evaluate(
        [(nd.array(x, dtype=x.dtype), nd.array(y))])
    assert plain["loss"] != pytest.approx(figures["loss"], rel=1e-4)  # the views changed something


def test_the_views_are_what_they_say():
    x = np.arange(2 * 1 * 5 * 5, dtype=np.float32).reshape(2, 1, 5, 5)
    original, mirrored, down, _, up, _ = parse_tta("flip,shift=1").numpy_views(x)
    assert (original == x).all() and (mirrored == x[..., ::-1]).all()
    assert (down[:, :, 1:, 1:] == x[:, :, :-1, :-1]).all() and (down[:, :, 0] == 0).all()
    assert (up[:, :, :-1, :-1] == x[:, :, 1:, 1:]).all() and (up[:, :, -1] == 0).all()
    graph = parse_tta("flip,shift=1").view_batch(nd, nd.array(x)).asnumpy()
    assert np.array_equal(graph, np.concatenate(parse_tta("flip,shift=1").numpy_views(x)))


@pytest.mark.parametrize("text,message", [("rotate", "expected a comma list"), ("shift=0", "from 1 to 8"),
                                          ("shift=x", "from 1 to 8"), ("flip=1", "expected a comma list"),
                                          # ran as shift=1, as shift=2, as flip; int() refused '²' (#62)
                                          ("shift=", "from 1 to 8"), ("shift=1,shift=2", "shift is given twice"),
                                          ("flip,flip", "flip is given twice"), ("shift=²", "from 1 to 8")])
def test_bad_tta_is_one_line(text, message):
    with pytest.raises(UserError, match=message):
        parse_tta(text)


def test_the_api_refuses_tta_where_it_means_nothing():
    assert tta_for("none", Classification(10), 1) is None
    with pytest.raises(ValueError, match="classification head"):
        tta_for("flip", Regression(), 1)
    with pytest.raises(ValueError, match="not an ensemble"):
        tta_for("flip", Classification(10), 3)
    with pytest.raises(TypeError, match="TestTimeAugmentation"):
        tta_for(3, Classification(10), 1)
    with pytest.raises(ValueError, match="expected a comma list"):
        DataParallel(init_model("lenet", 0, [mx.cpu(0)]), [mx.cpu(0)], tta="mirror")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tta") / "run")
    assert train.main(["--devices", "cpu*2", "--epochs", "1", "--limit", "2048", "--val-limit", "500",
                       "--tta", "flip", "--quiet", "--out", out]) == 0
    return out


def test_a_run_validates_with_tta_and_records_it(run):
    metrics = read_metrics(run)
    assert metrics["config"]["tta"] == "flip"
    data = load_dataset("fashion-mnist", limit=16)
    net = init_model("lenet", 0, [mx.cpu(0)])
    net.load_parameters(f"{run}/net.params", ctx=[mx.cpu(0)])
    x, y = data.val_x[:500], data.val_y[:500].astype(np.int64)
    transform = data.spec.transform()
    transform.initialize(ctx=mx.cpu(0))
    _, acc = _hand(net, transform, parse_tta("flip"), x, y)
    assert metrics["epochs"][-1]["val_acc"] == pytest.approx(acc, abs=1e-6)


@pytest.mark.parametrize("inference", ["graph", "fused"])
def test_evaluate_with_tta_says_so_and_equals_the_hand_computation(run, capsys, inference):
    assert evaluate.main(["--params", f"{run}/net.params", "--devices", "cpu", "--tta", "flip,shift=1",
                          "--inference", inference]) == 0
    line = capsys.readouterr().out
    assert "tta flip,shift=1" in line
    data = load_dataset("fashion-mnist", limit=16)
    net = init_model("lenet", 0, [mx.cpu(0)])
    net.load_parameters(f"{run}/net.params", ctx=[mx.cpu(0)])
    transform = data.spec.transform()
    transform.initialize(ctx=mx.cpu(0))
    _, acc = _hand(net, transform, parse_tta("flip,shift=1"), data.val_x, data.val_y.astype(np.int64))
    assert f"acc {acc:.4f}" in line


def test_predict_with_tta_gives_the_views_mean(run, capsys):
    idx = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    assert predict.main(["--params", f"{run}/net.params", "--devices", "cpu", "--idx", idx, "--index", "0:4",
                         "--tta", "flip", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    data = load_dataset("fashion-mnist", limit=16)
    net = init_model("lenet", 0, [mx.cpu(0)])
    net.load_parameters(f"{run}/net.params", ctx=[mx.cpu(0)])
    transform = data.spec.transform()
    transform.initialize(ctx=mx.cpu(0))
    logps = [nd.log_softmax(net(transform(nd.array(v)))).asnumpy() for v in parse_tta("flip").numpy_views(
        data.val_x[:4])]
    probs = np.exp(np.mean(logps, axis=0))
    probs /= probs.sum(1, keepdims=True)
    assert [r["probability"] for r in rows] == pytest.approx(probs.max(1).tolist(), abs=1e-3)


@pytest.mark.parametrize("text", ["flip", "shift=2", "flip,shift=1"])
def test_the_pytorch_rows_take_the_same_views(text):
    """torch_train.py imports nothing of gluon_gpu (PyTorch's interpreter has no MXNet):
    its views are written again there, and must stay the same."""
    from gluon_gpu.programs.bench import torch_train
    x = np.random.default_rng(0).integers(0, 255, (3, 1, 6, 6), dtype=np.uint8)
    ours, theirs = parse_tta(text).numpy_views(x), torch_train.tta_views(text)(x)
    assert len(ours) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_tta_is_fixed_on_resume(tmp_path, capsys):
    """#62: a run resumed with another --tta mixed two kinds of validation in its history
    and picked best.params across both."""
    from gluon_gpu.programs import train
    out = str(tmp_path / "r")
    assert train.main(["--devices", "cpu", "--limit", "256", "--val-limit", "64", "--epochs", "1", "--tta", "flip",
                       "--quiet", "--out", out]) == 0
    for other, shown in (("none", "none"), ("flip,shift=1", "flip,shift=1")):
        assert train.main(["--resume", out, "--epochs", "2", "--tta", other]) == 2
        assert capsys.readouterr().err.startswith(f"gluon_gpu.train: error: --tta {shown} differs from the run's flip; "
                                                  "on --resume only")
    assert train.main(["--resume", out, "--epochs", "2", "--tta", "flip", "--quiet"]) == 0  # the same: fine
