"""Files that matter are written atomically: temporary file, fsync, rename, fsync dir.

A crash at any moment leaves either the old file or the new one, never half of one.
"""
import json
import os
import tempfile

import mxnet as mx
from mxnet import nd


def atomic_write(path, write):
    """Call ``write(tmp_path)`` then move the finished file to ``path`` atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path, obj):
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")
    atomic_write(path, write)


def save_parameters(net, path):
    """``net.save_parameters`` made atomic."""
    atomic_write(path, net.save_parameters)


class ParamSnapshot:
    """A host copy of a network's parameters, in ``save_parameters``'s naming, so the
    last good state can be written out after the live parameters have gone NaN."""

    def __init__(self, net):
        # Gluon's own structural names (what save_parameters writes and load_parameters reads).
        params = net._collect_params_with_prefix()  # pylint: disable=protected-access
        self.arrays = {name: p.data(p.list_ctx()[0]).copyto(mx.cpu()) for name, p in params.items()}

    def save(self, path):
        atomic_write(path, lambda tmp: nd.save(tmp, self.arrays))
