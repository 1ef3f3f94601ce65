"""Optional packages gluon_gpu uses when they are installed: whether they are, without
importing them, and the one line that says how to install one that is missing."""
import importlib.util

from .errors import UserError

HOROVOD_INSTALL = "make horovod (docs/install.md: it builds Horovod with MXNet and Gloo once, 10 to 20 minutes)"


def require_horovod(what):
    """Refuse ``what`` (a flag and its value) in one UserError where Horovod for MXNet is
    not installed. Imports nothing of Horovod: see core/step/horovod_store.py for why."""
    if importlib.util.find_spec("horovod") is None or importlib.util.find_spec("horovod.mxnet") is None:
        raise UserError(f"{what} needs Horovod built for MXNet, which this Python lacks: {HOROVOD_INSTALL}")
