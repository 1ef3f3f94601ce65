"""This process's cgroups and their ancestors, in cgroup v1 (a hierarchy per
controller) or v2 (one unified tree): where a container's or a job's limits are
written. memory.py reads the memory limits from them, environment.py the CPU quota."""
import os

CGROUP_ROOT = "/sys/fs/cgroup"
V2_PERIOD = "100000"  # cpu.max may give the quota alone


def read_file(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def cgroup_dirs(controller, proc_cgroup="/proc/self/cgroup", root=CGROUP_ROOT):
    """``[(version, directory)]``: this process's cgroup of ``controller`` ("memory",
    "cpu") and each of its ancestors up to the root, innermost first, in the v1
    hierarchy that has the controller and in the v2 tree."""
    found = []
    for line in read_file(proc_cgroup, "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            version, base = 1, os.path.join(root, controller)
        elif controllers == "":
            unified = os.path.join(root, "unified")  # v1 and v2 side by side (systemd's hybrid layout)
            version, base = 2, unified if os.path.isdir(unified) else root
        else:
            continue
        parts = [p for p in path.strip().split("/") if p]
        found += [(version, os.path.join(base, *parts[:depth])) for depth in range(len(parts), -1, -1)]
    return found


def cpu_quota(proc_cgroup="/proc/self/cgroup", root=CGROUP_ROOT):
    """The whole CPUs' worth of time the tightest CPU quota over this process's cgroups
    allows (v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, v2 ``cpu.max``; a container's
    ``--cpus``, a job's CPU limit), rounded down, at least 1; None without a quota."""
    quotas = []
    for version, directory in cgroup_dirs("cpu", proc_cgroup, root):
        if version == 1:
            quota, period = (read_file(os.path.join(directory, f)) for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        else:
            quota, period = ((read_file(os.path.join(directory, "cpu.max")) or "max").split() + [V2_PERIOD])[:2]
        try:
            quota, period = int(quota), int(period)
        except (TypeError, ValueError):  # no such file, or "max": no quota
            continue
        if quota > 0 and period > 0:  # v1 writes "no quota" as -1
            quotas.append(max(1, quota // period))
    return min(quotas) if quotas else None
