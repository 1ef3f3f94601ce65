"""bench --inference RUN: one trained network's inference on every engine, timed side by
side on the same validation samples in one invocation.

Each engine runs the loop ``evaluate`` runs (batches of ``--batch-size`` from memory,
metrics summed on the host): the training graph over the first ``--devices`` spec (what
``evaluate`` ran before 0.9, ``--inference graph``), then on the CPU oneDNN's fused
graph, INT8 and bfloat16 (models/inference.py), onnxruntime on the exported ONNX file
(checked against the network as ``export`` checks it), and with ``--torch-python PY``
(an interpreter with PyTorch: gluoncv refuses to import beside PyTorch 2) PyTorch eager
running the same LeNet with the same weights (programs/bench/torch_lenet.py). Each engine
makes one untimed pass, then ``--repeats`` timed passes (the median counts). Writes a
table, ``OUT/bench.json`` and ``OUT/inference.png``.
"""
import json
import os
import statistics
import sys
import tempfile
import time

import mxnet as mx

from ...core.loop.callbacks import save_figure, subplots
from ...core.platform.devices import parse_devices, thread_settings
from ...core.platform.cpu_time import CpuMeter
from ...core.platform.errors import UserError
from ...core.platform.files import write_json
from ...core.platform.pools import process_temp_dir
from ...core.step.heads import head_for
from ...core.step.precision import cpu_flags, has_bfloat16
from ...data.sources import sample_batches
from ...models import load_model, params_in, recorded_run
from ...models.inference import inference_model, inference_threads
from ..evaluate import evaluate_inference, graph_evaluation, recorded_spec, validation_data
from ..export import export
from . import children, torch_lenet
from .torch_child import save_samples, torch_lines
from ..cli import text_table
from .timing import SHARE, figure, machine_info, marked, quiet, share_remarks

CALIBRATION = 512  # training samples INT8 calibrates on (evaluate's default)


# The engines, in process groups: the training graph with the process's threads as
# evaluate ran it before 0.9; the rest with every core's OpenMP threads per operator, as
# evaluate runs oneDNN's graphs now (onnxruntime and PyTorch keep their own thread pools).
GROUPS = (("graph",), ("fused", "int8", "bfloat16", "onnxruntime", "pytorch"))


def run_inference(args):
    """Each group of engines in a process of its own (MXNet takes its threads at start),
    then one table."""
    if args.engines:
        write_json(os.path.join(args.out, "rows.json"), time_engines(args, args.engines.split(",")))
        return 0
    rows = []
    for group in GROUPS:
        out = os.path.join(args.out, f"engines-{group[0]}")
        omp = inference_threads(group[0], args.omp_threads[0])
        command = [sys.executable, "-m", "gluon_gpu.bench", "--inference", args.inference, "--engines", ",".join(group),
                   "--devices", args.devices[0], "--batch-size", str(args.batch_size), "--repeats", str(args.repeats),
                   "--out", out] + (["--omp-threads", str(omp)] if omp else []) \
            + (["--val-limit", str(args.val_limit)] if args.val_limit else []) \
            + (["--data-dir", args.data_dir] if args.data_dir else []) \
            + (["--torch-python", args.torch_python] if args.torch_python else [])
        done = children.run(command, f"the {','.join(group)} engines' bench", args.timeout)
        if done.returncode != 0:
            last = children.last_words(done.stderr, done.returncode)
            raise children.failure(f"`inference` {' '.join(group)}: {last.split(': error: ', 1)[-1]}", done.returncode)
        with open(os.path.join(out, "rows.json")) as f:
            rows += [{**row, "omp_threads": omp or thread_settings()["omp_threads"]} for row in json.load(f)]
    for row in rows:
        if quiet(row, rows[0]):
            row["vs_graph"] = row["samples_per_s"] / rows[0]["samples_per_s"]
    return report(args, rows, recorded_run(params_in(args.inference))["model"], rows[0]["samples"])


def time_engines(args, engines):
    """The rows of ``engines`` (names of :data:`GROUPS`) for the network of ``args.inference``."""
    path = params_in(args.inference)
    spec = recorded_spec(path)
    if spec is None:
        raise UserError(f"`inference` {args.inference}: a run folder (or a params file beside its metrics.json), "
                        "so that its data is known")
    data = validation_data(spec, args.data_dir, CALIBRATION)
    x, y = data.val_x[:args.val_limit], data.val_y[:args.val_limit]
    head, ctx, bs = head_for(spec.task, spec.outputs), parse_devices(args.devices[0]), args.batch_size
    rows = []
    if "graph" in engines:
        rows.append(_timed("graph", f"training graph on {args.devices[0]} (--inference graph)", args.repeats,
                           graph_evaluation(path, ctx, spec, x, y, bs)))
    for mode, what in (("fused", "oneDNN fused graph (--inference fused)"), ("int8", "oneDNN INT8 (--int8)"),
                       ("bfloat16", "oneDNN bfloat16 (--inference bfloat16)")):
        if mode in engines and (mode != "bfloat16" or has_bfloat16(cpu_flags())):
            net = inference_model(path, spec, mode, x[:bs], calibration=data.train_x[:CALIBRATION], log=True)
            rows.append(_timed(mode, what, args.repeats, lambda net=net: evaluate_inference(net, head, x, y, bs,
                                                                                             spec.dtype)))
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as scratch:
        if "onnxruntime" in engines:
            export(path, os.path.join(scratch, "served"), spec, x[:256], chosen=("onnx",))
            rows.append(_timed("onnxruntime", "onnxruntime on the exported ONNX file", args.repeats,
                               _onnx_loop(os.path.join(scratch, "served", "model.onnx"), spec, x, y, bs)))
        if "pytorch" in engines and args.torch_python:
            rows.append(_torch_row(args, path, spec, x, y, scratch))
    return rows


def _timed(key, what, repeats, loop):
    """The row of an engine: ``loop()`` once untimed, then ``repeats`` times."""
    figures = loop()
    seconds = []
    with CpuMeter() as meter:
        for _ in range(repeats):
            start = time.perf_counter()
            figures = loop()
            seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"key": key, "name": what, "seconds": seconds, "median_s": median, "samples": figures["samples"],
            "samples_per_s": figures["samples"] / median, "acc": figures.get("acc"), **meter.share.as_dict()}


def _onnx_loop(onnx_file, spec, x, y, bs):
    import onnxruntime
    session = onnxruntime.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def loop():
        right = 0
        for start, batch in sample_batches(x, bs):
            probabilities = session.run(None, {name: batch})[0]
            if spec.task == "classify":
                right += int((probabilities.argmax(1) == y[start:start + len(batch)]).sum())
        return {"samples": len(x), "acc": right / len(x) if spec.task == "classify" else None}
    return loop


def _torch_row(args, path, spec, x, y, scratch):
    """PyTorch eager, in its own interpreter, on the same LeNet with the same weights."""
    run = recorded_run(path)
    if run["model"] != "lenet" or run["members"] != 1:
        raise UserError("`torch_python`: the PyTorch row runs LeNet alone (the baseline's network)")
    weights, inputs = os.path.join(scratch, "lenet.npz"), os.path.join(scratch, "inputs.npz")
    torch_lenet.save_weights(load_model(path, mx.cpu(), fused_conv="off"), weights)
    save_samples(inputs, spec, x=x, y=y)
    with CpuMeter() as meter:
        lines = list(torch_lines(args.torch_python, torch_lenet.__file__, weights, inputs, args.batch_size,
                                 args.repeats, seconds=args.timeout))
    result = json.loads(lines[-1])
    median = statistics.median(result["seconds"])
    return {"key": "pytorch", "name": f"PyTorch {result['torch']} eager, same LeNet and weights",
            "seconds": result["seconds"], "median_s": median, "samples": len(x), "samples_per_s": len(x) / median,
            "acc": result["acc"], **meter.share.as_dict()}


def report(args, rows, model, samples):
    columns = [("engine", 54, marked("name")), ("threads", 8, figure("omp_threads", "d")), *SHARE,
               ("median s", 10, figure("median_s", ".3f")),
               ("samples/s", 12, figure("samples_per_s", ".0f")), ("val-acc", 9, figure("acc", ".4f")),
               ("vs graph", 10, figure("vs_graph", ".2f", "x"))]
    print(text_table(columns, rows, f"{model}: inference on {samples} validation samples, batches of "
                                    f"{args.batch_size}, median of {args.repeats}"))
    print("\n".join(share_remarks(rows)))
    write_json(os.path.join(args.out, "bench.json"), {"config": vars(args), "machine": machine_info(),
                                                      "inference": rows})
    plot(rows, model, os.path.join(args.out, "inference.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/inference.png")
    return 0


def plot(rows, model, path):
    fig, ax = subplots(figsize=(8, 4.5))
    bars = ax.barh([r["key"] for r in rows][::-1], [r["samples_per_s"] for r in rows][::-1], color="C0")
    ax.bar_label(bars, labels=[f"{r['vs_graph']:.2f}x" if "vs_graph" in r else "busy" for r in rows][::-1])
    ax.set_xlabel("samples/s (median pass)")
    ax.set_title(f"{model}: inference, against the training graph")
    save_figure(fig, path)


def check_inference_flags(args):
    """bench --inference measures one trained network: refuse what would time training."""
    for flag in ("ensemble", "workers", "to_accuracy", "sweep", "sweep_random"):
        if getattr(args, flag, None):
            raise UserError(f"`inference` times a trained network's inference; `{flag}` times training: one at a time")
