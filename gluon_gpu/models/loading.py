"""Loading saved parameters onto any device: gluon_gpu's files (today's and older
versions'), and files saved by the user's own code in either MXNet API."""
import json
import os

import mxnet as mx

from ..core.platform.errors import ParamsError, UserError
from ..core.state.compat import LAYOUT_BEFORE_0_3, upgrade_config, upgrade_lenet_keys
from ..core.step.array_api import forward_zeros
from ..core.step.members import member_count
from ..core.step.params import assign_parameters, last_line, read_parameter_file
from .fused_lenet import extract_member
from .init import fused_for
from .member_stack import MemberStack
from .zoo import get_model

DEFAULT_INPUT, DEFAULT_OUTPUTS = (1, 28, 28), 10  # FashionMNIST, where no run was recorded


def params_in(path, member=None):
    """The parameter file ``path`` names: itself, or for a run folder its ``best.params``
    (the best epoch by the run's monitor), else its ``net.params`` (the last); asked for a
    ``member``, its ``net.params`` (every member)."""
    if not os.path.isdir(path):
        return path
    for name in ("best.params", "net.params") if member is None else ("net.params",):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise ParamsError(f"{path} is a folder without best.params or net.params: not a finished run "
                      "(a stopped one continues with `resume`)")


def recorded_run(params_path):
    """What the run beside a params file recorded in its metrics.json: ``{'model',
    'members', 'layout', 'input_shape', 'outputs', 'data', 'sweep'}``; defaults (LeNet on
    FashionMNIST's shape) where there is no such file. Ensembles before 0.3 were fused.
    A sweep's net.params holds every member, its best.params the best member alone."""
    meta = os.path.join(os.path.dirname(os.path.abspath(params_path)), "metrics.json")
    found = {"model": "lenet", "members": 1, "layout": LAYOUT_BEFORE_0_3, "input_shape": DEFAULT_INPUT,
             "outputs": DEFAULT_OUTPUTS, "data": None, "sweep": False}
    try:
        with open(meta) as f:
            record = json.load(f)
        config = record["config"]
        members = len(record.get("sweep") or []) or int(config.get("ensemble", 1))
        if record.get("sweep") and os.path.basename(params_path) == "best.params":
            members = 1
        found.update(model=config["model"], members=members, layout=upgrade_config(config)["ensemble_layout"],
                     sweep=bool(record.get("sweep")))
        if record.get("data"):  # runs before 0.2 trained on FashionMNIST only
            found.update(input_shape=tuple(record["data"]["input_shape"]), outputs=record["data"]["outputs"],
                         data=record["data"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return found


def adapt_keys(model, members):
    """The key map for ``model``'s files of older gluon_gpu versions, or None."""
    return upgrade_lenet_keys if model == "lenet" and members == 1 else None


def load_model(path, ctx=None, model=None, members=None, input_shape=None, outputs=None, fused_conv="auto",
               member=None, arrays=None):
    """Load saved parameters onto ``ctx`` (a Context or a list) and return the network.

    ``model``, ``members`` (ensemble size), ``input_shape`` (one sample, channels first)
    and ``outputs`` default to what the run recorded beside the file, else LeNet on
    FashionMNIST's shape. Files saved in either MXNet API, by gluon_gpu or by the
    tutorial's own LeNet, load. The network is built in the API in force. A missing or
    corrupt file, or one of another architecture or shape, raises ParamsError.
    ``member``: member k of a saved ensemble or sweep, as the network it is alone.
    ``arrays``: the file's contents already read (``read_parameter_file``), for two
    networks from one version of a file a live run replaces."""
    net = _load(path, ctx, model, members, input_shape, outputs, fused_conv, arrays)
    if member is None:
        return net
    count = member_count(net)
    if not 0 <= member < count:
        raise UserError(f"`member` {member}: {path} holds " + (f"members 0 to {count - 1}" if count > 1 else
                                                              "one network, not an ensemble or sweep"))
    return extract_member(net, member, input_shape=tuple(input_shape or recorded_run(path)["input_shape"]))


def _load(path, ctx, model, members, input_shape, outputs, fused_conv, arrays):
    ctx = ctx if ctx is not None else mx.cpu()
    ctx = ctx if isinstance(ctx, (list, tuple)) else [ctx]
    run = recorded_run(path)
    same = model is None or model == run["model"]
    model = model or run["model"]
    members = members or (run["members"] if same else 1)
    input_shape = tuple(input_shape or run["input_shape"])
    outputs = outputs or run["outputs"]
    if arrays is None and not os.path.isfile(path):
        raise ParamsError(f"parameter file {path} does not exist")
    fused = fused_for(model, ctx, fused_conv)
    if members > 1 and (run["layout"] if same else "auto") != "fused":  # a MemberStack, on the first device
        ctx = ctx[:1]
        net = MemberStack([get_model(model, outputs, input_shape[0], fused=fused) for _ in range(members)],
                          ctx * members, input_shape[0])
    else:
        net = get_model(model, outputs, input_shape[0], members, fused)
    what = f"an ensemble of {members} {model}" if members > 1 else model
    arrays = read_parameter_file(path) if arrays is None else arrays
    adapt = adapt_keys(model, members)
    try:
        assign_parameters(net, adapt(arrays) if adapt else arrays, ctx, path)
        shape = (members * input_shape[0],) + input_shape[1:]
        for c in ctx:  # deferred shapes are only checked by a forward pass
            forward_zeros(net, shape, c).wait_to_read()
    except ParamsError as e:
        raise ParamsError(f"cannot load {path} as {what} for {_shape(input_shape)} inputs: "
                          f"{str(e).split(': ', 1)[-1]}") from None
    except (mx.base.MXNetError, AssertionError, ValueError, RuntimeError, UserError) as e:
        raise ParamsError(f"cannot load {path} as {what} for {_shape(input_shape)} inputs: "
                          f"{last_line(e)}") from None
    return net


def _shape(input_shape):
    return "x".join(str(d) for d in input_shape)
