"""Seed-parallel ensembles of any network: K independent members side by side.

Member k is an ordinary network (LeNet, a zoo network, a user's block) with its own
parameters, initialized as ``--seed seed+k`` alone initializes it, on one device: with
the layout ``devices`` the members are dealt out over D devices in contiguous runs
(K not a multiple of D: the first K mod D devices hold one member more; K < D: D - K
devices idle), with ``separate`` and ``sequential`` every member lives on the first
device. Members are independent: no gradient crosses devices.

In training DataParallel runs one step graph per :class:`MemberGroup` (a hybridizable
block), fed its members' columns of each batch (``pipeline_layout``). ``devices`` makes
a group of each device's members: on one engine worker, K graphs called one by one,
batch by batch, cost more per member than one graph of K (README "Seed-parallel
ensembles"). ``separate`` makes each member a group of its own, all stepped on every
batch: K graphs with no buffer in common (one graph's static memory plan would chain
its members through shared buffers), which a device's engine workers run at once.
``sequential`` makes each member a group of its own and the groups take turns, each its
whole epoch: one member's buffers at a time, as when the members train one after
another. The stack itself, with the fused EnsembleLeNet's contract (input
``(B, K*C, ...)``, member k's sample in channels k*C..; output ``(B, K, outputs)``),
evaluates and predicts on its home device. Its parameter keys are ``<k>.<the member's
own key>`` whatever the grouping, so a run may resume on another device count.
"""
import os
from collections import namedtuple

import mxnet as mx
from mxnet import gluon, nd

from ..core.platform.memory import check_fits, size_text
from ..core.step.array_api import legacy, model_is_np, semantics, to_api
from ..core.step.graph import skipped_members_unused
from ..core.step.members import PlacedMembers
from .footprint import footprint, training_bytes

# The layouts by name (--ensemble-layout), with what they do (the --help text).
LAYOUTS = {
    "auto": "devices on several devices; on one CPU context separate when it has several engine workers, "
            "as `engine_threads` 0 gives a multi-core CPU, else sequential",
    "devices": "each device trains its own members",
    "fused": "one network of grouped convolutions, BatchNorm and batched Dense",
    "separate": "side by side on the first device, a graph each",
    "sequential": "on the first device, one member's epoch after another's",
}
MAX_RANDOM_STATES = 72  # see ensemble_variables


class MemberGroup(gluon.HybridBlock):
    """The members of one device as one block: input ``(B, Kg*C, ...)``, output
    ``(B, Kg, outputs)``. ``skip``: members (of this group) that no longer run, a sweep's
    pruned ones: zeros in their place, nothing computed for them."""

    def __init__(self, nets, channels, **kwargs):
        super().__init__(**kwargs)
        self.nets, self.channels, self.skip = list(nets), channels, frozenset()
        for j, net in enumerate(self.nets):
            self.register_child(net, str(j))

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        c, is_np = self.channels, mx.util.is_np_array()
        if len(self.nets) == 1:  # the input is the member's own: no slice, no copy
            return F.np.expand_dims(self.nets[0](x), axis=1) if is_np else F.expand_dims(self.nets[0](x), axis=1)
        return self.members_on(F, lambda j: x[:, j * c:(j + 1) * c] if is_np else
                               F.slice_axis(x, axis=1, begin=j * c, end=(j + 1) * c))

    def members_on(self, F, member_input):
        """``(B, Kg, outputs)``: member j run on ``member_input(j)``, zeros for the skipped."""
        is_np = mx.util.is_np_array()
        outs = {j: net(member_input(j)) for j, net in enumerate(self.nets) if j not in self.skip}
        zeros = F.np.zeros_like if is_np else F.zeros_like
        outs = [outs[j] if j in outs else zeros(next(iter(outs.values()))) for j in range(len(self.nets))]
        return F.np.stack(outs, axis=1) if is_np else F.stack(*outs, axis=1)

    def shared_input(self):
        """This group's members on one input they share, ``(B, C, ...)`` (the core's
        PlacedMembers.graph_of): a sweep's members that draw one data order take each
        batch gathered and normalized once, not once per member."""
        return SharedInput(self)

    def _build_cache(self, *args):
        with skipped_members_unused(self.skip):
            super()._build_cache(*args)


class SharedInput(gluon.HybridBlock):
    """A MemberGroup's members all on one input: ``(B, C, ...)`` to ``(B, Kg, outputs)``."""

    def __init__(self, group):
        super().__init__(prefix=group.prefix)
        self.group = group

    @property
    def skip(self):
        return self.group.skip

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.group.members_on(F, lambda j: x)


class MemberStack(PlacedMembers):
    """``nets[k]`` on ``devices[k]`` (initialized there already; members of one device
    contiguous), the core's PlacedMembers: DataParallel leaves the members where they are
    and feeds the stack on ``home``. ``layout`` (devices, separate, sequential) groups the
    members as the module docstring says; ``apart``: a key per member, and members whose
    keys differ never share a group (their step graphs differ: a sweep's label smoothing)."""

    def __init__(self, nets, devices, channels, hybridize=True, layout="devices", apart=None, **kwargs):
        super().__init__(**kwargs)
        self.members, self.channels, self.home = len(nets), channels, devices[0]
        self.in_turns, per_member = layout == "sequential", layout in ("separate", "sequential")
        self.groups = []  # (first member, device, group)
        apart = apart or [None] * len(nets)
        for k, (net, device) in enumerate(zip(nets, devices)):
            if not self.groups or self.groups[-1][1] != device or per_member or apart[k] != apart[k - 1]:
                self.groups.append((k, device, []))
            self.groups[-1][2].append(net)
        with semantics(model_is_np(nets[0])):
            self.groups = [(first, device, MemberGroup(nets, channels)) for first, device, nets in self.groups]
        for i, (_, _, group) in enumerate(self.groups):
            self.register_child(group, f"group{i}")
            if hybridize:
                group.hybridize(static_alloc=True, static_shape=True)

    def stop(self, members):
        """Stopped members are left out of their group's graph (rebuilt at its next call):
        the rest of a device's members no longer wait on them."""
        super().stop(members)
        for first, _, group in self.groups:
            skip = frozenset(j for j in range(len(group.nets)) if first + j in self.stopped)
            if skip != group.skip and len(skip) < len(group.nets):  # (a group of only stopped members never runs)
                group.skip = skip
                group._clear_cached_op()  # pylint: disable=protected-access

    def _collect_params_with_prefix(self, prefix=""):
        """Keys by member, not by group: ``<k>.<key>``."""
        prefix = prefix + "." if prefix else ""
        found = {}
        for k, net in enumerate(self.nets):
            found.update(net._collect_params_with_prefix(prefix + str(k)))  # pylint: disable=protected-access
        return found

    def forward(self, x):  # pylint: disable=arguments-differ
        is_np, member_np = mx.util.is_np_array(), model_is_np(self.nets[0])
        x, c = legacy(x), self.channels
        outs = []
        for first, device, group in self.groups:
            part = x if len(self.groups) == 1 else nd.slice_axis(x, axis=1, begin=first * c,
                                                                  end=(first + len(group.nets)) * c)
            with semantics(member_np):
                out = group(to_api(part.as_in_context(device), member_np))
            outs.append(legacy(out).as_in_context(self.home))
        with mx.util.np_array(False):
            return to_api(outs[0] if len(outs) == 1 else nd.concat(*outs, dim=1), is_np)


def member_devices(members, devices, layout):
    """The device of each member: contiguous runs over ``devices`` (``devices``; the
    first K mod D devices one member more) or all on the first (the other layouts)."""
    if layout != "devices":
        return [devices[0]] * members
    d = len(devices)
    counts = [members // d + (i < members % d) for i in range(d)]
    return [device for device, count in zip(devices, counts) for _ in range(count)]


def check_memory(make_net, members, devices, layout, input_shape, batch_size, name="your network"):
    """Refuse, before anything is allocated, an ensemble that cannot fit: the members
    each device holds (CPU contexts share the host's memory) x one member's training
    state at ``batch_size`` (models.footprint), against the free memory."""
    params, activations = footprint(make_net, input_shape, name)
    per_member = training_bytes(params, activations, 1, batch_size)
    if devices[0].device_type == "cpu" or layout in ("separate", "sequential"):
        loads = {devices[0]: members}
    else:  # fused: every device holds every member; devices: its run of members
        placed = member_devices(members, devices, "devices")
        loads = {d: members if layout == "fused" else placed.count(d) for d in devices}
    check_fits({device: count * per_member for device, count in loads.items()},
               f"{members} members ({size_text(per_member)} each: parameters, optimizer state, activations of a "
               f"batch of {batch_size})", "train fewer members at once (`ensemble`, or a `sweep` of fewer configurations), "
               "or a smaller `batch_size`")


PipelineLayout = namedtuple("PipelineLayout", "train_ctx member_groups eval_ctx in_turns")


def pipeline_layout(net, ctx):
    """Where a DevicePipeline feeds ``net`` on ``ctx`` from: a PipelineLayout of the
    training devices, the member groups, the evaluation devices and whether the groups
    train in turns. A MemberStack trains each group on its members' columns of whole
    batches and evaluates on its home device; any other network takes a slice of the
    samples on every device."""
    if not isinstance(net, PlacedMembers):
        return PipelineLayout(ctx, None, ctx, False)
    return PipelineLayout([device for _, device, _ in net.groups],
                          [(first, len(group.nets)) for first, _, group in net.groups], [net.home], net.in_turns)


def ensemble_variables(members, model="lenet", fused_conv="auto"):
    """The variables an ensemble wants set before MXNet starts: MXNet hands every
    operator from an extension library (LeNet's fused conv operator) a random-number
    state from one pool shared by all CPU contexts, round-robin, and two operators
    holding the same state run one after the other, whatever their device: with the
    default 8 states, the two devices of cpu*2 took turns (README "Seed-parallel
    ensembles"). Each member's graphs hold about four such operators; a state costs
    ~5 MiB, so the pool grows with K up to 72 states (K=16). {} for other models, and
    when the variable already allows it."""
    if members < 2 or model not in ("lenet", "auto") or fused_conv == "off":
        return {}
    wanted = min(4 * members + 8, MAX_RANDOM_STATES)
    try:
        current = int(os.environ.get("MXNET_CPU_PARALLEL_RAND_COPY", "1"))
    except ValueError:
        current = 1
    return {"MXNET_CPU_PARALLEL_RAND_COPY": str(wanted)} if current < wanted else {}
