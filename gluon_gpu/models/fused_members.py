"""The ``fused`` ensemble layout for networks built of convolutions, BatchNorm and Dense
layers: K members as one network, layer by layer, as HFTA (MLSys'21) fuses them.

Member k's channels are stacked after member k-1's: the input is ``(B, K*C, ...)``, and
every layer keeps the stacking. A convolution becomes one convolution of K times the
channels in K times the groups (member k's outputs see only member k's inputs); a
BatchNorm normalizes each channel by itself anyway, so it just takes K times the
channels; a Dense layer becomes a :class:`MemberDense`, one batched product over the
member axis. Layers without parameters (activations, pooling, flattening, a residual
sum) act on each channel or element alone and stay as they are. What else a network's
own forward does is not read: :func:`fuse` compares the fused network's outputs with the
members' before it is used, and refuses one that mixes members (a concat of channels).

The fused network's parameter keys are the member's under ``net.`` (``net.features.0.weight``),
K times as wide: Conv and BatchNorm parameters concatenated on axis 0, Dense ones
stacked on a new axis 0.
"""
import contextlib
import io

import mxnet as mx
import numpy as np
from mxnet import gluon, nd
from mxnet.gluon import nn

from ..core.platform.errors import UserError
from ..core.platform.walk import named_blocks
from ..core.step.array_api import call, forward_zeros, legacy, model_is_np, semantics, to_api
from ..core.step.members import MemberAxis
from ..core.step.params import assign_parameters, last_line
from .blocks import replace_blocks

_CONVS = (nn.Conv1D, nn.Conv2D, nn.Conv3D)
_FUSABLE = _CONVS + (nn.BatchNorm, nn.Dense)


class MemberDense(gluon.HybridBlock):
    """K Dense layers side by side: input ``(B, K*F)`` or ``(B, K*C, ...)`` (member k's
    features contiguous), output ``(B, K*units)``; weight ``(K, units, F)``, bias ``(K, units)``."""

    def __init__(self, members, units, activation=None, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.members, self.units, self.activation = members, units, activation
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(members, units, 0), allow_deferred_init=True)
            self.bias = self.params.get("bias", shape=(members, units), init="zeros") if use_bias else None

    def infer_shape(self, x, *args):  # pylint: disable=arguments-differ
        self.weight.shape = (self.members, self.units, int(np.prod(x.shape[1:])) // self.members)

    def hybrid_forward(self, F, x, weight, bias=None):  # pylint: disable=arguments-differ
        is_np = mx.util.is_np_array()
        with mx.util.np_array(False):
            x = F.transpose(F.reshape(legacy(x), shape=(0, self.members, -1)), axes=(1, 0, 2))  # (K, B, F)
            y = F.batch_dot(x, legacy(weight), transpose_b=True)                              # (K, B, units)
            if bias is not None:
                y = F.broadcast_add(y, F.expand_dims(legacy(bias), axis=1))
            if self.activation:
                y = F.Activation(y, act_type=self.activation)
            out = F.reshape(F.transpose(y, axes=(1, 0, 2)), shape=(0, -1))                     # (B, K*units)
        return to_api(out, is_np)


class FusedMembers(MemberAxis, gluon.HybridBlock):
    """``members`` copies of ``make_net()`` fused (see the module): input ``(B, K*C, ...)``,
    output ``(B, K, outputs)``. Uninitialized; :func:`fuse` fills it from trained members."""

    def __init__(self, make_net, members, **kwargs):
        super().__init__(**kwargs)
        self.members, self.make_net = members, make_net
        net = make_net()
        why = unfusable_layer(net)
        if why:
            raise UserError(f"`ensemble_layout` fused: your network cannot be fused: {why}")
        replace_blocks(net, lambda b: type(b) in _FUSABLE, lambda b: _widened(b, members))
        self.net = net  # registered as the child "net"

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        is_np = mx.util.is_np_array()
        out = self.net(x)
        with mx.util.np_array(False):
            return to_api(F.reshape(legacy(out), shape=(0, self.members, -1)), is_np)


def _widened(block, k):  # pylint: disable=protected-access
    """``block`` (one member's Conv, BatchNorm or Dense) for K members side by side."""
    act = block.act._act_type if getattr(block, "act", None) is not None else None
    if isinstance(block, nn.Dense):
        return MemberDense(k, block._units, act, block.bias is not None, prefix=block.prefix)
    kw = block._kwargs
    if isinstance(block, nn.BatchNorm):
        return nn.BatchNorm(axis=1, momentum=kw["momentum"], epsilon=kw["eps"], scale=not kw["fix_gamma"],
                            center=block.beta.grad_req != "null", use_global_stats=kw["use_global_stats"],
                            in_channels=k * getattr(block, "in_channels", 0), prefix=block.prefix)
    return type(block)(k * block._channels, kw["kernel"], strides=kw["stride"], padding=kw["pad"],
                       dilation=kw["dilate"], groups=k * kw["num_group"], layout=kw["layout"], activation=act,
                       use_bias=not kw["no_bias"], in_channels=k * block._in_channels, prefix=block.prefix)


def unfusable_layer(net):
    """Why ``net`` (one member) has no fused form, naming its first layer with
    parameters of a kind the fused layout lacks; None if it has one."""
    for path, block in named_blocks(net):
        if not block._reg_params:  # pylint: disable=protected-access
            continue
        kind = type(block).__name__
        if type(block) not in _FUSABLE:
            return f"its layer {path or kind} ({kind}) has no fused form"
        if isinstance(block, nn.Dense):
            if not block._flatten:  # pylint: disable=protected-access
                return f"its layer {path} (Dense with flatten=False) has no fused form"
            continue
        options = block._kwargs  # pylint: disable=protected-access
        if options.get("layout", "NC")[:2] != "NC" or options.get("axis", 1) != 1:
            return f"its layer {path} ({kind}) works on channels-last data, which has no fused form"
    return None


def _stacked(fused):
    """The keys of ``fused``'s parameters that stack members on a new axis (MemberDense's)."""
    return {f"{path}.{name}" for path, block in named_blocks(fused) if isinstance(block, MemberDense)
            for name in block._reg_params}  # pylint: disable=protected-access


def fuse(nets, make_net, ctx, input_shape):
    """A FusedMembers on ``ctx`` holding copies of ``nets``' parameters (initialized
    members of ``make_net``; ``input_shape`` one member's), checked to compute what the
    members compute; UserError for a network whose forward mixes members."""
    k = len(nets)
    with semantics(model_is_np(nets[0])):
        fused = FusedMembers(make_net, k)
        fused.initialize(ctx=ctx)
    c = input_shape[0]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # MXNet prints a failed shape inference's arguments
            forward_zeros(fused, (k * c,) + tuple(input_shape[1:]), ctx[0])
    except (mx.base.MXNetError, ValueError) as e:  # a reshape or concat over channels breaks the shapes
        raise UserError(_MIXES + f" ({last_line(e)})") from None
    stacked = _stacked(fused)
    members = [n._collect_params_with_prefix() for n in nets]  # pylint: disable=protected-access
    for key, param in fused._collect_params_with_prefix().items():  # pylint: disable=protected-access
        parts = [legacy(m[key[len("net."):]].data()).asnumpy() for m in members]
        value = np.stack(parts) if key in stacked else np.concatenate(parts)
        param.set_data(to_api(nd.array(value), model_is_np(fused)))
    x = nd.array(np.random.default_rng(0).uniform(-1, 1, (2, k * c) + tuple(input_shape[1:])), ctx=ctx[0])
    together = call(fused, x).asnumpy()
    for j, net in enumerate(nets):
        alone = call(net, nd.slice_axis(x, axis=1, begin=j * c, end=(j + 1) * c)).asnumpy()
        if not np.allclose(together[:, j], alone, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(alone).max())):
            raise UserError(_MIXES)
    return fused


_MIXES = ("`ensemble_layout` fused: the fused network does not compute what its members compute: its forward "
          "mixes the members' channels (a concat, reshape or shuffle over channels); use `ensemble_layout` "
          "devices, separate or sequential")


def extract(fused, k, ctx):
    """Member ``k`` of a FusedMembers as an ordinary network on ``ctx`` (a copy)."""
    net = fused.make_net()
    stacked = _stacked(fused)
    arrays = {}
    for key, param in fused._collect_params_with_prefix().items():  # pylint: disable=protected-access
        value = legacy(param.data(param.list_ctx()[0])).asnumpy()  # plain layout: oneDNN's blocked ones do not slice
        size = value.shape[0] // fused.members
        arrays[key[len("net."):]] = nd.array(value[k] if key in stacked else value[k * size:(k + 1) * size])
    with semantics(model_is_np(fused)):
        assign_parameters(net, arrays, ctx, f"member {k} of the fused ensemble")
    return net
