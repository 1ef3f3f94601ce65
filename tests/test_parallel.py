import re

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd, npx

from gluon_gpu import Classification, DataParallel, get_model
from gluon_gpu.core.step.array_api import forward_zeros, semantics
from gluon_gpu.data import DevicePipeline
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.models import init_model
from gluon_gpu.core.step import precision
from gluon_gpu.core.step.kvstores import check_options
from gluon_gpu.core.step.precision import check_precision, precision_for

from conftest import fashion_transform, param_arrays


@pytest.fixture(params=["legacy", "numpy"])
def api(request):
    """The MXNet API the user's program runs in: legacy, or numpy after npx.set_np()."""
    if request.param == "numpy":
        npx.set_np()
    yield request.param
    npx.reset_np()


def make_dp(ctx, seed=0, fused=False, **kw):
    """A LeNet DataParallel, in whichever API is on (a numpy-mode net when set_np is)."""
    if fused:  # the fused LeNet, seeded as every gluon_gpu run seeds it
        net = init_model("lenet", seed, ctx, fused_conv="on")
    else:
        mx.random.seed(seed)
        net = get_model("lenet")
        net.initialize(mx.init.Xavier(), ctx=ctx)
        forward_zeros(net, (1, 28, 28), ctx[0])
    kw.setdefault("optimizer_params", {"learning_rate": 0.1})
    kw.setdefault("head", Classification(10))
    return DataParallel(net, ctx, **kw)


def host_batches(train_slice, sizes):
    """Tutorial-normalized float batches of the given sizes, in file order, as arrays of
    the API in force (numpy arrays after npx.set_np())."""
    x, y = train_slice[0][:sum(sizes)], train_slice[1][:sum(sizes)]
    with semantics(False):
        norm_x = fashion_transform()(nd.array(x, dtype="uint8")).asnumpy()
    starts = np.cumsum([0] + sizes)
    api = mx.np.array if mx.util.is_np_array() else nd.array
    return [(api(norm_x[a:b]), api(y[a:b])) for a, b in zip(starts[:-1], starts[1:])]


def run(dp, batches):
    losses = [float(dp.step(x, y).asscalar()) for x, y in batches]
    return losses, param_arrays(dp.net)


def assert_same_params(a, b, atol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=atol, err_msg=k)


@pytest.mark.parametrize("optimizer,params", [
    ("sgd", {"learning_rate": 0.1}),
    ("sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}),
    ("adam", {"learning_rate": 0.001}),
])
def test_two_devices_match_one_device(train_slice, optimizer, params, api):
    batches = host_batches(train_slice, [256, 256, 256])
    one = make_dp([mx.cpu(0)], optimizer=optimizer, optimizer_params=params)
    two = make_dp([mx.cpu(0), mx.cpu(1)], optimizer=optimizer, optimizer_params=params)
    assert_same_params(param_arrays(one.net), param_arrays(two.net), atol=0)
    loss1, p1 = run(one, batches)
    loss2, p2 = run(two, batches)
    np.testing.assert_allclose(loss1, loss2, rtol=1e-5)
    assert_same_params(p1, p2)
    # the step really moved the parameters
    fresh = param_arrays(make_dp([mx.cpu(0)]).net)
    assert max(np.abs(fresh[k] - p1[k]).max() for k in fresh) > 1e-3


@pytest.mark.parametrize("fused", [False, True], ids=["standard", "fused"])
@pytest.mark.parametrize("sizes", [[5], [1], [3, 1, 7]])
def test_uneven_and_tiny_batches_over_two_devices(train_slice, sizes, fused, api):
    """A batch that does not divide evenly, or is smaller than the device count,
    gives the same update as on one device (idle devices add zero, not stale, gradients)."""
    batches = host_batches(train_slice, [256] + sizes)
    _, p1 = run(make_dp([mx.cpu(0)], fused=fused), batches)
    _, p2 = run(make_dp([mx.cpu(0), mx.cpu(1)], fused=fused), batches)
    assert_same_params(p1, p2)


@pytest.mark.parametrize("spec", ["cpu", "cpu*2"])
def test_a_batch_smaller_than_the_nominal_size_moves_the_parameters_in_proportion(train_slice, spec):
    """With batch_size=8 a batch of 4 is divided by 8 (as trainer.step(batch_size) in the
    tutorial): plain SGD moves every parameter exactly half as far as dividing by 4."""
    ctx = [mx.cpu(i) for i in range(2 if spec == "cpu*2" else 1)]
    (x, y), = host_batches(train_slice, [4])
    moves = []
    for nominal in (None, 8):
        dp = make_dp(ctx, seed=4, batch_size=nominal)
        start = param_arrays(dp.net)
        dp.step(x, y)
        moves.append({k: v - start[k] for k, v in param_arrays(dp.net).items()})
    for k in moves[0]:
        assert np.abs(moves[0][k]).max() > 1e-5 or k.endswith("bias"), k
        np.testing.assert_allclose(moves[1][k], moves[0][k] / 2, rtol=1e-4, atol=1e-7, err_msg=k)


def test_same_seed_same_losses(train_slice):
    batches = host_batches(train_slice, [128] * 4)
    a, pa = run(make_dp([mx.cpu(0)], seed=5), batches)
    b, pb = run(make_dp([mx.cpu(0)], seed=5), batches)
    c, _ = run(make_dp([mx.cpu(0)], seed=6), batches)
    assert a == b
    assert_same_params(pa, pb, atol=0)
    assert a != c


def test_hybridized_and_imperative_agree(train_slice):
    batches = host_batches(train_slice, [256, 100])
    _, p1 = run(make_dp([mx.cpu(0)], hybridize=True), batches)
    _, p2 = run(make_dp([mx.cpu(0)], hybridize=False), batches)
    assert_same_params(p1, p2)


def test_device_pipeline_step_matches_host_batches(train_slice):
    """uint8 shards normalized in the graph train exactly like tutorial-normalized floats."""
    x, y = train_slice[0][:600], train_slice[1][:600]
    ctx = [mx.cpu(0), mx.cpu(1)]
    dev_dp = make_dp(ctx, transform=fashion_transform())
    for xs, ys in DevicePipeline(x, y, 256, ctx, shuffle=False).epoch(0):
        dev_dp.step(xs, ys)
    host_dp = make_dp(ctx)
    for xb, yb in host_batches(train_slice, [256, 256, 88]):
        host_dp.step(xb, yb)
    assert_same_params(param_arrays(dev_dp.net), param_arrays(host_dp.net))
    assert dev_dp.read_metrics()["samples"] == 600


def test_metrics_accumulate_on_device_until_read(train_slice):
    dp = make_dp([mx.cpu(0), mx.cpu(1)])
    batches = host_batches(train_slice, [200, 56])
    losses = [float(dp.step(x, y).asscalar()) for x, y in batches]
    m = dp.read_metrics()
    assert m["samples"] == 256
    assert m["loss"] == pytest.approx((losses[0] * 200 + losses[1] * 56) / 256, rel=1e-5)
    assert 0 <= m["acc"] <= 1 and m["acc"] <= m["top5"] <= 1
    assert dp.read_metrics()["samples"] == 0


def test_evaluate_matches_numpy(train_slice, api):
    """Accuracy, top-5 and loss over two devices equal numpy's on the whole batch."""
    dp = make_dp([mx.cpu(0), mx.cpu(1)])
    (x, y), = host_batches(train_slice, [300])
    logits, labels = dp.net(x).asnumpy(), y.asnumpy().astype(int)
    got = dp.evaluate([(x, y)])
    assert got["acc"] == pytest.approx(float((logits.argmax(1) == labels).mean()))
    top5 = np.argsort(-logits, axis=1)[:, :5]
    assert got["top5"] == pytest.approx(float((top5 == labels[:, None]).any(1).mean()))
    shifted = logits - logits.max(1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(len(labels)), labels]
    assert got["loss"] == pytest.approx(float(nll.mean()), rel=1e-5)
    predicted = logits.argmax(1)
    assert got["samples"] == 300 and got["predicted_classes"] == len(set(predicted))
    assert len(set(predicted)) > 2, "an untrained LeNet predicts more than two classes of 300 samples"
    for classes in (predicted[:1], sorted(set(predicted))[:2]):  # only the samples predicted as these
        kept, as_api = np.isin(predicted, classes), mx.np.array if api == "numpy" else nd.array
        assert dp.evaluate([(as_api(x.asnumpy()[kept]), as_api(labels[kept]))])["predicted_classes"] == len(classes)


@pytest.mark.parametrize("kwargs,message", [
    ({"kvstore": "nccl"}, "nccl needs GPU devices"),
    ({"kvstore": "bogus"}, "unknown kvstore"),
    ({"kvstore": "dist_sync"}, "gluon_gpu.launch"),
])
def test_gpu_and_launcher_only_options_fail_clearly(monkeypatch, kwargs, message):
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    with pytest.raises(UserError, match=message):
        check_options([mx.cpu(0)], **kwargs)


def test_nccl_on_gpus_needs_an_nccl_build():
    """The CPU wheel has no NCCL: on GPU contexts the error names the build, not the devices."""
    if mx.runtime.Features().is_enabled("NCCL"):
        pytest.skip("this MXNet build has NCCL")
    with pytest.raises(UserError, match="build with NCCL"):
        check_options([mx.gpu(0), mx.gpu(1)], kvstore="nccl")


@pytest.mark.parametrize("dtype,amp,ctx,message", [
    ("float16", False, [mx.cpu(0)], "float16 training needs GPU devices"),
    ("float32", True, [mx.cpu(0), mx.cpu(1)], "`amp` (float16 mixed precision) needs GPU devices"),
    ("bfloat16", False, [mx.gpu(0)], "on GPUs use `amp`"),
    ("bfloat16", True, [mx.cpu(0)], "pass one of them"),
    ("int8", False, [mx.cpu(0)], "unknown dtype"),
])
def test_precisions_the_devices_cannot_train_in_fail_clearly(dtype, amp, ctx, message):
    with pytest.raises(UserError, match=re.escape(message)):
        check_precision(precision_for(dtype, amp), ctx)


@pytest.mark.parametrize("dtype,amp", [("float16", False), ("float32", True), ("float16", True)])
def test_float16_and_amp_accepted_for_gpu_contexts(dtype, amp):
    check_precision(precision_for(dtype, amp), [mx.gpu(0), mx.gpu(1)])
    assert precision_for(dtype, amp).loss_scaling == amp  # AMP float16 scales its loss; a cast network does not


def test_bfloat16_needs_the_cpu_instructions(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", "avx512bw"})
    with pytest.raises(UserError, match="needs a CPU with AVX-512 BF16"):
        check_precision(precision_for("bfloat16"), [mx.cpu(0)])
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    check_precision(precision_for("bfloat16"), [mx.cpu(0)])


def test_a_loop_that_never_reads_holds_a_bounded_number_of_steps(train_slice, monkeypatch):
    import gluon_gpu.core.step.metrics as metrics
    monkeypatch.setattr(metrics, "MAX_PENDING", 3)
    dp = make_dp([mx.cpu(0)])
    batches = host_batches(train_slice, [32] * 7)
    losses = [float(dp.step(x, y).asscalar()) for x, y in batches]
    assert len(dp._sums._pending) < 3  # pylint: disable=protected-access
    m = dp.read_metrics()
    assert m["samples"] == 7 * 32 and m["loss"] == pytest.approx(np.mean(losses), rel=1e-5)
