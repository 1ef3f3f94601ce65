"""Initializing a network as every gluon_gpu run does: seeded, the same values for a seed
whatever the process did before, shapes materialized by one forward pass."""
import numpy as np
import mxnet as mx

from ..core.errors import UserError
from ..core.modes import forward_zeros, model_is_np, semantics
from .zoo import get_model


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
    """Whether model ``name`` on ``ctx`` gets the fused conv operator under mode
    ``fused_conv`` (auto, on, off; see fused_conv.use_fused): LeNet and its ensembles only."""
    from .fused_conv import use_fused
    if name != "lenet":
        if fused_conv == "on":
            raise UserError(f"--fused-conv on applies to lenet only, not {name}")
        return False
    return use_fused(fused_conv, ctx)


def init_model(model, seed, ctx, input_shape=(1, 28, 28), outputs=10, members=1, fused_conv="auto"):
    """A network initialized on ``ctx`` with seeded Xavier: ``model`` is a zoo name (see
    get_model) or a user's Block (initialized here unless it already is). An ensemble's
    member k is initialized exactly as a single network with seed ``seed + k``."""
    if not isinstance(model, str):
        params = model.collect_params().values()
        if not all(p._data or p._deferred_init for p in params):  # pylint: disable=protected-access
            with semantics(model_is_np(model)):
                model.initialize(SeededXavier(seed), ctx=ctx)
        forward_zeros(model, input_shape, ctx[0])
        return model
    fused = fused_for(model, ctx, fused_conv)
    if members > 1:
        from .ensemble import combine_members
        get_model(model, outputs, input_shape[0], members)  # validates the name
        nets = [init_model(model, seed + k, ctx, input_shape, outputs, fused_conv="off") for k in range(members)]
        return combine_members(nets, ctx, fused, input_shape)
    mx.random.seed(seed)
    np.random.seed(seed)
    net = get_model(model, outputs, input_shape[0], fused=fused)
    net.initialize(SeededXavier(seed), ctx=ctx)
    forward_zeros(net, input_shape, ctx[0])
    return net
