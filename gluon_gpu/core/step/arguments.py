"""The public API's arguments checked where they come in (DataParallel, its step and
evaluate): one TypeError or ValueError naming the parameter, what it got and what it
takes, rather than MXNet's error from deep inside a step."""
import mxnet as mx
import numpy as np
from mxnet import gluon, nd

ARRAYS = (nd.NDArray, mx.np.ndarray)


def check_devices(ctx):
    """``ctx`` as a list of distinct contexts."""
    if isinstance(ctx, mx.Context):
        ctx = [ctx]
    if not isinstance(ctx, (list, tuple)) or not all(isinstance(c, mx.Context) for c in ctx):
        raise TypeError(f"ctx: a list of MXNet contexts (mx.cpu(0), mx.gpu(1), ...), got {ctx!r}")
    if not ctx:
        raise ValueError("ctx: at least one device, got an empty list")
    twice = sorted({str(c) for c in ctx if ctx.count(c) > 1})
    if twice:
        raise ValueError(f"ctx: {', '.join(twice)} given twice: each device holds one replica (mx.cpu(0), "
                         "mx.cpu(1), ... are distinct CPU devices)")
    return list(ctx)


def check_network(net):
    """A Gluon Block with parameters to train."""
    if not isinstance(net, gluon.Block):
        raise TypeError(f"net: a gluon.Block (a HybridBlock trains fastest), got {type(net).__name__}")
    if not any(p.grad_req != "null" for p in net.collect_params().values()):
        raise ValueError(f"net: {type(net).__name__} has no parameters to train")


def batch_arrays(data, label):
    """``(data, label)`` as MXNet arrays (a numpy batch converted: float64 to float32), or
    lists of per-device shards as given; the same number of samples in each."""
    if isinstance(data, (list, tuple)) and all(x is None or isinstance(x, ARRAYS) for x in data):
        if not isinstance(label, (list, tuple)) or len(data) != len(label):
            raise ValueError("data, label: per-device shards come as two lists of the same length")
        return data, label
    data, label = _array("data", data), _array("label", label)
    if data.ndim == 0 or label.ndim == 0 or data.shape[0] != label.shape[0]:
        raise ValueError(f"data, label: {data.shape[0] if data.ndim else 0} samples but "
                         f"{label.shape[0] if label.ndim else 0} labels; each batch needs one label per sample")
    return data, label


def _array(name, value):
    if isinstance(value, np.ndarray):
        return nd.array(value, dtype=np.float32 if value.dtype == np.float64 else value.dtype)
    if not isinstance(value, ARRAYS):
        raise TypeError(f"{name}: an MXNet or numpy array (or a list of per-device shards), got "
                        f"{type(value).__name__}")
    return value


def check_labels(label, classes):
    """Refuse class labels outside ``0..classes-1`` (a host read of the labels)."""
    shards = label if isinstance(label, (list, tuple)) else [label]
    values = np.concatenate([np.asarray(_host(y)).reshape(-1) for y in shards if y is not None] or [np.zeros(0)])
    bad = values[(values < 0) | (values >= classes) | (values != np.floor(values))]
    if bad.size:
        raise ValueError(f"label: {bad[0]:g} is no class of this head's {classes} (0 to {classes - 1})")


def _host(y):
    return y.asnumpy() if hasattr(y, "asnumpy") else y


def check_per_sample(head, out, y):
    """A custom head's loss and each metric give one value per sample of ``out``."""
    n = out.shape[0]
    figures = [("loss", head.loss_of(nd, out, y))] + [(f"metric {name!r}", fn(nd, out, y))
                                                      for name, fn in head.metrics.items()]
    for what, value in figures:
        if tuple(value.shape) != (n,):
            raise ValueError(f"head: its {what} gave shape {tuple(value.shape)} for {n} samples; a Head's loss and "
                             "metrics give one value per sample, shape (n,) (gluon.loss losses do; a mean over the "
                             "batch does not)")
