"""Seed-parallel ensembles: K independently initialized LeNets fused into one network.

Member k is exactly the tutorial LeNet with its own parameters: the members are stacked
along the channel axis, so the two convolutions are one grouped convolution each
(``groups=K``) and the three dense layers are one batched matrix product each
(``batch_dot`` over a member axis). Every layer runs as one operator for all K members,
which keeps a device busy that one small LeNet leaves idle.

Input ``(B, K*C, H, W)`` (member k's image in channels k*C..), output ``(B, K, outputs)``.
"""
import mxnet as mx
from mxnet import gluon, nd

from ..core.step.array_api import forward_zeros, legacy, model_is_np, to_api
from ..core.step.members import MemberAxis, PlacedMembers
from .fused_members import FusedMembers, extract
from .lenet import conv_stages, lenet

_CONVS = (("0", 6, 5), ("2", 16, 3))          # LeNet child index, channels, kernel
_DENSES = (("4", 120), ("5", 84), ("6", None))  # LeNet child index, units (None: the outputs)


class EnsembleLeNet(MemberAxis, gluon.HybridBlock):
    """``fused=True``: each grouped conv -> ReLU -> max-pool runs as the fused CPU operator
    with ``groups=K`` (fused_conv.py), with the same parameters and keys."""

    def __init__(self, members, fused=False, channels=1, outputs=10, **kwargs):
        super().__init__(**kwargs)
        self.members, self.channels, self.outputs = members, channels, outputs
        k = members
        with self.name_scope():
            self.conv1, self.pool1, self.conv2, self.pool2 = conv_stages(channels, k, fused)
            for i, (_, units) in enumerate(_DENSES, 1):
                units = units or outputs
                setattr(self, f"fc{i}_weight", self.params.get(f"fc{i}_weight", shape=(k, units, 0),
                                                               allow_deferred_init=True))
                setattr(self, f"fc{i}_bias", self.params.get(f"fc{i}_bias", shape=(k, 1, units),
                                                             init=mx.init.Zero()))

    def infer_shape(self, x, *args):
        """The first dense layer's input width follows from the image size."""
        features = self.pool2(self.conv2(self.pool1(self.conv1(x))))
        width = features.shape[1] // self.members * features.shape[2] * features.shape[3]
        for i, (_, units) in enumerate(_DENSES, 1):
            units = units or self.outputs
            getattr(self, f"fc{i}_weight").shape = (self.members, units, width)
            width = units

    def hybrid_forward(self, F, x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, fc3_weight, fc3_bias):
        is_np = mx.util.is_np_array()  # the conv layers run in the API in force, the rest legacy
        x = self.pool2(self.conv2(self.pool1(self.conv1(x))))        # (B, 16K, 5, 5)
        with mx.util.np_array(False):
            x = F.transpose(F.reshape(legacy(x), shape=(0, self.members, -1)), axes=(1, 0, 2))  # (K, B, 400)
            layers = ((fc1_weight, fc1_bias), (fc2_weight, fc2_bias), (fc3_weight, fc3_bias))
            for i, (weight, bias) in enumerate(layers):
                x = F.broadcast_add(F.batch_dot(x, legacy(weight), transpose_b=True), legacy(bias))
                if i < 2:
                    x = F.relu(x)
            out = F.transpose(x, axes=(1, 0, 2))                      # (B, K, 10)
        return to_api(out, is_np)


def _lenet_arrays(net):
    return {name: legacy(p.data(p.list_ctx()[0])) for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def _ensemble_params(ens):
    convs = [ens.conv1, ens.conv2]
    fused = {}
    for (index, _, _), conv in zip(_CONVS, convs):
        fused[index + ".weight"], fused[index + ".bias"] = conv.weight, conv.bias
    for i, (index, _) in enumerate(_DENSES, 1):
        fused[index + ".weight"] = getattr(ens, f"fc{i}_weight")
        fused[index + ".bias"] = getattr(ens, f"fc{i}_bias")
    return fused


def combine_members(nets, ctx=None, fused=False, input_shape=(1, 28, 28)):
    """An EnsembleLeNet (``fused``: with the fused conv operator) whose member k holds
    ``nets[k]``'s parameters (copies); ``input_shape``: one member's (C, H, W)."""
    first = next(iter(nets[0].collect_params().values()))
    ctx = ctx or first.list_ctx()
    c, h, w = input_shape
    outputs = _lenet_arrays(nets[0])["6.bias"].shape[0]
    ens = EnsembleLeNet(len(nets), fused, c, outputs)
    ens.initialize(ctx=ctx)
    forward_zeros(ens, (len(nets) * c, h, w), ctx[0])
    arrays = [_lenet_arrays(n) for n in nets]
    for name, param in _ensemble_params(ens).items():
        parts = [a[name].as_in_context(mx.cpu()) for a in arrays]
        if name.startswith(("0.", "2.")):       # grouped conv: members concatenated on axis 0
            value = nd.concat(*parts, dim=0)
        elif name.endswith(".bias"):            # dense bias (K, 1, units)
            value = nd.stack(*parts).expand_dims(1)
        else:                                    # dense weight (K, units, in_units)
            value = nd.stack(*parts)
        param.set_data(to_api(value, model_is_np(ens)))
    return ens


def extract_member(ens, k, ctx=None, input_shape=(1, 28, 28)):
    """An ordinary network with member ``k``'s parameters: savable, loadable, evaluable;
    ``input_shape``: one member's (C, H, W). A MemberStack's member is that network
    itself (it shares its parameters); a fused ensemble's is a copy."""
    if not 0 <= k < ens.members:
        raise IndexError(f"member {k} of an ensemble of {ens.members}")
    if isinstance(ens, PlacedMembers):
        return ens.nets[k]
    ctx = ctx or next(iter(ens.collect_params().values())).list_ctx()
    if isinstance(ens, FusedMembers):
        return extract(ens, k, ctx)
    net = lenet(ens.outputs, ens.channels)
    net.initialize(ctx=ctx)
    forward_zeros(net, input_shape, ctx[0])
    targets = net._collect_params_with_prefix()  # pylint: disable=protected-access
    for name, param in _ensemble_params(ens).items():
        value = legacy(param.data(param.list_ctx()[0])).as_in_context(mx.cpu())
        if name.startswith(("0.", "2.")):
            size = value.shape[0] // ens.members
            value = value[k * size:(k + 1) * size]
        else:
            value = value[k].reshape(targets[name].shape)
        targets[name].set_data(to_api(value, model_is_np(net)))
    return net
