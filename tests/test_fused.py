"""The fused conv+relu+pool operator: exact against MXNet's own layers (values and every
gradient), the fused LeNet interchangeable with the standard one, and the build,
fallback and error paths."""
import ctypes
import os
import select
import subprocess
import sys

import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, nd

from gluon_gpu.core.platform.pools import remove_dead_partials
from gluon_gpu.models import compiled, fused_conv
from gluon_gpu.programs import train
from gluon_gpu.data import DevicePipeline
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.models import init_model, load_model
from gluon_gpu.core.step.parallel import DataParallel
from gluon_gpu.core.step.params import save_parameters
from conftest import fashion_transform, param_arrays, read_metrics


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    fused_conv.load()  # CI has g++: the operator must build there, not silently fall back


def standard(x, w, b, groups=1):
    z = nd.Convolution(x, w, b, kernel=w.shape[2:], num_filter=w.shape[0], num_group=groups)
    return nd.Pooling(nd.relu(z), kernel=(2, 2), stride=(2, 2), pool_type="max")


def fused(x, w, b, data_grad=1):
    return nd.gg_conv_relu_pool(x, w, b, data_grad=data_grad)[0]


def forward_backward(fn, x, w, b, head):
    for a in (x, w, b):
        a.attach_grad()
    with autograd.record():
        y = fn(x, w, b)
    y.backward(head)
    return [a.asnumpy() for a in (y, x.grad, w.grad, b.grad)]


SHAPES = [  # N, C, H, W, F, K
    (5, 1, 28, 28, 6, 5),     # LeNet conv1 (its compiled-in specialization)
    (5, 6, 12, 12, 16, 3),    # LeNet conv2 (its specialization)
    (3, 2, 11, 9, 3, 4),      # the generic path: odd sizes (the pool drops the last row/column)
    (2, 3, 10, 10, 20, 3),    # more than one block of 16 output channels, the last partial
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_operator_matches_conv_relu_maxpool_values_and_gradients(shape):
    n, c, h, w_, f, k = shape
    rng = np.random.default_rng(0)
    x, w, b = (nd.array(rng.normal(size=s)) for s in ((n, c, h, w_), (f, c, k, k), (f,)))
    out_shape = (n, f, (h - k + 1) // 2, (w_ - k + 1) // 2)
    head = nd.array(rng.normal(size=out_shape))
    want = forward_backward(standard, x, w, b, head)
    got = forward_backward(fused, x, w, b, head)
    for name, g, e in zip(("output", "data grad", "weight grad", "bias grad"), got, want):
        assert g.shape == e.shape, name
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=name)
    assert (got[0] > 0).mean() > 0.2 and np.abs(got[2]).max() > 0.1  # not a trivial case


@pytest.mark.parametrize("shape", [(4, 3, 28, 28, 18, 5), (4, 18, 12, 12, 48, 3)], ids=["conv1x3", "conv2x3"])
def test_groups_match_a_grouped_convolution(shape):
    """groups=3, as a 3-member ensemble's layers: against Convolution(num_group=3)."""
    n, c, h, w_, f, k = shape
    groups = 3
    rng = np.random.default_rng(2)
    x, w, b = (nd.array(rng.normal(size=s)) for s in ((n, c, h, w_), (f, c // groups, k, k), (f,)))
    head = nd.array(rng.normal(size=(n, f, (h - k + 1) // 2, (w_ - k + 1) // 2)))
    want = forward_backward(lambda *a: standard(*a, groups=groups), x, w, b, head)
    got = forward_backward(lambda *a: nd.gg_conv_relu_pool(*a, groups=groups)[0], x, w, b, head)
    for name, g, e in zip(("output", "data grad", "weight grad", "bias grad"), got, want):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=name)


def test_without_data_grad_the_parameter_gradients_are_unchanged_and_the_data_gradient_is_zero():
    rng = np.random.default_rng(1)
    x, w, b = (nd.array(rng.normal(size=s)) for s in ((4, 1, 28, 28), (6, 1, 5, 5), (6,)))
    head = nd.ones((4, 6, 12, 12))
    full = forward_backward(fused, x, w, b, head)
    skipped = forward_backward(lambda *a: fused(*a, data_grad=0), x, w, b, head)
    assert np.abs(full[1]).max() > 0 and not skipped[1].any()
    for g, e in zip(skipped[2:], full[2:]):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_a_nan_in_the_input_stays_a_nan():
    x = nd.random.normal(shape=(2, 1, 28, 28))
    x[1, 0, 10, 10] = float("nan")
    y = fused(x, nd.random.normal(shape=(6, 1, 5, 5)), nd.zeros((6,))).asnumpy()
    assert np.isnan(y[1]).any() and not np.isnan(y[0]).any()


def test_gradient_accumulation_falls_back_to_the_standard_operators():
    """MXNet's extension API cannot add into a gradient: with grad_req='add' the block
    must still accumulate (it runs the standard operators then)."""
    ctx = [mx.cpu()]
    x = nd.random.uniform(shape=(8, 1, 28, 28))
    grads = []
    for mode in ("on", "off"):
        net = init_model("lenet", 5, ctx, fused_conv=mode)
        net.collect_params().setattr("grad_req", "add")
        for _ in range(2):
            with autograd.record():
                loss = net(x).sum()
            loss.backward()
        grads.append({k: p.grad().asnumpy() for k, p in net._collect_params_with_prefix().items()})
    for name in grads[1]:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_fused_lenet_has_the_standard_lenets_parameters_and_initial_values():
    ctx = [mx.cpu()]
    plain, fast = init_model("lenet", 7, ctx, fused_conv="off"), init_model("lenet", 7, ctx, fused_conv="on")
    assert fused_conv.is_fused(fast) and not fused_conv.is_fused(plain)
    assert [p.name[len(plain.prefix):] for p in plain.collect_params().values()] == \
           [p.name[len(fast.prefix):] for p in fast.collect_params().values()]
    a, b = param_arrays(plain), param_arrays(fast)
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    x = nd.random.uniform(shape=(16, 1, 28, 28))
    np.testing.assert_allclose(fast(x).asnumpy(), plain(x).asnumpy(), rtol=1e-5, atol=1e-5)


def test_fused_and_standard_lenet_train_alike_on_two_contexts(train_slice):
    """The real step (hybridized, cpu*2, kvstore) with either network: the same losses
    and, after a few updates, the same parameters up to float rounding."""
    x, y = train_slice
    ctx = [mx.cpu(0), mx.cpu(1)]
    results = []
    for mode in ("off", "on"):
        net = init_model("lenet", 0, ctx, fused_conv=mode)
        start = param_arrays(net)
        dp = DataParallel(net, ctx, "sgd", {"learning_rate": 0.03, "momentum": 0.5}, transform=fashion_transform())
        losses = [dp.step(xs, ys).asscalar() for xs, ys in DevicePipeline(x, y, 256, ctx).epoch(0)]
        results.append((losses, param_arrays(net)))
    (plain_loss, plain), (fast_loss, fast) = results
    np.testing.assert_allclose(fast_loss, plain_loss, rtol=1e-3)
    assert plain_loss[-1] < plain_loss[0] - 0.15, plain_loss  # it learned
    for name in plain:  # rounding differences grow over the steps: small against the steps' movement
        moved = np.abs(plain[name] - start[name]).max()
        assert np.abs(fast[name] - plain[name]).max() < 0.03 * moved, (name, moved)


def test_parameters_move_between_fused_and_standard_lenet(tmp_path):
    ctx = [mx.cpu()]
    x = nd.random.uniform(shape=(4, 1, 28, 28))
    path = str(tmp_path / "net.params")
    fast = init_model("lenet", 3, ctx, fused_conv="on")
    save_parameters(fast, path)
    plain = load_model(path, ctx, fused_conv="off")
    assert not fused_conv.is_fused(plain) and fused_conv.is_fused(load_model(path, ctx))
    np.testing.assert_allclose(plain(x).asnumpy(), fast(x).asnumpy(), rtol=1e-5, atol=1e-5)


def test_modes(monkeypatch):
    cpu = [mx.cpu(0), mx.cpu(1)]
    assert fused_conv.use_fused("auto", cpu) and fused_conv.use_fused("on", cpu)
    assert not fused_conv.use_fused("off", cpu)
    assert not fused_conv.use_fused("auto", [mx.gpu(0)])  # no GPU kernels: standard layers
    with pytest.raises(UserError, match="needs CPU devices"):
        fused_conv.use_fused("on", [mx.gpu(0)])
    with pytest.raises(UserError, match="unknown `fused_conv`"):
        fused_conv.use_fused("fast", cpu)
    assert fused_conv.is_fused(init_model("lenet", 0, cpu[:1], members=2, layout="fused"))  # groups=K
    assert not fused_conv.is_fused(init_model("lenet", 0, cpu[:1], members=2, fused_conv="off", layout="fused"))
    assert fused_conv.is_fused(init_model("lenet", 0, cpu[:1], members=2))  # members of their own
    with pytest.raises(UserError, match="CPU kernels only"):  # a fused net moved to GPUs by hand
        DataParallel(init_model("lenet", 0, cpu[:1], fused_conv="on"), [mx.gpu(0)])


def _fresh_state(monkeypatch, tmp_path):
    monkeypatch.setattr(fused_conv, "_state", {"loaded": False, "error": None, "warned": False})
    monkeypatch.setenv("GLUON_GPU_CACHE", str(tmp_path / "cache"))
    # use_fused writes it into os.environ for a re-executed program; "" (unsaid) here, and
    # monkeypatch removes it at teardown, so no later test's children inherit "said"
    monkeypatch.setenv(fused_conv.WARNED_ENV, "")


def test_without_a_compiler_auto_warns_once_and_on_fails_in_one_line(monkeypatch, tmp_path, capsys):
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert not fused_conv.use_fused("auto", [mx.cpu()])
    assert not fused_conv.use_fused("auto", [mx.cpu()])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no C++ compiler 'no-such-compiler'" in err[0] and "standard layers" in err[0]
    with pytest.raises(UserError, match="^`fused_conv` on: no C\\+\\+ compiler"):
        fused_conv.use_fused("on", [mx.cpu()])


def test_a_compile_error_is_reported_in_one_line_and_nothing_is_cached(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    bad = tmp_path / "bad.cc"
    bad.write_text("this is not C++;\n")
    monkeypatch.setattr(fused_conv, "SOURCE", str(bad))
    with pytest.raises(fused_conv.FusedConvUnavailable, match="failed: .*error") as e:
        fused_conv.build()
    assert "\n" not in str(e.value)
    assert not os.listdir(tmp_path / "cache")  # no half-written library left behind


def test_an_unwritable_cache_is_one_clear_reason(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GLUON_GPU_CACHE", str(tmp_path / "file" / "cache"))  # under a file
    with pytest.raises(fused_conv.FusedConvUnavailable, match="cannot write the cache directory .*GLUON_GPU_CACHE"):
        fused_conv.build()


def test_the_library_is_compiled_once_and_reused(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    path = fused_conv.build()
    assert os.path.isfile(path) and os.path.dirname(path) == str(tmp_path / "cache")

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled again")
    monkeypatch.setattr(compiled, "_compile", no_compiling)
    assert fused_conv.build() == path


@pytest.mark.parametrize("damage", ["cut", "garbage", "no digest"])
def test_a_damaged_cached_library_is_compiled_again_not_trusted(tmp_path, capsys, damage):
    """#62, class 'a cached artifact trusted without a check': the library cut in half
    crashed every LeNet run with SIGBUS; filled with garbage, it warned and fell back on
    every run, never rebuilt. Now its digest is checked first and a damaged copy compiled
    again."""
    source = tmp_path / "tiny.cc"
    source.write_text('extern "C" int answer() { return 42; }\n')
    path, command = str(tmp_path / "cache" / "tiny.so"), ["g++", "-shared", "-fPIC", str(source)]
    assert compiled.build_library(path, command, "a tiny library") == path
    good = open(path, "rb").read()
    if damage == "cut":
        open(path, "wb").write(good[:len(good) // 2])
    elif damage == "garbage":
        open(path, "wb").write(os.urandom(len(good)))
    else:
        os.remove(path + ".sha256")
    capsys.readouterr()
    assert not compiled.intact(path)
    assert compiled.build_library(path, command, "a tiny library") == path and compiled.intact(path)
    assert "the cached copy failed its check" in capsys.readouterr().err
    assert ctypes.CDLL(path).answer() == 42


def test_a_compile_dies_with_the_program_that_started_it(tmp_path):
    """#62, class 'a child outliving its owner': SIGKILL of a run while g++ compiled left
    g++ running for seconds, its .so in the cache for good and its cc*.s files in TMPDIR.
    Here the compiler is a script whose own child (as cc1plus is g++'s) would run for
    minutes: both end with the program, and the next compile removes what it left."""
    compiler = tmp_path / "slow-cxx"
    compiler.write_text("#!/bin/sh\nsleep 600 &\necho $! > \"$PIDFILE\"\nwait\n")
    compiler.chmod(0o755)
    env = {**os.environ, "CXX": str(compiler), "GLUON_GPU_CACHE": str(tmp_path / "cache"),
           "PIDFILE": str(tmp_path / "grandchild")}
    program = subprocess.Popen([sys.executable, "-c", "from gluon_gpu.models import fused_conv; fused_conv.build()"],
                               env=env, stderr=subprocess.PIPE, text=True)
    assert program.stderr.readline().startswith("gluon_gpu: compiling")
    while not (tmp_path / "grandchild").exists() or not (tmp_path / "grandchild").read_text().strip():
        assert program.poll() is None  # waits on the file the compiler writes
    grandchild = int((tmp_path / "grandchild").read_text())
    program.kill()
    program.wait()
    assert _ends(grandchild), "the compiler's child outlived the program"
    assert not [name for name in os.listdir(tmp_path / "cache") if name.endswith(".so")]  # nothing trusted
    (tmp_path / "cache" / f"conv_relu_pool-x.so.{program.pid}.partial").write_text("half")
    remove_dead_partials(str(tmp_path / "cache" / "conv_relu_pool-x.so"))
    assert os.listdir(tmp_path / "cache") == []


def _ends(pid):
    """Whether process ``pid`` ends: waits on its state (a pidfd turns readable when it
    does), with a minute as the safety net of a test that would otherwise hang."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 60)[0])
    finally:
        os.close(fd)


def test_train_records_the_fused_operator_and_refuses_it_where_it_cannot_run(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(["--devices", "cpu", "--epochs", "1", "--limit", "512", "--quiet", "--out", out]) == 0
    assert read_metrics(out)["fused_conv"] is True
    assert train.main(["--devices", "cpu", "--model", "cifar_resnet20_v1", "--fused-conv", "on",
                       "--dry-run", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gluon_gpu.train: error: --fused-conv on applies to lenet's convolutions and to the gather of a "
                   "geometric --augment (flip, crop, ...); this run has neither (cifar_resnet20_v1, no such "
                   "augmentation)"]
    # #62: the flag also chooses the compiled gather, and an MLP with flips takes it
    assert train.main(["--devices", "cpu", "--model", "mlp", "--fused-conv", "on", "--augment", "flip", "--epochs",
                       "1", "--limit", "256", "--val-limit", "64", "--quiet", "--out", str(tmp_path / "m")]) == 0
    assert train.main(["--devices", "cpu", "--fused-conv", "off", "--dry-run", "--out", str(tmp_path / "y")]) == 0
    assert "conv+relu+pool" not in capsys.readouterr().out


def test_a_run_resumes_with_the_other_implementation(tmp_path):
    out = str(tmp_path / "run")
    common = ["--devices", "cpu", "--limit", "512", "--quiet"]
    assert train.main(common + ["--epochs", "1", "--fused-conv", "off", "--out", out]) == 0
    assert read_metrics(out)["fused_conv"] is False
    assert train.main(common + ["--epochs", "2", "--fused-conv", "on", "--resume", out]) == 0
    metrics = read_metrics(out)
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2] and metrics["fused_conv"] is True
