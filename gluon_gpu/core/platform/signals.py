"""The signals that stop a program, handled alike from its first instruction: SIGTERM
(a scheduler, ``kill``) and SIGHUP (a closed terminal or ssh session) as Ctrl-C's
SIGINT is. Outside training they raise :class:`Stopped` (the programs' main_guard turns
it into one line and the shell's 128 + N); training installs its own handlers, which
checkpoint after the step in progress (programs/train.py). Imports no MXNet."""
import contextlib
import os
import select
import signal
import sys
import threading
import time

from .cpu_time import own_cpu_seconds

# What a training loop stops on, in precedence when workers got different ones.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopped(BaseException):
    """A stop signal outside training; a BaseException, as KeyboardInterrupt is, so that
    no ``except Exception`` swallows it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def ignore_at_exit():
    """Once a program's main is done (its line said, its checkpoint written), a stop
    signal has nothing left to stop: a second SIGTERM (Slurm's scancel signals every
    process of a step, and again) landing in the interpreter's teardown printed a
    traceback from inside an MXNet array's ``__del__``. Ignore them from here on, and
    leave unsaid what MXNet's arrays raise as they are freed during finalization."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    previous = sys.unraisablehook

    def hook(unraisable):
        where = getattr(unraisable.object, "__module__", "") or ""
        if sys.is_finalizing() or (where.startswith("mxnet") and isinstance(unraisable.exc_value, Stopped)):
            return
        previous(unraisable)
    sys.unraisablehook = hook


def raise_on_stop_signals():
    """SIGTERM and SIGHUP raise Stopped in this process; a process forked from it (a
    DataLoader or pack worker) ends as the signal's default does, quietly, from its
    first instruction: a worker whose main thread is blocked in a lock never runs a
    Python handler, so with this process's handler inherited, a pool's ``terminate()``
    left it alive and the pool's join waited forever (a tutorial-loop DataLoader worker
    stuck at its start, seen in a benchmark)."""
    def handler(signum, _frame):
        raise Stopped(signum)

    for signum in STOP_SIGNALS[:2]:
        signal.signal(signum, handler)
    if not _state["at_fork"]:
        os.register_at_fork(after_in_child=_default_stop_signals)
        _state["at_fork"] = True


_state = {"at_fork": False}


def _default_stop_signals():
    for signum in STOP_SIGNALS[:2]:
        signal.signal(signum, signal.SIG_DFL)


IDLE_SECONDS = 10  # a stop signal unheard this long while the process computes nothing: it waits in C++


@contextlib.contextmanager
def heard_while(what, idle=None):
    """Inside the block the main thread may wait in C++ (ps-lite's connect, pushes, pulls
    and barriers, Horovod's rendezvous) for peers that may never come, and no Python
    signal handler runs until the wait ends: a worker waiting for a scheduler ignored
    SIGTERM and Ctrl-C for the connect deadline's 600 s. Here the signal is heard where the
    C handler writes it (``signal.set_wakeup_fd``), by a thread that says so in one line
    (``what``: what was waited for) and ends the process with 128 + the signal: at once
    (``idle`` None: a wait has nothing to save), or once the process has used next to no
    CPU for ``idle`` seconds since (training: the step in progress, the agreement to stop
    and the checkpoint compute, and are let finish; a wait for a stopped peer does not)."""
    if threading.current_thread() is not threading.main_thread():  # its own handlers hear the signals
        yield
        return
    heard, quit_ = os.pipe(), os.pipe()
    os.set_blocking(heard[1], False)
    previous = signal.set_wakeup_fd(heard[1], warn_on_full_buffer=False)
    thread = threading.Thread(target=_hear, args=(heard[0], quit_[0], what, idle), daemon=True)
    thread.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.write(quit_[1], b"q")
        thread.join()
        for fd in (*heard, *quit_):
            os.close(fd)


def _hear(heard, quit_, what, idle):
    signum, since, cpu = None, 0.0, 0.0
    while True:
        ready, _, _ = select.select([heard, quit_], [], [], None if signum is None else 1.0)
        if quit_ in ready:
            return
        stops = [s for s in (os.read(heard, 64) if heard in ready else b"") if s in STOP_SIGNALS]
        if signum is None and stops:
            signum, since, cpu = stops[0], time.monotonic(), own_cpu_seconds(children=False)
        if signum is None:
            continue
        now, used = time.monotonic(), own_cpu_seconds(children=False)
        if idle is not None and used - cpu > 0.05 * max(now - since, 1.0):  # it computes: let it go on
            since, cpu = now, used
        if idle is None or now - since >= idle:
            print(f"gluon_gpu: stopped by {signal.Signals(signum).name} while {what}", file=sys.stderr, flush=True)
            os._exit(128 + signum)
