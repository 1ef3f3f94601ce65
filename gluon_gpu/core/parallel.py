"""The data-parallel step: one network replicated on a device list, usable from any loop.

    dp = DataParallel(net, ctx, "sgd", {"learning_rate": 0.1})
    for data, label in loader:
        dp.step(data, label)             # split, forward+backward on every device, update
    print(dp.read_metrics())            # the only host sync: mean loss and metrics

Each host batch is cut over the devices (``devices.split_batch``; the device pipeline
delivers it already cut), every device runs forward and backward concurrently through
MXNet's async engine, and ``gluon.Trainer`` aggregates the gradients through the kvstore
(or the gradient buckets). DataParallel knows neither the model nor the data: the input
transform and the task head (loss and metrics, heads.py) are passed in, and the network
may use either MXNet API (modes.py).
"""
import signal

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

from .buckets import DEFAULT_BUCKET_BYTES, Buckets, bucketable
from .devices import split_batch
from .errors import UserError
from .graph import make_step_graph
from .heads import Classification, Head, head_for
from .kvstores import check_options, default_kvstore
from .metrics import DeviceSums, report
from .modes import legacy, model_is_np, semantics, to_api
from .precision import (check_precision, enable_amp, init_loss_scaling, loss_scale, precision_for,
                        scaled_losses)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # what a training loop stops on, in precedence


class DataParallel:
    """A network, its ``gluon.Trainer`` and the device list it is replicated on.

    ``head``: the task, a :class:`heads.Head` or ``'classify'``/``'regress'`` (default:
    classification with accuracy). ``transform``: a HybridBlock run on each input shard
    inside the step graph before the network (e.g. the device pipeline's uint8 ->
    normalized float); None: inputs go to the network as they are.

    ``batch_size``: the nominal (global, per worker) batch size. Gradients are divided by
    the larger of it and the batch's own size, so an epoch's smaller last batch moves the
    parameters in proportion to its size, as ``trainer.step(batch_size)`` does in MXNet's
    tutorial and GluonCV's scripts (README "Python API" has the measured effect).

    ``bucket_bytes``: on several devices of one process, the gradients live in contiguous
    buckets of up to this size and the kvstore sums buckets, not parameters (buckets.py).
    0, distributed jobs, and accumulated or sparse gradients: the Trainer's own exchange.
    From the first step on DataParallel owns the gradients' storage: re-allocating the
    parameters (``reset_ctx``, ``cast``, ``force_reinit``) raises at the next step.

    ``exchange=False`` leaves the gradient exchange out: every device trains its own
    replica. Not training: the benchmark's baseline for what the exchange costs.

    ``accumulate=N``: the gradients of N steps are summed (``grad_req='add'``) before
    one exchange and update (``step(..., flush=True)`` updates at once: an epoch's end).
    ``clip_grad``: the global norm of the mean gradient is clipped to it after the
    exchange, on every device alike.

    ``dtype``/``amp``/``loss_scaling``: the precision (precision.py): ``'bfloat16'``
    (CPUs) or ``amp=True`` (float16 on GPUs) train through ``contrib.amp``, which is
    process-wide: one such precision per process.
    """

    def __init__(self, net, ctx, optimizer="sgd", optimizer_params=None, kvstore=None, head=None,
                 transform=None, hybridize=True, dtype="float32", initializer=None, batch_size=None,
                 bucket_bytes=DEFAULT_BUCKET_BYTES, exchange=True, accumulate=1, clip_grad=None, amp=False,
                 loss_scaling=None):
        # A network that places itself (an ensemble of members on their own devices,
        # models/member_stack.py): each device trains its group of members on whole
        # batches of their columns, in a graph of its own; evaluation runs the whole stack
        # on its home device.
        self.places_itself = getattr(net, "places_itself", False)
        self.ctx = [device for _, device, _ in net.groups] if self.places_itself else list(ctx)
        self.batch_size = batch_size
        self.accumulate, self.clip_grad = accumulate, clip_grad
        self.pending_batches, self._pending_samples, self._pending_groups = 0, 0, None
        store = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        kvstore = store.type if store else (kvstore or default_kvstore(self.ctx))
        check_options(self.ctx, kvstore)
        self.precision = precision_for(dtype, amp, loss_scaling)
        check_precision(self.precision, self.ctx)
        _check_devices(net, self.ctx)
        self.net, self.transform, self.hybridize = net, transform, hybridize
        self.head = head if isinstance(head, Head) else (head_for(head) if head else Classification())
        self.members = getattr(net, "members", 1)
        self.is_np = model_is_np(net)
        enable_amp(self.precision, self.is_np)  # before any graph is built
        with semantics(self.is_np):
            if not self.places_itself:
                _place(net, self.ctx, initializer or mx.init.Xavier())
            if self.precision.param_dtype != "float32":
                net.cast(self.precision.param_dtype)
        if transform is not None:  # its constants (per-channel normalization) on the devices
            _place(transform, self.ctx, mx.init.Uniform())  # constants keep their own values
        params = dict(optimizer_params or {})
        if self.precision.param_dtype == "float16":
            params.setdefault("multi_precision", True)
        if accumulate > 1:  # backward adds to the gradients until the update
            for p in net.collect_params().values():
                if p.grad_req != "null":
                    p.grad_req = "add"
        self.distributed = kvstore.startswith("dist")
        if self.places_itself:
            _check_members(self.distributed)
        if clip_grad and kvstore == "dist_async":
            raise UserError("--clip-grad needs the update on the workers; dist_async updates on the servers")
        if self.distributed and not exchange:
            raise UserError("exchange=False is for one process: a distributed job always exchanges")
        self.kvstore = (store or mx.kv.create(kvstore)) if self.distributed else kvstore
        self.rank = self.kvstore.rank if self.distributed else 0
        self.num_workers = self.kvstore.num_workers if self.distributed else 1
        # Synchronous jobs aggregate gradients on the servers and update on every worker
        # (identical updates: identical replicas); dist_async must update on the servers.
        self._sync = self.distributed and kvstore != "dist_async"
        # Buckets are made at the first step, when every shape is known (a net may infer
        # its shapes in its first forward pass); the Trainer then has no kvstore of its own.
        self.bucketing = (exchange and not self.distributed and not self.places_itself and len(self.ctx) > 1
                          and bucket_bytes > 0 and bucketable(net.collect_params().values()))
        self._bucket_config = (kvstore, bucket_bytes)
        self.buckets = None
        # Every device updates its own replica from the summed gradients (dist_async can
        # only update on the servers): the same kernels with buckets or without, so the two
        # give the same numbers, and a checkpoint may resume under either.
        kvstore_options = {"kvstore": self.kvstore if exchange and not self.bucketing and not self.places_itself
                           else None, "update_on_kvstore": None if kvstore == "dist_async" else False}
        self.trainer = (MemberTrainer(net.nets, optimizer, params, **kvstore_options) if self.places_itself
                        else gluon.Trainer(net.collect_params(), optimizer, params, **kvstore_options))
        init_loss_scaling(self.precision, self.trainer)  # AMP needs update_on_kvstore=False, as here
        self.names = self.head.names
        self.sums = DeviceSums(self.ctx, (1 + len(self.names)) * self.members, self.members)
        if self.distributed:
            self._start_distributed()
        self._graphs = {}

    def _start_distributed(self):
        """Initialize the parameters on the servers now, and wait for every worker to
        have pulled them, before any gradient is pushed: MXNet 1.9 with
        update_on_kvstore=False uses one key for both, and a worker still pulling the
        initial weights otherwise races another's first gradient push and can receive
        the gradient sum as its weights (seen here as replicas that differ)."""
        with semantics(self.is_np):
            self.trainer._init_kvstore()  # pylint: disable=protected-access
            self.trainer._init_params()  # pylint: disable=protected-access
        nd.waitall()
        self.kvstore._barrier()  # pylint: disable=protected-access
        self._metric_key = 1 << 20  # beyond any parameter index
        self.kvstore.init(self._metric_key, nd.zeros((self.sums.width + 1,)))
        self._stop_key = self._metric_key + 1
        self.kvstore.init(self._stop_key, nd.zeros((len(STOP_SIGNALS),)))
        self._state_key = self._metric_key + 2
        self.kvstore.init(self._state_key, nd.zeros((self.sums.width * len(self.ctx) + 1,)))

    # -- the step -----------------------------------------------------------
    def split(self, data, label, training=True):
        """Per-device shards of a batch; already-split lists pass through unchanged. An
        ensemble of placed members: in training each group gets its members' columns
        (axis 1) of the whole batch (a pipeline in turns gives None to the groups whose
        turn it is not), in evaluation the home device the whole batch."""
        if isinstance(data, (list, tuple)):
            return list(data), list(label)
        if self.places_itself:
            if not training:
                return [data.as_in_context(self.net.home)], [label.as_in_context(self.net.home)]
            return ([a[:, first:first + len(group.nets)].as_in_context(device)
                     for first, device, group in self.net.groups] for a in (data, label))
        return split_batch(data, self.ctx), split_batch(label, self.ctx)

    def step(self, data, label, return_loss=True, flush=False):
        """Forward, backward and, every ``accumulate`` batches (or now, with ``flush``:
        the end of an epoch), one optimizer update; returns the batch's mean loss as a
        lazy NDArray on the first device (reading it forces a sync), or None with
        ``return_loss=False`` (the epoch loop: a few operators fewer per step)."""
        if self.buckets is not None:
            self.buckets.check()
        xs, ys = self.split(data, label)
        active = [g for g, x in enumerate(xs) if x is not None]  # placed members: the groups stepping
        if self.places_itself and self.pending_batches and active != self._pending_groups:
            self._update()  # groups in turns: the last turn's short accumulation ends with it
        self._pending_groups = active
        batch_size = xs[active[0]].shape[0] if self.places_itself else sum(x.shape[0] for x in xs)
        with semantics(self.is_np):
            with autograd.record():
                outs = {g: self._run(xs[g], ys[g], training=True, group=g if self.places_itself else None)
                        for g in active}
                with scaled_losses(self.trainer, [loss_sum for loss_sum, _ in outs.values()]) as losses:
                    autograd.backward(losses)  # one call for every device
            if len(xs) < len(self.ctx):
                self._idle(self.ctx[len(xs):])
            self.pending_batches += 1
            self._pending_samples += batch_size
            if self.pending_batches >= self.accumulate or flush:
                self._update()
        self.sums.add([outs[g][1] if g in outs else None for g in range(len(xs))], batch_size,
                      self._members_of(active))
        if not return_loss:
            return None
        total = nd.add_n(*[nd.sum(l).as_in_context(self.ctx[0]) for l, _ in outs.values()])  # groups may differ
        return total / (batch_size * len(self._members_of(active)))

    def _members_of(self, groups):
        """The ensemble members that ``groups`` (indices into the placed groups) train;
        any other network: all of its ``members``."""
        if not self.places_itself:
            return list(range(self.members))
        return [first + j for first, _, group in (self.net.groups[g] for g in groups)
                for j in range(len(group.nets))]

    def _update(self):
        """Exchange the gradients, clip them, update every replica, and (accumulating)
        start the next sum from zero. Gradients are divided by the larger of the nominal
        samples (batch size x batches summed) and the real ones; synchronous workers
        receive the sum over all workers' equal batches."""
        nominal = (self.batch_size or 0) * self.accumulate
        scale = max(self._pending_samples, nominal) * (self.num_workers if self._sync else 1)
        self.pending_batches, self._pending_samples = 0, 0
        if self.trainer._update_on_kvstore:  # pylint: disable=protected-access
            self.trainer.step(scale)  # dist_async: the servers update
            return
        if self.bucketing:
            self._bucketed().allreduce()
        else:
            self.trainer.allreduce_grads()
        if self.clip_grad:  # the gradients carry the scale of the batch and of the loss
            self._clip(self.clip_grad * scale * loss_scale(self.trainer))
        if self.places_itself:
            self.trainer.update_members(scale, self._members_of(self._pending_groups))
        else:
            self.trainer.update(scale)
        if self.accumulate > 1:
            self._zero_grads(self.ctx)

    def _clip(self, max_norm):
        """Global-norm clipping of the summed gradients, on every device alike: replicas
        hold the same sums after the exchange, so they stay identical. Placed members:
        each member's own norm, as it would be clipped alone. No host sync."""
        if self.places_itself:
            for member in (self.net.nets[k] for k in self._members_of(self._pending_groups)):
                grads = [legacy(p.list_grad()[0]) for p in member.collect_params().values() if p.grad_req != "null"]
                gluon.utils.clip_global_norm(grads, max_norm, check_isfinite=False)
            return
        trained = self._trained()
        for c in self.ctx:
            gluon.utils.clip_global_norm([legacy(p.grad(c)) for p in trained], max_norm, check_isfinite=False)

    def _trained(self):
        return [p for p in self.net.collect_params().values() if p.grad_req != "null"]

    def _run(self, x, y, training, group=None):
        """One shard through its cached graph (placed members: ``group``'s); legacy
        outputs whatever the model's API."""
        graph = self._graph(x.shape, training, group)
        out = graph(to_api(x, self.is_np), to_api(y, self.is_np))
        return tuple(legacy(o) for o in out) if training else legacy(out)

    def first_nonfinite_step(self):
        """The 1-based position, among the steps since the last call, of the first whose
        loss was NaN/inf, else None (one add per device; per-step reads only if one was)."""
        return self.sums.first_nonfinite()

    def read_metrics(self, reset=True):
        """``{'loss', <metric>..., 'samples'}`` means since the last reset: the one host
        sync. Ensembles: the means over members, and ``member_<name>`` lists."""
        vector, samples = self.sums.total(), self.sums.seen
        if self._sync:  # every worker calls this at the same steps: sum the sums over workers
            vector, samples = self._allreduce(vector, self.sums.samples)
        if reset:
            self.sums.reset()
        return report(vector, samples, self.names, self.members)

    def reset_metrics(self):
        self.sums.reset()

    def _allreduce(self, vector, samples):
        total = self._sum_over_workers(self._metric_key, np.concatenate([vector, [samples]]))
        return total[:-1], int(round(total[-1]))

    def _sum_over_workers(self, key, vector):
        local = nd.array(vector)
        self.kvstore.push(key, local)
        total = nd.zeros(local.shape)
        self.kvstore.pull(key, out=total)
        return total.asnumpy()

    def any_worker(self, flag):
        """Whether ``flag`` holds on any worker (every synchronous worker calls this at the
        same point: one small sum); in one process, ``flag``."""
        if not self._sync:
            return bool(flag)
        return self._sum_over_workers(self._stop_key, [float(bool(flag)), 0.0])[0] > 0

    def agree_to_stop(self, signum, sync_point):
        """The signal to stop on after this step, or None. One process: its own request
        (``signum``), at once. Synchronous workers: at sync points only (every worker
        calls this at the same steps), any worker's request, so all stop together;
        SIGTERM wins over SIGINT when workers got different ones."""
        if self.pending_batches:  # only between updates: a checkpoint holds no half sum
            return None
        if not self._sync:
            return signum
        if not sync_point:
            return None
        votes = self._sum_over_workers(self._stop_key, [float(signum == s) for s in STOP_SIGNALS])
        return next((s for s, n in zip(STOP_SIGNALS, votes) if n > 0), None)

    def metric_state(self):
        """The running sums behind ``read_metrics`` (for checkpoints). Synchronous workers
        must all call it at the same step: it returns the sums over all of them."""
        state = self.sums.state()
        if self._sync:
            flat = np.concatenate([np.ravel(state["sums"]), [state["samples"]]])
            total = self._sum_over_workers(self._state_key, flat)
            state = {"sums": total[:-1].reshape(len(self.ctx), -1).tolist(), "samples": int(round(total[-1]))}
        return state

    def load_metric_state(self, state):
        """Resume the running sums of ``metric_state``; in a distributed job rank 0 holds
        them for the whole job and the other workers start from zero."""
        if self.rank == 0:
            self.sums.load_state(state)
        else:
            self.sums.reset()

    # -- evaluation -----------------------------------------------------------
    def evaluate(self, batches):
        """``{'loss', <metric>..., 'samples'}`` over an iterable of batches (host batches
        or per-device shards). An ensemble reports its combined output (the head's
        ``combine``: the mean-softmax vote for classification), and ``member_<name>`` lists."""
        width = self.sums.width + (1 + len(self.names)) * (self.members > 1)
        totals = [nd.zeros((width,), ctx=c) for c in self.ctx]
        samples = 0
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

    # -- internals ------------------------------------------------------------
    def _graph(self, shape, training, group=None):
        """One hybridized graph per (input shape, mode), all sharing the net's parameters,
        so a last partial batch gets its own cached graph instead of re-planning the
        full-batch one every epoch. Placed members train in one graph per ``group``; its
        figures land in the group's member slots."""
        key = (tuple(shape), training, group)
        graph = self._graphs.get(key)
        if graph is None:
            net, members, slots = self.net, self.members, None
            if group is not None:
                first, _, net = self.net.groups[group]
                members, slots = len(net.nets), (first, self.members)
            graph = make_step_graph(net, self.head, self.transform, self.precision, members,
                                    self.is_np, training, slots)
            if self.hybridize and isinstance(net, gluon.HybridBlock):
                graph.hybridize(static_alloc=True, static_shape=True)
            self._graphs[key] = graph
        return graph

    def _bucketed(self):
        """The buckets, made at the first step, after its backward: shapes are known and
        that step's gradients move into the buckets. The graphs are rebuilt, since ones
        that ran before bound the old gradient arrays."""
        if self.buckets is None:
            kvstore, bucket_bytes = self._bucket_config
            self.buckets = Buckets(self.net.collect_params().values(), self.ctx, mx.kv.create(kvstore),
                                   bucket_bytes, self.is_np)
            self._graphs.clear()
        return self.buckets

    def _idle(self, idle_ctx):
        """Devices that got no samples this step must contribute zero, not stale, grads
        (accumulating: what they summed so far), and the Trainer, which updates every
        device, must take them as fresh."""
        if self.accumulate == 1:
            self._zero_grads(idle_ctx)
        for param in self._trained():
            for c in idle_ctx:
                param.data(c)._fresh_grad = True  # pylint: disable=protected-access

    def _zero_grads(self, ctx):
        if self.buckets is not None:
            self.buckets.zero(ctx)
            return
        for param in self._trained():  # a placed member's parameter lives on its one device
            for grad in param.list_grad() if self.places_itself else [param.grad(c) for c in ctx]:
                grad[:] = 0


class MemberTrainer(gluon.Trainer):
    """The Trainer of an ensemble's members (``nets``), which live on different devices,
    each member's parameters on one. ``gluon.Trainer`` asserts that all parameters share
    one device list, which only its kvstore needs; with none, its one updater updates
    every parameter where it lives, which is what independent members want.

    ``update_members`` updates the members that stepped: members in turns step one at a
    time. The learning-rate schedule reads the optimizer's ``num_update``, the most
    updates of any parameter so far; here it is the count of the members being updated,
    so each member follows its own schedule as it would alone."""

    def __init__(self, nets, optimizer, optimizer_params=None, **kwargs):
        params = {p.name: p for net in nets for p in net.collect_params().values()}
        super().__init__(params, optimizer, optimizer_params, **kwargs)
        index = {id(p): i for i, p in enumerate(self._params)}
        self._member_params = [[index[id(p)] for p in net.collect_params().values() if p.grad_req != "null"]
                               for net in nets]
        self._devices = [self._params[i[0]].list_ctx()[0] if i else None for i in self._member_params]
        self._stepping = range(len(nets))

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


def _check_members(distributed):
    """What an ensemble of placed members cannot do yet, one line."""
    if distributed:
        raise UserError("an ensemble laid out over devices trains in one process: use --ensemble-layout fused "
                        "with a distributed kvstore, or no launcher")


def _check_devices(net, ctx):
    """A block with CPU-only kernels declares ``cpu_only`` (a one-line reason); refuse it
    on other devices."""
    if all(c.device_type == "cpu" for c in ctx):
        return
    stack = [net]
    while stack:
        block = stack.pop()
        reason = getattr(block, "cpu_only", None)
        if reason:
            raise UserError(reason)
        stack.extend(block._children.values())  # pylint: disable=protected-access


def _place(block, ctx, initializer):
    """Initialize ``block`` on ``ctx``, or move its initialized parameters there."""
    try:
        initialized = all(p.list_ctx() for p in block.collect_params().values())
    except RuntimeError:
        initialized = False
    if initialized:
        block.collect_params().reset_ctx(ctx)
    else:
        block.initialize(initializer, ctx=ctx)
