"""gluon_gpu.export: the exported MXNet pair and ONNX file give the trained network's
outputs for raw samples (LeNet, an ensemble and its members, a zoo network, an MLP
regression), carry their names and classes, and bad input is one line."""
import json
import os
import shutil
import warnings

import mxnet as mx
import numpy as np
import onnx
import onnxruntime
import pytest
from mxnet import gluon

from conftest import trained_run
from failure_table import table_exit
from gluon_gpu.data.fashion_mnist import fashion_spec, load_split
from gluon_gpu.core.platform.files import RunLock
from gluon_gpu.core.step.params import read_parameter_file
from gluon_gpu.models import load_model, loading, zoo
from gluon_gpu.models.export import TOLERANCE, CheckFailed, check_outputs
from gluon_gpu.programs import export
from gluon_gpu.programs.evaluate import recorded_spec
from gluon_gpu.programs.predict import predict

SHORT = ["--epochs", "2", "--limit", "2560", "--batch-size", "64", "--val-limit", "512", "--quiet"]


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory):
    return trained_run(tmp_path_factory, ["--devices", "cpu"] + SHORT, "lenet")


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory):
    return trained_run(tmp_path_factory, ["--devices", "cpu*2", "--ensemble", "2"] + SHORT, "ensemble")


@pytest.fixture(scope="module")
def held_out(data_dir):
    """Validation samples the export's own check does not use (it takes the first 256)."""
    x, y = load_split("test", data_dir)
    return x[1000:1400, None], y[1000:1400]


def exported(run, tmp_path, capsys, *flags):
    out = str(tmp_path / "served")
    code = export.main([run, "--out", out] + list(flags))
    printed = capsys.readouterr().out
    assert code == 0, printed
    return out, printed


def trained_outputs(run, x, member=None):
    path = os.path.join(run, "net.params" if member is not None else "best.params")
    spec = recorded_spec(path)
    return predict(load_model(path, mx.cpu(), member=member), x, [mx.cpu()], spec)


def served_outputs(out, x, dtype="uint8", input_name="images"):
    """The outputs as a server gets them: MXNet's SymbolBlock and onnxruntime."""
    with warnings.catch_warnings():  # MXNet's: imports() takes no input type, so type inference warns
        warnings.simplefilter("ignore", UserWarning)
        net = gluon.SymbolBlock.imports(os.path.join(out, "model-symbol.json"), [input_name],
                                        os.path.join(out, "model-0000.params"))
    session = onnxruntime.InferenceSession(os.path.join(out, "model.onnx"), providers=["CPUExecutionProvider"])
    return net(mx.nd.array(x, dtype=dtype)).asnumpy(), session.run(None, {input_name: x.astype(dtype)})[0]


def test_lenet_exports_take_raw_pixels_and_give_the_trained_probabilities(lenet_run, held_out, tmp_path, capsys):
    out, printed = exported(lenet_run, tmp_path, capsys)
    x, y = held_out
    expected = trained_outputs(lenet_run, x)
    for got in served_outputs(out, x):
        np.testing.assert_allclose(got, expected, **TOLERANCE)
        assert np.mean(got.argmax(1) == y) > 0.6  # a trained LeNet, not chance (0.1)
    model = onnx.load(os.path.join(out, "model.onnx"))
    props = {p.key: p.value for p in model.metadata_props}
    assert [i.name for i in model.graph.input] == ["images"]
    used = {name for node in model.graph.node for name in node.input}
    assert [t.name for t in model.graph.initializer if t.name not in used] == []  # onnxruntime warns of any
    assert [o.name for o in model.graph.output] == ["probabilities"]
    assert json.loads(props["classes"]) == fashion_spec().classes and model.opset_import[0].version == 13
    with open(os.path.join(out, "signature.json")) as f:
        signature = json.load(f)
    assert signature["inputs"][0]["dtype"] == "uint8" and signature["inputs"][0]["shape"] == [-1, 1, 28, 28]
    assert set(signature["check"]["max_abs_diff"]) == {"mxnet", "onnxruntime"}
    with open(os.path.join(out, "synset.txt")) as f:
        assert f.read().splitlines() == fashion_spec().classes
    assert "checked on 256 validation samples" in printed and "input `images` uint8" in printed
    assert sorted(os.listdir(out)) == sorted(signature["files"])  # no staging folder or temporary left
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".export-")]


def test_an_ensemble_exports_its_mean_vote_and_each_member_alone(ensemble_run, held_out, tmp_path, capsys):
    x, _ = held_out
    out, _ = exported(ensemble_run, tmp_path, capsys)
    for got in served_outputs(out, x):
        np.testing.assert_allclose(got, trained_outputs(ensemble_run, x), **TOLERANCE)
    one, _ = exported(ensemble_run, tmp_path / "member", capsys, "--member", "1")
    alone = trained_outputs(ensemble_run, x, member=1)
    assert not np.allclose(alone, trained_outputs(ensemble_run, x, member=0), atol=1e-3)  # members differ
    for got in served_outputs(one, x):
        np.testing.assert_allclose(got, alone, **TOLERANCE)


@pytest.mark.parametrize("kind", ["zoo", "regression"])
def test_zoo_networks_and_regressions_export(kind, tmp_path_factory, tmp_path, capsys, held_out):
    if kind == "zoo":
        run = trained_run(tmp_path_factory, ["--devices", "cpu", "--model", "cifar_resnet20_v1", "--epochs", "1",
                                             "--limit", "256", "--val-limit", "256", "--batch-size", "64", "--quiet"])
        x, dtype, name = held_out[0][:64], "uint8", "images"
    else:
        rng = np.random.default_rng(0)
        features = rng.normal(size=(1200, 10)).astype(np.float32)
        target = (features @ rng.normal(size=10) + 3).astype(np.float32)
        data = str(tmp_path / "r.npz")
        np.savez(data, x_train=features[:1000], y_train=target[:1000], x_val=features[1000:], y_val=target[1000:])
        run = trained_run(tmp_path_factory, ["--dataset", "npz", "--data-dir", data, "--epochs", "3", "--optimizer",
                                             "adam", "--lr", "0.01", "--quiet"])
        x, dtype, name = features[1100:], "float32", "features"
    out, _ = exported(run, tmp_path, capsys)
    expected = trained_outputs(run, x)
    for got in served_outputs(out, x, dtype, name):
        np.testing.assert_allclose(got, expected, **TOLERANCE)
    if kind == "regression":
        assert np.mean((expected[:, 0] - target[1100:]) ** 2) < 0.5 * np.var(target[1100:])  # it learned


def test_onnx_alone(lenet_run, tmp_path, capsys):
    out, _ = exported(lenet_run, tmp_path, capsys, "--formats", "onnx")
    assert sorted(os.listdir(out)) == ["model.onnx", "signature.json", "synset.txt"]


def test_a_check_that_disagrees_fails():
    expected = np.full((4, 10), 0.1, dtype=np.float32)
    assert check_outputs("x", expected + 1e-7, expected) == pytest.approx(1e-7, rel=0.1)
    with pytest.raises(CheckFailed, match="differs from the trained network by up to 0.001"):
        check_outputs("x", expected + 1e-3, expected)
    with pytest.raises(CheckFailed, match="shape"):
        check_outputs("x", expected[:, :5], expected)


def test_an_export_that_disagrees_is_not_written(lenet_run, tmp_path, capsys, monkeypatch):
    real = export.onnx_outputs
    monkeypatch.setattr(export, "onnx_outputs", lambda *args: real(*args) + 0.01)  # a faulty conversion
    out = tmp_path / "served"
    assert table_exit("an exported file whose outputs differ", export.main([lenet_run, "--out", str(out)]))
    assert capsys.readouterr().err.strip().startswith("gluon_gpu.export: error: the ONNX export differs from the "
                                                      "trained network by up to 0.01")
    assert not out.exists() and os.listdir(tmp_path) == []  # no empty --out, no temporary left


def test_a_run_still_training_exports_one_version_of_its_parameters(lenet_run, held_out, tmp_path, capsys,
                                                                      monkeypatch):
    """The issue's export during a live run: net.params, replaced by the run's next epoch
    between the exporter's two reads, gave `the MXNet export differs ... by up to 0.524`.
    Here the file is replaced right after the first read (as the run would): the export
    is of the version read, and a note says the run is live (its lock is held)."""
    run = str(tmp_path / "run")
    shutil.copytree(lenet_run, run)
    path, next_epoch = os.path.join(run, "net.params"), str(tmp_path / "next.params")
    mx.nd.save(next_epoch, {k: v * 1.5 for k, v in read_parameter_file(path).items()})  # another epoch's
    x = held_out[0]
    spec = recorded_spec(path)
    expected = predict(load_model(path, mx.cpu()), x, [mx.cpu()], spec)
    assert np.abs(expected - predict(load_model(next_epoch, mx.cpu()), x, [mx.cpu()], spec)).max() > 0.01

    def read_then_replaced(name):
        arrays = read_parameter_file(name)
        if os.path.exists(next_epoch):
            os.replace(next_epoch, name)
        return arrays
    monkeypatch.setattr(export, "read_parameter_file", read_then_replaced)
    monkeypatch.setattr(loading, "read_parameter_file", read_then_replaced)
    out = str(tmp_path / "served")
    with RunLock(run):
        assert table_exit("an export of a run still training", export.main([path, "--out", out]))
    err = capsys.readouterr().err.strip()
    assert err == (f"gluon_gpu.export: note: {run} is still being trained (process {os.getpid()}): exporting "
                   "net.params as it is when read"), err
    assert not os.path.exists(next_epoch)  # the run's next epoch did land mid-export
    for served in served_outputs(out, x):
        np.testing.assert_allclose(served, expected, **TOLERANCE)


class GroupNormNet(gluon.HybridBlock):
    """A user's network with a layer MXNet 1.9.1's ONNX exporter cannot convert."""

    def __init__(self, outputs, **kwargs):
        super().__init__(**kwargs)
        self.conv, self.norm, self.out = gluon.nn.Conv2D(4, 3), gluon.nn.GroupNorm(2), gluon.nn.Dense(outputs)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.out(self.norm(self.conv(x)))


def test_bad_input_is_one_line(lenet_run, tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert table_exit("an export of a folder without", export.main([str(empty), "--out", str(tmp_path / "a")]))
    assert capsys.readouterr().err.strip().endswith("is a folder without best.params or net.params: not a finished "
                                                    "run (a stopped one continues with --resume)")

    blocker = tmp_path / "file"
    blocker.write_text("")
    assert table_exit("an export to a folder", export.main([lenet_run, "--out", str(blocker / "sub")]))
    assert capsys.readouterr().err.strip() == (f"gluon_gpu.export: error: cannot write the export to --out "
                                               f"{blocker}/sub: Not a directory")

    monkeypatch.setitem(zoo.MODELS, "groupnorm", zoo.ModelKind(lambda outputs, channels, fused: GroupNormNet(outputs),
                                                                True, "a user's network"))
    net = GroupNormNet(10)
    net.initialize()
    net(mx.nd.zeros((1, 1, 28, 28)))
    params = str(tmp_path / "gn.params")
    net.save_parameters(params)
    out = tmp_path / "gn"
    assert table_exit("an export of a network", export.main([params, "--model", "groupnorm",
                                                             "--out", str(out)]))
    assert not out.exists()  # the folder it made for the export is gone again (it was left empty)
    err = capsys.readouterr().err.strip()
    assert err == ("gluon_gpu.export: error: cannot export to ONNX: MXNet 1.9.1's ONNX exporter has no conversion for "
                   "operator GroupNorm (the MXNet format alone exports it: --formats mxnet)")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".export-")]  # no temporary left
    assert export.main([params, "--model", "groupnorm", "--out", str(out), "--formats", "mxnet"]) == 0
