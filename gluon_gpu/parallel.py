"""The data-parallel step: one network replicated on a device list, usable from any loop.

    dp = DataParallel(net, ctx, optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    for data, label in loader:
        loss = dp.step(data, label)      # split, forward+backward on every device, update
    print(dp.read_metrics())            # the only host sync: mean loss and accuracy

Each batch is split with ``gluon.utils.split_and_load(..., even_split=False)`` (or
arrives already split by the device pipeline), every device runs forward and backward
concurrently through MXNet's async engine, and ``gluon.Trainer`` aggregates gradients
through the kvstore. Loss and correct counts are summed on the devices and read only
when ``read_metrics`` is called.
"""
import os

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd

from .buckets import DEFAULT_BUCKET_BYTES, Buckets, bucketable
from .data import Normalize
from .errors import UserError

MAX_PENDING = 512  # steps whose outputs are held between metric reads
KVSTORES = ("device", "local", "nccl", "dist_sync", "dist_device_sync", "dist_async")
DTYPES = ("float32", "float16")


def default_kvstore(ctx):
    """'device' (aggregate on the GPUs) for GPUs, 'local' for CPU contexts."""
    return "device" if ctx[0].device_type == "gpu" else "local"


def check_options(ctx, kvstore=None, dtype="float32"):
    """Reject GPU-only or launcher-only options where they cannot work (UserError)."""
    on_gpu = all(c.device_type == "gpu" for c in ctx)
    if kvstore is not None and kvstore not in KVSTORES:
        raise UserError(f"unknown kvstore {kvstore!r}: choose one of {', '.join(KVSTORES)}")
    if kvstore == "nccl":
        if not on_gpu:
            raise UserError("kvstore nccl needs GPU devices (got %s)" % ", ".join(map(str, ctx)))
        if not mx.runtime.Features().is_enabled("NCCL"):
            raise UserError("kvstore nccl needs an MXNet build with NCCL; this one has none "
                            "(use --kvstore device)")
    if kvstore is not None and kvstore.startswith("dist"):
        if "DMLC_ROLE" not in os.environ:
            raise UserError(f"kvstore {kvstore} needs the DMLC_* environment of a distributed "
                            "job: start it with python -m gluon_gpu.launch")
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if dtype == "float16" and not on_gpu:
        raise UserError("float16 training is supported on GPU devices only")


class _Graph(gluon.HybridBlock):
    """(optional uint8 normalize) -> net -> per-member (summed loss, correct count), for
    one input shape. An ordinary net is an ensemble of one: its vectors have length 1.
    Without a loss (evaluation), an ensemble also gets the count of its mean-softmax vote."""

    def __init__(self, net, loss, normalize, dtype, members):
        super().__init__(prefix="")
        self.net, self.loss_fn, self._dtype, self._members = net, loss, dtype, members
        self.normalize = Normalize(add_channel=members == 1) if normalize else None

    def hybrid_forward(self, F, x, y):
        if self.normalize is not None:
            x = self.normalize(x)
        out = self.net(x.astype(self._dtype))          # (b, 10) or (b, K, 10)
        y = y.astype(self._dtype)                      # (b,) or (b, K)
        hit = F.argmax(out, axis=-1) == y
        correct = self._f32(F, F.sum(F.reshape(hit, shape=(-1, self._members)), axis=0))
        if self.loss_fn is None:
            if self._members == 1:
                return correct
            vote = F.argmax(F.mean(F.softmax(out, axis=-1), axis=1), axis=-1)
            first = F.reshape(F.slice_axis(y, axis=1, begin=0, end=1), shape=(-1,))
            return F.concat(correct, self._f32(F, F.sum(vote == first, axis=0, keepdims=True)), dim=0)
        if self._members > 1:
            out, y = F.reshape(out, shape=(-3, -2)), F.reshape(y, shape=(-1,))
        loss = F.reshape(self.loss_fn(out, y), shape=(-1, self._members))
        return self._f32(F, F.sum(loss, axis=0)), correct

    def _f32(self, F, x):
        """Sums leave the graph as float32 (the device accumulators), whatever --dtype."""
        return x if self._dtype == "float32" else F.cast(x, dtype="float32")


class DataParallel:
    """A network, its ``gluon.Trainer`` and the device list it is replicated on.

    ``normalize_in_graph=True`` takes uint8 (B, 28, 28) input (the device pipeline)
    and normalizes it inside the graph; otherwise input is already float (B, 1, 28, 28).

    ``batch_size``: the nominal (global, per worker) batch size. Gradients are divided by
    the larger of it and the batch's own size, so an epoch's smaller last batch moves the
    parameters in proportion to its size, as ``trainer.step(batch_size)`` does in MXNet's
    tutorial and GluonCV's scripts. Dividing a last batch of 96 by 96 instead (None: each
    batch's own size) gives its few samples a full step right before every validation:
    LeNet's final test accuracy was 0.872 +- 0.010 over 5 seeds that way, 0.883 +- 0.005
    this way.

    ``bucket_bytes``: on several devices of one process, the gradients are stored in
    contiguous buckets of up to this size per device and the kvstore sums the buckets,
    not one key per parameter (buckets.py); the Trainer then updates every device. 0,
    distributed jobs, and parameters with accumulated or sparse gradients: the Trainer's
    own exchange, one key per parameter. From the first step on DataParallel owns the
    gradients' storage: re-allocating the parameters (``reset_ctx``, ``cast``,
    ``force_reinit``) raises at the next step.

    ``exchange=False`` leaves the gradient exchange out: every device trains its own
    replica on its shard. Not training: the benchmark's baseline for what the exchange
    costs (the same steps, minus the data-parallel part).
    """

    def __init__(self, net, ctx, optimizer="sgd", optimizer_params=None, kvstore=None,
                 loss=None, hybridize=True, normalize_in_graph=False, dtype="float32",
                 initializer=None, batch_size=None, bucket_bytes=DEFAULT_BUCKET_BYTES, exchange=True):
        self.ctx = list(ctx)
        self.batch_size = batch_size
        kvstore = kvstore or default_kvstore(self.ctx)
        store = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        kvstore = store.type if store else kvstore
        check_options(self.ctx, kvstore, dtype)
        from .fused_conv import is_fused
        if is_fused(net) and any(c.device_type != "cpu" for c in self.ctx):
            raise UserError("this LeNet uses the fused conv operator, which has CPU kernels only: "
                            "build it with fused=False (--fused-conv off) for GPUs")
        self.net, self.hybridize, self.dtype = net, hybridize, dtype
        self.members = getattr(net, "members", 1)
        self.normalize_in_graph = normalize_in_graph
        self.loss = loss or gluon.loss.SoftmaxCrossEntropyLoss()
        if not _is_initialized(net):
            net.initialize(initializer or mx.init.Xavier(), ctx=self.ctx)
        else:
            net.collect_params().reset_ctx(self.ctx)
        if dtype != "float32":
            net.cast(dtype)
        params = dict(optimizer_params or {})
        if dtype == "float16":
            params.setdefault("multi_precision", True)
        self.distributed = kvstore.startswith("dist")
        self.kvstore = (store or mx.kv.create(kvstore)) if self.distributed else kvstore
        self.rank = self.kvstore.rank if self.distributed else 0
        self.num_workers = self.kvstore.num_workers if self.distributed else 1
        # Synchronous jobs aggregate gradients on the servers and update on every worker
        # (identical updates: identical replicas); dist_async must update on the servers.
        self._sync = self.distributed and kvstore != "dist_async"
        if self.distributed and not exchange:
            raise UserError("exchange=False is for one process: a distributed job always exchanges")
        # Buckets are made at the first step, when every shape is known (a net may infer
        # its shapes in its first forward pass); the Trainer then has no kvstore of its own.
        self.bucketing = (exchange and not self.distributed and len(self.ctx) > 1 and bucket_bytes > 0
                           and bucketable(net.collect_params().values()))
        self._bucket_config = (kvstore, bucket_bytes)
        self.buckets = None
        own_exchange = exchange and not self.bucketing
        # Every device updates its own replica from the summed gradients (dist_async can
        # only update on the servers): the same kernels with buckets or without, so the two
        # give the same numbers, and a checkpoint may resume under either.
        self.trainer = gluon.Trainer(net.collect_params(), optimizer, params,
                                     kvstore=self.kvstore if own_exchange else None,
                                     update_on_kvstore=None if kvstore == "dist_async" else False)
        if self.distributed:
            self._start_distributed()
        self._graphs = {}
        self.reset_metrics()

    def _start_distributed(self):
        """Initialize the parameters on the servers now, and wait for every worker to
        have pulled them, before any gradient is pushed: MXNet 1.9 with
        update_on_kvstore=False uses one key for both, and a worker still pulling the
        initial weights otherwise races another's first gradient push and can receive
        the gradient sum as its weights (seen here as replicas that differ)."""
        self.trainer._init_kvstore()  # pylint: disable=protected-access
        self.trainer._init_params()  # pylint: disable=protected-access
        nd.waitall()
        self.kvstore._barrier()  # pylint: disable=protected-access
        self._metric_key = 1 << 20  # beyond any parameter index
        self.kvstore.init(self._metric_key, nd.zeros((2 * self.members + 1,)))

    # -- the step -----------------------------------------------------------
    def split(self, data, label):
        """Per-device shards of a batch; already-split lists pass through unchanged."""
        if isinstance(data, (list, tuple)):
            return list(data), list(label)
        n = data.shape[0]
        ctx = self.ctx[:n]  # a last batch smaller than the device count uses fewer devices
        return (gluon.utils.split_and_load(data, ctx, even_split=False),
                gluon.utils.split_and_load(label, ctx, even_split=False))

    def step(self, data, label, return_loss=True):
        """Forward, backward and one optimizer update on a batch; returns the batch's mean
        loss as a lazy NDArray on the first device (reading it forces a sync), or None
        with ``return_loss=False`` (the epoch loop: a few operators fewer per step)."""
        if self.buckets is not None:
            self.buckets.check()
        xs, ys = self.split(data, label)
        batch_size = sum(x.shape[0] for x in xs)
        with autograd.record():
            outs = [self._graph(x.shape, training=True)(x, y) for x, y in zip(xs, ys)]
        autograd.backward([loss_sum for loss_sum, _ in outs])  # one call for every device
        if len(xs) < len(self.ctx):  # idle devices must contribute zero, not stale, grads
            self._zero_grads(self.ctx[len(xs):])
        if self.bucketing:
            self._bucketed().allreduce()
        # Synchronous workers receive the gradient sum over all workers' equal batches.
        self.trainer.step(max(batch_size, self.batch_size or 0) * (self.num_workers if self._sync else 1))
        self._pending.append(outs)  # summed on the devices at the next read, not per step
        if len(self._pending) >= MAX_PENDING:  # a loop that never reads: bound what is held
            self._fold_pending()
        self._samples += batch_size
        if not return_loss:
            return None
        total = nd.add_n(*[l.as_in_context(self.ctx[0]) for l, _ in outs])
        return nd.sum(total) / (batch_size * self.members)

    def reset_metrics(self):
        self._loss = [nd.zeros((self.members,), ctx=c) for c in self.ctx]
        self._correct = [nd.zeros((self.members,), ctx=c) for c in self.ctx]
        self._samples = 0
        self._pending = []

    def first_nonfinite_step(self):
        """Fold the steps since the last call into the running sums; return the 1-based
        position among them of the first whose loss was NaN/inf, else None. Costs one
        add per device per call, and per-step reads only when something went wrong."""
        pending = self._pending
        self._fold_pending()
        if all(np.isfinite(l.asnumpy()).all() for l in self._loss):
            return None
        for position, outs in enumerate(pending, 1):
            if not all(np.isfinite(loss.asnumpy()).all() for loss, _ in outs):
                return position
        return 1  # the sums were already non-finite before these steps

    def _fold_pending(self):
        """Add the held step outputs into the running sums (device ops, no host sync)."""
        pending, self._pending = self._pending, []
        for i in range(len(self.ctx)):
            losses = [outs[i][0] for outs in pending if i < len(outs)]
            if losses:
                self._loss[i] += nd.add_n(*losses)
                self._correct[i] += nd.add_n(*[outs[i][1] for outs in pending if i < len(outs)])

    def read_metrics(self, reset=True):
        """``{'loss', 'accuracy', 'samples'}`` since the last reset: the one host sync.
        Ensembles: the means over members, and ``member_loss``/``member_accuracy`` lists."""
        self._fold_pending()
        loss, correct, samples = sum(l.asnumpy() for l in self._loss), \
            sum(c.asnumpy() for c in self._correct), self._samples
        if self._sync:  # every worker calls this at the same steps: sum the sums over workers
            loss, correct, samples = self._allreduce(loss, correct, samples)
        loss, acc = loss / max(samples, 1), correct / max(samples, 1)
        result = {"loss": float(loss.mean()), "accuracy": float(acc.mean()), "samples": samples}
        if self.members > 1:
            result["member_loss"], result["member_accuracy"] = loss.tolist(), acc.tolist()
        if reset:
            self.reset_metrics()
        return result

    def _allreduce(self, loss, correct, samples):
        local = nd.array(np.concatenate([loss, correct, [samples]]))
        self.kvstore.push(self._metric_key, local)
        total = nd.zeros(local.shape)
        self.kvstore.pull(self._metric_key, out=total)
        total = total.asnumpy()
        k = self.members
        return total[:k], total[k:2 * k], int(round(total[-1]))

    def metric_state(self):
        """The running sums behind ``read_metrics``, per device (for checkpoints)."""
        self._fold_pending()
        return {"loss": [l.asnumpy().tolist() for l in self._loss],
                "correct": [c.asnumpy().tolist() for c in self._correct], "samples": self._samples}

    def load_metric_state(self, state):
        """Restore ``metric_state`` output (onto the first device if the count changed)."""
        self.reset_metrics()
        same = len(state["loss"]) == len(self.ctx)
        for name, arrays in (("loss", self._loss), ("correct", self._correct)):
            values = state[name] if same else \
                [[sum(col) for col in zip(*state[name])]] + [[0.0] * self.members] * (len(self.ctx) - 1)
            for array, value in zip(arrays, values):
                array[:] = nd.array(value, ctx=array.context)
        self._samples = state["samples"]

    # -- evaluation -----------------------------------------------------------
    def evaluate(self, batches):
        """Accuracy over an iterable of batches (host batches or per-device shards);
        for an ensemble, the accuracy of its mean-softmax vote."""
        counts = self._evaluate_counts(batches)
        return counts[-1]

    def evaluate_members(self, batches):
        """Ensembles: ``(per-member accuracies, ensemble accuracy)``."""
        counts = self._evaluate_counts(batches)
        return counts[:self.members], counts[-1]

    def _evaluate_counts(self, batches):
        width = self.members + (self.members > 1)
        correct = [nd.zeros((width,), ctx=c) for c in self.ctx]
        total = 0
        for data, label in batches:
            xs, ys = self.split(data, label)
            for i, (x, y) in enumerate(zip(xs, ys)):
                correct[i] += self._graph(x.shape, training=False)(x, y)
            total += sum(x.shape[0] for x in xs)
        return (sum(c.asnumpy() for c in correct) / max(total, 1)).tolist()

    # -- internals ------------------------------------------------------------
    def _graph(self, shape, training):
        """One hybridized graph per (input shape, mode), all sharing the net's parameters,
        so a last partial batch gets its own cached graph instead of re-planning the
        full-batch one every epoch."""
        key = (tuple(shape), training)
        graph = self._graphs.get(key)
        if graph is None:
            graph = _Graph(self.net, self.loss if training else None, self.normalize_in_graph,
                           self.dtype, self.members)
            if self.hybridize:
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
                                   bucket_bytes)
            self._graphs.clear()
        return self.buckets

    def _zero_grads(self, idle_ctx):
        """Devices that got no samples this step must contribute zero, not stale, grads,
        and the Trainer, which updates every device, must take those zeros as this step's."""
        trained = [p for p in self.net.collect_params().values() if p.grad_req != "null"]
        if self.buckets is not None:
            self.buckets.zero(idle_ctx)
        else:
            for param in trained:
                for c in idle_ctx:
                    param.grad(c)[:] = 0
        for param in trained:
            for c in idle_ctx:
                param.data(c)._fresh_grad = True  # pylint: disable=protected-access


def _is_initialized(net):
    try:
        return all(p.list_ctx() for p in net.collect_params().values())
    except RuntimeError:
        return False
