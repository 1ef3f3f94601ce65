"""``bench --to-accuracy ACC``: the wall time until the validation accuracy reaches ACC,
ours against the baseline loop (the tutorial's, or GluonCV's for zoo models) trained
with the same recipe, in one invocation; with ``--torch-python PY``, against PyTorch
eager too, float32 and under bfloat16 autocast (LeNet or a CIFAR ResNet v1: torch_train.py).

Both train the ``--recipe`` (or the plain flags) on the first ``--devices`` spec and
validate after every epoch inside the timed span (validation is part of the time to an
accuracy), and stop at the first epoch at ACC or at the recipe's last epoch. Ours and
PyTorch's rows are processes of their own, timed from their start (imports, data,
compiles included) to the line that reports ACC; the baseline loop runs in this process
and its start-up is not counted. Each row's CPU share is measured (cpu_time.py): a row
that ran beside other work is marked and quoted in no ratio, and a row that ends near
chance is named. Writes a table to stdout, ``OUT/accuracy.json`` and ``OUT/accuracy.png``
(validation accuracy against seconds, every row).
"""
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import replace

from ...core.loop.callbacks import save_figure, subplots
from ...core.platform.cpu_time import CpuMeter
from ...core.platform.devices import parse_devices
from ...core.platform.environment import cpu_flags
from ...core.platform.errors import UserError
from ...core.platform.files import write_json
from ...core.platform.pools import process_temp_dir
from ...core.step.precision import has_bfloat16
from .. import tutorial_loop
from ..config import RunConfig, as_argv
from ..recipes import apply_recipe
from . import children, torch_train
from ..cli import text_table
from .timing import SHARE, figure, machine_info, machine_words, marked, quiet, share_remarks
from .torch_child import save_samples, torch_lines


def bench_config(args, typed=frozenset()):
    """The run configuration both loops train: the recipe, on the first spec, but for
    the flags the user ``typed`` (``--epochs 4`` runs at most 4 epochs)."""
    config = RunConfig(devices=args.devices[0], model=args.model, batch_size=args.batch_size, epochs=args.epochs,
                       dataset=args.dataset, data_dir=args.data_dir, image_size=args.image_size,
                       lr=args.lr, limit=args.limit, val_limit=args.val_limit, pipeline=args.pipeline[0],
                       loader_workers=args.loader_workers, fused_conv=args.fused_conv[0], recipe=args.recipe, quiet=True,
                       dtype=args.dtype[0], bfloat16_kernels=args.bfloat16_kernels)
    return apply_recipe(config, given=typed)


def ours(args, config, scratch, bar):
    """``[(seconds since its start, val-acc)]`` per epoch of ``gluon-gpu-train`` training
    ``config`` in a process of its own, as a user runs it, until ``--to-accuracy``."""
    run = replace(config, out=os.path.join(scratch, "ours"), quiet=True)
    cmd = [sys.executable, "-u", "-m", "gluon_gpu.train", *as_argv(run)]  # -u: each epoch line as it is printed
    return timed_curve(children.lines(cmd, "the gluon_gpu training process", args.timeout), epoch_accuracy,
                       args.to_accuracy, bar)


def epoch_accuracy(line):
    """The accuracy an epoch line of train reports (the better of the weights' and their
    moving average's, which best.params takes; NaN for an epoch not validated: --val-every),
    or None for any other line."""
    if not line.startswith("epoch"):
        return None
    found = [float(v) for v in re.findall(r"(?:^|\s)(?:ema-)?val-acc (\d+\.\d+)", line)]
    return max(found) if found else math.nan


def torch_accuracy(line):
    """The accuracy of a line of torch_train.py (NaN for an epoch it did not validate)."""
    accuracy = json.loads(line)["val_acc"]
    return math.nan if accuracy is None else accuracy


def timed_curve(lines, accuracy_of, target, bar):
    """``[(seconds, accuracy)]`` of a child's epoch ``lines`` (``accuracy_of(line)``: None
    for other lines, NaN for an epoch not validated, whose accuracy is None here), timed
    from the child's start to each line's arrival; the child is stopped at the first line
    at ``target``."""
    start, curve = time.perf_counter(), []
    for line in lines:
        accuracy = accuracy_of(line)
        if accuracy is None:
            continue
        curve.append((time.perf_counter() - start, None if math.isnan(accuracy) else accuracy))
        bar.update(1)
        if accuracy >= target:
            break
    lines.close()  # children.lines ends a child that is still training
    return curve


def baseline(config, data, target, bar):
    ctx = parse_devices(config.devices)
    iters = math.ceil(len(data.train_x) / config.batch_size)
    recipe = tutorial_loop.BaselineRecipe(config, iters, target, data.spec.input_shape[1:])
    curve = []

    def on_epoch(epoch, loss, seconds, accuracy):
        curve.append(((curve[-1][0] if curve else 0.0) + seconds, accuracy))
        bar.update(1)
    tutorial_loop.run(data.train_x, data.train_y, data.val_x, data.val_y, ctx, config.epochs, config.batch_size,
                      config.loader_workers, on_epoch=on_epoch, model=config.model, classes=data.spec.outputs,
                      recipe=recipe)
    return curve


CHANCE = 1.5  # a row whose last val-acc is below CHANCE / classes did not learn

# A PyTorch user's standard ResNet-20 recipe (issue #52), as its own row: random 2-pixel
# crops and flips, nesterov SGD, weight decay off BatchNorm and biases, one warm-up epoch,
# then cosine per step, label smoothing, batch 128, 20 epochs; PyTorch's own optimizer
# update (the rows of our recipe take MXNet's: torch_train.Trainer.update).
STANDARD = {"model": "cifar_resnet20_v1", "epochs": 20, "batch_size": 128, "optimizer": "nag", "lr": 0.1,
            "momentum": 0.9, "wd": 5e-4, "no_wd": True, "lr_mode": "cosine", "warmup_epochs": 1,
            "label_smoothing": 0.1, "augment": "flip,crop=2", "seed": 0, "pytorch_update": True}


def pytorch(args, config, data, scratch, bar):
    """PyTorch's rows, each validating every epoch inside the timed span: the same
    network and recipe in ``--torch-python``, in float32 and (on a CPU with bfloat16
    instructions) under bfloat16 autocast; and :data:`STANDARD` at the CPU's best precision."""
    precisions = ("float32", "bfloat16") if has_bfloat16(cpu_flags()) else ("float32",)
    samples = os.path.join(scratch, "samples.npz")
    save_samples(samples, data.spec, train_x=data.train_x, train_y=data.train_y, val_x=data.val_x, val_y=data.val_y)
    runs = [(f"PyTorch {dtype}" + " autocast" * (dtype == "bfloat16"), config.to_dict(), dtype)
            for dtype in precisions]
    runs.append((f"PyTorch standard recipe, {precisions[-1]}" + " autocast" * (precisions[-1] == "bfloat16"),
                 {**RunConfig().to_dict(), **STANDARD}, precisions[-1]))  # whatever the recipe
    rows = []
    for i, (name, settings, dtype) in enumerate(runs):
        path = os.path.join(scratch, f"config{i}.json")
        write_json(path, settings)
        with CpuMeter() as meter:
            curve = timed_curve(torch_lines(args.torch_python, torch_train.__file__, samples, path, args.to_accuracy,
                                            dtype, seconds=args.timeout),
                                torch_accuracy, args.to_accuracy, bar)
        rows.append(row(name, curve, args.to_accuracy, meter.share, data.spec.outputs))
    return rows


def row(name, curve, target, share, classes):
    """A table row: when the curve reached ``target``, its median epoch (the first, with
    the start-up, apart), the CPU it had (``share``), and whether it ended near chance."""
    reached = next(((i + 1, s) for i, (s, a) in enumerate(curve) if a is not None and a >= target), (None, None))
    epochs = [b - a for a, b in zip([0.0] + [s for s, _ in curve], [s for s, _ in curve])]
    last = next((a for _, a in reversed(curve) if a is not None), None)
    return {"name": name, "epochs_to_target": reached[0], "seconds_to_target": reached[1],
            "epochs": len(curve), "seconds": curve[-1][0], "val_acc": last, "curve": curve,
            "median_epoch_s": statistics.median(epochs[1:] or epochs), **share.as_dict(),
            "near_chance": bool(classes > 1 and last is not None and last < CHANCE / classes)}


def compare(rows):
    """Each row's seconds to the target over ours (``ours_sooner``; the baseline loop's is
    ours' ``speedup``), only between rows that both had the machine to themselves."""
    first = rows[0]
    for other in rows[1:]:
        if first["seconds_to_target"] and other["seconds_to_target"] and quiet(first, other):
            other["ours_sooner"] = other["seconds_to_target"] / first["seconds_to_target"]
            if other["name"] == "baseline loop":
                first["speedup"] = other["ours_sooner"]


def run_to_accuracy(args, config, data, bar):
    if args.baseline == "tutorial":  # what a loop cannot train is said before any trains
        tutorial_loop.check_recipe(config, data.spec.input_shape[1:])
    why = torch_train.refused(config.to_dict()) if args.torch_python else ""
    if why:
        raise UserError(f"`torch_python`: the PyTorch rows cannot train this: {why}")
    classes = data.spec.outputs
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as scratch:
        with CpuMeter() as meter:
            curve = ours(args, config, scratch, bar)
        rows = [row(f"gluon_gpu {config.dtype}", curve, args.to_accuracy, meter.share, classes)]
        if args.torch_python:
            rows += pytorch(args, config, data, scratch, bar)
    if args.baseline == "tutorial":
        with CpuMeter() as meter:
            curve = baseline(config, data, args.to_accuracy, bar)
        rows.append(row("baseline loop", curve, args.to_accuracy, meter.share, classes))
    compare(rows)
    report = {"config": config.to_dict(), "target": args.to_accuracy, "machine": machine_info(), "results": rows}
    print(report_text(report))
    write_json(os.path.join(args.out, "accuracy.json"), report)
    plot(rows, args.to_accuracy, os.path.join(args.out, "accuracy.png"))
    print(f"wrote {args.out}/accuracy.json and {args.out}/accuracy.png")
    return 0


def report_text(report):
    """The table ``bench --to-accuracy`` prints, from its report (accuracy.json)."""
    config, target = report["config"], report["target"]
    columns = [("loop", 44, marked("name")),
               ("epochs to ACC", 15, figure("epochs_to_target", "d")),
               ("seconds to ACC", 16, figure("seconds_to_target", ".1f")), ("epochs run", 12, figure("epochs", "d")),
               ("median epoch s", 15, figure("median_epoch_s", ".1f")), *SHARE, ("last val-acc", 13, figure("val_acc", ".4f")),
               ("faster", 8, figure("speedup", ".2f", "x")), ("ours sooner", 12, figure("ours_sooner", ".2f", "x"))]
    title = (f"time to val-acc {target} on {config['devices']}: {config['model']}, recipe {config['recipe'] or 'none'} "
             f"(at most {config['epochs']} epochs; validation counted in the time)"
             + (f", tta {config['tta']}" if config.get("tta") else ""))
    return "\n".join([text_table(columns, report["results"], title), *remarks(report["results"]),
                      f"measured on {machine_words(report['machine'])}"])


def remarks(rows):
    """The lines under the table: what marks a row, and a row that did not learn."""
    return share_remarks(rows) + [
        f"{r['name']} ended near chance (val-acc {r['val_acc']:.4f}, under {CHANCE:g} x chance): it did not learn, "
        "so its time says nothing" for r in rows if r.get("near_chance")]


def plot(rows, target, path):
    fig, ax = subplots(figsize=(6, 4))
    for number, r in enumerate(rows):
        shown = [(s, a) for s, a in r["curve"] if a is not None]  # the validated epochs
        if shown:
            ax.plot(*zip(*shown), marker="o", color=f"C{number}", label=r["name"])
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target}")
    ax.set_xlabel("seconds (training and validation)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("time to accuracy")
    ax.legend()
    save_figure(fig, path)
