"""gluon_gpu: multi-device data-parallel training on Apache MXNet Gluon.

Layers (each imports only those before it): ``core`` (devices, the data-parallel step,
task heads, both MXNet APIs, checkpoints, the loop), ``data`` (datasets, pipelines) and
``models`` (LeNet, the zoo, ensembles, the fused operator, loading), then ``programs``
(train, evaluate, predict, bench, launch).
"""

from .core.version import __version__  # noqa: F401  (gluon_gpu.__version__)
from .core import environment  # noqa: E402  (imports no mxnet: it runs before mxnet starts)

environment.check()

from .core.devices import devices, parse_devices  # noqa: E402
from .core.errors import UserError  # noqa: E402
from .core.heads import Classification, Head, Regression  # noqa: E402
from .core.parallel import DataParallel  # noqa: E402
from .models import ensemble, get_model, load_model  # noqa: E402

__all__ = ["devices", "parse_devices", "DataParallel", "Head", "Classification", "Regression",
           "ensemble", "get_model", "load_model", "UserError"]
