"""Writing a Servable where models are served, and reading it back to check it.

Two formats: MXNet's symbol + params pair (``HybridBlock.export``'s files, which MXNet's
C++ and Java/DJL front ends and model servers load), and ONNX (onnxruntime and every
serving stack), converted from that pair by MXNet's own exporter (``mx.onnx``). The
input and output are named (``images`` or ``features``; ``probabilities`` or
``prediction``) and the ONNX file carries the class names in its metadata.
"""
import contextlib
import json
import os
import re
import warnings

import mxnet as mx
import numpy as np
from mxnet import gluon

from ..core.platform.errors import UserError
from ..core.state.version import __version__
from ..core.step.params import last_line

# mx2onnx (MXNet 1.9.1) translates operators for ONNX opsets 12 and 13 only. It would
# stamp the file with the newest opset the installed onnx knows, and check its graph
# against it (onnx 1.15: opset 20, where ReduceMean's `axes` is no longer an attribute).
OPSET = 13
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # exported outputs against the trained network's
_NO_CONVERSION = re.compile(r"No conversion function registered for op type (\S+) yet")


class ExportError(UserError):
    """A network that cannot be exported to a format (an operator without a conversion)."""


class CheckFailed(Exception):
    """An exported model whose outputs differ from the trained network's: an exporter
    fault, not the user's (exit status 1); nothing was written."""


def names_for(spec):
    """``(input name, output name)`` of a served model for data ``spec``."""
    return ("images" if len(spec.input_shape) == 3 else "features",
            "probabilities" if spec.task == "classify" else "prediction")


def write_symbol(servable, prefix, spec):
    """``prefix-symbol.json`` and ``prefix-0000.params`` of ``servable``, input and
    output named by :func:`names_for`."""
    input_name, output_name = names_for(spec)
    sym = mx.sym.identity(servable(mx.sym.var(input_name, dtype=spec.dtype)), name=output_name)
    args, aux = set(sym.list_arguments()), set(sym.list_auxiliary_states())
    arrays = {}
    for name, param in servable.collect_params().items():
        kind = "arg" if name in args else "aux" if name in aux else None
        if kind:
            arrays[f"{kind}:{name}"] = param.data(mx.cpu())
    sym.save(prefix + "-symbol.json")
    mx.nd.save(prefix + "-0000.params", arrays)
    return prefix + "-symbol.json", prefix + "-0000.params"


def write_onnx(symbol_file, params_file, path, spec, metadata):
    """``path``: the ONNX model of the MXNet pair, the batch size left free, initializers
    kept out of the graph's inputs (onnxruntime folds them only then), ``metadata``
    (str -> str) in its properties. An operator MXNet cannot convert is an ExportError
    naming it."""
    import onnx
    from mxnet.onnx.mx2onnx._export_helper import load_module
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
    sym, params = load_module(symbol_file, params_file)
    dtype = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    try:
        with _checker_opset(onnx.checker.DEFAULT_CONTEXT, OPSET):
            graph = MXNetGraph().create_onnx_graph_proto(
                sym, params, [(1,) + tuple(spec.input_shape)], [dtype], opset_version=OPSET, dynamic=True,
                dynamic_input_shapes=[(None,) + tuple(spec.input_shape)])
    except (AttributeError, NotImplementedError, ValueError, onnx.checker.ValidationError) as e:
        found = _NO_CONVERSION.search(str(e))
        if found:
            raise ExportError(f"cannot export to ONNX: MXNet {mx.__version__}'s ONNX exporter has no conversion for "
                              f"operator {found[1]} (the MXNet format alone exports it: `formats` mxnet)") from None
        raise ExportError(f"cannot export to ONNX: {last_line(e)}") from None
    constants = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in constants]
    del graph.input[:]
    graph.input.extend(inputs)
    # mx2onnx leaves initializers no node reads (softmax's unused label), which onnxruntime
    # warns about in colour at every session it opens
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
                                   producer_name="gluon_gpu", producer_version=__version__)
    onnx.helper.set_model_props(model, metadata)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@contextlib.contextmanager
def _checker_opset(context, opset):
    saved = context.opset_imports
    context.opset_imports = {"": opset}
    try:
        yield
    finally:
        context.opset_imports = saved


def mxnet_outputs(symbol_file, params_file, spec, x):
    """The MXNet pair's outputs for stored samples ``x``, as a model server loads it."""
    input_name, _ = names_for(spec)
    with warnings.catch_warnings():  # MXNet's: imports() declares no input type, so infer_type warns
        warnings.simplefilter("ignore", UserWarning)
        net = gluon.SymbolBlock.imports(symbol_file, [input_name], params_file, ctx=mx.cpu())
    return net(mx.nd.array(x, dtype=spec.dtype)).asnumpy()


def onnx_outputs(path, spec, x):
    """The ONNX model's outputs for stored samples ``x``, in onnxruntime."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {names_for(spec)[0]: np.asarray(x, dtype=spec.dtype)})[0]


def check_outputs(what, got, expected):
    """The largest ``|got - expected|``; CheckFailed past :data:`TOLERANCE`."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        raise CheckFailed(f"{what} gives outputs of shape {got.shape}, the trained network {expected.shape}")
    worst = float(np.max(np.abs(got - expected))) if got.size else 0.0
    if not np.allclose(got, expected, **TOLERANCE):
        raise CheckFailed(f"{what} differs from the trained network by up to {worst:.3g} "
                          f"(tolerance {TOLERANCE['atol']:g} + {TOLERANCE['rtol']:g} x |output|)")
    return worst


def metadata_for(spec, source):
    """The ONNX file's properties: what a server needs to use its output."""
    return {"gluon_gpu.version": __version__, "source": os.path.abspath(source), "task": spec.task,
            "classes": json.dumps(spec.classes or []), "input_normalization": "embedded"}
