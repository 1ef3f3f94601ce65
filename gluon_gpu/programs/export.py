"""Write a trained network where models are served, as
MXNet's symbol + params pair (C++, Java/DJL, model servers) and as ONNX (onnxruntime),
each taking samples as stored (raw uint8 pixels: the normalization is inside) and
giving class probabilities or the prediction; an ensemble gives its mean vote.

    gluon-gpu-export runs/RUN --out served/
    gluon-gpu-export runs/SWEEP --member 3 --out served/ --formats onnx

Each file is read back at once (MXNet's SymbolBlock, onnxruntime) and its outputs on
held-out validation samples compared with the trained network's; nothing is written
unless they agree.
"""
import argparse
import contextlib
import os
import shutil
import sys
import tempfile

import mxnet as mx
import numpy as np

from ..core.platform.errors import UserError
from ..core.platform.files import check_writable, fsync_path, lock_holder, umask_mode, write_guard, write_json, write_text
from ..core.state.version import __version__
from ..core.step.params import read_parameter_file
from ..data.fashion_mnist import fashion_spec
from ..models import load_model, params_in, recorded_run
from ..models.export import (OPSET, TOLERANCE, CheckFailed, check_outputs, metadata_for, mxnet_outputs,
                             names_for, onnx_outputs, write_onnx, write_symbol)
from ..models.servable import servable_model
from .cli import Parser, main_guard, parse_args, positive_int
from .config import add_flags
from .evaluate import add_saved_model_flags, recorded_spec, validation_data
from .predict import predict

FORMATS = ("mxnet", "onnx")
PREFIX = "model"


def build_parser():
    p = Parser("export", description=__doc__)
    add_flags(p, ("data_dir", "omp_threads", "engine_threads"))
    add_saved_model_flags(p, positional=True)
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the exported files to")
    p.add_argument("--formats", default=",".join(FORMATS), type=formats,
                   help="which to write, comma-separated: mxnet (symbol + params), onnx")
    p.add_argument("--check-samples", type=positive_int, default=256, metavar="N",
                   help="validation samples the exported outputs are compared on")
    return p


def formats(text):
    chosen = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(FORMATS)}")
    return chosen


def held_out(spec, data_dir, count):
    """``(samples as stored, where from)``: the run's first validation samples, else (no
    data here) random samples of its shape, said so."""
    try:
        data = validation_data(spec, data_dir, limit=1)  # the validation split; of the training one, a sample
        return np.asarray(data.val_x[:count]), f"{min(count, len(data.val_x))} validation samples"
    except UserError as e:
        rng = np.random.default_rng(0)
        shape = (count,) + tuple(spec.input_shape)
        x = rng.integers(0, 256, shape).astype("uint8") if spec.dtype == "uint8" else rng.normal(size=shape)
        return x.astype(spec.dtype), f"{count} random samples ({str(e).split(': ')[-1]})"


def export(path, out, spec, x, model=None, member=None, chosen=FORMATS):
    """Export the parameters in ``path`` to folder ``out``; check on stored samples ``x``.
    Returns the signature (also written as ``out/signature.json``). The file is read
    once: a live run may replace it meanwhile."""
    arrays = read_parameter_file(path)
    servable = servable_model(path, spec, model, member, arrays=arrays)
    trained = load_model(path, mx.cpu(), model, input_shape=spec.input_shape, outputs=spec.outputs, member=member,
                         arrays=arrays)
    expected = predict(trained, x, [mx.cpu()], spec)  # as `predict` runs it, gluon_gpu's own operators and all
    parent = os.path.dirname(os.path.abspath(out))
    with write_guard(out) as temporaries:
        staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
        temporaries.append(staging)
        prefix = os.path.join(staging, PREFIX)
        symbol, params = write_symbol(servable, prefix, spec)
        checks = {"mxnet": check_outputs("the MXNet export", mxnet_outputs(symbol, params, spec, x), expected)}
        if "onnx" in chosen:
            onnx_file = write_onnx(symbol, params, prefix + ".onnx", spec, metadata_for(spec, path))
            checks["onnxruntime"] = check_outputs("the ONNX export", onnx_outputs(onnx_file, spec, x), expected)
        if "mxnet" not in chosen:
            for name in (symbol, params):
                os.remove(name)
        signature = _signature(path, spec, member, x, checks, sorted(os.listdir(staging)))
        write_json(os.path.join(staging, "signature.json"), signature)
        if spec.classes:
            write_text(os.path.join(staging, "synset.txt"), "\n".join(spec.classes) + "\n")
        _move_into(staging, out)
    return signature


def _signature(path, spec, member, x, checks, files):
    input_name, output_name = names_for(spec)
    return {"gluon_gpu": __version__, "source": os.path.abspath(path), "member": member, "task": spec.task,
            "inputs": [{"name": input_name, "dtype": spec.dtype, "shape": [-1] + list(spec.input_shape),
                        "as": "raw pixels 0-255" if spec.dtype == "uint8" else "features as stored",
                        "normalization": {"embedded": True, "scale": spec.scale, "mean": spec.mean, "std": spec.std}}],
            "outputs": [{"name": output_name, "shape": [-1, spec.outputs]}], "classes": spec.classes,
            "onnx_opset": OPSET, "files": files + ["signature.json"] + ["synset.txt"] * bool(spec.classes),
            "check": {"samples": len(x), "tolerance": TOLERANCE, "max_abs_diff": checks}}


def _move_into(staging, out):
    """The checked files into ``out`` (made if missing), each by one rename."""
    os.makedirs(out, mode=umask_mode(0o777), exist_ok=True)
    for name in os.listdir(staging):
        os.chmod(os.path.join(staging, name), umask_mode(0o666))
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    fsync_path(out)
    shutil.rmtree(staging)


@contextlib.contextmanager
def removed_unless_written(out, made):
    """A folder ``out`` this export made is gone again if the export ends without writing
    into it (an error, a refusal, Ctrl-C)."""
    try:
        yield
    finally:
        if made and os.path.isdir(out) and not os.listdir(out):
            os.rmdir(out)


@main_guard("gluon_gpu.export")
def main(argv=None):
    args = parse_args(build_parser(), argv)
    path = params_in(args.params, args.member)
    spec = recorded_spec(path) or fashion_spec()  # a file without a run: the tutorial's LeNet
    holder = lock_holder(os.path.dirname(os.path.abspath(path)))
    if holder:
        print(f"gluon_gpu.export: note: {os.path.dirname(path) or '.'} is still being trained (process {holder}): "
              f"exporting {os.path.basename(path)} as it is when read", file=sys.stderr)
    with removed_unless_written(args.out, check_writable(args.out, "the export to `out`")):
        x, source = held_out(spec, args.data_dir, args.check_samples)
        try:
            signature = export(path, args.out, spec, x, args.model, args.member, args.formats)
        except CheckFailed as e:
            print(f"gluon_gpu.export: error: {e}; nothing written", file=sys.stderr)
            return 1
    run = recorded_run(path)
    what = f"member {args.member} of {path}" if args.member is not None else path
    print(f"{what} ({args.model or run['model']}) -> {args.out}")
    for name in signature["files"]:
        print(f"  {name}")
    inputs, outputs = signature["inputs"][0], signature["outputs"][0]
    print(f"  input `{inputs['name']}` {inputs['dtype']} {tuple(inputs['shape'])} ({inputs['as']}, normalized inside); "
          f"output `{outputs['name']}` {tuple(outputs['shape'])}")
    figures = ", ".join(f"{k} {v:.2g}" for k, v in signature["check"]["max_abs_diff"].items())
    print(f"  checked on {source}: max |difference| from the trained network {figures}")
    return 0
