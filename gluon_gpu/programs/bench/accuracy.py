"""``bench --to-accuracy ACC``: the wall time until the validation accuracy reaches ACC,
ours against the baseline loop (the tutorial's, or GluonCV's for zoo models) trained
with the same recipe, in one invocation; with ``--torch-python PY``, against PyTorch
eager too, float32 and under bfloat16 autocast (LeNet or a CIFAR ResNet v1: torch_train.py).

Both train the ``--recipe`` (or the plain flags) on the first ``--devices`` spec and
validate after every epoch inside the timed span (validation is part of the time to an
accuracy), and stop at the first epoch at ACC or at the recipe's last epoch. Writes a
table to stdout, ``OUT/accuracy.json`` and ``OUT/accuracy.png`` (validation accuracy
against seconds, both loops).
"""
import json
import math
import os
import tempfile
import time

from ...core.loop.callbacks import save_figure, subplots
from ...core.loop.fit import train_epoch, validate
from ...core.platform.devices import parse_devices
from ...core.platform.environment import cpu_flags
from ...core.platform.errors import UserError
from ...core.platform.files import write_json
from ...core.platform.pools import process_temp_dir
from ...core.step.precision import has_bfloat16
from .. import tutorial_loop
from ..config import RunConfig
from ..recipes import apply_recipe
from ..run import build_run
from . import torch_train
from .timing import figure, machine_info, machine_words, text_table
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


def ours(config, data, target, bar):
    """``[(seconds so far, val-acc)]`` per epoch until ``target``."""
    run = build_run(config, parse_devices(config.devices), data=data)
    curve, elapsed = [], 0.0
    for epoch in range(config.epochs):
        start = time.perf_counter()
        train_epoch(run.dp, run.train, epoch)
        accuracy = validate(run.dp, run.val)["val_acc"]
        elapsed += time.perf_counter() - start
        curve.append((elapsed, accuracy))
        bar.update(1)
        if accuracy >= target:
            break
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


# A PyTorch user's standard ResNet-20 recipe (issue #52), as its own row: random 2-pixel
# crops and flips, nesterov SGD, weight decay off BatchNorm and biases, one warm-up epoch,
# then cosine per step, label smoothing, batch 128, 20 epochs.
STANDARD = {"model": "cifar_resnet20_v1", "epochs": 20, "batch_size": 128, "optimizer": "nag", "lr": 0.1,
            "momentum": 0.9, "wd": 5e-4, "no_wd": True, "lr_mode": "cosine", "warmup_epochs": 1,
            "label_smoothing": 0.1, "augment": "flip,crop=2", "seed": 0}


def pytorch(args, config, data, bar):
    """PyTorch's rows, each validating every epoch inside the timed span: the same
    network and recipe in ``--torch-python``, in float32 and (on a CPU with bfloat16
    instructions) under bfloat16 autocast; and :data:`STANDARD` at the CPU's best precision."""
    precisions = ("float32", "bfloat16") if has_bfloat16(cpu_flags()) else ("float32",)
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as scratch:
        samples = os.path.join(scratch, "samples.npz")
        save_samples(samples, data.spec, train_x=data.train_x, train_y=data.train_y, val_x=data.val_x,
                     val_y=data.val_y)
        runs = [(f"PyTorch {dtype}" + " autocast" * (dtype == "bfloat16"), config.to_dict(), dtype)
                for dtype in precisions]
        runs.append((f"PyTorch standard recipe, {precisions[-1]}" + " autocast" * (precisions[-1] == "bfloat16"),
                     {**RunConfig().to_dict(), **STANDARD}, precisions[-1]))  # whatever the recipe
        return [row(name, torch_curve(args, samples, os.path.join(scratch, f"config{i}.json"), settings, dtype, bar),
                    args.to_accuracy) for i, (name, settings, dtype) in enumerate(runs)]


def torch_curve(args, samples, path, settings, dtype, bar):
    """``[(seconds so far, val-acc)]`` of one PyTorch run (torch_train.py)."""
    write_json(path, settings)
    curve = []
    for line in torch_lines(args.torch_python, torch_train.__file__, samples, path, args.to_accuracy, dtype,
                            seconds=args.timeout):
        epoch = json.loads(line)
        curve.append((epoch["seconds"], epoch["val_acc"]))
        bar.update(1)
    return curve


def row(name, curve, target):
    reached = next(((i + 1, s) for i, (s, a) in enumerate(curve) if a >= target), (None, None))
    return {"name": name, "epochs_to_target": reached[0], "seconds_to_target": reached[1],
            "epochs": len(curve), "seconds": curve[-1][0], "val_acc": curve[-1][1], "curve": curve}


def run_to_accuracy(args, config, data, bar):
    if args.baseline == "tutorial":  # what a loop cannot train is said before any trains
        tutorial_loop.check_recipe(config, data.spec.input_shape[1:])
    why = torch_train.refused(config.to_dict()) if args.torch_python else ""
    if why:
        raise UserError(f"`torch_python`: the PyTorch rows cannot train this: {why}")
    rows = [row(f"gluon_gpu {config.dtype}", ours(config, data, args.to_accuracy, bar), args.to_accuracy)]
    if args.torch_python:
        rows += pytorch(args, config, data, bar)
    if args.baseline == "tutorial":
        rows.append(row("baseline loop", baseline(config, data, args.to_accuracy, bar), args.to_accuracy))
    for other in rows[1:]:  # how much sooner ours reached the target than each; the baseline's: ours' speedup
        if rows[0]["seconds_to_target"] and other["seconds_to_target"]:
            other["ours_sooner"] = other["seconds_to_target"] / rows[0]["seconds_to_target"]
            if other["name"] == "baseline loop":
                rows[0]["speedup"] = other["ours_sooner"]
    report = {"config": config.to_dict(), "target": args.to_accuracy, "machine": machine_info(), "results": rows}
    print(report_text(report))
    write_json(os.path.join(args.out, "accuracy.json"), report)
    plot(rows, args.to_accuracy, os.path.join(args.out, "accuracy.png"))
    print(f"wrote {args.out}/accuracy.json and {args.out}/accuracy.png")
    return 0


def report_text(report):
    """The table ``bench --to-accuracy`` prints, from its report (accuracy.json)."""
    config, target = report["config"], report["target"]
    columns = [("loop", 44, lambda r: r["name"]), ("epochs to ACC", 15, figure("epochs_to_target", "d")),
               ("seconds to ACC", 16, figure("seconds_to_target", ".1f")), ("epochs run", 12, figure("epochs", "d")),
               ("last val-acc", 14, figure("val_acc", ".4f")), ("faster", 9, figure("speedup", ".2f", "x")),
               ("ours sooner", 13, figure("ours_sooner", ".2f", "x"))]
    title = (f"time to val-acc {target} on {config['devices']}: {config['model']}, recipe {config['recipe'] or 'none'} "
             f"(at most {config['epochs']} epochs; validation counted in the time)"
             + (f", tta {config['tta']}" if config.get("tta") else ""))
    return text_table(columns, report["results"], title) + f"\nmeasured on {machine_words(report['machine'])}"


def plot(rows, target, path):
    fig, ax = subplots(figsize=(6, 4))
    for number, r in enumerate(rows):
        seconds, accuracy = zip(*r["curve"])
        ax.plot(seconds, accuracy, marker="o", color=f"C{number}", label=r["name"])
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target}")
    ax.set_xlabel("seconds (training and validation)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("time to accuracy")
    ax.legend()
    save_figure(fig, path)
