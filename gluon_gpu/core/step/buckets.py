"""Gradient buckets: the gradients of a network's parameters stored contiguously, in a
few buffers per device, so the kvstore exchanges a few keys per step instead of one per
parameter (PyTorch DDP's buckets, built from Gluon's and MXNet's own pieces).

Why: with one key per parameter, ``Trainer.step`` on two CPU contexts cost 0.55-0.65 ms
of Python per LeNet step (a kvstore call per parameter, and the Trainer's per-parameter
bookkeeping) plus a chain of small engine operators per parameter; on 2 cores that time
is taken from the workers computing. With LeNet's 10 gradients in one bucket exchange
and update cost 0.42 ms of Python, and a cpu*2 epoch took 0.83 s instead of 0.89 s (the
benchmark, with and without --bucket-mb 0). The numbers are
identical: the same operators write the same values, only into slices of one buffer.

How: each bucket holds the gradients of consecutive parameters of one dtype, up to
``bucket_bytes`` (a larger parameter gets a bucket of its own). Every member's gradient
on every device becomes a reshaped slice (a view: same memory) of its bucket's buffer on
that device, and autograd is told so. A step then sums each bucket over the devices with
one ``pushpull`` and lets ``gluon.Trainer`` (without a kvstore of its own) update every
device's parameters from the summed gradients, as it does after its own exchange.

Only gradients, never weights, are views: MXNet's oneDNN convolution and dense operators
re-lay-out a weight's whole buffer in place when run for inference, which on a view
corrupts the bucket (seen here: a failed ``!is_view`` check, and a SIGFPE later). A
bucket is one engine variable, so its exchange starts when all its gradients are
written; bounded buckets keep some overlap with backward for large models on GPUs.
"""
import numpy as np
from mxnet import autograd, nd

from ..platform.errors import UserError
from .array_api import legacy, to_api

DEFAULT_BUCKET_BYTES = 4 << 20
DEFAULT_BUCKET_MB = DEFAULT_BUCKET_BYTES / 2**20  # --bucket-mb


def bucketable(params):
    """Buckets need every trained parameter dense, all with one ``grad_req`` ('write', or
    'add' when accumulating): sparse gradients are left to the Trainer's own exchange."""
    trained = [p for p in params if p.grad_req != "null"]
    return len({p.grad_req for p in trained}) <= 1 and all(
        p._stype == "default" and p._grad_stype == "default" for p in trained)  # pylint: disable=protected-access


class Buckets:
    """The gradients of ``params`` (initialized on ``ctx``, shapes known) as views of
    bucket buffers, exchanged through ``kvstore`` (an ``mx.kv.KVStore``)."""

    def __init__(self, params, ctx, kvstore, bucket_bytes=DEFAULT_BUCKET_BYTES, is_np=False):
        self.ctx, self.kvstore, self._is_np = list(ctx), kvstore, is_np
        self._members = [p for p in params if p.grad_req != "null"]
        self.buffers = [self._place(group) for group in _groups(self._members, bucket_bytes)]
        self._grad_lists = [p._grad for p in self._members]  # pylint: disable=protected-access
        for key, per_device in enumerate(self.buffers):
            kvstore.init(key, nd.zeros_like(per_device[0]))

    def __del__(self):
        """MXNet's CPU kvstore frees its reducer with the object, and a reduce still
        queued in the engine then reads freed memory (seen here: a SIGFPE in
        ``CommCPU::ReduceSumCPU`` after a DataParallel was dropped mid-flight). The last
        operators of an exchange write the buffers: wait for them before the kvstore goes."""
        for per_device in getattr(self, "buffers", ()):
            for buffer in per_device:
                buffer.wait_to_read()

    def _place(self, group):
        """One buffer per device for ``group``; its members' gradients become views."""
        size = sum(int(np.prod(p.shape)) for p in group)
        per_device = [nd.zeros((size,), ctx=c, dtype=group[0].dtype) for c in self.ctx]
        for i, (c, buffer) in enumerate(zip(self.ctx, per_device)):
            offset = 0
            for p in group:
                n = int(np.prod(p.shape))
                view = buffer[offset:offset + n].reshape(p.shape)
                view[:] = legacy(p.grad(c))  # the gradients of a step already taken
                p._grad[i] = to_api(view, self._is_np)  # pylint: disable=protected-access
                offset += n
            autograd.mark_variables([p.data(c) for p in group], [p.grad(c) for p in group],
                                    grad_reqs=[p.grad_req for p in group])
            for p in group:  # marking clears the flag the Trainer checks; this step's are fresh
                p.data(c)._fresh_grad = True  # pylint: disable=protected-access
        return per_device

    def check(self):
        """Raise UserError if a member's gradients were re-allocated after bucketing
        (``reset_ctx``, ``cast``, ``initialize(force_reinit=True)``): the exchange would
        then sum buffers backward no longer writes, and the replicas would drift apart."""
        for p, grads in zip(self._members, self._grad_lists):
            if p._grad is not grads:  # pylint: disable=protected-access
                raise UserError(f"parameter {p.name} was re-allocated (reset_ctx, cast or "
                                "force_reinit) after DataParallel took the network: build a new DataParallel")

    def allreduce(self):
        """Sum every bucket over the devices, in place on each: one pushpull per bucket,
        prioritized as the Trainer does, first layers first (the next forward needs them
        first)."""
        for key, per_device in enumerate(self.buffers):
            self.kvstore.pushpull(key, per_device, out=per_device, priority=-key)

    def zero(self, idle_ctx):
        """Zero every gradient on ``idle_ctx``: one operator per bucket per device."""
        for per_device in self.buffers:
            for c, buffer in zip(self.ctx, per_device):
                if c in idle_ctx:
                    buffer[:] = 0


def _groups(params, bucket_bytes):
    """Consecutive runs of parameters of one dtype, cut when the next would pass
    ``bucket_bytes``."""
    groups, dtype, used = [], None, 0
    for p in params:
        nbytes = int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
        if groups and np.dtype(p.dtype) == dtype and used + nbytes <= bucket_bytes:
            groups[-1].append(p)
            used += nbytes
        else:
            groups.append([p])
            dtype, used = np.dtype(p.dtype), nbytes
    return groups
