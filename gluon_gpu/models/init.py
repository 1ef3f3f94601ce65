"""Initializing a network as every gluon_gpu run does: seeded, the same values for a seed
whatever the process did before, shapes materialized by one forward pass."""
import os

import mxnet as mx
import numpy as np

from ..core.platform.devices import THREAD_VARIABLES, cpu_contexts, thread_settings
from ..core.platform.errors import UserError
from ..core.step.array_api import forward_zeros, model_is_np, semantics
from .footprint import cannot_take, check_training_memory
from .member_stack import LAYOUTS, MemberStack, check_memory, member_devices
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
            raise UserError(f"`fused_conv` on applies to lenet's convolutions and to the gather of a geometric "
                            f"`augment` (flip, crop, ...); this run has neither ({name}, no such augmentation)")
        return False
    return use_fused(fused_conv, ctx)


def init_model(model, seed, ctx, input_shape=(1, 28, 28), outputs=10, members=1, fused_conv="auto",
               layout="auto", hybridize=True, batch_size=None, seeds=None, apart=None, spread=None):
    """A network initialized on ``ctx`` with seeded Xavier: ``model`` is a zoo name (see
    get_model) or a user's Block (initialized here unless it already is). An ensemble's
    member k is initialized exactly as a single network with seed ``seed + k`` (or
    ``seeds[k]``); ``layout`` (ensemble_layout) lays the members out over ``ctx``, once
    ``batch_size`` (if given) shows they fit in memory (as it must for a single network
    too); ``apart``: see MemberStack; ``spread``: see ensemble."""
    if not isinstance(model, str):
        if batch_size and isinstance(model, mx.gluon.HybridBlock):  # an imperative Block: first_pass tells
            check_training_memory(lambda: model, input_shape, ctx, batch_size, "your network")
        params = model.collect_params().values()
        if not all(p._data or p._deferred_init for p in params):  # pylint: disable=protected-access
            with semantics(model_is_np(model)):
                model.initialize(SeededXavier(seed), ctx=ctx)
        first_pass(model, input_shape, ctx[0], "your network")
        return model
    if members > 1:
        return ensemble(model, members, ctx, seed, input_shape, outputs, layout, fused_conv, hybridize, batch_size,
                        seeds, apart, spread)
    if batch_size:
        check_training_memory(lambda: get_model(model, outputs, input_shape[0]), input_shape, ctx, batch_size, model,
                              outputs)
    seed_generators(seed)
    return zoo_network(model, seed, ctx, input_shape, outputs, fused_conv)


def zoo_network(model, seed, ctx, input_shape, outputs, fused_conv):
    """Zoo network ``model`` initialized on ``ctx`` from ``seed``, the generators untouched."""
    net = get_model(model, outputs, input_shape[0], fused=fused_for(model, ctx, fused_conv))
    net.initialize(SeededXavier(seed), ctx=ctx)
    first_pass(net, input_shape, ctx[0], model)
    return net


def seed_generators(seed):
    """Seed MXNet's and numpy's global generators (dropout, augmentation), once a run: MXNet
    reseeds every state of its pool, up to 72 of a few MiB each for an ensemble
    (member_stack.ensemble_variables), so seeding for each member of a 500-member sweep
    took most of its dry run."""
    mx.random.seed(seed)
    np.random.seed(seed)


def first_pass(net, input_shape, ctx, name):
    """The forward pass that materializes ``net``'s shapes; an input it cannot take is
    one UserError (footprint.cannot_take)."""
    try:
        forward_zeros(net, input_shape, ctx)
        mx.nd.waitall()
    except mx.base.MXNetError as e:
        raise cannot_take(name, input_shape, e) from None


def ensemble(model, members, ctx, seed=0, input_shape=(1, 28, 28), outputs=10, layout="auto",
             fused_conv="auto", hybridize=True, batch_size=None, seeds=None, apart=None, spread=None):
    """``members`` independently seeded copies of a network, trained at once: ``model`` is
    a zoo name or a function that returns a fresh (uninitialized) network. Member k is
    initialized exactly as ``init_model(model, seeds[k], ...)`` alone (default seeds:
    ``seed + k``); ``layout`` (ensemble_layout) places the members on ``ctx``; ``apart``:
    see MemberStack. Input ``(B, K*C, ...)``, output ``(B, K, outputs)``: train it with
    DataParallel and a pipeline of ``members=K``. ``batch_size``: first check that the
    members fit in memory at that batch size. ``spread=(owners, rank)``: the members are
    spread over a distributed job's workers (core/step/spread_members.py), this process's
    dealt over ``ctx`` as ``layout`` says, the others (which it holds, never trains) on
    the first device in groups of their own."""
    layout = ensemble_layout(layout, model, ctx)
    seeds = list(seeds) if seeds is not None else [seed + k for k in range(members)]
    if batch_size:
        check_memory(member_factory(model, input_shape, outputs), members, ctx, layout, input_shape, batch_size,
                     model if isinstance(model, str) else "your network")

    if isinstance(model, str):
        seed_generators(seeds[-1])  # as after initializing the last member alone
    if layout == "fused":
        nets = [_member(model, seeds[k], ctx, input_shape, outputs, "off") for k in range(members)]
        if model == "lenet":
            from .fused_lenet import combine_members
            return combine_members(nets, ctx, fused_for(model, ctx, fused_conv), input_shape)
        from .fused_members import fuse
        return fuse(nets, member_factory(model, input_shape, outputs), ctx, input_shape)
    owners, rank = spread or ([0] * members, 0)
    mine = [k for k in range(members) if owners[k] == rank]
    dealt = dict(zip(mine, member_devices(len(mine), ctx, layout)))
    devices = [dealt.get(k, ctx[0]) for k in range(members)]
    nets = [_member(model, seeds[k], [devices[k]], input_shape, outputs, fused_conv) for k in range(members)]
    keys = [(owner, key) for owner, key in zip(owners, apart or [None] * members)]  # no group spans two workers
    stack = MemberStack(nets, devices, input_shape[0], hybridize, layout, keys)
    if spread:
        stack.owners, stack.rank = owners, rank
    return stack


def _member(model, seed, ctx, input_shape, outputs, fused_conv):
    """An ensemble's member: zoo network ``model`` (the generators untouched: the ensemble
    seeds them once), or a fresh network from the function ``model``, initialized."""
    if isinstance(model, str):
        return zoo_network(model, seed, ctx, input_shape, outputs, fused_conv)
    return init_model(model(), seed, ctx, input_shape)


def member_factory(model, input_shape, outputs):
    """A function that builds a fresh, uninitialized member: ``model`` itself when it is one."""
    return model if not isinstance(model, str) else lambda: get_model(model, outputs, input_shape[0])


def ensemble_layout(layout, model, ctx, engine_threads=0):
    """The members' layout for ``--ensemble-layout``: ``auto`` gives each device its own
    members (``devices``) on several devices. On one CPU context with several engine
    workers (``engine_threads``, else this process's) it runs the members side by side
    (``separate``), the workers taking their graphs at once; with one worker, or on one
    GPU (not measured), it trains them in turns (``sequential``): the benchmark found
    every layout that runs members side by side on one worker slower than one after
    another (README "Seed-parallel ensembles"). ``fused``: one network of all members,
    layer by layer (LeNet's in fused_lenet.py, any other's in fused_members.py); a network
    with a layer of a kind it has no fused form of is refused naming that layer."""
    if layout not in LAYOUTS:
        raise UserError(f"unknown `ensemble_layout` {layout!r}: choose one of {', '.join(LAYOUTS)}")
    if layout == "auto":
        if len(ctx) > 1:
            return "devices"
        workers = engine_threads or thread_settings()["engine_threads"]
        return "separate" if ctx[0].device_type == "cpu" and workers > 1 else "sequential"
    if layout == "fused" and model != "lenet":
        from .fused_members import unfusable_layer
        why = unfusable_layer(member_factory(model, (1, 28, 28), 10)())
        if why:
            name = model if isinstance(model, str) else "your network"
            raise UserError(f"`ensemble_layout` fused: {name} cannot be fused: {why}; the fused layout takes "
                            "convolutions, BatchNorm and Dense layers: use `ensemble_layout` devices, separate "
                            "or sequential")
    return layout


def ensemble_engine_workers(members, layout, ctx):
    """The engine workers per CPU context an ensemble of ``members`` is started with when
    neither --engine-threads nor MXNET_CPU_WORKER_NTHREADS says (0: leave MXNet's one).
    On one CPU context the members run side by side (``auto``, ``separate``) only on
    several workers, a graph each: one worker per core's worth of OpenMP threads, at most
    one per member. Several contexts keep the cores busy with one worker each (two each
    measured slower: README "Seed-parallel ensembles")."""
    if (members < 2 or layout not in ("auto", "separate") or len(ctx) != 1 or ctx[0].device_type != "cpu"
            or THREAD_VARIABLES["engine_threads"] in os.environ):
        return 0
    workers = min(members, cpu_contexts())
    return workers if workers > 1 else 0
