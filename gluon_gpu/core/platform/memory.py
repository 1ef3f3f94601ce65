"""The memory a run may use, and the one check every large allocation goes through
before it is made (decoded datasets, their copies on the devices, a network's training
state at its batch size, ensembles): a refusal in one line with the figure and what is
free, instead of the OOM killer or "Failed to allocate CPU Memory" half a minute in."""
import contextlib
import os
from typing import NamedTuple

from .cgroups import CGROUP_ROOT, cgroup_dirs, read_file
from .errors import UserError

UNLIMITED = 2 ** 60  # cgroup v1 writes "no limit" as 9223372036854771712, v2 as "max"
MEMORY_FILES = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),  # by cgroup version
                2: ("memory.max", "memory.current", "inactive_file")}


def _cgroup_free(directory, limit_file, usage_file, cache_key):
    """Limit - usage (page cache the kernel can drop not counted as used) of one cgroup
    directory, or None when it sets no limit."""
    limit, usage = read_file(os.path.join(directory, limit_file)), read_file(os.path.join(directory, usage_file))
    if limit is None or usage is None or limit.strip() == "max" or int(limit) >= UNLIMITED:
        return None
    stat = dict(line.split() for line in (read_file(os.path.join(directory, "memory.stat"), "")).splitlines()
                if len(line.split()) == 2)
    return max(0, int(limit) - (int(usage) - int(stat.get(cache_key, 0))))


def cgroup_free(proc_cgroup="/proc/self/cgroup", root=CGROUP_ROOT):
    """The least free memory under the memory limits of this process's cgroup and its
    ancestors, v1 (``memory`` controller) or v2 (unified); None when none sets a limit."""
    frees = [_cgroup_free(directory, *MEMORY_FILES[version])
             for version, directory in cgroup_dirs("memory", proc_cgroup, root)]
    frees = [free for free in frees if free is not None]
    return min(frees) if frees else None


def host_available():
    """Bytes this process may still allocate on the host: the kernel's MemAvailable,
    lowered to what the cgroup memory limits leave (a container's or a job's cap)."""
    meminfo = read_file("/proc/meminfo", "")
    free = next((int(l.split()[1]) * 1024 for l in meminfo.splitlines() if l.startswith("MemAvailable:")), UNLIMITED)
    limited = cgroup_free()
    return free if limited is None else min(free, limited)


def _memory_of(device):
    """The memory ``device`` allocates from: a GPU's own, or "host" (CPU contexts share it)."""
    return device if getattr(device, "device_type", "cpu") == "gpu" else "host"


def available_bytes(device):
    """Free memory for ``device`` (an MXNet context, or "host"): the GPU's, or the host's."""
    if _memory_of(device) == "host":
        return host_available()
    import mxnet as mx  # only for a GPU: the data layer checks the host without MXNet
    return mx.context.gpu_memory_info(device.device_id)[0]


def size_text(nbytes):
    """``nbytes`` for a person: GiB, MiB below one, KiB below one MiB, bytes below that."""
    for unit, size, digits in (("GiB", 2 ** 30, 1), ("MiB", 2 ** 20, 0), ("KiB", 2 ** 10, 0)):
        if nbytes >= size:
            return f"{nbytes / size:.{digits}f} {unit}"
    return f"{nbytes} bytes"


def _by_memory(needs):
    """{memory: bytes} of ``needs``, (device or "host", bytes) pairs: CPU contexts share the
    host's memory, so their needs add up."""
    totals = {}
    for device, nbytes in needs:
        totals[_memory_of(device)] = totals.get(_memory_of(device), 0) + nbytes
    return totals


def _memory_name(memory):
    return "the host" if memory == "host" else str(memory)


def shortfall(needs):
    """The first memory that ``needs``, {device or "host": bytes}, would overflow, as
    ``(where, need, free)``; None when all fit (see _by_memory)."""
    for memory, nbytes in _by_memory(needs.items()).items():
        free = available_bytes(memory)
        if nbytes > free:
            return _memory_name(memory), nbytes, free
    return None


class Need(NamedTuple):
    """A check that passed: ``what`` needs ``needs``, {device or "host": bytes}."""
    what: str
    needs: dict


_RECORDS = []  # a list per recording() in progress: the checks passed meanwhile


@contextlib.contextmanager
def recording():
    """A list that receives a :class:`Need` for each check passed inside the ``with``."""
    passed = []
    _RECORDS.append(passed)
    try:
        yield passed
    finally:
        _RECORDS.remove(passed)


def total_text(passed):
    """What the checks ``passed`` (a :func:`recording` list) need together, for a person:
    each check compares its own need with the free memory, the whole run needs the sum."""
    totals = _by_memory(pair for need in passed for pair in need.needs.items())
    parts = [f"{size_text(nbytes)} of {_memory_name(memory)}'s {size_text(available_bytes(memory))} free"
             for memory, nbytes in totals.items()]
    if not parts:
        return "no memory estimated"
    return f"about {' and '.join(parts)}: " + "; ".join(
        f"{need.what} {size_text(sum(need.needs.values()))}" for need in passed)


def check_fits(needs, what, advice):
    """Refuse (UserError, one line) before allocating when ``needs`` (see
    :func:`shortfall`) exceed the free memory. ``what`` says what needs the memory,
    ``advice`` what to change."""
    short = shortfall(needs)
    if short:
        where, nbytes, free = short
        raise UserError(f"{what} needs about {size_text(nbytes)}, and {where} has {size_text(free)} free; {advice}")
    for passed in _RECORDS:
        passed.append(Need(what, dict(needs)))
