"""Files that matter are written atomically: temporary file, fsync, rename, fsync dir.

A crash at any moment leaves either the old file or the new one, never half of one.
"""
import json
import os
import tempfile


def fsync_path(path):
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, write):
    """Call ``write(tmp_path)`` then move the finished file to ``path`` atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
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
