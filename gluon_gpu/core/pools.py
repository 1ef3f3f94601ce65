"""Waiting on a ``multiprocessing.Pool`` without waiting forever. A pool replaces a
worker that dies (the out-of-memory killer's SIGKILL) but loses the task it held, so a
result waited on never comes: Gluon's DataLoader gives up after 120 s with a traceback,
``Pool.imap`` never. These waits poll the result and the pool's processes instead, and
raise :class:`ProcessDied` within a fraction of a second of a death."""
import multiprocessing
from multiprocessing.pool import TERMINATE

from .errors import ProcessDied

POLL_SECONDS = 0.2


class PoolWatch:
    """The processes of ``pool`` (``pool._pool``: multiprocessing's, the same in every
    Python this package supports) from the watch's start on, replacements included: a
    pool never ends one itself before it is closed, so one that ended was killed, and
    whatever it held is lost. ``what`` names them in the error."""

    def __init__(self, pool, what):
        self.pool, self.what = pool, what
        self.processes = list(pool._pool)

    def check(self):
        """ProcessDied if a watched process ended."""
        dead = self.dead()
        if dead is not None:
            raise ProcessDied(self.what, dead.pid, dead.exitcode)

    def dead(self):
        """A watched process that ended (the pool then ended), or None."""
        for process in self.processes:
            if process.exitcode is not None:
                _end_pool(self.pool)
                return process
        self.processes += [p for p in self.pool._pool if p not in self.processes]
        return None

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
        except (OSError, EOFError):
            self.check()
            raise

    def each(self, results):
        """The items of ``pool.imap(...)`` in order, or ProcessDied."""
        while True:
            try:
                yield results.next(POLL_SECONDS)
            except multiprocessing.TimeoutError:
                self.check()
            except StopIteration:
                return


def _end_pool(pool):
    """End a pool one of whose processes was killed. ``pool.terminate()`` alone would
    wait forever: the killed one may have held the lock of the task queue (an idle worker
    holds it while it waits for a task) or of the result queue (while it sends one).
    With no process left, the locks are freed for the pool's own end."""
    if pool._state == TERMINATE:
        return
    pool._worker_handler._state = TERMINATE  # no replacements from here on
    pool._change_notifier.put(None)
    pool._worker_handler.join()
    for process in pool._pool:
        process.kill()
        process.join()
    for lock in (pool._inqueue._rlock, pool._outqueue._wlock):
        lock.acquire(False)
        lock.release()
    pool.terminate()
