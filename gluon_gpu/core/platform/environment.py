"""The environment variables MXNet reads once, when it is imported, checked before that:
on bad values MXNet 1.9 aborts (``OMP_NUM_THREADS=abc``: an uncaught C++ exception),
crashes (``OMP_NUM_THREADS=100000``: a segfault when libgomp cannot make the threads),
hangs (``MXNET_CPU_WORKER_NTHREADS=0``) or fails deep inside its engine
(``MXNET_ENGINE_TYPE=Bogus``), divides by zero (``MXNET_CPU_TEMP_COPY=0``: SIGFPE) or
refuses to start (``MXNET_CPU_TEMP_COPY=abc``). Also the CPUs this process can use
(affinity mask and CPU quota). Imports nothing of MXNet."""
import os
import platform
import sys

from .cgroups import cpu_quota
from .errors import UserError

THREADS_PER_CORE = 16  # far above any useful setting, far below what the machine cannot make
THREAD_COUNTS = ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS", "MXNET_CPU_PRIORITY_NTHREADS",
                 "MXNET_GPU_WORKER_NTHREADS", "MXNET_GPU_COPY_NTHREADS")
# The pools MXNet shares among a device type's contexts (devices.CPU_POOLS): 0 copies is
# a division by zero (SIGFPE) at the first operator that draws from one.
POOLS = ("MXNET_CPU_TEMP_COPY", "MXNET_GPU_TEMP_COPY", "MXNET_CPU_PARALLEL_RAND_COPY",
         "MXNET_GPU_PARALLEL_RAND_COPY")
MAX_POOL_COPIES = 1024
ENGINES = ("NaiveEngine", "ThreadedEngine", "ThreadedEnginePerDevice")


def whole_number(text):
    """``text`` as a whole number as every consumer reads it, or None: ASCII digits (with
    spaces around) only. ``str.isdigit`` also takes '²', which int() refuses, and int()
    takes '٣' and '1_0', which the C libraries that read MXNet's, OpenMP's, ps-lite's and
    Slurm's variables (atoi, strtol) do not."""
    text = text.strip()
    return int(text) if text and text.isascii() and text.isdigit() else None


def affinity_cpus():
    """The logical CPUs this process may run on: its affinity mask (a container's cpuset,
    ``taskset``), which ``os.cpu_count()`` ignores, else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def usable_cpus():
    """The CPUs this process can keep busy: :func:`affinity_cpus`, at most the whole CPUs
    its CPU quota allows (a container's ``--cpus`` on a larger host, a job's CPU limit),
    which neither ``os.cpu_count()`` nor the affinity mask shows."""
    quota = cpu_quota()
    return min(affinity_cpus(), quota) if quota else affinity_cpus()


def fit_threads_to_cpu_quota():
    """Without ``OMP_NUM_THREADS``, MXNet gives each operator half the CPUs of the
    affinity mask, blind to a CPU quota: on a 64-CPU host a container of 4 CPUs would
    run 32 threads an operator. Where a quota is tighter than the mask, set the variable
    to half the quota's CPUs (at least 1), as MXNet would choose on a machine of that
    size. Does nothing once MXNet is imported (it reads the variable when it starts)."""
    if "OMP_NUM_THREADS" not in os.environ and "mxnet" not in sys.modules and usable_cpus() < affinity_cpus():
        os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cpus() // 2))


def _cpuinfo_line(prefixes):
    """The value of the first /proc/cpuinfo line starting with one of ``prefixes``, or
    None (no such file or line: not Linux, or another architecture's fields)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((l for l in f if l.startswith(prefixes)), None)
    except OSError:
        return None
    return line.split(":", 1)[-1].strip() if line else None


def cpu_flags():
    """This CPU's feature flags (empty where /proc/cpuinfo has none)."""
    return set((_cpuinfo_line(("flags", "Features")) or "").split())


def cpu_model():
    """This CPU's model name, else ``platform.processor()``."""
    return _cpuinfo_line(("model name",)) or platform.processor()


def bfloat16_isa(flags=None):
    """What this CPU has for bfloat16, as measured figures name it: 'AVX-512 BF16 and
    AMX', 'AVX-512 BF16' or 'no bfloat16 instructions'."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "AVX-512 BF16 and AMX"
    return "AVX-512 BF16" if "avx512_bf16" in flags else "no bfloat16 instructions"


def whole_numbers():
    """``{variable: (lowest, highest, why)}`` of the whole numbers MXNet reads at start."""
    most = THREADS_PER_CORE * affinity_cpus()
    per_core = f" ({THREADS_PER_CORE} per core)"
    return {**{name: (1, most, per_core) for name in THREAD_COUNTS},
            "MXNET_KVSTORE_REDUCTION_NTHREADS": (0, most, per_core),
            **{name: (1, MAX_POOL_COPIES, "") for name in POOLS},
            "MXNET_KVSTORE_BIGARRAY_BOUND": (1, 2 ** 62, "")}


def problem(env=None):
    """The first bad variable as a one-line message, or None: MXNet's, a distributed
    job's (DMLC_*, read by ps-lite: a bad one hung or aborted it), Slurm's and ours.
    DMLC_PS_ROOT_URI is not resolved here: on Kubernetes the scheduler's name has an
    address only once its pod runs, which may be after a worker's; the worker's wait for
    it has a deadline instead (kvstores.create_store)."""
    env = os.environ if env is None else env
    found = _out_of_range(env, {**whole_numbers(), **job_whole_numbers()})
    if found:
        return found
    engine = env.get("MXNET_ENGINE_TYPE")
    if engine is not None and engine not in ENGINES:
        return f"MXNET_ENGINE_TYPE={engine!r}: must be one of {', '.join(ENGINES)}"
    return job_problem(env)


def _out_of_range(env, ranges):
    """The first of ``ranges`` (``{variable: (lowest, highest, why)}``) that ``env`` sets to
    anything but a whole number within them, as a line, or None."""
    for name, (low, high, why) in ranges.items():
        value = env.get(name)
        number = None if value is None else whole_number(value)
        if value is not None and not (number is not None and low <= number <= high):  # no OpenMP list
            return f"{name}={value!r}: must be a whole number from {low} to {high}{why}"
    return None


MAX_JOB_PROCESSES = 4096  # workers or servers of one job: far above any job of this project
MAX_WAIT_SECONDS = 7 * 86400  # the longest deadline any wait takes (a week): threading's and poll's limits are far above
MAX_RESTARTS = 10 ** 6  # restarts or resets of a job: the children read their number back from a variable
PROCESSES_PER_CORE = 8  # processes one host starts for a job or a loader, at most, per core
DMLC_ROLES = ("worker", "server", "scheduler")
RESOLVE_SECONDS = 10


def job_whole_numbers():
    """``{variable: (lowest, highest, why)}`` of the whole numbers of a job's environment."""
    return {"DMLC_NUM_WORKER": (1, MAX_JOB_PROCESSES, ""), "DMLC_NUM_SERVER": (1, MAX_JOB_PROCESSES, ""),
            "DMLC_PS_ROOT_PORT": (1, 65535, " (a TCP port)"), "GLUON_GPU_CONNECT_TIMEOUT": (1, MAX_WAIT_SECONDS, " seconds"),
            "GLUON_GPU_STALL_TIMEOUT": (1, MAX_WAIT_SECONDS, " seconds"),
            "HOROVOD_RANK": (0, MAX_JOB_PROCESSES - 1, " (Horovod's launcher sets it)"),
            "HOROVOD_SIZE": (1, MAX_JOB_PROCESSES, " (Horovod's launcher sets it)"),
            "HOROVOD_GLOO_TIMEOUT_SECONDS": (1, MAX_WAIT_SECONDS, " seconds"),
            "GLUON_GPU_ELASTIC_TRAINING": (0, MAX_RESTARTS, " (the resets before it, as an elastic worker's supervisor "
                                                       "sets it)"),
            "GLUON_GPU_RESTART": (1, MAX_RESTARTS, " (the restart's number, as gluon-gpu-launch sets it)")}


def slurm_problem(env=None):
    """The first bad Slurm variable the launcher reads, as a line, or None. SLURM_NTASKS'
    ceiling: PROCESSES_PER_CORE processes a CPU of the allocation."""
    env = os.environ if env is None else env
    nodes = env.get("SLURM_JOB_NUM_NODES", "1")
    cpus = env.get("SLURM_CPUS_ON_NODE", "")
    nodes, cpus = whole_number(nodes) or 1, whole_number(cpus) or usable_cpus()
    ranges = {"SLURM_RESTART_COUNT": (0, MAX_RESTARTS, ""), "SLURM_JOB_NUM_NODES": (1, MAX_JOB_PROCESSES, ""),
              "SLURM_GPUS_ON_NODE": (0, MAX_JOB_PROCESSES, " (the GPUs Slurm gave the job on this node)"),
              "SLURM_NTASKS": (1, nodes * cpus * PROCESSES_PER_CORE,
                               f" ({PROCESSES_PER_CORE} a CPU of the allocation's {nodes} node(s) of {cpus})")}
    found = _out_of_range(env, ranges)
    if found:
        return found
    job = env.get("SLURM_JOB_ID")
    if job is not None and whole_number(job) is None:
        return f"SLURM_JOB_ID={job!r}: must be Slurm's job number"
    return None


def job_problem(env):
    """A distributed job's variables that are not whole numbers, as a line, or None."""
    role = env.get("DMLC_ROLE")
    if role is not None and role not in DMLC_ROLES:
        return f"DMLC_ROLE={role!r}: must be one of {', '.join(DMLC_ROLES)}"
    if role is not None:
        for name in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER"):
            if not env.get(name):
                return f"DMLC_ROLE={role!r} but {name} is not set: a {role} needs the scheduler's address and the " \
                       "job's size (gluon-gpu-launch sets them; docs/distributed.md)"
    if env.get("GLUON_GPU_RESTART") and not (env.get("GLUON_GPU_JOB") or role):
        return (f"GLUON_GPU_RESTART={env['GLUON_GPU_RESTART']!r} is set outside a distributed job (gluon-gpu-launch "
                "sets it for its workers' restarts, a job's pod spec for its workers): unset it (to continue a "
                "run: --resume RUN)")
    share = env.get("GLUON_GPU_GPU_SHARE")
    if share is not None and not _share_ok(share):
        return f"GLUON_GPU_GPU_SHARE={share!r}: must be J/W, worker J (from 0) of the W on its node"
    cycle = env.get("HOROVOD_CYCLE_TIME")
    if cycle is not None and not _milliseconds_ok(cycle):
        return f"HOROVOD_CYCLE_TIME={cycle!r}: must be milliseconds above 0, at most 1000 (Horovod's loop's cycle)"
    return None


def _milliseconds_ok(text):
    try:  # float() takes '١٠' and '1_0', Horovod's C++ does not
        return text.strip().isascii() and "_" not in text and 0 < float(text) <= 1000
    except ValueError:
        return False


def _share_ok(text):
    parts = [whole_number(p) for p in text.split("/")]
    return len(parts) == 2 and None not in parts and parts[0] < parts[1]


def resolves(host, seconds=RESOLVE_SECONDS):
    """Whether ``host`` has an address, asked with a deadline (a resolver that does not
    answer counts as no)."""
    import socket
    import threading
    found = []

    def look():
        try:
            found.append(bool(socket.getaddrinfo(host, None)))
        except (OSError, UnicodeError):
            found.append(False)
    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(found and found[0])


def check():
    """Raise UserError naming the first bad variable."""
    found = problem()
    if found is not None:
        raise UserError(found)
