"""Models: the tutorial's LeNet, gluoncv model-zoo networks, and loading saved parameters."""
import json
import os

import numpy as np
import mxnet as mx
from mxnet.gluon import nn

from .errors import ParamsError, UserError

INPUT_SHAPE = (1, 1, 28, 28)
# gluoncv zoo networks whose stems accept 1x28x28 input (CIFAR-style: 3x3 stem, global pool).
ZOO_MODELS = ("cifar_resnet20_v1", "cifar_resnet20_v2", "cifar_resnet56_v1",
              "cifar_wideresnet16_10", "cifar_resnext29_16x64d")


def lenet(fused=False):
    """LeNet exactly as in MXNet's 'Use GPUs' tutorial, hybridizable.

    ``fused=True``: each conv -> ReLU -> max-pool pair runs as one compiled CPU operator
    (see fused_conv.py; the operator must be loaded) with the same parameters, names and
    file keys, and the same initial values for the same seed.

    The layers are made inside the net's name scope, so their parameter names do not
    depend on how many layers the process made before. That matters: ``gluon.Trainer``
    numbers parameters by sorted name and ``save_states`` stores optimizer state by that
    number, so with global names (conv9 vs conv10 sort differently) a resume in another
    process state would hand one layer's momentum to another."""
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(*conv_stages(1, fused))
        net.add(nn.Flatten(),
                nn.Dense(120, activation="relu"),
                nn.Dense(84, activation="relu"),
                nn.Dense(10))
    return net


def conv_stages(members=1, fused=False):
    """LeNet's two conv -> ReLU -> max-pool stages, for ``members`` LeNets side by side
    (channel groups, as in an ensemble), as four blocks to make inside the caller's name
    scope: Conv2D, MaxPool2D, Conv2D, MaxPool2D; with ``fused``, each conv + pool pair is
    one ConvReluPool followed by a PooledAbove where the pool stood (same parameters)."""
    k = members
    if fused:
        from .fused_conv import ConvReluPool, PooledAbove
        return (ConvReluPool(6 * k, 5, in_channels=k, groups=k, data_grad=False), PooledAbove(),
                ConvReluPool(16 * k, 3, in_channels=6 * k, groups=k), PooledAbove())
    return (nn.Conv2D(6 * k, 5, groups=k, in_channels=k, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(16 * k, 3, groups=k, in_channels=6 * k, activation="relu"),
            nn.MaxPool2D(pool_size=2, strides=2))


def model_names():
    return ("lenet",) + ZOO_MODELS


def get_model(name="lenet", classes=10, members=1, fused=False):
    """A fresh, uninitialized network by name: 'lenet' or a gluoncv zoo name in ZOO_MODELS;
    ``members > 1``: an EnsembleLeNet of that many members. ``fused``: LeNet (or the
    ensemble) with the fused conv operator (other networks ignore it)."""
    if members > 1:
        if name != "lenet":
            raise UserError(f"--ensemble supports lenet only, not {name}")
        from .ensemble import EnsembleLeNet
        return EnsembleLeNet(members, fused)
    if name == "lenet":
        return lenet(fused)
    if name not in ZOO_MODELS:
        raise UserError(f"unknown model {name!r}: choose one of {', '.join(model_names())}")
    from gluoncv import model_zoo  # imported lazily: gluoncv is slow to import
    return model_zoo.get_model(name, classes=classes)


def input_shape(members=1):
    return INPUT_SHAPE if members == 1 else (1, members, 28, 28)


class SeededXavier(mx.init.Xavier):
    """MXNet's default Xavier (uniform, fan average, magnitude 3), drawn by numpy from
    ``seed``, in the order the parameters are initialized.

    Why not MXNet's own draws: its random operators take generator copies from a pool
    (MXNET_CPU_PARALLEL_RAND_COPY, which devices.py raises so that CPU contexts stop
    waiting for each other) handed out round-robin, so the values a seed gives depend on
    how many random or extension operators the process ran before; a numpy generator's
    do not. The fused and the standard LeNet start from the same values."""

    def __init__(self, seed):
        super().__init__(rnd_type="uniform", factor_type="avg", magnitude=3)
        self._rng = np.random.default_rng(seed)

    def _init_weight(self, name, arr):
        shape = arr.shape
        if len(shape) < 2:
            raise ValueError(f"Xavier initializer cannot be applied to vector {name}")
        receptive = int(np.prod(shape[2:]))
        scale = np.sqrt(self.magnitude / ((shape[1] + shape[0]) * receptive / 2.0))
        arr[:] = self._rng.uniform(-scale, scale, shape).astype(np.float32)


def fused_for(name, ctx, fused_conv="auto"):
    """Whether ``name`` on ``ctx`` gets the fused conv operator under mode ``fused_conv``
    (auto, on, off; see fused_conv.use_fused): LeNet and its ensembles only."""
    from .fused_conv import use_fused
    if name != "lenet":
        if fused_conv == "on":
            raise UserError(f"--fused-conv on applies to lenet only, not {name}")
        return False
    return use_fused(fused_conv, ctx)


def init_model(name, seed, ctx, members=1, fused_conv="auto"):
    """A network initialized as every gluon_gpu run does it: seeded Xavier on ``ctx``,
    parameters materialized by one forward pass. An ensemble's member k is initialized
    exactly as a single network with seed ``seed + k``."""
    fused = fused_for(name, ctx, fused_conv)
    if members > 1:
        from .ensemble import combine_members
        get_model(name, members=members)  # validates the name
        nets = [init_model(name, seed + k, ctx, fused_conv="off") for k in range(members)]
        return combine_members(nets, ctx, fused)
    mx.random.seed(seed)
    np.random.seed(seed)
    net = get_model(name, fused=fused)
    net.initialize(SeededXavier(seed), ctx=ctx)
    net(mx.nd.zeros(INPUT_SHAPE, ctx=ctx[0]))
    return net


def recorded_model(params_path, default="lenet"):
    """``(model name, ensemble size)`` recorded in the run's metrics.json next to a params
    file, else ``(default, 1)``."""
    meta = os.path.join(os.path.dirname(os.path.abspath(params_path)), "metrics.json")
    try:
        with open(meta) as f:
            config = json.load(f)["config"]
        return config["model"], int(config.get("ensemble", 1))
    except (OSError, ValueError, KeyError, TypeError):
        return default, 1


def load_model(path, ctx=None, model=None, members=None, fused_conv="auto"):
    """Load saved parameters onto ``ctx`` (a Context or a list) and return the network.

    ``model`` and ``members`` (ensemble size) default to what the run recorded beside the
    file, else 'lenet' and 1. A missing file, a corrupt one, or one saved from another
    architecture or ensemble size raises ParamsError. ``fused_conv``: see init_model.
    """
    ctx = ctx if ctx is not None else mx.cpu()
    ctx = ctx if isinstance(ctx, (list, tuple)) else [ctx]
    recorded, recorded_members = recorded_model(path)
    model = model or recorded
    members = members or (recorded_members if model == recorded else 1)
    if not os.path.isfile(path):
        raise ParamsError(f"parameter file {path} does not exist")
    net = get_model(model, members=members, fused=fused_for(model, ctx, fused_conv))
    if members > 1:
        model = f"an ensemble of {members} {model}"
    try:
        net.load_parameters(path, ctx=ctx)
        for c in ctx:  # deferred shapes are only checked by a forward pass
            net(mx.nd.zeros(input_shape(members), ctx=c)).wait_to_read()
    except (mx.base.MXNetError, AssertionError, ValueError, RuntimeError) as e:
        raise ParamsError(f"cannot load {path} as {model}: {_last_line(e)}") from None
    return net


def _last_line(error):
    """MXNet errors carry a C++ traceback; the reason is the last non-empty line."""
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]
