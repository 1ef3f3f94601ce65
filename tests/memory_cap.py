"""Running a command under a memory cap, as a container or a shared box imposes one: a
cgroup v1 memory group of its own (root only; tests skip elsewhere and say why)."""
import contextlib
import os
import subprocess
import uuid

import pytest

MEMORY_ROOT = "/sys/fs/cgroup/memory"


def can_cap():
    return os.geteuid() == 0 and os.access(MEMORY_ROOT, os.W_OK)


@contextlib.contextmanager
def memory_group(limit_bytes):
    """A fresh memory cgroup limited to ``limit_bytes``, removed afterwards: yields its
    directory; a process joins it by writing its PID to cgroup.procs."""
    if not can_cap():
        pytest.skip("capping memory needs root and a writable cgroup v1 memory controller")
    group = os.path.join(MEMORY_ROOT, f"gluon_gpu_test_{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    try:
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit_bytes))
        yield group
    finally:
        _remove(group)


def _remove(group):
    """rmdir once the group is empty: a killed member leaves it a moment after it exits."""
    for _ in range(10_000):
        try:
            os.rmdir(group)
            return
        except OSError:
            with open(os.path.join(group, "cgroup.procs")) as f:
                if f.read().strip():
                    raise
    os.rmdir(group)


def run_capped(limit_bytes, argv, **kwargs):
    """``subprocess.run(argv)`` inside a memory group of ``limit_bytes``."""
    with memory_group(limit_bytes) as group:
        def join():
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        return subprocess.run(argv, preexec_fn=join, **kwargs)
