"""Predict with saved parameters, for image files, IDX
entries or rows of an .npz array.

    gluon-gpu-predict --params runs/RUN shoe.png shirt.jpg
    gluon-gpu-predict --params runs/RUN --idx t10k-images-idx3-ubyte.gz --index 0:10
    gluon-gpu-predict --params runs/RUN --npz data.npz --index 0:5

Images are read with Pillow, converted to the run's channels (grayscale or colour),
resized to its input size and normalized exactly as in training. Classification prints
class names and probabilities; regression the predicted values. On CPU contexts the
network runs as oneDNN's fused inference graph (``--int8``: quantized, calibrated on
the run's training samples).
"""
import json
import os

import numpy as np
from mxnet import nd

from ..core.platform.devices import devices, gpu_count, split_batch
from ..core.platform.errors import DataError, UserError
from ..core.step.array_api import call
from ..core.step.heads import head_for
from ..core.step.members import member_count
from ..core.step.tta import check_tta, parse_tta
from ..data.fashion_mnist import fashion_spec, read_idx
from ..data.images import decode
from ..models import load_model, params_in
from ..models.inference import inference_model
from .cli import Parser, main_guard, parse_args
from .config import add_flags
from .evaluate import (add_inference_flags, add_saved_model_flags, graph_mode, one_dnn_threads, recorded_spec,
                       validation_data)


def build_parser():
    p = Parser("predict", description=__doc__, brief=True)
    add_flags(p, ("devices", "fused_conv", "omp_threads", "engine_threads", "data_dir", "tta"),
              defaults={"devices": None})
    add_saved_model_flags(p)
    add_inference_flags(p)
    p.add_argument("--idx", help="an IDX images file (.gz or not) to predict entries of")
    p.add_argument("--npz", help="an .npz file: predict rows of its x_val (else x) array")
    p.add_argument("--index", default=None, help="with --idx/--npz: START:STOP or one index (default 0:10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("images", nargs="*", help="image files (PNG, JPEG, ...)")
    p.brief_flags("params", "model", "member", "inference", "idx", "npz", "index", "json")
    return p


def parse_index(text, n):
    try:
        if ":" in text:
            start, stop = (int(t) if t else None for t in text.split(":", 1))
            rows = range(n)[slice(start, stop)]
        else:
            i = int(text)
            rows = range(n)[i:i + 1] if -n <= i < n else range(0)
    except ValueError:
        raise UserError(f"--index {text!r}: expected START:STOP or an index") from None
    if len(rows) == 0:
        raise UserError(f"--index {text!r} selects nothing from {n} rows")
    return list(rows)


def predict(net, inputs, ctx, spec, tta=None, log=False):
    """Outputs for stored-format inputs ``(N, *spec.input_shape)``, cut over ``ctx``:
    class probabilities (classification) or predictions (regression); an ensemble
    gives its combined output (the mean softmax, or the mean prediction). ``tta``: the
    softmax of the mean of the views' log-probabilities (core/step/tta.py). ``log``:
    log-probabilities."""
    if tta is not None:
        return nd.softmax(tta.host_mean(lambda view: nd.array(predict(net, view, ctx, spec, log=True)), inputs),
                          axis=-1).asnumpy()
    members = member_count(net)
    batch = nd.array(inputs, dtype="uint8" if spec.dtype == "uint8" else "float32")
    if members > 1:  # every member sees every input
        batch = batch.expand_dims(1).broadcast_to((len(inputs), members) + batch.shape[1:])
    head, transform = head_for(spec.task, spec.outputs), spec.transform(members)
    transform.initialize(ctx=ctx)
    outs = []
    for x in split_batch(batch, ctx):
        out = call(net, transform(x))
        if members > 1:
            out = head.combine(nd, out)
        outs.append((nd.log_softmax if log else nd.softmax)(out, axis=-1) if spec.task == "classify" else out)
    return np.concatenate([o.asnumpy() for o in outs])


def _inputs(args, spec):
    given = [bool(args.idx), bool(args.npz), bool(args.images)]
    if sum(given) > 1:
        raise UserError("give image files, --idx or --npz, not several")
    if args.index is not None and not (args.idx or args.npz):
        raise UserError("--index picks rows of --idx or --npz; image files are predicted as given: leave it out")
    args.index = args.index or "0:10"
    if args.idx:
        images = read_idx(args.idx, 3)[:, None]
        rows = parse_index(args.index, len(images))
        return [f"{args.idx}[{i}]" for i in rows], _fit(images[rows], spec, args.idx)
    if args.npz:
        try:
            with np.load(args.npz, allow_pickle=False) as f:
                key = "x_val" if "x_val" in f.files else "x"
                x = f[key]
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise DataError(f"cannot read {args.npz} as .npz with an x_val or x array: {e}") from None
        x = x[:, None] if x.ndim == 3 else x
        rows = parse_index(args.index, len(x))
        return [f"{args.npz}[{i}]" for i in rows], _fit(x[rows], spec, args.npz)
    if not args.images:
        raise UserError("nothing to predict: give image files, --idx FILE or --npz FILE")
    if len(spec.input_shape) != 3:
        raise UserError(f"this run takes {spec.input_shape[0]} features, not images: use --npz")
    for path in args.images:
        if not os.path.isfile(path):
            raise UserError(f"{path}: no such file")
    size = spec.input_shape[1:]
    return list(args.images), np.stack([decode(p, spec.channels, size) for p in args.images])


def _fit(x, spec, source):
    if tuple(x.shape[1:]) != tuple(spec.input_shape):
        raise DataError(f"{source} holds samples of shape {x.shape[1:]}; this run takes {tuple(spec.input_shape)}")
    return x


def default_devices():
    return "gpu:0" if gpu_count() else "cpu"


def describe_output(name, values, spec):
    if spec.task == "classify":
        names = spec.classes or [str(i) for i in range(len(values))]
        best = int(values.argmax())
        return {"input": name, "class": names[best], "index": best, "probability": float(values[best]),
                "probabilities": [float(v) for v in values]}
    return {"input": name, "prediction": [float(v) for v in np.ravel(values)]}


@main_guard("gluon_gpu.predict")
def main(argv=None):
    args = parse_args(build_parser(), argv, adjust=lambda a: one_dnn_threads(a, a.devices or default_devices()))
    args.params = params_in(args.params, args.member)
    spec = recorded_spec(args.params) or fashion_spec()  # a file without a run: the tutorial's LeNet
    names, inputs = _inputs(args, spec)
    tta = parse_tta(args.tta)
    check_tta(tta, spec.input_shape, spec.task)
    with devices(args.devices or default_devices()) as ctx:
        mode = graph_mode(args, ctx)
        if mode == "graph":
            net = load_model(args.params, ctx, args.model, input_shape=spec.input_shape, outputs=spec.outputs,
                             fused_conv=args.fused_conv, member=args.member)
            outputs = predict(net, inputs, ctx, spec, tta)
        else:
            calibration = (validation_data(spec, args.data_dir, args.calibration_samples).train_x[
                :args.calibration_samples] if mode == "int8" else None)
            net = inference_model(args.params, spec, mode, inputs, args.model, args.member, calibration,
                                  log=tta is not None)
            outputs = (nd.softmax(tta.host_mean(lambda view: net(nd.array(view, dtype=spec.dtype)), inputs), axis=-1)
                       if tta else net(nd.array(inputs, dtype=spec.dtype))).asnumpy()
    results = [describe_output(name, values, spec) for name, values in zip(names, outputs)]
    if args.json:
        print(json.dumps(results, indent=2))
    for r in results if not args.json else []:
        if "class" in r:
            print(f"{r['input']}: {r['class']} ({r['probability']:.3f})")
        else:
            print(f"{r['input']}: " + " ".join(f"{v:.4f}" for v in r["prediction"]))
    return 0
