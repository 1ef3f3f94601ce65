"""What both step strategies share (replicated.py, placed.py): the setup of a network,
its ``gluon.Trainer``, gradients, metric sums and a job's workers; metrics; evaluation;
and the step graphs. parallel.py chooses the strategy."""
import mxnet as mx
from mxnet import gluon, nd

from ..platform.devices import check_cpu_only
from .arguments import batch_arrays, check_labels, check_network, check_per_sample
from .array_api import call, legacy, model_is_np, semantics, to_api
from .buckets import DEFAULT_BUCKET_BYTES
from .coordination import Workers
from .gradients import Gradients
from .graph import make_step_graph
from .heads import as_heads
from .kvstores import check_exchange, create_store, default_kvstore, is_distributed
from .members import member_count, trainer_for
from .metrics import DeviceSums, report
from .params import place
from .precision import check_precision, enable_amp, init_loss_scaling, own_bfloat16, precision_for
from .training_inputs import TrainingInputs
from .tta import tta_for


class Step:  # pylint: disable=too-many-instance-attributes
    """A network, its ``gluon.Trainer`` and the devices it trains on.

    The interface loops and programs use: ``step``, ``read_metrics``, ``evaluate``; the
    metric sums a checkpoint keeps (``metric_state``, ``load_metric_state``,
    ``metric_width``, ``first_nonfinite``); what a job's workers agree on
    (``agree_to_stop``, ``any_worker``, ``share_members``, ``agree_stopped_members``);
    ``share_running_statistics`` (before validation);
    and ``net``, ``ctx`` (its devices), ``trainer``, ``head`` and ``names`` (its
    metrics), ``precision``, ``is_np`` (the network's MXNet API), ``members`` (an
    ensemble's K), ``accumulate``, ``pending_batches`` (steps whose gradients wait for
    an update), ``rank``, ``num_workers`` and ``distributed`` (a job's), ``spread``
    (members spread over its workers, else None), ``owner`` (the PlacedMembers whose
    members stay where it put them, else None), ``buckets``/``bucketing``, ``inputs``
    and ``transform``.

    ``head``: a Head or 'classify'/'regress' (default: classification; placed members: a list, one each).
    ``optimizer_params``: a dict (placed members: or a list, one each). ``transform``: a HybridBlock run on
    each input shard in the step graph (normalization). ``batch_size``: the nominal batch; gradients are
    divided by the larger of it and the batch's own size, as ``trainer.step(batch_size)`` does.
    ``bucket_bytes``: gradient buckets on several devices of one process (0: one kvstore key per parameter).
    ``exchange=False``: no gradient exchange (the benchmark's baseline). ``accumulate=N``: N steps' gradients
    summed before one update. ``clip_grad``: the mean gradient's global norm clipped after the exchange.
    ``dtype``/``amp``/``loss_scaling``: precision.py. ``augment``, ``mixing``: training inputs (training_inputs.py).
    ``tta``: test-time augmentation of evaluation, ``'flip,shift=1'`` or a TestTimeAugmentation
    (core/step/tta.py; a classifier of images, one network).
    """

    owner = None  # placed.py: the network, a PlacedMembers

    def __init__(self, net, ctx, optimizer="sgd", optimizer_params=None, kvstore=None, head=None,
                 transform=None, hybridize=True, dtype="float32", initializer=None, batch_size=None,
                 bucket_bytes=DEFAULT_BUCKET_BYTES, exchange=True, accumulate=1, clip_grad=None, amp=False,
                 loss_scaling=None, augment=None, mixing=None, tta=None):
        check_network(net)
        self.ctx, self.net, self.transform, self.hybridize = list(ctx), net, transform, hybridize
        self._labels_checked = False
        self.batch_size, self.accumulate, self.clip_grad = batch_size, accumulate, clip_grad
        self.pending_batches, self._pending_samples = 0, 0
        self.precision = precision_for(dtype, amp, loss_scaling, own_bfloat16(net))
        check_precision(self.precision, self.ctx)
        check_cpu_only(net, self.ctx)
        self.head, self.heads = as_heads(head)  # placed members may have one each
        self.names, self.members, self.is_np = self.head.names, member_count(net), model_is_np(net)
        self.inputs = TrainingInputs(augment, mixing, self.members > 1, self.owner is not None)
        self.tta = tta_for(tta, self.head, self.members)
        self._prepare(initializer or mx.init.Xavier(), accumulate)
        store = kvstore if isinstance(kvstore, mx.kv.KVStoreBase) else None
        kvstore = store.type if store else (kvstore or default_kvstore(self.ctx))
        check_exchange(self.ctx, kvstore, self.owner is not None, clip_grad, exchange)
        self.distributed = is_distributed(kvstore)
        self._workers = Workers((store or create_store(kvstore)) if self.distributed else None)
        self.rank, self.num_workers = self._workers.rank, self._workers.count
        self.bucketing = exchange and not self.distributed and self._can_bucket(bucket_bytes)
        params = self.precision.optimizer_params(optimizer_params)
        # Every device updates its own replica from the summed gradients (dist_async can
        # only update on the servers); with buckets the Trainer has no kvstore of its own.
        through = (self._workers.store or kvstore) if self._trainer_exchanges(exchange) else None
        self.trainer = trainer_for(net, optimizer, params, through,
                                   update_on_kvstore=None if kvstore == "dist_async" else False)
        init_loss_scaling(self.precision, self.trainer)  # AMP needs update_on_kvstore=False, as here
        self.gradients = Gradients(net, self.ctx, self.trainer, kvstore, self.bucketing, bucket_bytes,
                                   self.is_np, self.owner)
        self._sums = DeviceSums(self.ctx, (1 + len(self.names)) * self.members, self.members)
        self.spread = self._workers.start(self.trainer, self.is_np, self._sums.width, len(self.ctx),
                                         self.owner) if self.distributed else None
        self._graphs = {}

    def _prepare(self, initializer, accumulate):
        """AMP on before any graph is built; the network on its devices in its dtype, and
        the transform's and inputs' constants (normalization, pixel grids) beside it."""
        enable_amp(self.precision, self.is_np)
        with semantics(self.is_np):
            self._place(initializer)
            if self.precision.param_dtype != "float32":
                self.net.cast(self.precision.param_dtype)
        for block in ([self.transform] if self.transform else []) + self.inputs.blocks:
            place(block, self.ctx, mx.init.Uniform())  # keep their own values
        if accumulate > 1:  # backward adds to the gradients until the update
            for p in (p for p in self.net.collect_params().values() if p.grad_req != "null"):
                p.grad_req = "add"

    def _place(self, initializer):
        """Put the network's parameters on the devices (a strategy's own layout)."""
        raise NotImplementedError

    def _can_bucket(self, bucket_bytes):
        """Whether one process's gradients go through buckets (a strategy's choice)."""
        raise NotImplementedError

    def _trainer_exchanges(self, exchange):
        """Whether the Trainer's own kvstore sums the gradients (a strategy's choice)."""
        raise NotImplementedError

    def step(self, data, label, augmentation=None, mixing=None, return_loss=True, flush=False):
        """Forward, backward and, every ``accumulate`` batches (or now, with ``flush``: an epoch's end), one
        update; the batch's mean loss as a lazy NDArray on the first device (reading it syncs), or None with
        ``return_loss=False``. ``augmentation``, ``mixing``: their parameters (training_inputs.py)."""
        raise NotImplementedError

    def split(self, data, label, training=True):
        """Per-device shards of a batch (MXNet or numpy arrays, checked: arguments.py);
        already-split lists pass through unchanged. The first batch's class labels are
        checked against the head's classes (one host read, once)."""
        data, label = batch_arrays(data, label)
        if self._workers.watch is not None:
            self._workers.watch.progress()
        if not self._labels_checked:
            if getattr(self.head, "classes", None):
                check_labels(label, self.head.classes)
            if self.head.task == "custom" and self.members == 1 and self.owner is None:
                self._probe_head(data, label)
            self._labels_checked = True
        return self._split(data, label, training)

    def _probe_head(self, data, label):
        """A custom head's loss and metrics on two samples of the first batch, eagerly:
        one value per sample each (a scalar would train silently, summed as one sample)."""
        x, y = (next(v for v in (part if isinstance(part, (list, tuple)) else [part]) if v is not None)
                for part in (data, label))
        x, y = legacy(x)[:2].as_in_context(self.ctx[0]), legacy(y)[:2].as_in_context(self.ctx[0])
        with mx.autograd.pause():
            x = self.transform(x) if self.transform is not None else x
            out = legacy(call(self.net, x.astype(self.precision.param_dtype))).astype("float32")
        check_per_sample(self.head, out, y.astype("float32"))

    def _split(self, data, label, training):
        """The strategy's shards of a checked batch."""
        raise NotImplementedError

    @property
    def buckets(self):
        """The gradient buckets, once the first step made them (else None)."""
        return self.gradients.buckets

    def _take_pending(self):
        """The divisor of the pending gradients, zeroing the count: the larger of the
        nominal samples (batch x batches summed) and the real ones."""
        scale = max(self._pending_samples, (self.batch_size or 0) * self.accumulate)
        self.pending_batches, self._pending_samples = 0, 0
        return scale

    def _mean_loss(self, outs, batch_size, members):
        """The batch's mean loss over ``members``, on the first device."""
        total = nd.add_n(*[nd.sum(l).as_in_context(self.ctx[0]) for l, _ in outs])  # groups may differ
        return total / (batch_size * members)

    def read_metrics(self, reset=True):
        """``{'loss', <metric>..., 'samples'}`` means since the last reset, over all workers:
        the one host sync. Ensembles: means over members, and ``member_<name>`` lists."""
        vector, samples = self._sums.total(), self._sums.seen
        if self._workers.sync:
            vector, samples = self._workers.sum_metrics(vector, self._summed_samples())
        if reset:
            self._sums.reset()
        return report(vector, samples, self.names, self.members)

    @property
    def metric_width(self):
        """The length of a device's metric sums (a checkpoint's, to upgrade older ones to)."""
        return self._sums.width

    def metric_state(self):
        """The metric sums since the last read, over a synchronous job's workers: what a
        checkpoint of a partial epoch keeps."""
        return self._workers.sum_metric_state(self._sums.state())

    def load_metric_state(self, state):
        self._sums.load_state(state)

    def first_nonfinite(self):
        """The 1-based step since the last read whose loss was NaN/inf, or None."""
        return self._sums.first_nonfinite()

    def agree_to_stop(self, signum, sync_point):
        """The stop signal any worker was asked for, once all agree (coordination.py)."""
        return self._workers.agree_to_stop(signum, sync_point)

    def any_worker(self, flag):
        """Whether ``flag`` is true on any worker of the job (this process alone: itself)."""
        return self._workers.any(flag)

    def share_members(self):
        """Members spread over the workers: each from the worker that trains it, to all."""
        if self.spread:
            self.spread.share()

    def agree_stopped_members(self):
        """Members spread over the workers: the ones any worker stopped, stopped on all."""
        if self.spread:
            self.spread.agree_stopped()

    def _summed_samples(self):
        """What a synchronous job sums with the metrics: samples seen (a strategy's count)."""
        raise NotImplementedError

    def share_running_statistics(self):
        """Copy the first device's running statistics (BatchNorm's, and any other
        parameter without a gradient) to the others. Each device updates its own from
        its own samples, a checkpoint keeps the first one's, and a resumed run starts
        every device from those: validation after this sees what is saved, resumed or not."""
        for param in self.net.collect_params().values():
            if param.grad_req == "null" and len(param.list_ctx()) > 1:
                first, *others = param.list_data()
                for other in others:
                    first.copyto(other)

    def evaluate(self, batches):
        """``{'loss', <metric>..., 'samples'}`` over an iterable of batches. An ensemble
        reports its combined output (the head's ``combine``) and ``member_<name>`` lists;
        a classifier that knows its class count, ``predicted_classes``: how many classes
        its (combined) output predicted at least once."""
        tally_at = self._sums.width + (1 + len(self.names)) * (self.members > 1)  # the ensemble's figures before
        width = tally_at + self.head.tallied
        totals, samples = [nd.zeros((width,), ctx=c) for c in self.ctx], 0
        with semantics(self.is_np):
            for data, label in batches:
                xs, ys = self.split(data, label, training=False)
                for i, (x, y) in enumerate(zip(xs, ys)):
                    totals[i] += self._run(x, y, training=False)
                samples += sum(x.shape[0] for x in xs)
        vector = sum(t.asnumpy() for t in totals)
        result = report(vector[:self._sums.width], samples, self.names, self.members)
        if self.members > 1:
            result.update(report(vector[self._sums.width:tally_at], samples, self.names, 1))
        result.update(self.head.tally_figures(vector[tally_at:]))
        return result

    def _run(self, x, y, training, group=None, extras=(), mixed=False):  # legacy outputs whatever the model's API
        out = self._graph(x.shape, training, group, mixed)(*[to_api(a, self.is_np) for a in (x, y) + extras])
        return tuple(legacy(o) for o in out) if training else legacy(out)

    def _graph(self, shape, training, group=None, mixed=False):
        """A hybridized graph per (input shape, mode, group, mixed, what the strategy adds):
        a partial batch gets its own."""
        key = (tuple(shape), training, group, mixed, self._graph_version())
        if key not in self._graphs:
            block = self._graph_block(group, shape)
            graph = make_step_graph(block.net, block.head, self.transform, self.precision, block.members,
                                    self.is_np, training, block.slots, self.inputs.augment,
                                    self.inputs.mixing if mixed else None, block.shared, block.skipping,
                                    self.tta)
            if self.hybridize and isinstance(block.net, gluon.HybridBlock):
                graph.hybridize(static_alloc=True, static_shape=True)
            self._graphs[key] = graph
        return self._graphs[key]

    def _graph_version(self):
        """What, changing, makes every graph stale (a strategy's; None: nothing)."""
        return None

    def _graph_block(self, group, shape):
        """The GraphBlock that group ``group``'s graphs run for batches of ``shape``."""
        raise NotImplementedError
