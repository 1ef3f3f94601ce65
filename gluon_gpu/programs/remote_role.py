"""The wrapper around each role the launcher starts on an ssh host.

ssh does not pass signals on, and a remote process outlives a dropped session. So the
launcher runs every remote role as ``python -c SOURCE COMMAND...`` and keeps the ssh
session's stdin as a control line: "SIGTERM" or "SIGINT" on it is sent to the role, and
its end (the launcher closed it, or died, or the connection broke) kills the role's whole
process group. The role itself dies with this wrapper (PR_SET_PDEATHSIG). A stop signal
sent to the wrapper itself (Slurm signals every process of a step) is passed on to the
role, which decides. Standard library only: it runs before anything of the job is
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


def _send(child, signum):
    try:
        os.kill(child.pid, signum)
    except ProcessLookupError:
        pass


def _obey(control, child):
    for line in control:
        name = line.strip()
        if name in CONTROL:
            _send(child, getattr(signal, name))
    signal_group(child.pid)  # the session is gone: so is the job


def run(command):
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=die_with_parent)
    except OSError as e:
        print(f"gluon_gpu.launch: cannot start {command[0]} on this host: {e.strerror or e}", file=sys.stderr)
        return 127
    for name in CONTROL:  # to the role, which stops as it does (the wrapper waits for it)
        signal.signal(getattr(signal, name), lambda signum, _frame: _send(child, signum))
    threading.Thread(target=_obey, args=(sys.stdin, child), daemon=True).start()
    code = child.wait()
    signal_group(child.pid)  # helpers the role left behind
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
else:
    with open(__file__) as _f:
        SOURCE = _f.read()
