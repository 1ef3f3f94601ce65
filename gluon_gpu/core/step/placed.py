"""The placed-members step: an ensemble whose members sit on their own devices
(members.PlacedMembers). Each group of members trains on its members' columns of whole
batches in a graph of its own, no gradient crosses groups, and each member is updated
by its own optimizer; members may take turns (groups stepping one at a time), stop (a
sweep's pruned ones) or be spread over a job's workers (spread_members.py)."""
from mxnet import autograd

from .array_api import semantics
from .base import Step
from .graph import GraphBlock
from .precision import loss_scale, scaled_losses


class PlacedStep(Step):
    """The members of ``net``, a PlacedMembers, where it placed them (the arguments:
    base.Step; ``ctx``: the devices they were placed among, or None)."""

    def __init__(self, net, ctx=None, *args, **kwargs):
        if ctx is not None and not set(net.devices) <= set(ctx):
            raise ValueError(f"ctx={list(ctx)}, but the members are placed on {net.devices}: pass the devices "
                             "they were placed among, or None")
        self.owner = net
        self._pending_groups = None
        super().__init__(net, net.devices, *args, **kwargs)

    def _place(self, initializer):
        """The members are where the network put them."""

    def _can_bucket(self, bucket_bytes):
        return False

    def _trainer_exchanges(self, exchange):
        return False

    def _split(self, data, label, training):
        if isinstance(data, (list, tuple)):
            return list(data), list(label)
        return self.owner.split(data, label, training)

    def step(self, data, label, augmentation=None, mixing=None, return_loss=True, flush=False):
        self.gradients.check()
        xs, ys = self.split(data, label)
        extras, mixed = self.inputs.shards(xs, self.ctx, augmentation, mixing)
        active = [g for g, x in enumerate(xs) if x is not None and self.owner.members_of([g])]
        if not active:  # groups in turns, or all stopped: none steps
            return self._update() if flush and self.pending_batches else None
        if self.pending_batches and active != self._pending_groups:
            self._update()  # groups in turns: the last turn's short accumulation ends with it
        self._pending_groups = active
        batch_size = xs[active[0]].shape[0]  # every group takes the whole batch
        with semantics(self.is_np):
            with autograd.record():
                outs = {g: self._run(xs[g], ys[g], True, g, extras[g], mixed) for g in active}
                with scaled_losses(self.trainer, [loss_sum for loss_sum, _ in outs.values()]) as losses:
                    autograd.backward(losses)  # one call for every group
            self.pending_batches += 1
            self._pending_samples += batch_size
            if self.pending_batches >= self.accumulate or flush:
                self._update()
        members = self.owner.members_of(active)
        self._sums.add([outs[g][1] if g in outs else None for g in range(len(xs))], batch_size, members)
        return self._mean_loss(outs.values(), batch_size, len(members)) if return_loss else None

    def _update(self):
        """Clip and update the pending groups' members, each by its own optimizer, and
        (accumulating) zero the sums. Nothing is exchanged: a member lives on one device."""
        scale = self._take_pending()
        members = self.owner.members_of(self._pending_groups)
        if self.clip_grad:  # the gradients carry the scale of the batch and of the loss
            self.gradients.clip(self.clip_grad * scale * loss_scale(self.trainer), members)
        self.trainer.update_members(scale, members)
        if self.accumulate > 1:
            self.gradients.zero(self.ctx)

    def _summed_samples(self):
        return self._sums.seen

    def _graph_version(self):
        return self.owner.stopped  # a member stopped: its group's graphs are rebuilt without it

    def _graph_block(self, group, shape):
        if group is None:  # evaluation: the whole ensemble on its home device
            return GraphBlock(self.net, self.head, self.members)
        part = self.owner.graph_of(group, shape)
        head = self.heads[part.slots[0]] if self.heads else self.head  # a group's members share one
        return GraphBlock(part.block, head, part.members, part.slots, part.shared, part.skipping)
