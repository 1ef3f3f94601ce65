"""The step graph: input transform -> network -> task head -> per-member sums, one
hybridized graph per input shape and mode, sharing the network's parameters."""
import contextlib
import warnings
from typing import NamedTuple, Optional

import mxnet as mx
from mxnet import gluon, nd

from .array_api import legacy, to_api


class GraphBlock(NamedTuple):
    """What a step graph runs: ``net`` (a network, or one group of placed members) under
    ``head``; the rest as make_step_graph takes them."""
    net: gluon.Block
    head: object
    members: int
    slots: Optional[tuple] = None
    shared: bool = False
    skipping: Optional[frozenset] = None


def make_step_graph(net, head, transform, precision, members, is_np, training, slots=None, augment=None,
                    mixing=None, shared=False, skipping=None, tta=None):
    """``(x, y) -> (loss sums (K,), stats)`` in training, ``stats`` in evaluation.

    ``stats`` is ``[loss sums (K), each metric's sums (K)]``; evaluating an ensemble
    adds the combined output's ``[loss, each metric]`` sums (the head's ``combine``).
    The network runs in its own API (``is_np``) and ``precision`` (inputs cast to the
    parameters' dtype; its outputs to float32); transform and head in the legacy one.
    A HybridBlock network gets a hybridizable graph; any other Block an eager one.
    ``slots=(first, total)``: the network is members first.. of an ensemble of ``total``
    (one group of placed members) and the stats come back in those members' places among
    ``total``, zeros elsewhere, so every group's sums add up to the ensemble's.
    Training only: ``augment`` (data/augment.py) runs on the samples as stored, before
    ``transform``, from a third input (its parameters); ``mixing`` (data/mixing.py) takes
    pairs ``x (n, 2, ...)``, ``y (n, 2)`` and its parameters as the last input, augments
    both of each pair, mixes them, and weighs the partner's loss by ``1 - lam``; members
    mix their own pairs, ``x (n, K, 2, ...)``, ``y (n, K, 2)``, parameters ``(n, K, width)``.
    ``shared``: the members share one batch, ``x (n, 1, ...)``, ``y (n, 1)``, augmented
    once for all of them. Members augment each their own column, parameters
    ``(n, K, P)`` (shared: ``(n, 1, P)``), when they do not mix. ``skipping``: members of
    a group left out of it (built without Gluon's warning that their parameters are unused).
    Evaluation only: ``tta`` (tta.py) runs the network on each sample's views
    and judges the mean of their log-probabilities."""
    kind = StepGraph if isinstance(net, gluon.HybridBlock) else EagerStepGraph
    graph = kind(prefix="")
    graph.net, graph.transform, graph.skipping = net, transform, skipping
    graph.augment, graph.mixing = (augment, mixing) if training else (None, None)
    graph.tta = None if training else tta
    graph._config = (head, precision, members, is_np, training, slots, shared)  # pylint: disable=protected-access
    return graph


def _forward(graph, F, x, y, extras=()):
    head, precision, members, is_np, training, slots, _ = graph._config  # pylint: disable=protected-access
    x, y, partner = _inputs(graph, F, legacy(x), legacy(y), [legacy(e) for e in extras])
    out = graph.net(to_api(x, is_np))
    with mx.util.np_array(False):
        out = legacy(out)
        if precision.dtype != "float32":  # losses and sums in float32 whatever the network computes in
            out = F.cast(out, dtype="float32")
        if graph.tta is not None:
            out = graph.tta.combine(F, out)
        sums = _head_sums(F, head, out, y.astype("float32"), members, training, slots, partner)
    return tuple(to_api(s, is_np) for s in sums) if training else to_api(sums, is_np)


def _inputs(graph, F, x, y, extras):
    """``(x, y, partner)``: the network's input (augmented, mixed, its views, normalized,
    in the parameters' dtype), the labels, and a mixed sample's partner (or None)."""
    _, precision, members, _, _, slots, shared = graph._config  # pylint: disable=protected-access
    augmentation = extras.pop(0) if graph.augment is not None else None
    mixing = extras.pop(0) if graph.mixing is not None else None
    partner = None
    member_axis = members > 1 or bool(slots)  # an ensemble's or sweep's batch: (n, K, ...)
    with mx.util.np_array(False):
        if shared:  # one batch for every member: each member's label of each sample
            y = F.broadcast_axis(y, axis=1, size=members)
        if mixing is not None and member_axis:  # each member's pairs: (n, K, 2, ...) -> nK pairs
            x, y, mixing = (F.reshape(v, shape=(-3, -2)) for v in (x, y, mixing))
        if mixing is not None:  # pairs: (n, 2, ...) -> 2n samples to augment
            x = F.reshape(x, shape=(-3, -2))
            augmentation = None if augmentation is None else F.reshape(augmentation, shape=(-3, -2))
            own, other = (F.reshape(half, shape=(-1,)) for half in F.split(y, num_outputs=2, axis=1))
            y, partner = own, (other.astype("float32"), F.reshape(F.slice_axis(mixing, axis=1, begin=0, end=1),
                                                                  shape=(-1,)))
        if graph.augment is not None and member_axis and mixing is None:  # (n, columns, ...) as (n * columns, ...)
            augmented = graph.augment(F.reshape(x, shape=(-3, -2)), F.reshape(augmentation, shape=(-3, -2)))
            x = F.reshape(augmented, shape=(-4, -1, 1 if shared else members, -2))
        elif graph.augment is not None:
            x = graph.augment(x, augmentation)
        if mixing is not None:
            x = graph.mixing(F.reshape(x, shape=(-4, -1, 2, -2)), mixing)
            if member_axis:  # back to (n, K, ...), labels (n, K); the partners' stay (nK,), as the losses
                x, y = F.reshape(x, shape=(-4, -1, members, -2)), F.reshape(y, shape=(-1, members))
        if graph.tta is not None:
            x = graph.tta.view_batch(F, x)
        if graph.transform is not None:
            x = graph.transform(x)
        return x.astype(precision.param_dtype), y, partner


class StepGraph(gluon.HybridBlock):
    def hybrid_forward(self, F, x, y, *extras):  # pylint: disable=arguments-differ
        return _forward(self, F, x, y, extras)

    def _build_cache(self, *args):
        with skipped_members_unused(self.skipping):
            super()._build_cache(*args)


@contextlib.contextmanager
def skipped_members_unused(skipping):
    """Building the graph of a group of placed members that skips some (a sweep's pruned
    members keep their parameters but leave the graph), without Gluon's warning that
    their parameters are unused; ``skipping`` false: as Gluon does."""
    with warnings.catch_warnings():
        if skipping:
            warnings.filterwarnings("ignore", r"Parameter .* is not used by any computation", UserWarning)
        yield


class EagerStepGraph(gluon.Block):
    def forward(self, x, y, *extras):  # pylint: disable=arguments-differ
        return _forward(self, nd, x, y, extras)


def _head_sums(F, head, out, y, k, training, slots=None, partner=None):
    """Training: ``(the loss per sample's sum per member, the stats vector)``; evaluation:
    the stats vector, then an ensemble's combined figures, then the head's tally."""
    parts, combined = [], out
    if k > 1 or slots:  # an ensemble (a group of placed members may hold one)
        if not training:
            first = F.reshape(F.slice_axis(y, axis=1, begin=0, end=1), shape=(-3, -2))
            combined = head.combine(F, out)
            loss, metrics = head.per_sample(F, combined, first)
            parts = [F.sum(v, axis=0, keepdims=True) for v in [loss] + metrics]
        out, y = F.reshape(out, shape=(-3, -2)), F.reshape(y, shape=(-3, -2))
    if head.tallied and not training:
        parts.append(F.sum(head.predicted(F, combined), axis=0))
    loss, metrics = head.per_sample(F, out, y, training)
    if partner is not None:  # mixed samples: the partner's label weighs 1 - lam
        other, lam = partner
        loss = lam * loss + (1 - lam) * head.loss_of(F, out, other, training)
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
