"""bfloat16 on oneDNN 3's AMX kernels (issue #41): a CIFAR ResNet v1's features as one
operator (models/amx_features.py). In float32 it computes what MXNet's layers compute;
in bfloat16 it learns as float32 does and resumes exactly; it is chosen only on CPUs
with AMX, for the networks it runs, and a CPU without AMX keeps contrib.amp."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from gluon_gpu import DataParallel
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.models import amx_features, init_model
from gluon_gpu.models.zoo import get_model
from gluon_gpu.programs import train

from conftest import read_metrics
from test_checkpoints import REPO, assert_same_run

needs_amx = pytest.mark.skipif(not amx_features.has_amx(), reason="this CPU has no AMX (amx_bf16)")
RESNET = ["--model", "cifar_resnet20_v1", "--devices", "cpu*2", "--limit", "2048", "--val-limit", "500",
          "--batch-size", "128", "--quiet"]
NO_AMX = frozenset(("avx512f", "avx512_bf16"))  # an AVX-512 BF16 CPU without AMX, as AMD's EPYC


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


@needs_amx
def test_bfloat16_on_amx_learns_as_float32_does_and_says_so(tmp_path, capsys):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = str(tmp_path / dtype)
        assert train.main(RESNET + ["--dtype", dtype, "--epochs", "3", "--out", out]) == 0
        runs[dtype] = read_metrics(out)["epochs"][-1]
    plan = capsys.readouterr().out
    assert "in bfloat16 (oneDNN 3 on AMX" in plan and "slower than float32" not in plan
    assert runs["bfloat16"]["val_acc"] > 0.7 and runs["bfloat16"]["val_acc"] > runs["float32"]["val_acc"] - 0.06
    assert abs(runs["bfloat16"]["train_loss"] - runs["float32"]["train_loss"]) < 0.1 * runs["float32"]["train_loss"]


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_amx)])
def test_a_resnet_on_two_devices_resumes_exactly(tmp_path, dtype):
    """Validation included: each device keeps running statistics of its own, a checkpoint
    the first one's; validation now gives every device those (a resumed float32 run's
    val-loss differed in the fourth digit before)."""
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert train.main(RESNET + ["--dtype", dtype, "--epochs", "2", "--out", straight]) == 0
    assert train.main(RESNET + ["--dtype", dtype, "--epochs", "1", "--out", resumed]) == 0
    assert train.main(["--resume", resumed, "--epochs", "2", "--quiet"]) == 0
    assert_same_run(straight, resumed)


def test_the_kernels_are_chosen_only_on_amx_cpus_for_the_networks_they_run(monkeypatch):
    cpu = [mx.cpu(0)]
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: NO_AMX)
    net = init_model("cifar_resnet20_v1", 0, cpu)
    assert not amx_features.uses(amx_features.choose(net, "auto", cpu))  # contrib.amp, as before
    with pytest.raises(UserError, match="^`bfloat16_kernels` onednn: this CPU has no AMX"):
        amx_features.choose(net, "onednn", cpu)
    monkeypatch.setattr(amx_features, "cpu_flags", lambda: NO_AMX | amx_features.AMX_FLAGS)
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
    with pytest.raises(UserError, match="computes in bfloat16 on oneDNN 3 .*: train it with `dtype` bfloat16"):
        DataParallel(net, [mx.cpu(0)], "sgd", {"learning_rate": 0.1})


AS_IF_WITHOUT_AMX = """
import sys
from gluon_gpu.core.step import precision
from gluon_gpu.models import amx_features
amx_features.cpu_flags = precision.cpu_flags = lambda: {flags!r}
from gluon_gpu.programs import train
sys.exit(train.main(sys.argv[1:]))
"""


def test_without_amx_bfloat16_keeps_contrib_amp_and_its_warning(tmp_path):
    """contrib.amp is process-wide: each run is a process of its own, told the CPU has
    AVX-512 BF16 without AMX (a dry run computes nothing in bfloat16: any CPU will do)."""
    script = AS_IF_WITHOUT_AMX.format(flags=set(NO_AMX))
    args = [sys.executable, "-c", script, *RESNET, "--dtype", "bfloat16", "--dry-run", "--out", str(tmp_path / "run")]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "in bfloat16 (contrib.amp) (warning: slower than float32" in done.stdout and "oneDNN 3" not in done.stdout
    done = subprocess.run(args + ["--bfloat16-kernels", "onednn"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.strip() == (
        "gluon_gpu.train: error: --bfloat16-kernels onednn: this CPU has no AMX (/proc/cpuinfo lists no amx_bf16)")
