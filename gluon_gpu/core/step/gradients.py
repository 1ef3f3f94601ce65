"""A replicated network's gradients between backward and the update: summed over the
devices (gradient buckets, buckets.py, or the Trainer's own kvstore exchange), clipped,
and zeroed where a device sat a step out or an accumulation ends."""
import mxnet as mx
from mxnet import gluon

from .array_api import legacy
from .buckets import Buckets


class Gradients:
    """The trained parameters of ``net`` on ``ctx`` and their exchange: ``bucketing``
    (through a ``kvstore`` of that name, buckets of up to ``bucket_bytes``) or the
    ``trainer``'s. ``placed``: the network places its own members (members.py), each
    parameter on its member's one device."""

    def __init__(self, net, ctx, trainer, kvstore, bucketing, bucket_bytes, is_np, placed):
        self.net, self.ctx, self.trainer, self.placed = net, list(ctx), trainer, placed
        self.bucketing, self._bucket_config, self._is_np = bucketing, (kvstore, bucket_bytes), is_np
        self.buckets = None

    def trained(self):
        return [p for p in self.net.collect_params().values() if p.grad_req != "null"]

    def check(self):
        if self.buckets is not None:
            self.buckets.check()

    def exchange(self):
        """Sum every gradient over the devices; True when this made the buckets (at the
        first step, after its backward: shapes known, that step's gradients move in),
        since step graphs that ran before bound the old gradient arrays."""
        if not self.bucketing:
            self.trainer.allreduce_grads()
            return False
        made = self.buckets is None
        if made:
            kvstore, bucket_bytes = self._bucket_config
            self.buckets = Buckets(self.net.collect_params().values(), self.ctx, mx.kv.create(kvstore), bucket_bytes,
                                   self._is_np)
        self.buckets.allreduce()
        return made

    def clip(self, max_norm, members=None):
        """Global-norm clipping of the summed gradients, on every device alike (replicas
        hold the same sums: they stay identical); placed ``members`` each by its own
        norm, as it would be clipped alone. No host sync."""
        if self.placed is not None:
            self.placed.clip(members, max_norm)
            return
        for c in self.ctx:
            gluon.utils.clip_global_norm([legacy(p.grad(c)) for p in self.trained()], max_norm, check_isfinite=False)

    def zero(self, ctx):
        if self.buckets is not None:
            self.buckets.zero(ctx)
            return
        for param in self.trained():  # a placed member's parameter lives on its one device
            for grad in param.list_grad() if self.placed else [param.grad(c) for c in ctx]:
                grad[:] = 0

    def idle(self, idle_ctx, accumulating):
        """Devices that got no samples this step contribute zero, not stale, gradients
        (``accumulating``: their sums so far), taken as fresh by the Trainer."""
        if not accumulating:
            self.zero(idle_ctx)
        for param in self.trained():
            for c in idle_ctx:
                param.data(c)._fresh_grad = True  # pylint: disable=protected-access
