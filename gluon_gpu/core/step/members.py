"""Networks that place their own members: the interface DataParallel calls for an
ensemble laid out over devices (the models layer implements it:
models/member_stack.MemberStack), and the Trainer of such members, with one optimizer
for all or one per member (a sweep: members that differ in their hyperparameters)."""
from typing import NamedTuple, Optional

import mxnet as mx
from mxnet import gluon

from .array_api import legacy
from .member_optimizer import MemberOptimizer


class MemberAxis:
    """A network whose output holds ``members`` (K) members on axis 1, ``(B, K, outputs)``:
    an ensemble stacked in one block (models/fused_lenet.py, models/fused_members.py)."""

    members = 1


class GroupGraph(NamedTuple):
    """What a group of placed members runs in its step graph (PlacedMembers.graph_of)."""
    block: gluon.Block
    members: int
    slots: tuple  # (first member, all members): where its figures land
    shared: bool  # its members share one input column
    skipping: Optional[frozenset] = None  # its members left out (stopped)


class PlacedMembers(gluon.Block):
    """K independent members in groups, each group a block on one device.

    A subclass sets ``members`` (K), ``home`` (the device it evaluates on) and ``groups``:
    ``[(first member, device, group)]``, where ``group.nets`` are its members in order and
    the group maps ``(B, Kg*C, ...)`` to ``(B, Kg, outputs)`` and its ``shared_input()``
    maps ``(B, C, ...)``, one input for all its members, to the same; ``group.skip``: its
    members left out of its graph (stopped ones). DataParallel leaves
    the members where they are: each group trains on its members' columns of whole
    batches (or the one column they share), in a graph of its own, and no gradient
    crosses groups."""

    @property
    def nets(self):
        """The members, in order."""
        return [net for _, _, group in self.groups for net in group.nets]

    @property
    def devices(self):
        """Each group's device (a device may hold several groups)."""
        return [device for _, device, _ in self.groups]

    def split(self, data, label, training=True):
        """In training each group's members' columns (axis 1) of the whole batch, or a
        batch of one column, which every member shares, whole; in evaluation the whole
        batch on the home device."""
        if not training:
            return [data.as_in_context(self.home)], [label.as_in_context(self.home)]
        shared = data.shape[1] == 1
        return tuple([(a if shared else a[:, first:first + len(group.nets)]).as_in_context(device)
                      for first, device, group in self.groups] for a in (data, label))

    stopped = frozenset()  # members that take no more steps (stop)
    owners, rank = None, 0  # members spread over a job's workers: each member's rank, and this one's

    def stop(self, members):
        """``members`` take no more steps (a sweep's pruned members): their parameters
        stay as they are, and a group of only such members no longer runs."""
        self.stopped = frozenset(self.stopped) | set(members)

    def mine(self, k):
        """Whether this process trains member ``k`` (core/step/spread_members.py)."""
        return self.owners is None or self.owners[k] == self.rank

    def members_of(self, groups):
        """The members that ``groups`` (indices into ``groups``) train here, less the stopped ones."""
        return [first + j for first, _, group in (self.groups[g] for g in groups) for j in range(len(group.nets))
                if first + j not in self.stopped and self.mine(first + j)]

    def graph_of(self, g, shape):
        """The GroupGraph of group ``g`` for batches of ``shape``: its figures land in
        its members' slots among all K. A batch of one
        column, ``(n, 1, ...)``, is one its members share (``shared``): the block is then
        the group's ``shared_input()``, every member on the same ``(n, C, ...)``."""
        first, _, group = self.groups[g]
        shared = len(group.nets) > 1 and shape[1] == 1
        return GroupGraph(group.shared_input() if shared else group, len(group.nets), (first, self.members), shared,
                          group.skip)

    def clip(self, members, max_norm):
        """Clip each of ``members`` by its own gradient norm, as it would be clipped alone."""
        for member in (self.nets[k] for k in members):
            grads = [legacy(p.list_grad()[0]) for p in member.collect_params().values() if p.grad_req != "null"]
            gluon.utils.clip_global_norm(grads, max_norm, check_isfinite=False)


class MemberTrainer(gluon.Trainer):
    """The Trainer of members (``nets``) that live on different devices, each member's
    parameters on one. ``gluon.Trainer`` asserts that all parameters share one device
    list, which only its kvstore needs; with none, its one updater updates every
    parameter where it lives, which is what independent members want.

    ``update_members`` updates the members that stepped: members in turns step one at a
    time. The learning-rate schedule reads the optimizer's ``num_update``, the most
    updates of any parameter so far; here it is the count of the members being updated,
    so each member follows its own schedule as it would alone.

    ``optimizer_params``: one dict for every member, or a list of one per member (each
    member then has an optimizer of its own, under one :class:`MemberOptimizer`)."""

    def __init__(self, nets, optimizer, optimizer_params=None, **kwargs):
        params = {p.name: p for net in nets for p in net.collect_params().values()}
        per_member = isinstance(optimizer_params, (list, tuple))
        if per_member:
            optimizer = MemberOptimizer([mx.optimizer.create(optimizer, **p) for p in optimizer_params])
        super().__init__(params, optimizer, None if per_member else optimizer_params, **kwargs)
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._member_params = [[self._index[id(p)] for p in net.collect_params().values() if p.grad_req != "null"]
                               for net in nets]
        if per_member:
            self._optimizer.owners = {i: k for k, indices in enumerate(self._member_params) for i in indices}
        self._nets = list(nets)
        self._devices = [self._params[i[0]].list_ctx()[0] if i else None for i in self._member_params]
        self._stepping = range(len(nets))

    def member_arrays(self, member):
        """Member ``member``'s parameters (all: BatchNorm's statistics too) and optimizer
        states, in a fixed order; states its optimizer has not made yet are made now
        (zeros, as it would make them)."""
        updater, arrays = self._updaters[0], []
        for param in self._nets[member].collect_params().values():
            arrays.append(param.list_data()[0])
            i = self._index[id(param)]
            if i in self._member_params[member]:
                if i not in updater.states:
                    updater.states[i] = self._optimizer.create_state_multi_precision(i, arrays[-1])
                    updater.states_synced[i] = True
                arrays += _flat_state(updater.states[i])
        return arrays

    def member_counts(self, member):
        """The update count of each of member ``member``'s trained parameters."""
        counts = self._optimizer._index_update_count  # pylint: disable=protected-access
        return [counts.get(i, 0) for i in self._member_params[member]]

    def set_member_counts(self, member, values):
        counts = self._optimizer._index_update_count  # pylint: disable=protected-access
        counts.update({i: v for i, v in zip(self._member_params[member], values) if v})

    def _check_contexts(self):
        return self._params[0].list_ctx()[:1] if self._params else []

    def update_members(self, batch_size, members):
        optimizer = self._optimizer
        counts = optimizer._index_update_count  # pylint: disable=protected-access
        optimizer.num_update = max(counts.get(i, optimizer.begin_num_update)
                                   for k in members for i in self._member_params[k])
        self._stepping = members
        self.update(batch_size)

    def _update(self, ignore_stale_grad=False):
        """The stepping members' parameters, one updater call per device: the optimizer
        aggregates several parameters into one operator, which must not span two
        devices (it would make each wait for the other), and no parameter's
        fresh-gradient flag is asked (a call into MXNet each, per step)."""
        loss_scaler = getattr(self, "_amp_loss_scaler", None)
        if loss_scaler is not None and loss_scaler.has_overflow(self._params):
            return  # AMP: skip the step on overflow
        by_device = {}
        for k in self._stepping:
            by_device.setdefault(self._devices[k], []).extend(self._member_params[k])
        for indices in by_device.values():
            params = [self._params[i] for i in indices]
            self._updaters[0](indices, [p.list_grad()[0] for p in params], [p.list_data()[0] for p in params])

    def _init_kvstore(self):
        self._kvstore, self._update_on_kvstore, self._distributed = None, False, False
        self._kv_initialized = True


def _flat_state(state):
    if state is None:
        return []
    if isinstance(state, (list, tuple)):
        return [a for s in state for a in _flat_state(s)]
    return [state]


def member_count(net):
    """K of an ensemble (stacked in one block or placed), else 1."""
    return net.members if isinstance(net, (MemberAxis, PlacedMembers)) else 1


def trainer_for(net, optimizer, params, kvstore, update_on_kvstore):
    """The Trainer of ``net``: a MemberTrainer for placed members, else Gluon's own."""
    if isinstance(net, PlacedMembers):
        return MemberTrainer(net.nets, optimizer, params, kvstore=kvstore, update_on_kvstore=update_on_kvstore)
    return gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kvstore, update_on_kvstore=update_on_kvstore)
