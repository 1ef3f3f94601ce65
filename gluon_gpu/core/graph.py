"""The step graph: input transform -> network -> task head -> per-member sums, one
hybridized graph per input shape and mode, sharing the network's parameters."""
import mxnet as mx
import numpy as np
from mxnet import gluon, nd

from .devices import split_batch

from .modes import legacy, to_api


def make_step_graph(net, head, transform, precision, members, is_np, training, slots=None, augment=None):
    """``(x, y) -> (loss sums (K,), stats)`` in training, ``stats`` in evaluation.

    ``stats`` is ``[loss sums (K), each metric's sums (K)]``; evaluating an ensemble
    adds the combined output's ``[loss, each metric]`` sums (the head's ``combine``).
    The network runs in its own API (``is_np``) and ``precision`` (inputs cast to the
    parameters' dtype; its outputs to float32); transform and head in the legacy one.
    A HybridBlock network gets a hybridizable graph; any other Block an eager one.
    ``slots=(first, total)``: the network is members first.. of an ensemble of ``total``
    (one group of placed members) and the stats come back in those members' places among
    ``total``, zeros elsewhere, so every group's sums add up to the ensemble's.
    ``augment``: a training graph takes ``(x, y, parameters)`` and runs
    ``augment(x, parameters)`` on the samples as stored, before ``transform``."""
    kind = StepGraph if isinstance(net, gluon.HybridBlock) else EagerStepGraph
    graph = kind(prefix="")
    graph.net, graph.transform = net, transform
    graph.augment = augment if training else None
    graph._config = (head, precision, members, is_np, training, slots)  # pylint: disable=protected-access
    return graph


def _forward(graph, F, x, y, augmentation=()):
    head, precision, members, is_np, training, slots = graph._config  # pylint: disable=protected-access
    x, y = legacy(x), legacy(y)
    with mx.util.np_array(False):
        if graph.augment is not None:
            x = graph.augment(x, legacy(augmentation[0]))
        if graph.transform is not None:
            x = graph.transform(x)
        x = x.astype(precision.param_dtype)
    out = graph.net(to_api(x, is_np))
    with mx.util.np_array(False):
        out = legacy(out)
        if precision.dtype != "float32":  # losses and sums in float32 whatever the network computes in
            out = F.cast(out, dtype="float32")
        sums = _head_sums(F, head, out, y.astype("float32"), members, training, slots)
    return tuple(to_api(s, is_np) for s in sums) if training else to_api(sums, is_np)


def augmentation_shards(augment, augmentation, xs, ctx):
    """The augmentation input of each device's shards ``xs``: ``augmentation`` (one row of
    parameters per sample) split as the data or, not given, drawn here by numpy (then not
    a function of the sample); None for every shard without ``augment``."""
    if augment is None:
        return [None] * len(xs)
    for x in (x for x in xs if x is not None):
        augment.check_batch(x.shape)
    if augmentation is None:
        return [None if x is None else nd.array(augment.parameters(np.random.random((x.shape[0], augment.draws))),
                                                ctx=x.context) for x in xs]
    return list(augmentation) if isinstance(augmentation, (list, tuple)) else split_batch(augmentation, ctx)


class StepGraph(gluon.HybridBlock):
    def hybrid_forward(self, F, x, y, *augmentation):  # pylint: disable=arguments-differ
        return _forward(self, F, x, y, augmentation)


class EagerStepGraph(gluon.Block):
    def forward(self, x, y, *augmentation):  # pylint: disable=arguments-differ
        return _forward(self, nd, x, y, augmentation)


def _head_sums(F, head, out, y, k, training, slots=None):
    parts = []
    if k > 1 or slots:  # an ensemble (a group of placed members may hold one)
        if not training:
            first = F.reshape(F.slice_axis(y, axis=1, begin=0, end=1), shape=(-3, -2))
            loss, metrics = head.per_sample(F, head.combine(F, out), first)
            parts = [F.sum(v, axis=0, keepdims=True) for v in [loss] + metrics]
        out, y = F.reshape(out, shape=(-3, -2)), F.reshape(y, shape=(-3, -2))
    loss, metrics = head.per_sample(F, out, y, training)
    sums = [F.sum(F.reshape(v, shape=(-1, k)), axis=0) for v in [loss] + metrics]
    placed = [_in_slots(F, s, k, slots) for s in sums] if slots else sums
    stats = F.concat(*(placed + parts), dim=0)
    return (sums[0], stats) if training else stats


def _in_slots(F, sums, k, slots):
    """``sums`` of members first..first+k placed among ``total`` members, zeros elsewhere."""
    first, total = slots
    pieces = [F.zeros((first,))] if first else []
    pieces.append(sums)
    if total - first - k:
        pieces.append(F.zeros((total - first - k,)))
    return F.concat(*pieces, dim=0) if len(pieces) > 1 else sums
