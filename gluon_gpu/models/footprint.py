"""A network's memory in training, estimated before anything is allocated: its
parameter count and the values its layers produce per sample, from shape inference
(no array is made, so a 20000x20000 input costs nothing to estimate)."""
import mxnet as mx
import numpy as np
from mxnet import gluon, nd

from ..core.platform.errors import UserError
from ..core.platform.memory import check_fits, size_text
from ..core.platform.walk import leaves
from ..core.step.array_api import legacy, model_is_np, semantics, to_api

BYTES = 4  # float32: the training state is float32 whatever --dtype casts the step to


def cannot_take(name, input_shape, error):
    """The UserError for a network ``name`` that cannot take inputs of ``input_shape``
    (an image smaller than its kernels and poolings leave room for: LeNet needs 12x12),
    with MXNet's reason from ``error``, not an MXNetError from deep in the graph."""
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    reason = lines[-1].split("MXNetError: ")[-1] if lines else type(error).__name__
    return UserError(f"`model` {name} cannot take inputs of {'x'.join(map(str, input_shape))}: {reason}; "
                     "resize the images (`image_size`) or choose another `model`")


def footprint(make_net, input_shape, name="your network"):
    """(parameters, activation values per sample) of the network ``make_net()`` returns,
    on inputs of ``input_shape`` (without the batch axis). A HybridBlock is traced as a
    symbol and its shapes inferred, whether initialized or not; any other block (an
    imperative Block) must be a throwaway copy: it is initialized on the CPU and one
    sample runs through forward hooks on its layers. Inputs the network ``name`` cannot
    take: :func:`cannot_take`."""
    net = make_net()
    is_np = model_is_np(net)
    if isinstance(net, gluon.HybridBlock):
        try:
            with semantics(is_np):
                internals = legacy(net(to_api(mx.sym.var("data"), is_np))).get_internals()
                arg_shapes, out_shapes, aux_shapes = internals.infer_shape(data=(1,) + tuple(input_shape))
        except mx.base.MXNetError as e:
            raise cannot_take(name, input_shape, e) from None
        inputs = set(internals.list_arguments()) | set(internals.list_auxiliary_states())
        activations = sum(int(np.prod(shape)) for name, shape in zip(internals.list_outputs(), out_shapes)
                          if name.endswith("_output") and name[:-len("_output")] not in inputs)
        params = sum(int(np.prod(shape)) for name, shape in zip(internals.list_arguments(), arg_shapes)
                     if name != "data") + sum(int(np.prod(shape)) for shape in aux_shapes)  # BatchNorm's statistics
        return params, activations
    counted = []

    def hook(_block, _inputs, output):
        arrays = output if isinstance(output, (list, tuple)) else [output]
        counted.append(sum(o.size for o in arrays if isinstance(o, (nd.NDArray, mx.np.ndarray))))
    for layer in leaves(net):
        layer.register_forward_hook(hook)
    with semantics(is_np):
        net.initialize()
        net(to_api(nd.zeros((1,) + tuple(input_shape)), is_np))
    return sum(p.data().size for p in net.collect_params().values()), sum(counted)


def training_bytes(params, activations, replicas, samples):
    """Training memory of ``replicas`` copies of a network (parameters four times each:
    weights, gradients, at most two optimizer states) and ``samples`` samples in flight
    (each layer's output three times: value, gradient, workspace)."""
    return BYTES * (4 * params * replicas + 3 * activations * samples)


def check_training_memory(make_net, input_shape, devices, batch_size, name, outputs=None):
    """Refuse, before it is initialized, the network ``name`` (``make_net()``) whose
    training state at ``batch_size``, split over ``devices``, cannot fit in their free
    memory. ``outputs``: its output count (classes), named since the last layer grows
    with it (a label of 10**6 makes a million classes)."""
    params, activations = footprint(make_net, input_shape, name)
    share = -(-batch_size // len(devices))
    what = (f"`model` {name} on inputs of {'x'.join(map(str, input_shape))} with batches of {batch_size} samples"
            + (f" and {outputs} outputs" if outputs else "")
            + f" ({size_text(training_bytes(params, activations, 0, 1))} of activations a sample)")
    check_fits({device: training_bytes(params, activations, 1, share) for device in devices}, what,
               "choose a smaller `batch_size` or `image_size`")
