"""Gradient buckets (buckets.py): the same training as one kvstore key per parameter,
whatever the bucket size, shape inference, inference in between or multipliers."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from gluon_gpu import DataParallel, get_model
from gluon_gpu.data import DevicePipeline
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.models import SeededXavier, init_model

from conftest import fashion_transform, param_arrays

CTX2 = [mx.cpu(0), mx.cpu(1)]
MOMENTUM = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}


def batches(train_slice, ctx, steps):
    x, y = train_slice
    return list(DevicePipeline(x[:steps * 128], y[:steps * 128], 128, ctx).epoch(0))


def train(dp, train_slice, steps=6, only=slice(None)):
    """``steps`` steps of 128, or the ``only`` slice of them."""
    losses = [float(dp.step(xs, ys).asscalar()) for xs, ys in batches(train_slice, dp.ctx, steps)[only]]
    return losses, param_arrays(dp.net)


def assert_same(a, b):
    assert a[0] == pytest.approx(b[0], rel=1e-5)
    for name in a[1]:
        np.testing.assert_allclose(a[1][name], b[1][name], rtol=1e-5, atol=1e-6, err_msg=name)


def fresh_dp(bucket_bytes=4 << 20, fused_conv="off", **kw):
    net = init_model("lenet", 0, CTX2, fused_conv=fused_conv)
    return DataParallel(net, CTX2, "sgd", dict(MOMENTUM), transform=fashion_transform(),
                        bucket_bytes=bucket_bytes, **kw)


@pytest.mark.parametrize("bucket_bytes,buckets", [(4 << 20, 1), (20000, 5)])
@pytest.mark.parametrize("fused_conv", ["off", "on"])
def test_bucketed_training_equals_one_key_per_parameter(train_slice, bucket_bytes, buckets, fused_conv):
    """Momentum and weight decay included; 20000 bytes splits LeNet's 10 gradients into
    several buckets, one of them a single parameter larger than the bound (fc1: 192 kB)."""
    reference = fresh_dp(0, fused_conv)
    expected = train(reference, train_slice)
    assert not reference.bucketing and reference.buckets is None
    assert expected[0][-1] < expected[0][0] - 0.3  # it learns
    bucketed = fresh_dp(bucket_bytes, fused_conv)
    assert_same(train(bucketed, train_slice), expected)
    assert len(bucketed.buckets.buffers) == buckets


def test_gradients_are_views_of_their_bucket_and_weights_are_not(train_slice):
    dp = fresh_dp()
    train(dp, train_slice, steps=1)
    for i, c in enumerate(CTX2):
        dp.buckets.buffers[0][i][:] = 3
        for p in dp.net.collect_params().values():
            assert (p.grad(c).asnumpy() == 3).all(), p.name
            assert not (p.data(c).asnumpy() == 3).all(), p.name


def test_inference_between_steps_leaves_training_exact(train_slice):
    """MXNet's oneDNN convolution re-lays-out a weight's whole buffer when it runs for
    inference: were weights views of a bucket, this evaluation would corrupt it (it
    failed a '!is_view' check, or crashed the process later)."""
    expected = train(fresh_dp(0), train_slice, steps=6)
    dp = fresh_dp()
    train(dp, train_slice, steps=6, only=slice(0, 3))
    assert 0.1 < dp.evaluate(batches(train_slice, CTX2, 12)[8:])["acc"] < 1.0
    dp.net(nd.zeros((2, 1, 28, 28), ctx=CTX2[1])).wait_to_read()
    result = train(dp, train_slice, steps=6, only=slice(3, 6))
    assert_same((expected[0][3:], expected[1]), result)


def test_deferred_shapes_are_bucketed_at_the_first_step(train_slice):
    """A network whose shapes come from its first forward pass, as a user's own loop
    builds it, and a network hybridized and run before: both train as without buckets."""
    def deferred(bucket_bytes, hybridized):
        net = get_model("lenet")
        net.initialize(SeededXavier(0), ctx=CTX2)
        if hybridized:
            net.hybridize(static_alloc=True, static_shape=True)
            net(nd.zeros((2, 1, 28, 28), ctx=CTX2[0]))
        return DataParallel(net, CTX2, "sgd", dict(MOMENTUM), transform=fashion_transform(),
                            bucket_bytes=bucket_bytes)
    for hybridized in (False, True):
        dp = deferred(4 << 20, hybridized)
        assert dp.bucketing and dp.buckets is None
        result = train(dp, train_slice)
        assert len(dp.buckets.buffers) == 1
        assert_same(result, train(deferred(0, hybridized), train_slice))


def test_parameters_keep_their_multipliers(train_slice):
    """The Trainer still updates parameter by parameter: lr_mult=0 freezes a layer."""
    net = init_model("lenet", 0, CTX2, fused_conv="off")
    frozen = [p for name, p in net._collect_params_with_prefix().items() if name.startswith("5.")]
    assert len(frozen) == 2  # the first dense layer's weight and bias
    for p in frozen:
        p.lr_mult = 0.0
    before = {p.name: p.data(CTX2[0]).asnumpy() for p in net.collect_params().values()}
    dp = DataParallel(net, CTX2, "sgd", {"learning_rate": 0.1}, transform=fashion_transform())
    train(dp, train_slice, steps=2)
    assert dp.buckets is not None
    for p in net.collect_params().values():
        changed = not np.array_equal(p.data(CTX2[0]).asnumpy(), before[p.name])
        assert changed == (p not in frozen), p.name


def test_accumulated_gradients_go_through_the_buckets_too(train_slice):
    """--accumulate: backward adds into the bucket views; the same numbers as one key per
    parameter, and the buckets are really used."""
    bucketed, plain = fresh_dp(accumulate=2), fresh_dp(bucket_bytes=0, accumulate=2)
    assert_same(train(bucketed, train_slice), train(plain, train_slice))
    assert bucketed.buckets is not None and plain.buckets is None


def test_reallocated_parameters_fail_clearly(train_slice):
    dp = fresh_dp()
    train(dp, train_slice, steps=1)
    dp.net.collect_params().reset_ctx(CTX2)
    with pytest.raises(UserError, match="re-allocated"):
        train(dp, train_slice, steps=1)


def test_without_exchange_each_device_trains_its_own_replica(train_slice):
    """The benchmark's no-exchange baseline really leaves the exchange out (the replicas
    part), and the ordinary step really exchanges (they stay equal)."""
    for exchange in (True, False):
        dp = fresh_dp(exchange=exchange)
        train(dp, train_slice, steps=3)
        weight = next(iter(dp.net.collect_params().values()))
        same = np.array_equal(weight.data(CTX2[0]).asnumpy(), weight.data(CTX2[1]).asnumpy())
        assert same == exchange
