"""Parameter files: one format that both MXNet APIs read, and a reader for both formats.

Gluon's ``save_parameters`` writes with the semantics in force: a numpy-API model saved
under ``npx.set_np()`` gives a file legacy code refuses ("ndarray was saved in np shape
semantics"), while numpy-API code reads legacy files. So gluon_gpu always writes the
legacy format (readable by ``net.load_parameters`` in either API) and reads both.
"""
import mxnet as mx
from mxnet import nd

from ..platform.errors import ParamsError
from ..platform.files import atomic_write
from .array_api import legacy, model_is_np, semantics


def parameter_arrays(net):
    """``{structural name: legacy NDArray on the CPU}``, the names ``save_parameters``
    writes and ``load_parameters`` reads; values from the first device (replicas agree)."""
    params = net._collect_params_with_prefix()  # pylint: disable=protected-access
    return {name: legacy(p.data(p.list_ctx()[0])).copyto(mx.cpu()) for name, p in params.items()}


def save_arrays(arrays, path):
    """``arrays`` (name -> legacy NDArray) to ``path`` in the legacy format, atomically."""
    atomic_write(path, lambda tmp: nd.save(tmp, arrays))


def save_parameters(net, path):
    """``net.save_parameters(path)``, atomic and in the format both APIs read."""
    save_arrays(parameter_arrays(net), path)


class ParamSnapshot:
    """A host copy of a network's parameters, so the last good state can be written out
    after the live parameters have gone NaN."""

    def __init__(self, net):
        self.arrays = parameter_arrays(net)

    def save(self, path):
        save_arrays(self.arrays, path)


def read_parameter_file(path):
    """``{name: legacy NDArray}`` from a file saved in either API's semantics."""
    try:
        loaded = _load(path, is_np=False)
    except mx.base.MXNetError as e:
        if "np shape semantics" not in str(e) and "is_np_shape" not in str(e):
            raise ParamsError(f"cannot load {path}: {last_line(e)}") from None
        try:
            loaded = _load(path, is_np=True)
        except mx.base.MXNetError as e2:
            raise ParamsError(f"cannot load {path}: {last_line(e2)}") from None
    if not isinstance(loaded, dict) or not loaded:
        raise ParamsError(f"{path} holds no named parameters")
    return {name: legacy(array) for name, array in loaded.items()}


def _load(path, is_np):
    with semantics(is_np):
        return mx.npx.load(path) if is_np else nd.load(path)


def assign_parameters(net, arrays, ctx, source="the file"):
    """Load ``arrays`` (structural name -> NDArray) into ``net`` on ``ctx``, in the net's
    own API; every parameter must be there with its shape, and nothing else (ParamsError).
    Initialized parameters keep their devices (an ensemble's members live on several)."""
    params = net._collect_params_with_prefix()  # pylint: disable=protected-access
    missing = sorted(set(params) - set(arrays))
    extra = sorted(set(arrays) - set(params))
    if missing or extra:
        what = f"lacks {', '.join(missing[:4])}" if missing else f"has {', '.join(extra[:4])} the network lacks"
        raise ParamsError(f"{source} does not fit this network: it {what}")
    is_np = model_is_np(net)
    with semantics(is_np):
        for name, param in params.items():
            value = arrays[name]
            known = param.shape and all(d > 0 for d in param.shape)  # deferred shapes take the file's
            if known and tuple(param.shape) != value.shape:
                raise ParamsError(f"{source} does not fit this network: {name} has shape {value.shape}, "
                                  f"the network's is {tuple(param.shape)}")
            try:
                where = None if param._data is not None else ctx  # pylint: disable=protected-access
                param._load_init(value.as_np_ndarray() if is_np else value, where)  # pylint: disable=protected-access
            except AssertionError as e:
                raise ParamsError(f"{source} does not fit this network: {last_line(e)}") from None


def last_line(error):
    """MXNet errors carry a C++ traceback; the reason is the last non-empty line."""
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]


def place(block, ctx, initializer):
    """Initialize ``block`` on ``ctx``, or move its initialized parameters there."""
    try:
        initialized = all(p.list_ctx() for p in block.collect_params().values())
    except RuntimeError:
        initialized = False
    if initialized:
        block.collect_params().reset_ctx(ctx)
    else:
        block.initialize(initializer, ctx=ctx)
