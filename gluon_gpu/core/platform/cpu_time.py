"""How much of the machine a timed span had: the CPU time of this process and its
waited-for children against the wall time, and what everything else (other processes,
the hypervisor's steal) took meanwhile, from the kernel's counters (``/proc/stat``).

A benchmark row that ran beside other work is slower for it, and a ratio of two rows of
which one was slowed so is no result: the benchmark marks such a row instead of quoting it.
"""
import os
import time
from typing import NamedTuple

# Other work that took more than this share of the machine's CPU time during a row marks
# it: a busy loop beside a 2-core run takes about a third to a half; a quiet machine's
# daemons and kernel threads a few hundredths.
BUSY_LIMIT = 0.10
_TICK = os.sysconf("SC_CLK_TCK")


class CpuShare(NamedTuple):
    """A span's CPU figures: ``cpu_share``, its own processes' CPU seconds over wall
    seconds x the machine's CPUs; ``others``, everything else's share of the machine's
    CPU time (``None`` where the kernel's counters cannot be read)."""
    wall_seconds: float
    cpu_share: float
    others: object

    @property
    def busy(self):
        """Another job took enough of the machine to slow this span."""
        return self.others is not None and self.others > BUSY_LIMIT

    def as_dict(self):
        return {"cpu_share": self.cpu_share, "others": self.others, "busy": self.busy}


def stat_path():
    """Where the machine's CPU counters are read: ``$GLUON_GPU_CPU_STAT`` (a container's
    own view of them, such as LXCFS gives; an empty file such as /dev/null judges nothing
    busy), else the kernel's ``/proc/stat``."""
    return os.environ.get("GLUON_GPU_CPU_STAT") or "/proc/stat"


def machine_ticks(path):
    """``(busy ticks, CPUs)`` of the whole machine since boot (busy: all but idle and
    iowait; steal counts as busy: the hypervisor gave it to someone else), or None."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if not lines or not lines[0].startswith("cpu "):
        return None
    total = [int(v) for v in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return sum(total) - total[3] - total[4], cpus


def own_cpu_seconds(children=True):
    """CPU seconds of this process (every thread) and, with ``children``, of its children
    that were waited for."""
    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)


class CpuMeter:
    """``with CpuMeter() as meter: ...`` then ``meter.share``: the span's :class:`CpuShare`.
    Children started inside the span must be waited for inside it to count as its own."""

    def __init__(self, path=None):
        self.stat_path, self.share = path or stat_path(), None

    def __enter__(self):
        self._start = (time.perf_counter(), own_cpu_seconds(), machine_ticks(self.stat_path))
        return self

    def __exit__(self, *_exc):
        wall0, own0, machine0 = self._start
        wall, own = time.perf_counter() - wall0, own_cpu_seconds() - own0
        machine1 = machine_ticks(self.stat_path)
        cpus = (machine1 or machine0 or (0, os.cpu_count()))[1] or 1
        others = None
        if machine0 and machine1 and wall > 0:
            others = max(0.0, ((machine1[0] - machine0[0]) / _TICK - own) / (wall * cpus))
        self.share = CpuShare(wall, own / (wall * cpus) if wall > 0 else 0.0, others)
        return False
