"""Models: the tutorial's LeNet, gluoncv model-zoo networks, and loading saved parameters."""
import json
import os

import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn

from .errors import ParamsError, UserError

INPUT_SHAPE = (1, 1, 28, 28)
# gluoncv zoo networks whose stems accept 1x28x28 input (CIFAR-style: 3x3 stem, global pool).
ZOO_MODELS = ("cifar_resnet20_v1", "cifar_resnet20_v2", "cifar_resnet56_v1",
              "cifar_wideresnet16_10", "cifar_resnext29_16x64d")


def lenet():
    """LeNet exactly as in MXNet's 'Use GPUs' tutorial, hybridizable."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=3, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Flatten(),
            nn.Dense(120, activation="relu"),
            nn.Dense(84, activation="relu"),
            nn.Dense(10))
    return net


def model_names():
    return ("lenet",) + ZOO_MODELS


def get_model(name="lenet", classes=10):
    """A fresh, uninitialized network by name: 'lenet' or a gluoncv zoo name in ZOO_MODELS."""
    if name == "lenet":
        return lenet()
    if name not in ZOO_MODELS:
        raise UserError(f"unknown model {name!r}: choose one of {', '.join(model_names())}")
    from gluoncv import model_zoo  # imported lazily: gluoncv is slow to import
    return model_zoo.get_model(name, classes=classes)


def model_name_beside(params_path, default="lenet"):
    """The model name recorded in the run's metrics.json next to a params file, if any."""
    meta = os.path.join(os.path.dirname(os.path.abspath(params_path)), "metrics.json")
    try:
        with open(meta) as f:
            return json.load(f)["config"]["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return default


def load_model(path, ctx=None, model=None):
    """Load saved parameters onto ``ctx`` (a Context or a list) and return the network.

    ``model`` defaults to the name recorded beside the file, else 'lenet'. A missing
    file, a corrupt one, or one saved from another architecture raises ParamsError.
    """
    ctx = ctx if ctx is not None else mx.cpu()
    ctx = ctx if isinstance(ctx, (list, tuple)) else [ctx]
    model = model or model_name_beside(path)
    if not os.path.isfile(path):
        raise ParamsError(f"parameter file {path} does not exist")
    net = get_model(model)
    try:
        net.load_parameters(path, ctx=ctx)
        for c in ctx:  # deferred shapes are only checked by a forward pass
            net(mx.nd.zeros(INPUT_SHAPE, ctx=c)).wait_to_read()
    except (mx.base.MXNetError, AssertionError, ValueError, RuntimeError) as e:
        raise ParamsError(f"cannot load {path} as {model}: {_last_line(e)}") from None
    return net


def _last_line(error):
    """MXNet errors carry a C++ traceback; the reason is the last non-empty line."""
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]
