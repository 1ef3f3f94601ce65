"""A command that lives and dies with its owner: the wrapper around each role the
launcher starts on an ssh host, and around a compiler a program runs (models/compiled.py).

ssh does not pass signals on, a remote process outlives a dropped session, and a
compiler's own children (cc1plus, as, ld) outlive a driver that is killed. So the owner
runs the command as ``python -c SOURCE COMMAND...`` and keeps the wrapper's stdin as a
control line: "SIGTERM" or "SIGINT" on it is sent to the command, and its end (the owner
closed it, or died however it died, or the connection broke) kills the command's whole
process group. The command itself dies with this wrapper (PR_SET_PDEATHSIG). A stop
signal sent to the wrapper itself (Slurm signals every process of a step) is passed on to
the command, which decides. Standard library only: it runs before anything of the job is
imported, on any host.
"""
import ctypes
import os
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
CONTROL = ("SIGTERM", "SIGHUP", "SIGINT")  # what the control line may ask for
GPU_SHARE_ENV = "GLUON_GPU_GPU_SHARE"  # "J/W": the role is worker J of the W on its node, which share its GPUs


def listed_gpus(environ):
    """The GPUs ``environ``'s CUDA_VISIBLE_DEVICES lists (Slurm sets it for a step)."""
    return [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def counted_gpus(environ):
    """The GPUs Slurm gave the job on this node (SLURM_GPUS_ON_NODE, checked at entry by
    environment.slurm_problem, as ASCII digits: standard library only here), 0 unsaid."""
    count = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(count) if count.isascii() and count.isdigit() else 0


class NoShare(Exception):
    """This node's GPUs do not split into the launcher's shares; the message says why."""


def gpu_share(environ):
    """The environment the role gets: with GPU_SHARE_ENV "J/W", CUDA_VISIBLE_DEVICES
    narrowed to the J-th of W equal parts of the GPUs this process sees (those Slurm
    lists in CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE's count): every step of an
    ``--overlap`` job is given all of its node's GPUs, and W workers would each take all."""
    if not environ.get(GPU_SHARE_ENV):
        return environ
    j, w = (int(v) for v in environ[GPU_SHARE_ENV].split("/"))
    visible = listed_gpus(environ) or [str(g) for g in range(counted_gpus(environ))]
    if not visible or len(visible) % w:
        raise NoShare(f"this node's {len(visible)} GPUs (CUDA_VISIBLE_DEVICES {','.join(visible) or 'empty'}) "
                      f"do not split evenly among its {w} workers")
    each = len(visible) // w
    return {**environ, "CUDA_VISIBLE_DEVICES": ",".join(visible[j * each:(j + 1) * each])}


def die_with_parent():
    """In a child, before exec: the kernel sends it SIGKILL when its parent dies, however
    the parent dies (kill -9 included)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def signal_group(pid, signum=signal.SIGKILL):
    """Send ``signum`` to the process group led by ``pid``, if it is still there."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def send(child, signum):
    """``signum`` to the process ``child`` (a Popen), if it is still there."""
    try:
        os.kill(child.pid, signum)
    except ProcessLookupError:
        pass


def _obey(control, child):
    for line in control:
        name = line.strip()
        if name in CONTROL:
            send(child, getattr(signal, name))
    signal_group(child.pid)  # the session is gone: so is the job


def run(command):
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=die_with_parent, env=gpu_share(dict(os.environ)))
    except NoShare as e:
        print(f"gluon_gpu.launch: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"gluon_gpu.launch: cannot start {command[0]} on this host: {e.strerror or e}", file=sys.stderr)
        return 127
    for name in CONTROL:  # to the role, which stops as it does (the wrapper waits for it)
        signal.signal(getattr(signal, name), lambda signum, _frame: send(child, signum))
    threading.Thread(target=_obey, args=(sys.stdin, child), daemon=True).start()
    code = child.wait()
    signal_group(child.pid)  # helpers the role left behind
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
else:
    with open(__file__) as _f:
        SOURCE = _f.read()
