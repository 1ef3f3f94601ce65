"""Device discovery and the device-spec grammar shared by every CLI (``--devices``).

Grammar::

    all       every GPU, else one CPU
    gpu       every GPU (an error if there is none)
    gpu:0,2   those GPU ids
    gpu*2     the first 2 GPUs
    cpu       one CPU context
    cpu*N     N CPU contexts cpu(0)..cpu(N-1)

MXNet gives each ``mx.cpu(i)`` its own engine queue, so ``cpu*N`` runs exactly the
multi-device code path a multi-GPU box runs; that is how it is tested without GPUs.
"""
import contextlib
import ctypes
import os
import re

import mxnet as mx
from mxnet import npx

from .errors import DeviceError

_SPEC = re.compile(r"^(?P<kind>cpu|gpu)(?:(?P<star>\*(?P<count>\d+))|(?::(?P<ids>\d+(?:,\d+)*)))?$")


def gpu_count():
    """Number of GPUs MXNet sees (0 with a CPU-only wheel). Tests monkeypatch this."""
    return npx.num_gpus()


def parse_devices(spec="all"):
    """Turn a device spec into a non-empty list of ``mx.Context``; raise DeviceError."""
    text = str(spec).strip().lower()
    if text == "all":
        n = gpu_count()
        return [mx.gpu(i) for i in range(n)] if n else [mx.cpu(0)]
    match = _SPEC.match(text)
    if not match:
        raise DeviceError(
            f"bad device spec {spec!r}: use all, cpu, cpu*N, gpu, gpu*N or gpu:I,J")
    kind, count, ids = match.group("kind"), match.group("count"), match.group("ids")
    if count is not None and int(count) < 1:
        raise DeviceError(f"bad device spec {spec!r}: the count must be at least 1")
    if kind == "cpu":
        if ids is not None:
            raise DeviceError(f"bad device spec {spec!r}: CPU contexts are chosen by count, cpu*N")
        return [mx.cpu(i) for i in range(int(count or 1))]
    available = gpu_count()
    if ids is not None:
        wanted = [int(i) for i in ids.split(",")]
        if len(set(wanted)) != len(wanted):
            raise DeviceError(f"bad device spec {spec!r}: a GPU id is repeated")
        missing = [i for i in wanted if i >= available]
        if missing:
            raise DeviceError(f"GPU {missing[0]} does not exist: this machine has {_gpus(available)}")
        return [mx.gpu(i) for i in wanted]
    n = int(count) if count is not None else available
    if available == 0:
        raise DeviceError(f"device spec {spec!r} asks for GPUs but this machine has none "
                          "(or MXNet is the CPU wheel); use --devices cpu")
    if n > available:
        raise DeviceError(f"device spec {spec!r} asks for {n} GPUs: this machine has {_gpus(available)}")
    return [mx.gpu(i) for i in range(n)]


def _gpus(n):
    return "no GPU" if n == 0 else f"{n} GPU{'s' if n > 1 else ''} (ids 0..{n - 1})"


def describe(ctx):
    """'cpu(0), cpu(1)' for logs and metrics."""
    return ", ".join(str(c) for c in ctx)


def set_cpu_threads(ctx, requested=0):
    """OpenMP threads per CPU operator: ``requested``, or by default the cores shared out
    over the CPU contexts, so ``cpu*2`` on 2 cores runs 2 x 1 threads instead of
    oversubscribing 2 x 2. Returns the number set."""
    cpu_contexts = sum(c.device_type == "cpu" for c in ctx) or 1
    threads = requested or max(1, (os.cpu_count() or 1) // cpu_contexts)
    mx.base._LIB.MXSetNumOMPThreads(ctypes.c_int(threads))  # pylint: disable=protected-access
    return threads


@contextlib.contextmanager
def devices(spec="all", omp_threads=0):
    """``with devices("gpu*2") as ctx:`` yields the device list (and sets the OpenMP
    threads per CPU context, see :func:`set_cpu_threads`).

    On exit it waits for the asynchronous engine, so an error raised by queued device
    work surfaces inside the ``with`` block instead of at some later sync point.
    """
    ctx = parse_devices(spec)
    set_cpu_threads(ctx, omp_threads)
    yield ctx
    mx.nd.waitall()
