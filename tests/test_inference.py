"""evaluate and predict on oneDNN's inference graphs: the fused graph (conv+BN+ReLU as
one primitive) gives the training graph's figures; --int8 loses at most a point of
accuracy on LeNet and ResNet-20 and says how much; both refuse contexts not the CPU's."""
import json
import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from conftest import trained_run
from gluon_gpu.core.platform.devices import thread_settings
from gluon_gpu.core.platform.environment import usable_cpus
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.data.fashion_mnist import fashion_spec
from gluon_gpu.models.inference import inference_mode, inference_model
from gluon_gpu.programs import evaluate, predict

FIGURES = re.compile(r"validation loss (\S+)  acc (\S+)")


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory, small_fashion):
    return trained_run(tmp_path_factory, ["--data-dir", small_fashion, "--devices", "cpu", "--epochs", "2",
                                          "--batch-size", "64", "--val-limit", "500", "--quiet"], "lenet")


@pytest.fixture(scope="module")
def resnet_run(tmp_path_factory, small_fashion):
    return trained_run(tmp_path_factory, ["--data-dir", small_fashion, "--devices", "cpu", "--model",
                                          "cifar_resnet20_v1", "--epochs", "3", "--batch-size", "64",
                                          "--val-limit", "256", "--quiet"], "resnet")


def evaluated(run, data_dir, capsys, *flags):
    """``(loss, acc, printed)`` of evaluate on the 2000 validation samples of ``data_dir``."""
    assert evaluate.main(["--params", run, "--devices", "cpu", "--data-dir", data_dir] + list(flags)) == 0
    printed = capsys.readouterr().out
    loss, acc = FIGURES.search(printed).groups()
    return float(loss), float(acc), printed


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_the_fused_graph_gives_the_training_graphs_figures_and_int8_within_a_point(which, request, small_fashion,
                                                                                   capsys):
    run = request.getfixturevalue(f"{which}_run")
    graph_loss, graph_acc, printed = evaluated(run, small_fashion, capsys, "--inference", "graph")
    classes = re.search(r"\(2000 samples, (\d+) classes predicted, graph inference\)", printed)
    assert classes and int(classes[1]) > 1, printed
    _, _, printed = evaluated(run, small_fashion, capsys)  # auto: LeNet's fused conv operator beats oneDNN
    assert ("graph inference" if which == "lenet" else "fused inference") in printed
    loss, acc, printed = evaluated(run, small_fashion, capsys, "--inference", "fused")
    assert "fused inference" in printed and acc == graph_acc and loss == pytest.approx(graph_loss, abs=2e-4)
    assert f"(2000 samples, {classes[1]} classes predicted, fused inference)" in printed  # both paths count
    threads = thread_settings()["omp_threads"]  # main(argv) from Python: the process's, not a 0 for "as set"
    assert f"on cpu(0), {threads} OpenMP thread{'s' * (threads > 1)} (" in printed, printed
    assert graph_acc > (0.6 if which == "lenet" else 0.7)  # trained, not at chance (0.1)
    _, int8_acc, printed = evaluated(run, small_fashion, capsys, "--int8")
    assert "int8 inference" in printed and abs(int8_acc - acc) <= 0.01
    assert f"int8 against float32 (fused): acc {acc:.4f} ({int8_acc - acc:+.4f})" in printed


def test_the_fused_graph_holds_onednn_fused_operators(resnet_run):
    def graph_of(mode):  # the symbol the block runs
        net = inference_model(resnet_run + "/best.params", fashion_spec(), mode, np.zeros((4, 1, 28, 28), "uint8"))
        return net._cached_graph[1]  # pylint: disable=protected-access
    ops, plain_ops = ([node["op"] for node in json.loads(graph_of(mode).tojson())["nodes"]]
                      for mode in ("fused", "graph"))
    assert ops.count("_sg_mkldnn_conv") >= 19 and "BatchNorm" not in ops  # every conv, its BN folded in
    assert plain_ops.count("Convolution") >= 19 and "BatchNorm" in plain_ops


def test_predict_on_each_graph_names_the_same_classes(lenet_run, small_fashion, capsys):
    idx = f"{small_fashion}/t10k-images-idx3-ubyte.gz"
    answers = {}
    for mode in ("graph", "fused", "int8"):
        assert predict.main(["--params", lenet_run, "--idx", idx, "--index", "0:20", "--json", "--inference", mode,
                             "--data-dir", small_fashion]) == 0
        answers[mode] = json.loads(capsys.readouterr().out)
    graph = np.array([r["probabilities"] for r in answers["graph"]])
    np.testing.assert_allclose([r["probabilities"] for r in answers["fused"]], graph, atol=1e-5)
    int8 = np.array([r["probabilities"] for r in answers["int8"]])
    assert np.mean(int8.argmax(1) == graph.argmax(1)) >= 0.9 and np.abs(int8 - graph).max() < 0.2


def test_a_command_line_gives_onednn_graphs_every_core(resnet_run, small_fashion):
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.evaluate", "--params", resnet_run, "--data-dir",
                           small_fashion, "--devices", "cpu*2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"on cpu\(0\), {usable_cpus()} OpenMP threads \(2000 samples, \d+ classes predicted, fused "
                     r"inference\)", done.stdout), done.stdout


def test_onednn_graphs_are_for_cpu_contexts():
    assert inference_mode("auto", [mx.cpu(0), mx.cpu(1)], "cifar_resnet20_v1") == "fused"
    assert inference_mode("auto", [mx.cpu(0)], "lenet", "off") == "fused"
    assert inference_mode("auto", [mx.gpu(0)], "cifar_resnet20_v1") == "graph"
    for mode in ("fused", "int8"):
        with pytest.raises(UserError, match=f"`inference` {mode} is oneDNN's, for CPU contexts"):
            inference_mode(mode, [mx.gpu(0)])
