"""Seed-parallel ensembles of any network: K independent members side by side.

Member k is an ordinary network (LeNet, a zoo network, a user's block) with its own
parameters, initialized as ``--seed seed+k`` alone initializes it, and living on one
device: with the layout ``devices`` member k lives on ``devices[k % D]`` (K not a
multiple of D: the first K mod D devices hold one member more; K < D: D - K devices
idle), with ``separate`` every member lives on the first device. No gradient crosses
devices: members are independent, so the only traffic is each member's input slice going
out and its output coming back.

The stack has the fused EnsembleLeNet's contract: input ``(B, K*C, ...)`` (member k's
sample in channels k*C..), output ``(B, K, outputs)``. It is an eager Block whose members
are hybridized each, so each device runs compiled graphs and Python only dispatches.
"""
import mxnet as mx
from mxnet import gluon, nd

from ..core.errors import UserError
from ..core.modes import legacy, model_is_np, semantics, to_api

LAYOUTS = ("auto", "devices", "fused", "separate")


class MemberStack(gluon.Block):
    """``nets[k]`` on ``devices[k]`` (initialized there already). ``places_itself``:
    DataParallel leaves the members where they are and feeds the stack on ``home``."""

    places_itself = True

    def __init__(self, nets, devices, channels, hybridize=True, **kwargs):
        super().__init__(**kwargs)
        self.members, self.channels = len(nets), channels
        self.devices, self.home = list(devices), devices[0]
        self.nets = list(nets)
        for k, net in enumerate(self.nets):
            self.register_child(net, str(k))
            if hybridize and isinstance(net, gluon.HybridBlock):
                net.hybridize(static_alloc=True, static_shape=True)

    def forward(self, x):  # pylint: disable=arguments-differ
        is_np = mx.util.is_np_array()
        x = legacy(x)
        outs = []
        for k, (net, device) in enumerate(zip(self.nets, self.devices)):
            part = nd.slice_axis(x, axis=1, begin=k * self.channels, end=(k + 1) * self.channels)
            member_np = model_is_np(net)
            with semantics(member_np):
                out = net(to_api(part.as_in_context(device), member_np))
            outs.append(legacy(out).as_in_context(self.home))
        with mx.util.np_array(False):
            return to_api(nd.stack(*outs, axis=1), is_np)


def member_devices(members, devices, layout):
    """The device of each member: round-robin over ``devices`` (``devices``) or all on
    the first (``separate``)."""
    return [devices[k % len(devices)] if layout == "devices" else devices[0] for k in range(members)]


def member_bytes(make_net, input_shape, batch_size):
    """One member's memory in training, estimated from a fresh copy (``make_net()``):
    its parameters four times (weights, gradients, at most two optimizer states) and every
    layer's output three times per sample of the batch (value, gradient, workspace)."""
    net = make_net()
    net.initialize()
    outputs = []

    def hook(_block, _inputs, output):  # also called on symbols while shapes are inferred: not counted
        arrays = output if isinstance(output, (list, tuple)) else [output]
        outputs.append(sum(o.size for o in arrays if isinstance(o, (nd.NDArray, mx.np.ndarray))))
    stack = [net]
    while stack:
        block = stack.pop()
        children = list(block._children.values())  # pylint: disable=protected-access
        if not children:
            block.register_forward_hook(hook)
        stack.extend(children)
    with semantics(model_is_np(net)):
        net(to_api(nd.zeros((1,) + tuple(input_shape)), model_is_np(net)))
    params = sum(p.data().size for p in net.collect_params().values())
    return 4 * (4 * params + 3 * sum(outputs) * batch_size)


def available_bytes(device):
    """Free memory for ``device``: the GPU's, or the host's (MemAvailable) for CPU contexts."""
    if device.device_type == "gpu":
        return mx.context.gpu_memory_info(device.device_id)[0]
    with open("/proc/meminfo") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))


def check_memory(make_net, members, devices, layout, input_shape, batch_size):
    """Refuse, before anything is allocated, an ensemble that cannot fit: members per
    device (CPU contexts share the host's memory) x ``member_bytes`` against the free
    memory (UserError, one line)."""
    per_member = member_bytes(make_net, input_shape, batch_size)
    if devices[0].device_type == "cpu" or layout == "separate":
        loads = {devices[0]: members}
    else:  # fused: every device holds every member; devices: round-robin
        placed = member_devices(members, devices, "devices")
        loads = {d: members if layout == "fused" else placed.count(d) for d in devices}
    for device, count in loads.items():
        need, free = count * per_member, available_bytes(device)
        if need > free:
            raise UserError(f"--ensemble {members}: about {need / 2**30:.1f} GiB for {count} members of "
                            f"{per_member / 2**20:.0f} MiB (parameters, optimizer state, activations of a "
                            f"batch of {batch_size}) on {device}, which has {free / 2**30:.1f} GiB free; "
                            "train fewer members at once, or a smaller --batch-size")
