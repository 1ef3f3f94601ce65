"""Running a command under a memory cap or a CPU quota, as a container or a shared box
imposes one: a cgroup v1 group of its own (root only; tests skip elsewhere and say why)."""
import contextlib
import os
import subprocess
import uuid

import pytest

CGROUP_ROOT = "/sys/fs/cgroup"


def can_cap(controller="memory"):
    return os.geteuid() == 0 and os.access(os.path.join(CGROUP_ROOT, controller), os.W_OK)


@contextlib.contextmanager
def cgroup(controller, settings):
    """A fresh cgroup v1 group of ``controller`` with ``settings`` ({file: value}),
    removed afterwards: yields its directory; a process joins it by writing its PID to
    cgroup.procs."""
    if not can_cap(controller):
        pytest.skip(f"a cgroup of its own needs root and a writable cgroup v1 {controller} controller")
    group = os.path.join(CGROUP_ROOT, controller, f"gluon_gpu_test_{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    try:
        for name, value in settings.items():
            with open(os.path.join(group, name), "w") as f:
                f.write(str(value))
        yield group
    finally:
        _remove(group)


def memory_group(limit_bytes):
    return cgroup("memory", {"memory.limit_in_bytes": limit_bytes})


def _remove(group):
    """rmdir once the group is empty: a killed member leaves it a moment after it exits,
    and so may the worker processes of a member that ended (they are waited for, by
    their state, never longer than they live)."""
    for _ in range(100_000):
        try:
            os.rmdir(group)
            return
        except OSError:
            with open(os.path.join(group, "cgroup.procs")) as f:
                left = f.read().split()
            if left and not all(os.path.exists(f"/proc/{pid}") for pid in left):
                continue  # one is going: look again
            if left and any(_state(pid) not in ("Z", "X") for pid in left):
                os.sched_yield()
    os.rmdir(group)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def run_in(group, argv, **kwargs):
    """``subprocess.run(argv)`` inside the cgroup directory ``group``."""
    def join():
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    return subprocess.run(argv, preexec_fn=join, **kwargs)


def run_capped(limit_bytes, argv, **kwargs):
    """``subprocess.run(argv)`` inside a memory group of ``limit_bytes``."""
    with memory_group(limit_bytes) as group:
        return run_in(group, argv, **kwargs)


def run_with_cpu_quota(cpus, argv, **kwargs):
    """``subprocess.run(argv)`` inside a cpu group whose quota is ``cpus`` CPUs' worth."""
    with cgroup("cpu", {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": int(cpus * 100_000)}) as group:
        return run_in(group, argv, **kwargs)
