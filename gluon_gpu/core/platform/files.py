"""Files that matter are written atomically: temporary file, fsync, rename, fsync dir.

A crash at any moment leaves either the old file or the new one, never half of one.
"""
import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile

from .errors import UserError, WriteError

FULL_BELOW = 1 << 20  # bytes free under which a failed write is put down to a full disk


def fsync_path(path):
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def umask_mode(mode):
    """``mode`` (0o666 files, 0o777 directories) less the process umask: what ``open`` and
    ``mkdir`` would give. ``mkstemp``/``mkdtemp`` create 0600/0700 whatever the umask, which
    kept a teammate from reading a run's files."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def write_failure(error, path):
    """A WriteError naming ``path`` and why, for an error raised while writing it, or
    None if ``error`` is not a write failure (a bug keeps its traceback). Libraries that
    write through C (MXNet's ``nd.save``) report a full disk as their own error, so the
    disk's free space is asked too; call this before removing the temporaries."""
    if isinstance(error, WriteError):  # a file inside ``path`` (a checkpoint directory)
        reason = error.reason
    elif isinstance(error, OSError):
        reason = error.strerror or str(error)
    else:
        try:
            full = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < FULL_BELOW
        except OSError:
            full = False
        if not full:
            return None
        reason = os.strerror(errno.ENOSPC)
    return WriteError(path, reason)


@contextlib.contextmanager
def write_guard(path):
    """Guard the writing of ``path``: the temporaries the body adds to the yielded list
    are removed if it fails however it fails, and a write failure becomes a WriteError."""
    temporaries = []
    try:
        yield temporaries
    except BaseException as e:
        failure = write_failure(e, path) if isinstance(e, Exception) else None
        for tmp in temporaries:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            elif os.path.exists(tmp):
                os.remove(tmp)
        if failure is None:
            raise
        raise failure from None


def atomic_write(path, write):
    """Call ``write(tmp_path)`` then move the finished file to ``path`` atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    with write_guard(path) as temporaries:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
        os.close(fd)
        temporaries.append(tmp)
        write(tmp)
        os.chmod(tmp, umask_mode(0o666))
        fsync_replace(tmp, path)


def fsync_replace(tmp, path):
    """Move the finished file ``tmp`` to ``path`` durably: its bytes on disk before the
    rename, the rename on disk after it."""
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def remove_temporaries(directory):
    """Remove the temporaries ``atomic_write`` left in ``directory`` when a kill cut it
    short (only the directory's one writer may call this)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(".") and name.endswith(".tmp"):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


def write_text(path, text):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


class RunLock:
    """An exclusive lock on a run directory for the life of its one writer: ``flock`` on
    ``DIR/.lock``, which names the holder's PID. The kernel drops the lock when the holder
    dies, however it dies, so a lock left by a dead process is simply taken over. A
    writer that ends normally removes the file while still holding the lock; a writer that
    locked a file removed meanwhile (it opened the old one) tries again on the new one."""

    def __init__(self, directory):
        self.path = os.path.join(directory, ".lock")
        self._fd = None

    def __enter__(self):
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise UserError(f"run directory {os.path.dirname(self.path)} is in use by process {holder} "
                                "(another train or `resume`); wait for it or choose another `out`") from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its holder removed it after we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *_):
        try:
            os.remove(self.path)  # still holding the lock: nobody else holds this file
        except OSError:
            pass
        os.close(self._fd)


def _holder(fd):
    """The PID a lock file names ("?" when it names none yet)."""
    return os.read(fd, 32).decode(errors="replace").strip() or "?"


def lock_holder(directory):
    """The PID of the process holding ``directory``'s :class:`RunLock`, or None. (The
    look takes a shared lock for an instant: a writer starting in that instant is told
    the run is in use.)"""
    try:
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)


def _same_file(fd, path):
    """Whether the open file ``fd`` is still the one at ``path``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def check_writable(path, what):
    """Create the folder ``path`` and prove it writable before any work is done, or a
    UserError naming ``what`` it is for; whether it was made here (so that work that
    fails can take it away again)."""
    made = not os.path.exists(path)
    try:
        os.makedirs(path, mode=umask_mode(0o777), exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UserError(f"cannot write {what} {path}: {e.strerror or e}") from None
    return made
