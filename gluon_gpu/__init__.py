"""gluon_gpu: multi-device data-parallel training on Apache MXNet Gluon.

Layers (each imports only those before it): ``core`` (devices, the data-parallel step,
task heads, both MXNet APIs, checkpoints, the loop), ``data`` (datasets, pipelines) and
``models`` (LeNet, the zoo, ensembles, the fused operator, loading), then ``programs``
(train, evaluate, predict, bench, launch).

``import gluon_gpu`` starts nothing: the names below are imported on first use, after a
check of the environment variables MXNet reads when it starts (a bad one is a
UserError naming it, where MXNet would abort or hang), and OpenMP's threads fitted to
a CPU quota when MXNet is not imported yet (environment.fit_threads_to_cpu_quota).
"""
import importlib

from .core.platform import environment
from .core.state.version import __version__  # noqa: F401  (gluon_gpu.__version__)

_API = {"devices": "core.platform.devices", "parse_devices": "core.platform.devices", "DataParallel": "core.step.parallel",
        "Batch": "core.step.batch",
        "Head": "core.step.heads", "Classification": "core.step.heads", "Regression": "core.step.heads",
        "UserError": "core.platform.errors", "ensemble": "models", "get_model": "models", "load_model": "models"}
__all__ = list(_API)


def __getattr__(name):
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    environment.check()
    environment.fit_threads_to_cpu_quota()
    value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    globals()[name] = value
    return value
