"""gluon_gpu: multi-device data-parallel training on Apache MXNet Gluon."""
__version__ = "0.1.0"

from .devices import devices, parse_devices  # noqa: E402
from .errors import UserError  # noqa: E402
from .models import get_model, load_model  # noqa: E402
from .parallel import DataParallel  # noqa: E402

__all__ = ["devices", "parse_devices", "DataParallel", "get_model", "load_model", "UserError"]
