"""The data-parallel step, usable from any loop:

    dp = DataParallel(net, ctx, "sgd", {"learning_rate": 0.1})
    for data, label in loader:
        dp.step(data, label)             # split, forward+backward on every device, update
    print(dp.read_metrics())            # the only host sync: mean loss and metrics

Two strategies behind one interface (base.Step): a network replicated on every device
(replicated.py), or an ensemble whose members sit on their own devices (placed.py).
The task head (heads.py) and input transform are passed in; the network may use either
MXNet API (array_api.py); a distributed job's workers agree through coordination.py.
"""
from .arguments import check_devices
from .members import PlacedMembers
from .placed import PlacedStep
from .replicated import ReplicatedStep


def DataParallel(net, ctx=None, *args, **kwargs):  # pylint: disable=invalid-name (the public name of a class's maker)
    """The step strategy for ``net`` on ``ctx``: its members where they are when it places
    them itself (a PlacedMembers: ``ctx`` None or its devices), else replicated on ``ctx``.
    The arguments: base.Step."""
    if isinstance(net, PlacedMembers):
        return PlacedStep(net, ctx, *args, **kwargs)
    if ctx is None:
        raise ValueError("ctx: the devices to replicate the network on (a list of contexts)")
    return ReplicatedStep(net, check_devices(ctx), *args, **kwargs)
