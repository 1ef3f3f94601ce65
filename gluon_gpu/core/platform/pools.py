"""Waiting on a ``multiprocessing.Pool`` without waiting forever. A pool replaces a
worker that dies (the out-of-memory killer's SIGKILL) but loses the task it held, so a
result waited on never comes: Gluon's DataLoader gives up after 120 s with a traceback,
``Pool.imap`` never. These waits poll the result and the pool's processes instead, and
raise :class:`ProcessDied` within a fraction of a second of a death; a pool is ended
without waiting on what the dead left, and the workers' temporary folder goes with the
next start if not at exit (docs/maintainers/internals.md, "Worker pools")."""
import functools
import glob
import multiprocessing.connection
import multiprocessing.pool
import multiprocessing.util
import os
import shutil
import tempfile
from multiprocessing.pool import TERMINATE

from .environment import whole_number
from .errors import ProcessDied, UserError

POLL_SECONDS = 0.2
TEMP_PREFIX = "gluon_gpu-"  # + the PID of the process whose workers' temporary directory it holds
SOCKET_PATH_BYTES = 107  # an AF_UNIX path: sun_path's 108 bytes, with its closing NUL
SOCKET_TAIL = "/pymp-XXXXXXXX/listener-XXXXXXXX"  # what multiprocessing adds under our folder
DEATH_SECONDS = 1  # from a broken hand-over to the death of the worker behind it


class _OwnedPool(multiprocessing.pool.Pool):
    """A Pool that keeps every process it starts (``started``), replacements included:
    a worker killed at once, before anything watched the pool, is still seen dead."""

    def __init__(self, processes, **options):
        self.started = []
        super().__init__(processes, **options)

    def Process(self, ctx, *args, **kwds):  # pylint: disable=invalid-name,arguments-differ (Pool's factory)
        process = ctx.Process(*args, **kwds)
        self.started.append(process)
        return process


class PoolWatch:
    """A new pool of ``processes`` (``multiprocessing.Pool``'s ``options``) and every
    process it starts: a pool never ends one itself before it is closed, so one that
    ended was killed, and whatever it held is lost. ``what`` names them in the error."""

    def __init__(self, processes, what, **options):
        own_temp_dir()
        self.pool, self.what = _OwnedPool(processes, **options), what

    def dead(self):
        """A watched process that ended, or None: by its sentinel, closed as it exits,
        since its exit code may not be readable yet (not a zombie yet, or being reaped by
        the pool's thread: 2 kills in 20 then ended in an EOFError traceback)."""
        sentinels = _sentinels(self.pool.started)
        return next((sentinels[s] for s in multiprocessing.connection.wait(list(sentinels), 0)), None)

    def check(self):
        """ProcessDied, the pool ended, if a watched process ended."""
        dead = self.dead()
        if dead is not None:
            self.end()
            dead.join()  # reaped by now (by the pool's thread or by the end): its exit code
            raise ProcessDied(self.what, dead.pid, dead.exitcode)

    def end(self):
        """End the pool (:func:`_end`), whatever happened to its processes."""
        _end(self.pool)

    def wait(self, pending):
        """Until the ``AsyncResult`` ``pending`` is ready (its ``get`` then returns at
        once, or raises the worker's exception), or ProcessDied."""
        while not pending.ready():
            pending.wait(POLL_SECONDS)
            self.check()

    def result(self, pending, unpack):
        """``unpack(pending.get())``, or ProcessDied: while waiting, or when unpacking
        reaches a process that died (for the shared memory it was to hand over)."""
        self.wait(pending)
        try:
            return unpack(pending.get())
        except (OSError, EOFError):  # the worker died while handing it over, maybe not yet reaped
            multiprocessing.connection.wait(list(_sentinels(self.pool.started)), DEATH_SECONDS)
            self.check()
            raise

    def each(self, results):
        """The items of ``pool.imap(...)`` in order, or ProcessDied: at the first item
        after a death even when nothing waited on the dead (a replacement took over)."""
        while True:
            try:
                item = results.next(POLL_SECONDS)
            except multiprocessing.TimeoutError:
                self.check()
                continue
            except StopIteration:
                self.check()
                return
            self.check()
            yield item


def _sentinels(processes):
    """{sentinel: process} of ``processes``, but one the pool's thread is starting (a
    replacement), which has none yet."""
    found = {}
    for process in processes:
        try:
            found[process.sentinel] = process
        except ValueError:  # "process not started"
            pass
    return found


def _end(pool):
    """End ``pool`` without waiting on what a killed process may have left: a lock held
    (an idle worker holds the task queue's while it waits for a task) or half a message
    (a task it was reading, a result it was sending). ``Pool.terminate()`` waits on both,
    forever, and a death may not be visible yet when it starts; its SIGTERM does not end a
    worker whose signal lands on one of MXNet's engine threads while it waits on such a
    lock. So: no process replaced, every one killed, and the pool's threads told to stop
    and not waited for (each ends at once, or stays blocked on what the dead left, a
    daemon that ends with this process)."""
    if pool._state == TERMINATE:
        return
    pool._state = TERMINATE
    for thread in (pool._worker_handler, pool._task_handler, pool._result_handler):
        thread._state = TERMINATE
    pool._change_notifier.put(None)
    pool._worker_handler.join()  # no replacement from here on; it tells the task handler to stop
    for process in pool._pool:
        process.kill()
    for process in pool._pool:
        process.join()
    pool._terminate.cancel()  # Pool.terminate() and the exit's finalizers: nothing left to do


@functools.lru_cache(maxsize=None)
def own_temp_dir():
    """multiprocessing's temporary directory (``pymp-*``: sockets through which workers
    hand over shared memory), made before the workers, which inherit it (made by each,
    stopped at exit, they left theirs behind), inside :func:`process_temp_dir`."""
    folder = process_temp_dir()
    saved, tempfile.tempdir = tempfile.tempdir, folder
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = saved
    return folder


_FOLDERS = {}  # pid -> its folder (a forked child makes its own)
_SWEPT = set()  # the pids that swept


def process_temp_dir():
    """This process's temporary folder, ``TMPDIR/gluon_gpu-PID`` (``/tmp`` where worker
    sockets would not fit in TMPDIR), for whatever it makes there (worker sockets, the
    benchmark's scratch runs), removed at exit after multiprocessing's ``pymp-*``; after
    a SIGKILL nothing runs, so the next program removes it (:func:`sweep_temp_dirs`)."""
    if os.getpid() not in _FOLDERS:
        sweep_temp_dirs()
        folder = os.path.join(_socket_base(tempfile.gettempdir()), f"{TEMP_PREFIX}{os.getpid()}")
        os.makedirs(folder, exist_ok=True)
        multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-101)
        _FOLDERS[os.getpid()] = folder
    return _FOLDERS[os.getpid()]


def sweep_temp_dirs():
    """Remove the temporary folders of gluon_gpu processes that are gone (killed before
    they could): every program does at its start (entry.py), a library caller at its
    first temporary folder; once per process."""
    if os.getpid() in _SWEPT:
        return
    _SWEPT.add(os.getpid())
    for base in {tempfile.gettempdir(), "/tmp"}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            pid = whole_number(name[len(TEMP_PREFIX):])
            if name.startswith(TEMP_PREFIX) and pid is not None and not alive(pid):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _socket_base(base):
    """``base`` (TMPDIR), or /tmp where the sockets inside would not fit: multiprocessing
    binds ``<base>/gluon_gpu-PID/pymp-XXXXXXXX/listener-XXXXXXXX``, and an AF_UNIX path
    holds at most 107 bytes (a long TMPDIR otherwise fails in the first worker)."""
    for candidate in (base, "/tmp"):
        longest = os.path.join(candidate, f"{TEMP_PREFIX}{os.getpid()}") + SOCKET_TAIL
        if len(os.fsencode(longest)) <= SOCKET_PATH_BYTES and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    short = SOCKET_PATH_BYTES - len(f"/{TEMP_PREFIX}{os.getpid()}{SOCKET_TAIL}")
    raise UserError(f"TMPDIR {base!r} is too long for the sockets worker processes use (at most {short} "
                    "characters here), and /tmp is not writable: set a shorter TMPDIR")


def alive(pid):
    """Whether process ``pid`` is there (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def partial_path(path):
    """Where this process writes ``path`` before renaming it into place: named with its
    PID, so that :func:`remove_dead_partials` can tell a killed writer's from a live one's."""
    return f"{path}.{os.getpid()}.partial"


def remove_dead_partials(path):
    """Remove what writers of ``path`` that are gone (killed mid-write) left beside it."""
    for leftover in glob.glob(f"{glob.escape(path)}.*.partial"):
        pid = whole_number(leftover[len(path) + 1:].split(".", 1)[0])
        if pid is not None and not alive(pid):
            try:
                os.unlink(leftover)
            except OSError:
                pass
