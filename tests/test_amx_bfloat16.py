"""bfloat16 on oneDNN 3's kernels (issues #41, #52): a CIFAR ResNet v1's features as one
operator (models/amx_features.py). In float32 it computes what MXNet's layers compute;
in bfloat16 it learns as float32 does and resumes exactly (on AMX or AVX-512 BF16, and
on any AVX-512 CPU, where oneDNN emulates bfloat16);
``auto`` takes it where the table of the CPU's class measured it faster than
contrib.amp, for the networks it runs, and keeps contrib.amp elsewhere."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from gluon_gpu import DataParallel
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.core.step import precision
from gluon_gpu.models import amx_features, init_model
from gluon_gpu.models.zoo import get_model
from gluon_gpu.programs import train

from conftest import read_metrics
from test_checkpoints import REPO, assert_same_run

needs_avx512 = pytest.mark.skipif("avx512f" not in amx_features.cpu_flags(),
                                  reason="oneDNN 3 runs bfloat16 on AVX-512 CPUs only (this one has none)")
RESNET = ["--model", "cifar_resnet20_v1", "--devices", "cpu*2", "--limit", "2048", "--val-limit", "500",
          "--batch-size", "128", "--quiet"]
NO_AMX = frozenset(("avx512f", "avx512_bf16"))  # an AVX-512 BF16 CPU without AMX, as AMD's EPYC
AMX = amx_features.AMX_FLAGS


@pytest.fixture
def emulated_bf16(monkeypatch):
    """The CPU said to have AVX-512 BF16 without AMX, so that the kernels' path runs on any
    AVX-512 CPU: oneDNN 3 asks the CPU itself, and emulates bfloat16 where it has no
    bfloat16 instructions (an Ice Lake), as ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI makes it do
    here. contrib.amp is not involved: the network computes on its own kernels."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: NO_AMX)
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: NO_AMX)


def _twins(shape):
    """Two ResNet-20s with the same parameters; the second's features on the kernels in float32."""
    nets = [get_model("cifar_resnet20_v1", 10, 1) for _ in range(2)]
    x = nd.array(np.random.default_rng(0).standard_normal(shape))
    for net in nets:
        net.initialize(mx.init.Xavier(), ctx=mx.cpu())
        net(x)  # MXNet's layers infer the shapes (and leave their arrays in oneDNN 2's layouts)
    for mine, theirs in zip(nets[0].collect_params().values(), nets[1].collect_params().values()):
        theirs.set_data(nd.array(mine.data().asnumpy()))
    amx_features.use(nets[1], bfloat16=False)
    return nets, x


def _step(net, x, weights):
    with autograd.record():
        loss = (net(x) * weights).sum()
    loss.backward()
    params = net.collect_params().values()
    return ([p.grad().asnumpy().copy() for p in params if p.grad_req != "null"],
            [p.data().asnumpy().copy() for p in params if p.grad_req == "null"])  # the running statistics


def _relative(mine, theirs):
    return max(float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)) for a, b in zip(mine, theirs))


def test_in_float32_the_kernels_compute_what_mxnet_s_layers_compute():
    (ref, ours), x = _twins((16, 1, 16, 16))
    weights = nd.array(np.random.default_rng(1).standard_normal((16, 10)))
    grads, stats = zip(_step(ref, x, weights), _step(ours, x, weights))
    assert _relative(grads[1], grads[0]) < 1e-4  # every weight's, gamma's and beta's gradient
    assert _relative(stats[1], stats[0]) < 1e-5  # the running means and variances after the step
    for hybridized in (False, True):  # inference: the running statistics
        if hybridized:
            ref.hybridize()
            ours.hybridize()
        assert _relative([ours(x).asnumpy()], [ref(x).asnumpy()]) < 1e-5


@needs_avx512
def test_bfloat16_on_onednn_learns_as_float32_does_and_says_so(tmp_path, capsys, emulated_bf16):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = str(tmp_path / dtype)
        assert train.main(RESNET + ["--dtype", dtype, "--bfloat16-kernels", "onednn", "--epochs", "4",
                                    "--out", out]) == 0
        runs[dtype] = read_metrics(out)["epochs"][-1]
    plan = capsys.readouterr().out
    assert "in bfloat16 (oneDNN 3: the features'" in plan and "slower than float32" not in plan
    assert runs["bfloat16"]["val_acc"] > 0.7 and runs["bfloat16"]["val_acc"] > runs["float32"]["val_acc"] - 0.06
    assert abs(runs["bfloat16"]["train_loss"] - runs["float32"]["train_loss"]) < 0.1 * runs["float32"]["train_loss"]


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_avx512)])
def test_a_resnet_on_two_devices_resumes_exactly(tmp_path, dtype, emulated_bf16):
    """Validation included: each device keeps running statistics of its own, a checkpoint
    the first one's; validation now gives every device those (a resumed float32 run's
    val-loss differed in the fourth digit before)."""
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    kernels = ["--bfloat16-kernels", "onednn"] * (dtype == "bfloat16")
    assert train.main(RESNET + ["--dtype", dtype, *kernels, "--epochs", "2", "--out", straight]) == 0
    assert train.main(RESNET + ["--dtype", dtype, *kernels, "--epochs", "1", "--out", resumed]) == 0
    assert train.main(["--resume", resumed, "--epochs", "2", "--quiet"]) == 0
    assert_same_run(straight, resumed)


def _measured(tmp_path, monkeypatch, **classes):
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({"model": "ResNet-20", "page": "docs/bfloat16.md", "classes": {
        name: {"cpu": "some CPU", "date": "2026-12-07", "version": "0.9.2", **ratios}
        for name, ratios in classes.items()}}))
    monkeypatch.setattr(precision, "BFLOAT16_MEASURED", str(path))


def test_auto_takes_the_kernels_measured_faster_on_the_cpu_s_class(monkeypatch, tmp_path):
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: NO_AMX)
    monkeypatch.setattr(precision, "cpu_flags", lambda: NO_AMX)
    _measured(tmp_path, monkeypatch)  # nothing measured: AMX takes oneDNN 3, AVX-512 BF16 alone contrib.amp
    assert amx_features.auto_kernels() == "amp" and amx_features.auto_kernels(NO_AMX | AMX) == "onednn"
    _measured(tmp_path, monkeypatch, **{"AVX-512 BF16": {"amp": 1.6, "onednn": 1.75}})
    assert amx_features.auto_kernels() == "onednn"  # an AMD EPYC's measurement (Zen 4: no AMX)
    assert amx_features.auto_kernels(NO_AMX | AMX) == "onednn"  # AMX not measured: as before
    _measured(tmp_path, monkeypatch, **{"AVX-512 BF16": {"amp": 1.6, "onednn": 1.75},
                                        "AVX-512 BF16 and AMX": {"amp": 0.85, "onednn": 0.8}})
    assert amx_features.auto_kernels(NO_AMX | AMX) == "amp"  # measured slower there: not taken
    assert amx_features.auto_kernels({"avx512f"}) == "amp"  # no bfloat16 instructions: no figures
    assert precision.bfloat16_measured({"avx512f"}) is None


def test_the_kernels_are_chosen_only_where_they_run_and_pay(monkeypatch, tmp_path):
    cpu = [mx.cpu(0)]
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: NO_AMX)
    monkeypatch.setattr(precision, "cpu_flags", lambda: NO_AMX)
    _measured(tmp_path, monkeypatch, **{"AVX-512 BF16": {"amp": 1.6, "onednn": 1.4}})
    net = init_model("cifar_resnet20_v1", 0, cpu)
    assert not amx_features.uses(amx_features.choose(net, "auto", cpu))  # contrib.amp measured faster
    assert amx_features.uses(amx_features.choose(init_model("cifar_resnet20_v1", 0, cpu), "onednn", cpu))
    _measured(tmp_path, monkeypatch, **{"AVX-512 BF16": {"amp": 1.6, "onednn": 1.75}})
    assert amx_features.uses(amx_features.choose(init_model("cifar_resnet20_v1", 0, cpu), "auto", cpu))
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: {"avx512f"})
    with pytest.raises(UserError, match="^`bfloat16_kernels` onednn: this CPU has neither AVX-512 BF16 nor AMX"):
        amx_features.choose(init_model("cifar_resnet20_v1", 0, cpu), "onednn", cpu)
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: NO_AMX | AMX)
    net = init_model("cifar_resnet20_v1", 0, cpu)
    lenet = init_model("lenet", 0, cpu, fused_conv="off")
    assert not amx_features.uses(amx_features.choose(lenet, "auto", cpu))
    for net_, ctx, members, why in ((lenet, cpu, 1, "CIFAR ResNets v1"), (net, cpu, 2, "not an `ensemble`"),
                                    (net, [mx.gpu(0)], 1, "CPUs only")):
        with pytest.raises(UserError, match=why):
            amx_features.choose(net_, "onednn", ctx, members)
    with pytest.raises(UserError, match="not with `sync_bn`"):
        amx_features.choose(net, "onednn", cpu, sync_bn=True)
    assert not amx_features.uses(amx_features.choose(net, "auto", cpu, sync_bn=True))
    assert not amx_features.uses(amx_features.choose(net, "amp", cpu))
    assert amx_features.uses(amx_features.choose(net, "auto", cpu))


def test_a_network_on_the_kernels_trains_in_bfloat16_only():
    net = amx_features.use(init_model("cifar_resnet20_v1", 0, [mx.cpu(0)]))
    with pytest.raises(UserError, match="computes in bfloat16 on oneDNN 3: .*: train it with `dtype` bfloat16"):
        DataParallel(net, [mx.cpu(0)], "sgd", {"learning_rate": 0.1})


AS_IF = """
import sys
from gluon_gpu.core.step import precision
from gluon_gpu.models import amx_features
amx_features.cpu_flags = precision.cpu_flags = lambda: {flags!r}
precision.BFLOAT16_MEASURED = {measured!r}
from gluon_gpu.programs import train
sys.exit(train.main(sys.argv[1:]))
"""


def test_the_plan_names_the_choice_and_only_this_class_s_figures(tmp_path):
    """contrib.amp is process-wide: each run is a process of its own, told the CPU has
    AVX-512 BF16 without AMX (a dry run computes nothing in bfloat16: any CPU will do)."""
    measured = tmp_path / "measured.json"
    rows = {"AVX-512 BF16 and AMX": {"cpu": "an AMX Xeon", "date": "2026-12-05", "version": "0.9.0", "amp": 0.85,
                                     "onednn": 2.04}}
    measured.write_text(json.dumps({"model": "ResNet-20", "page": "docs/bfloat16.md", "classes": rows}))

    def plan(*flags):
        script = AS_IF.format(flags=set(NO_AMX), measured=str(measured))
        done = subprocess.run([sys.executable, "-c", script, *RESNET, "--dtype", "bfloat16", "--dry-run", "--out",
                               str(tmp_path / "run"), *flags], cwd=REPO, capture_output=True, text=True, timeout=300)
        return done
    done = plan()
    assert done.returncode == 0, done.stderr
    assert "in bfloat16 (contrib.amp) (not measured on a CPU with AVX-512 BF16" in done.stdout
    assert "an AMX Xeon" not in done.stdout and "0.85" not in done.stdout  # another class's figures
    rows["AVX-512 BF16"] = {"cpu": "AMD EPYC", "date": "2026-12-07", "version": "0.9.2", "amp": 1.6, "onednn": 1.75}
    measured.write_text(json.dumps({"model": "ResNet-20", "page": "docs/bfloat16.md", "classes": rows}))
    done = plan()
    assert done.returncode == 0, done.stderr
    assert ("in bfloat16 (oneDNN 3: the features' convolutions, BatchNorms, ReLUs and adds) (auto chose the faster: "
            "ResNet-20 trains at contrib.amp 1.60x float32, oneDNN 3 1.75x, measured 2026-12-07 on AMD EPYC "
            "(AVX-512 BF16), docs/bfloat16.md)") in done.stdout, done.stdout
    # #62: LeNet took contrib.amp because oneDNN 3's kernels do not run it, not as "the faster"
    lenet = subprocess.run([sys.executable, "-c", AS_IF.format(flags=set(NO_AMX), measured=str(measured)), "--model",
                            "lenet", "--devices", "cpu", "--dtype", "bfloat16", "--dry-run", "--out",
                            str(tmp_path / "lenet")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ("(auto: contrib.amp, as oneDNN 3's kernels run a CIFAR ResNet v1's features, not this network; "
            "ResNet-20 trains at contrib.amp 1.60x float32") in lenet.stdout, lenet.stdout + lenet.stderr
    rows["AVX-512 BF16"].update(amp=0.9, onednn=0.8)
    measured.write_text(json.dumps({"model": "ResNet-20", "page": "docs/bfloat16.md", "classes": rows}))
    done = plan()
    assert "in bfloat16 (contrib.amp) (warning: slower than float32: ResNet-20 trained at 0.90x" in done.stdout
    done = plan("--bfloat16-kernels", "onednn", "--devices", "gpu")
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_inference_calls_share_a_bounded_set_of_networks(monkeypatch):
    """MXNet makes a CustomOp per call of a graph not statically allocated: one oneDNN
    network each grew bench --inference of ResNet-20 to the OOM killer. Inference
    networks are shared per shape, at most MAX_SHARED_NETS, and compute as before."""
    (ref, ours), _ = _twins((4, 1, 16, 16))
    made = []
    create = amx_features._create
    monkeypatch.setattr(amx_features, "_create", lambda *a: made.append(a[1]) or create(*a))
    monkeypatch.setattr(amx_features, "MAX_SHARED_NETS", 3)
    for n in [4] * 5 + [1, 2, 3, 5, 6] + [4] * 3:  # one shape many times, then six more
        x = nd.array(np.random.default_rng(n).standard_normal((n, 1, 16, 16)))
        assert _relative([ours(x).asnumpy()], [ref(x).asnumpy()]) < 1e-5
    assert [shape[0] for shape in made] == [4, 1, 2, 3, 5, 6, 4]  # 4 again: evicted meanwhile, made again
    assert len(amx_features._SHARED) == 3
