"""Device discovery and the device-spec grammar shared by every CLI (``--devices``).

Grammar::

    all       every GPU, else the CPU: one context per group of OpenMP threads that
              fills the cores (2 on 2 cores with MXNet's default of 1 thread there)
    gpu       every GPU (an error if there is none)
    gpu:0,2   those GPU ids
    gpu*2     the first 2 GPUs
    cpu       one CPU context
    cpu*N     N CPU contexts cpu(0)..cpu(N-1)

MXNet gives each ``mx.cpu(i)`` its own engine queue, so ``cpu*N`` runs exactly the
multi-device code path a multi-GPU box runs; that is how it is tested without GPUs.
"""
import contextlib
import os
import re
import sys

import mxnet as mx
from mxnet import npx

from .environment import usable_cpus
from .errors import DeviceError, UserError
from .walk import descendants

_SPEC = re.compile(r"^(?P<kind>cpu|gpu)(?:(?P<star>\*(?P<count>\d+))|(?::(?P<ids>\d+(?:,\d+)*)))?$")


def gpu_count():
    """Number of GPUs MXNet sees (0 with a CPU-only wheel). Tests monkeypatch this."""
    return npx.num_gpus()


def parse_devices(spec="all"):
    """Turn a device spec into a non-empty list of ``mx.Context``; raise DeviceError.
    Sets the CPU pools' sizes if not set (:func:`use_cpu_pools`)."""
    use_cpu_pools()
    text = str(spec).strip().lower()
    if text == "all":
        n = gpu_count()
        return [mx.gpu(i) for i in range(n)] if n else [mx.cpu(i) for i in range(cpu_contexts())]
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
        n = int(count or 1)
        if n > max_cpu_contexts():
            raise DeviceError(f"bad device spec {spec!r}: at most {max_cpu_contexts()} CPU contexts here "
                              f"({CONTEXTS_PER_CORE} per core; each holds a replica of the model and the data)")
        return [mx.cpu(i) for i in range(n)]
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
                          "(or MXNet is the CPU wheel); use `devices` cpu")
    if n > available:
        raise DeviceError(f"device spec {spec!r} asks for {n} GPUs: this machine has {_gpus(available)}")
    return [mx.gpu(i) for i in range(n)]


CONTEXTS_PER_CORE = 8  # past this, contexts only add copies and engine threads


def max_cpu_contexts():
    """The most CPU contexts a spec may ask for: cpu*1000 allocated until the machine ran
    out of memory; a bound checked up front is one clear line instead."""
    return CONTEXTS_PER_CORE * usable_cpus()


def _gpus(n):
    return "no GPU" if n == 0 else f"{n} GPU{'s' if n > 1 else ''} (ids 0..{n - 1})"


def describe(ctx):
    """'cpu(0), cpu(1)' for logs and metrics."""
    return ", ".join(str(c) for c in ctx)


# MXNet draws CPU scratch buffers ("temp space") for every CPU context from one shared
# pool of MXNET_CPU_TEMP_COPY buffers, 4 by default, and operators holding the same buffer
# run one after the other. So with the default, cpu(0) and cpu(1) mostly took turns:
# a LeNet step on cpu*2 took 20 ms, as long as on one context; with 64 it takes 12.5 ms
# (both cores busy). The same holds for the pool of random-number states
# (MXNET_CPU_PARALLEL_RAND_COPY, default 1), which MXNet hands to every operator loaded
# from an extension library, the fused conv operator (fused_conv.py) among them: with one
# copy, cpu(0)'s and cpu(1)'s fused operators ran in turn (cpu*2 step 8.3 ms; 5.3 ms with
# 8). Each copy holds ~5 MiB of generator states, so 8, not 64 (64 cost 270 MiB more
# resident memory than 8).
CPU_POOLS = {"MXNET_CPU_TEMP_COPY": "64", "MXNET_CPU_PARALLEL_RAND_COPY": "8"}


def use_cpu_pools():
    """Give CPU contexts pools of their own size (:data:`CPU_POOLS`) unless the user set
    them. MXNet builds both pools at the first operator that needs one, so this counts
    only before that: the programs call it at start (``require_thread_settings``), a
    library caller through :func:`parse_devices`, the usual first call."""
    for name, value in CPU_POOLS.items():
        os.environ.setdefault(name, value)

THREAD_VARIABLES = {"omp_threads": "OMP_NUM_THREADS", "engine_threads": "MXNET_CPU_WORKER_NTHREADS"}


def cpu_contexts():
    """CPU contexts that keep every core busy: cores / OpenMP threads per operator. One
    context cannot: its operators run one after another on one engine worker, and more
    OpenMP threads per operator made LeNet slower here, not faster."""
    return max(1, usable_cpus() // thread_settings()["omp_threads"])


def thread_settings():
    """The CPU threading this process runs with: OpenMP threads per operator
    (``OMP_NUM_THREADS``, else MXNet's default of half the logical CPUs, at least 1),
    engine worker threads per CPU context (``MXNET_CPU_WORKER_NTHREADS``, default 1) and
    the shared pools of scratch buffers and of random states (``MXNET_CPU_TEMP_COPY``,
    ``MXNET_CPU_PARALLEL_RAND_COPY``)."""
    def number(name, default):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            return default
    return {"omp_threads": number("OMP_NUM_THREADS", max(1, usable_cpus() // 2)),
            "engine_threads": number("MXNET_CPU_WORKER_NTHREADS", 1),
            "cpu_temp_copy": number("MXNET_CPU_TEMP_COPY", 4),
            "cpu_parallel_rand_copy": number("MXNET_CPU_PARALLEL_RAND_COPY", 1)}


def thread_variables(omp_threads=0, engine_threads=0):
    """The variables that start MXNet with ``omp_threads`` OpenMP threads per CPU operator
    and ``engine_threads`` engine workers per CPU context (0: not set)."""
    return {THREAD_VARIABLES[name]: str(value) for name, value in
            (("omp_threads", omp_threads), ("engine_threads", engine_threads)) if value}


def require_thread_settings(omp_threads=0, engine_threads=0, restart=False, extra=None):
    """Make this process run with ``omp_threads`` OpenMP threads per CPU operator and
    ``engine_threads`` engine workers per CPU context (0: leave as they are).

    MXNet reads both once, when it starts: ``MXSetNumOMPThreads`` reaches only the calling
    thread, never the engine's workers that run the operators (measured: no effect at
    all). So a command-line program (``restart=True``) re-executes itself, same pid and
    arguments, with the variables set; a library caller gets a UserError saying what to
    set before starting Python."""
    use_cpu_pools()
    wanted = {**thread_variables(omp_threads, engine_threads), **(extra or {})}  # extra: others MXNet reads at start
    missing = {k: v for k, v in wanted.items() if os.environ.get(k) != v}
    if not missing:
        return
    if not restart:
        raise UserError("thread settings take effect only when MXNet starts: set "
                        + " ".join(f"{k}={v}" for k, v in missing.items()) + " before starting Python")
    os.environ.update(missing)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable] + sys.orig_argv[1:])


@contextlib.contextmanager
def devices(spec="all"):
    """``with devices("gpu*2") as ctx:`` yields the device list.

    On exit it waits for the asynchronous engine, so an error raised by queued device
    work surfaces inside the ``with`` block instead of at some later sync point.
    """
    ctx = parse_devices(spec)
    yield ctx
    mx.nd.waitall()


def shard_bounds(n, count):
    """``[(start, stop)]`` of ``n`` samples over at most ``count`` devices, as
    ``gluon.utils.split_data(even_split=False)`` cuts them (the last takes the rest); a
    batch smaller than the device count uses fewer devices."""
    used = min(count, n)
    step = n // used
    return [(i * step, (i + 1) * step if i < used - 1 else n) for i in range(used)]


def split_batch(array, ctx):
    """Per-device shards of a host batch (legacy or numpy array): the one place a batch
    is cut over devices (the device pipeline cuts its index arrays by ``shard_bounds``)."""
    return [array[lo:hi].as_in_context(c) for (lo, hi), c in zip(shard_bounds(array.shape[0], len(ctx)), ctx)]


class CpuOnly:
    """A block whose kernels run on CPUs only; ``cpu_only``: the one line that says so."""

    cpu_only = "this block has CPU kernels only"


def check_cpu_only(net, ctx):
    """Refuse a network holding a CpuOnly block on other devices than CPUs."""
    if all(c.device_type == "cpu" for c in ctx):
        return
    for block in descendants(net):
        if isinstance(block, CpuOnly):
            raise UserError(block.cpu_only)


def default_workers(ctx):
    """Data workers when the user names none: the cores this process may use (its CPU
    affinity and quota), less one for each CPU context's compute (a GPU's: one core feeding it),
    at least one."""
    cores = usable_cpus()
    compute = len({c for c in ctx if c.device_type == "cpu"}) or 1
    return max(1, cores - compute)
