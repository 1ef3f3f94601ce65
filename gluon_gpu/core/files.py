"""Files that matter are written atomically: temporary file, fsync, rename, fsync dir.

A crash at any moment leaves either the old file or the new one, never half of one.
"""
import fcntl
import json
import os
import tempfile

from .errors import UserError


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


def atomic_write(path, write):
    """Call ``write(tmp_path)`` then move the finished file to ``path`` atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, umask_mode(0o666))
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_path(directory)


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
    dies, however it dies, so a lock left by a dead process is simply taken over."""

    def __init__(self, directory):
        self.path = os.path.join(directory, ".lock")
        self._fd = None

    def __enter__(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UserError(f"run directory {os.path.dirname(self.path)} is in use by process {holder} "
                            "(another train or --resume); wait for it or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *_):
        os.close(self._fd)  # closing releases the lock; the file stays (harmless, reused)
