"""Blocks swapped inside built networks (models/blocks.py, models/sync_bn.py): the same
function and the same parameters, wherever the block sits."""
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from gluon_gpu.models import init_model
from gluon_gpu.models.blocks import GlobalMeanPool, replace_blocks, use_mean_pooling
from gluon_gpu.models.sync_bn import use_sync_batchnorm

CTX = [mx.cpu(0)]


def forward_backward(net, x):
    with autograd.record():
        out = net(x)
    out.backward()
    return out.asnumpy(), {k: p.grad(CTX[0]).asnumpy() for k, p in net._collect_params_with_prefix().items()
                           if p.grad_req != "null"}


def test_mean_pooling_is_global_average_pooling_forward_and_backward():
    x = mx.nd.array(np.random.RandomState(3).rand(8, 1, 28, 28))
    fast = init_model("cifar_resnet20_v1", 0, CTX, (1, 28, 28), 10)
    assert isinstance(fast.features[-1], GlobalMeanPool)
    plain = init_model("cifar_resnet20_v1", 0, CTX, (1, 28, 28), 10)
    assert replace_blocks(plain, lambda b: isinstance(b, GlobalMeanPool), lambda b: gluon.nn.GlobalAvgPool2D()) == 1
    (out_a, grads_a), (out_b, grads_b) = forward_backward(fast, x), forward_backward(plain, x)
    np.testing.assert_allclose(out_a, out_b, rtol=1e-5, atol=1e-6)
    for k in grads_b:
        np.testing.assert_allclose(grads_a[k], grads_b[k], rtol=1e-4, atol=1e-6, err_msg=k)


class Head(gluon.HybridBlock):
    """A user's block holding layers as attributes, one nested in a Sequential."""

    def __init__(self):
        super().__init__()
        self.body = gluon.nn.HybridSequential()
        self.body.add(gluon.nn.Conv2D(4, 3), gluon.nn.BatchNorm())
        self.pool = gluon.nn.GlobalAvgPool2D()
        self.out = gluon.nn.Dense(2)

    def hybrid_forward(self, F, x):
        return self.out(self.pool(self.body(x)))


def test_blocks_held_as_attributes_or_by_index_are_all_replaced():
    net = Head()
    net.initialize(ctx=CTX)
    x = mx.nd.array(np.random.RandomState(1).rand(4, 1, 8, 8))
    before, names = net(x).asnumpy(), sorted(net._collect_params_with_prefix())
    assert use_mean_pooling(net) == 1 and isinstance(net.pool, GlobalMeanPool)
    assert use_sync_batchnorm(net, 1) == 1 and type(net.body[1]).__name__ == "SyncBatchNorm"
    assert sorted(net._collect_params_with_prefix()) == names  # the same parameters under the same names
    np.testing.assert_allclose(net(x).asnumpy(), before, rtol=1e-5, atol=1e-6)
