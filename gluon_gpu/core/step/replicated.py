"""The replicated step: one network on every device, each batch cut over them.

Every device runs forward and backward at once through MXNet's async engine, and
``gluon.Trainer`` updates every replica from the gradients summed over the devices
(gradients.py: buckets or the Trainer's kvstore) and, in a job, over its workers."""
from mxnet import autograd

from ..platform.devices import split_batch
from .array_api import semantics
from .base import Step
from .buckets import bucketable
from .graph import GraphBlock
from .params import place
from .precision import loss_scale, scaled_losses


class ReplicatedStep(Step):
    """A network replicated on ``ctx`` (the arguments: base.Step)."""

    def _place(self, initializer):
        place(self.net, self.ctx, initializer)

    def _can_bucket(self, bucket_bytes):
        return len(self.ctx) > 1 and bucket_bytes > 0 and bucketable(self.net.collect_params().values())

    def _trainer_exchanges(self, exchange):
        return exchange and not self.bucketing

    def _split(self, data, label, training):
        if isinstance(data, (list, tuple)):
            return list(data), list(label)
        return split_batch(data, self.ctx), split_batch(label, self.ctx)

    def step(self, data, label, augmentation=None, mixing=None, return_loss=True, flush=False):
        self.gradients.check()
        xs, ys = self.split(data, label)
        extras, mixed = self.inputs.shards(xs, self.ctx, augmentation, mixing)
        active = [d for d, x in enumerate(xs) if x is not None]
        if not active:  # a stopped run's empty batch
            return self._update() if flush and self.pending_batches else None
        batch_size = sum(x.shape[0] for x in xs)
        with semantics(self.is_np):
            with autograd.record():
                outs = {d: self._run(xs[d], ys[d], True, None, extras[d], mixed) for d in active}
                with scaled_losses(self.trainer, [loss_sum for loss_sum, _ in outs.values()]) as losses:
                    autograd.backward(losses)  # one call for every device
            if len(xs) < len(self.ctx):  # a batch smaller than the devices: the others sat it out
                self.gradients.idle(self.ctx[len(xs):], self.accumulate > 1)
            self.pending_batches += 1
            self._pending_samples += batch_size
            if self.pending_batches >= self.accumulate or flush:
                self._update()
        self._sums.add([outs[d][1] if d in outs else None for d in range(len(xs))], batch_size,
                      list(range(self.members)))
        return self._mean_loss(outs.values(), batch_size, self.members) if return_loss else None

    def _update(self):
        """Exchange, clip, update every replica and (accumulating) zero the sums.
        Synchronous workers receive the sum over all workers: divided by all samples."""
        scale = self._take_pending() * (self.num_workers if self._workers.sync else 1)
        if self.trainer._update_on_kvstore:  # pylint: disable=protected-access
            self.trainer.step(scale)  # dist_async: the servers update
            return
        if self.gradients.exchange():
            self._graphs.clear()  # made the buckets: graphs that ran before bound the old gradients
        if self.clip_grad:  # the gradients carry the scale of the batch and of the loss
            self.gradients.clip(self.clip_grad * scale * loss_scale(self.trainer))
        self.trainer.update(scale)
        if self.accumulate > 1:
            self.gradients.zero(self.ctx)

    def _summed_samples(self):
        return self._sums.samples

    def _graph_block(self, group, shape):
        return GraphBlock(self.net, self.head, self.members)
