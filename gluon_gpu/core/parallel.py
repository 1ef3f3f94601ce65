"""The data-parallel step: one network replicated on a device list, usable from any loop.

    dp = DataParallel(net, ctx, "sgd", {"learning_rate": 0.1})
    for data, label in loader:
        dp.step(data, label)             # split, forward+backward on every device, update
    print(dp.read_metrics())            # the only host sync: mean loss and metrics

Each batch is cut over the devices, every device runs forward and backward at once through MXNet's async
engine, and ``gluon.Trainer`` updates every replica from the summed gradients (gradients.py). The task head
(heads.py) and input transform are passed in; the network may use either MXNet API (modes.py) or place its
own members (members.py); a distributed job's workers agree through coordination.py.
"""
import mxnet as mx
from mxnet import autograd, gluon, nd

from .buckets import DEFAULT_BUCKET_BYTES, bucketable
from .coordination import Workers
from .devices import check_cpu_only, split_batch
from .gradients import Gradients
from .graph import make_step_graph
from .heads import as_heads
from .inputs import TrainingInputs
from .kvstores import check_exchange, default_kvstore
from .members import PlacedMembers, trainer_for
from .metrics import DeviceSums, report
from .modes import legacy, model_is_np, semantics, to_api
from .params import place
from .precision import check_precision, enable_amp, init_loss_scaling, loss_scale, precision_for, scaled_losses


class DataParallel:  # pylint: disable=too-many-instance-attributes
    """A network, its ``gluon.Trainer`` and the device list it is replicated on.

    ``head``: a Head or 'classify'/'regress' (default: classification; placed members: a list, one each).
    ``optimizer_params``: a dict (placed members: or a list, one each). ``transform``: a HybridBlock run on
    each input shard in the step graph (normalization). ``batch_size``: the nominal batch; gradients are
    divided by the larger of it and the batch's own size, as ``trainer.step(batch_size)`` does.
    ``bucket_bytes``: gradient buckets on several devices of one process (0: one kvstore key per parameter).
    ``exchange=False``: no gradient exchange (the benchmark's baseline). ``accumulate=N``: N steps' gradients
    summed before one update. ``clip_grad``: the mean gradient's global norm clipped after the exchange.
    ``dtype``/``amp``/``loss_scaling``: precision.py. ``augment``, ``mixing``: training inputs (inputs.py).
    """

    def __init__(self, net, ctx, optimizer="sgd", optimizer_params=None, kvstore=None, head=None,
                 transform=None, hybridize=True, dtype="float32", initializer=None, batch_size=None,
                 bucket_bytes=DEFAULT_BUCKET_BYTES, exchange=True, accumulate=1, clip_grad=None, amp=False,
                 loss_scaling=None, augment=None, mixing=None):
        self.placed = net if isinstance(net, PlacedMembers) else None  # members on their own devices
        self.ctx = net.devices if self.placed else list(ctx)
        self.batch_size, self.accumulate, self.clip_grad = batch_size, accumulate, clip_grad
        self.pending_batches, self._pending_samples, self._pending_groups = 0, 0, None
        store = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        kvstore = store.type if store else (kvstore or default_kvstore(self.ctx))
        self.precision = precision_for(dtype, amp, loss_scaling)
        check_precision(self.precision, self.ctx)
        check_cpu_only(net, self.ctx)
        self.net, self.transform, self.hybridize = net, transform, hybridize
        self.head, self.heads = as_heads(head)  # placed members may have one each
        self.members, self.is_np = getattr(net, "members", 1), model_is_np(net)
        self.inputs = TrainingInputs(augment, mixing, self.members > 1, self.placed is not None)
        enable_amp(self.precision, self.is_np)  # before any graph is built
        with semantics(self.is_np):
            if not self.placed:
                place(net, self.ctx, initializer or mx.init.Xavier())
            if self.precision.param_dtype != "float32":
                net.cast(self.precision.param_dtype)
        for block in ([transform] if transform else []) + self.inputs.blocks:  # their constants on the devices
            place(block, self.ctx, mx.init.Uniform())  # (normalization, pixel grids): keep their own values
        params = self.precision.optimizer_params(optimizer_params)
        if accumulate > 1:  # backward adds to the gradients until the update
            for p in (p for p in net.collect_params().values() if p.grad_req != "null"):
                p.grad_req = "add"
        check_exchange(self.ctx, kvstore, self.placed is not None, clip_grad, exchange)
        distributed = kvstore.startswith("dist")
        self.workers = Workers((store or mx.kv.create(kvstore)) if distributed else None)
        self.distributed, self.rank, self.num_workers = distributed, self.workers.rank, self.workers.count
        # Every device updates its own replica from the summed gradients (dist_async can
        # only update on the servers); with buckets the Trainer has no kvstore of its own.
        self.bucketing = (exchange and not distributed and not self.placed and len(self.ctx) > 1
                          and bucket_bytes > 0 and bucketable(net.collect_params().values()))
        exchanging = exchange and not self.bucketing and not self.placed
        self.trainer = trainer_for(net, optimizer, params, (self.workers.store or kvstore) if exchanging else None,
                                   update_on_kvstore=None if kvstore == "dist_async" else False)
        init_loss_scaling(self.precision, self.trainer)  # AMP needs update_on_kvstore=False, as here
        self.gradients = Gradients(net, self.ctx, self.trainer, kvstore, self.bucketing, bucket_bytes, self.is_np,
                                   self.placed)
        self.names = self.head.names
        self.sums = DeviceSums(self.ctx, (1 + len(self.names)) * self.members, self.members)
        self.spread = self.workers.start(self.trainer, self.is_np, self.sums.width, len(self.ctx),
                                         self.placed) if distributed else None  # members spread over workers
        self._graphs = {}

    def split(self, data, label, training=True):
        """Per-device shards of a batch; already-split lists pass through unchanged."""
        if isinstance(data, (list, tuple)):
            return list(data), list(label)
        if self.placed:
            return self.placed.split(data, label, training)
        return split_batch(data, self.ctx), split_batch(label, self.ctx)

    def step(self, data, label, augmentation=None, mixing=None, return_loss=True, flush=False):
        """Forward, backward and, every ``accumulate`` batches (or now, with ``flush``: an epoch's end), one
        update; the batch's mean loss as a lazy NDArray on the first device (reading it syncs), or None with
        ``return_loss=False``. ``augmentation``, ``mixing``: their parameters (inputs.py)."""
        self.gradients.check()
        xs, ys = self.split(data, label)
        extras, mixed = self.inputs.shards(xs, self.ctx, augmentation, mixing)
        active = [g for g, x in enumerate(xs) if x is not None and (not self.placed or self.placed.members_of([g]))]
        if not active:  # placed members in turns, or stopped: the groups stepping
            return self._update() if flush and self.pending_batches else None
        if self.placed and self.pending_batches and active != self._pending_groups:
            self._update()  # groups in turns: the last turn's short accumulation ends with it
        self._pending_groups = active
        batch_size = xs[active[0]].shape[0] if self.placed else sum(x.shape[0] for x in xs)
        with semantics(self.is_np):
            with autograd.record():
                outs = {g: self._run(xs[g], ys[g], True, g if self.placed else None, extras[g], mixed) for g in active}
                with scaled_losses(self.trainer, [loss_sum for loss_sum, _ in outs.values()]) as losses:
                    autograd.backward(losses)  # one call for every device
            if len(xs) < len(self.ctx):
                self.gradients.idle(self.ctx[len(xs):], self.accumulate > 1)
            self.pending_batches += 1
            self._pending_samples += batch_size
            if self.pending_batches >= self.accumulate or flush:
                self._update()
        members = self.placed.members_of(active) if self.placed else list(range(self.members))
        self.sums.add([outs[g][1] if g in outs else None for g in range(len(xs))], batch_size, members)
        if not return_loss:
            return None
        total = nd.add_n(*[nd.sum(l).as_in_context(self.ctx[0]) for l, _ in outs.values()])  # groups may differ
        return total / (batch_size * len(members))

    def _update(self):
        """Exchange, clip, update every replica, and (accumulating) zero the sums.
        Gradients are divided by the larger of the nominal samples (batch x batches
        summed) and the real ones; synchronous workers receive the sum over all workers."""
        scale = max(self._pending_samples, (self.batch_size or 0) * self.accumulate)
        scale *= self.num_workers if self.workers.sync and not self.placed else 1
        self.pending_batches, self._pending_samples = 0, 0
        if self.trainer._update_on_kvstore:  # pylint: disable=protected-access
            self.trainer.step(scale)  # dist_async: the servers update
            return
        if self.gradients.exchange():
            self._graphs.clear()  # made the buckets: graphs that ran before bound the old gradients
        members = self.placed.members_of(self._pending_groups) if self.placed else None
        if self.clip_grad:  # the gradients carry the scale of the batch and of the loss
            self.gradients.clip(self.clip_grad * scale * loss_scale(self.trainer), members)
        self.trainer.update_members(scale, members) if self.placed else self.trainer.update(scale)
        if self.accumulate > 1:
            self.gradients.zero(self.ctx)

    @property
    def buckets(self):
        """The gradient buckets, once the first step made them (else None)."""
        return self.gradients.buckets

    def _run(self, x, y, training, group=None, extras=(), mixed=False):  # legacy outputs whatever the model's API
        out = self._graph(x.shape, training, group, mixed)(*[to_api(a, self.is_np) for a in (x, y) + extras])
        return tuple(legacy(o) for o in out) if training else legacy(out)

    def read_metrics(self, reset=True):
        """``{'loss', <metric>..., 'samples'}`` means since the last reset, over all workers:
        the one host sync. Ensembles: means over members, and ``member_<name>`` lists."""
        vector, samples = self.sums.total(), self.sums.seen
        if self.workers.sync:
            vector, samples = self.workers.sum_metrics(vector, samples if self.placed else self.sums.samples)
        if reset:
            self.sums.reset()
        return report(vector, samples, self.names, self.members)

    def evaluate(self, batches):
        """``{'loss', <metric>..., 'samples'}`` over an iterable of batches. An ensemble
        reports its combined output (the head's ``combine``) and ``member_<name>`` lists."""
        width = self.sums.width + (1 + len(self.names)) * (self.members > 1)
        totals, samples = [nd.zeros((width,), ctx=c) for c in self.ctx], 0
        with semantics(self.is_np):
            for data, label in batches:
                xs, ys = self.split(data, label, training=False)
                for i, (x, y) in enumerate(zip(xs, ys)):
                    totals[i] += self._run(x, y, training=False)
                samples += sum(x.shape[0] for x in xs)
        vector = sum(t.asnumpy() for t in totals)
        result = report(vector[:self.sums.width], samples, self.names, self.members)
        if self.members > 1:
            result.update(report(vector[self.sums.width:], samples, self.names, 1))
        return result

    def _graph(self, shape, training, group=None, mixed=False):
        """A hybridized graph per (input shape, mode, placed group, mixed): a partial batch gets its own."""
        key = (tuple(shape), training, group, mixed, self.placed and self.placed.stopped)  # stopped: rebuilt
        if key not in self._graphs:
            net, members, slots, shared = self.placed.graph_of(group, shape) if group is not None else \
                (self.net, self.members, None, False)
            head = self.heads[slots[0]] if self.heads and slots else self.head  # a group's members share one
            graph = make_step_graph(net, head, self.transform, self.precision, members, self.is_np, training,
                                    slots, self.inputs.augment, self.inputs.mixing if mixed else None, shared)
            if self.hybridize and isinstance(net, gluon.HybridBlock):
                graph.hybridize(static_alloc=True, static_shape=True)
            self._graphs[key] = graph
        return self._graphs[key]
