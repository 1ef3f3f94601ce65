"""Timing real training epochs for the benchmark: ours for a spec and a configuration,
the baseline loop, the summary row of a set of runs, and the text table of rows (shared
by bench.py and its ensemble and variant modes)."""
import json
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time

import mxnet as mx

from ...core.loop.fit import train_epoch
from ...core.platform.cpu_time import BUSY_LIMIT, CpuMeter
from ...core.platform.devices import gpu_count, parse_devices, thread_settings
from ...core.platform.environment import bfloat16_isa, cpu_model
from ...core.platform.environment import usable_cpus
from ...core.platform.files import write_json
from ...core.platform.pools import process_temp_dir
from ...core.state.version import __version__
from ...models.fused_conv import is_fused
from ...models.zoo import model_for
from .. import tutorial_loop
from ..config import RunConfig
from ..run import build_run
from . import torch_train
from .torch_child import save_samples, torch_lines


def scaling_config(args, spec, members=1, fused_conv=None, layout="auto", augment="", **flags):
    """The run configuration the benchmark times on ``spec``; ``flags``: other RunConfig
    values (a sweep's, or one of its configurations)."""
    return RunConfig(**{**dict(devices=spec, batch_size=args.batch_size, model=args.model, lr=args.lr,
                               pipeline=args.pipeline[0], loader_workers=args.loader_workers, quiet=True, ensemble=members,
                               ensemble_layout=layout, fused_conv=fused_conv or args.fused_conv[0],
                               bucket_mb=args.bucket_mb, limit=args.limit, dataset=args.dataset,
                               data_dir=args.data_dir, image_size=args.image_size, dtype=args.dtype[0], amp=args.amp,
                               bfloat16_kernels=args.bfloat16_kernels, augment=augment), **flags})


def time_ours(args, spec, bar, data, members=1, fused_conv=None, layout="auto", augment="", **flags):
    """Epoch seconds of gluon_gpu on ``spec`` and the validation accuracy after training;
    ``flags``: other RunConfig values (a sweep's, or one of its configurations)."""
    ctx = parse_devices(spec)
    config = scaling_config(args, spec, members, fused_conv, layout, augment, **flags)
    with CpuMeter() as meter:
        runs, dp, samples = _timed_runs(args, config, ctx, bar, data, members)
    return runs, {"devices": len(ctx), "samples": samples, "fused_conv": is_fused(dp.net), "share": meter.share}


def _timed_runs(args, config, ctx, bar, data, members):
    """``--repeats`` runs of ``--epochs`` timed epochs of ``config``."""
    runs = []
    for _ in range(args.repeats):
        run = build_run(config, ctx, data=data)
        dp, train_pipe = run.dp, run.train
        # Several devices: each epoch is followed by one of the same steps without the
        # gradient exchange, so what the exchange costs is measured epoch by epoch.
        alone = build_run(config, ctx, exchange=False, data=data, pipelines=(run.train, run.val)).dp \
            if len(ctx) > 1 and members == 1 else None
        seconds, cpu_seconds, alone_seconds, losses = [], [], [], []
        for epoch in range(args.epochs):
            cpu_start = time.process_time()
            record = train_epoch(dp, train_pipe, epoch)
            seconds.append(record["seconds"])
            losses.append(record["loss"])
            cpu_seconds.append(time.process_time() - cpu_start)
            if alone is not None:
                alone_seconds.append(train_epoch(alone, train_pipe, epoch)["seconds"])
            bar.update(1)
        runs.append({"seconds": seconds, "cpu_seconds": cpu_seconds, "no_exchange_seconds": alone_seconds,
                     "loss": losses, "val_acc": dp.evaluate(run.val.epoch(0))["acc"]})
    return runs, dp, train_pipe.n


def time_tutorial(args, data, bar):
    ctx = parse_devices(args.devices[0])
    model = model_for(args.model, data.spec.input_shape)
    runs = []
    for _ in range(args.repeats):
        mx.random.seed(0)
        seconds, acc = tutorial_loop.run(data.train_x, data.train_y, data.val_x, data.val_y, ctx, args.epochs,
                                         args.batch_size, args.loader_workers, on_epoch=lambda *_: bar.update(1),
                                         model=model, classes=data.spec.outputs)
        runs.append({"seconds": seconds, "val_acc": acc})
    return runs


TORCH_FACTS = ("torch", "threads", "parameters")  # what PyTorch's run says of itself: version, threads, size


def time_pytorch(args, config, data, bar):
    """Epoch seconds (training alone) of PyTorch eager training ``config`` (a run
    configuration's dict: the same network, batch, optimizer and data as ours) in
    torch_train.py under ``--torch-python``, at its default threads, and its validation
    accuracy after the last epoch."""
    runs = []
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as scratch:
        samples, path = os.path.join(scratch, "samples.npz"), os.path.join(scratch, "config.json")
        save_samples(samples, data.spec, train_x=data.train_x, train_y=data.train_y, val_x=data.val_x,
                     val_y=data.val_y)
        write_json(path, config)
        for _ in range(args.repeats):
            epochs = []
            for line in torch_lines(args.torch_python, torch_train.__file__, samples, path, "none", "float32",
                                    seconds=args.timeout):
                epochs.append(json.loads(line))
                bar.update(1)
            runs.append({"seconds": [e["train_seconds"] for e in epochs], "val_acc": epochs[-1]["val_acc"],
                         **{key: epochs[-1][key] for key in TORCH_FACTS}})
    return runs


def summarize(name, runs, samples, devices, share):
    """A table's row of ``runs`` (their epoch seconds), with what they had of the machine
    (``share``: a CpuShare)."""
    first = [r["seconds"][0] for r in runs]
    rest = [s for r in runs for s in r["seconds"][1:]] or first
    median = statistics.median(rest)
    row = {"name": name, "devices": devices, "first_epoch_s": statistics.median(first),
           "median_epoch_s": median, "epochs_timed": len(rest), "samples_per_s": samples / median,
           "val_acc": statistics.median(r["val_acc"] for r in runs), "runs": runs, **share.as_dict()}
    if all("cpu_seconds" in r for r in runs):  # this process's CPU time / wall time: cores kept busy
        timed = [(c, s) for r in runs for c, s in zip(r["cpu_seconds"][1:] or r["cpu_seconds"],
                                                       r["seconds"][1:] or r["seconds"])]
        row["cores_busy"] = statistics.median(c / s for c, s in timed)
    if all(r.get("no_exchange_seconds") for r in runs):
        pairs = [(s, a) for r in runs for s, a in zip(r["seconds"][1:] or r["seconds"],
                                                      r["no_exchange_seconds"][1:] or r["no_exchange_seconds"])]
        row["no_exchange_epoch_s"] = statistics.median(a for _, a in pairs)
        row["exchange_share"] = statistics.median(1 - a / s for s, a in pairs)
    return row


def machine_info():
    cpu = cpu_model()
    gpus = []
    if gpu_count():
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.split("\n")
        except (OSError, subprocess.SubprocessError):
            gpus = ["unknown"] * gpu_count()
    features = [f.name for f in mx.runtime.Features().values() if f.enabled]
    return {"cpu": cpu, "cpu_isa": bfloat16_isa(), "cores": usable_cpus(), "gpus": [g for g in gpus if g],
            "mxnet": mx.__version__, "mxnet_features": features, "python": platform.python_version(),
            "gluon_gpu": __version__, "threads": thread_settings()}


def machine_words(machine):
    """'AMD EPYC (AVX-512 BF16), 2 cores, MXNet 1.9.1, gluon_gpu 0.9.2': what a table was measured on."""
    return (f"{machine['cpu']} ({machine['cpu_isa']}), {machine['cores']} cores, MXNet {machine['mxnet']}, "
            f"gluon_gpu {machine['gluon_gpu']}")


def peak_rss_mib():
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return self_kib / 1024, child_kib / 1024



def figure(key, fmt, suffix=""):
    """A table cell: ``row[key]`` formatted (a ratio: ``suffix='x'``), '-' where the row
    lacks it, blank where it holds ''."""
    def cell(row):
        value = row.get(key)
        return "-" if value is None else "" if value == "" else format(value, fmt) + suffix
    return cell


TIMES = [("first s", 9, figure("first_epoch_s", ".2f")), ("median s", 10, figure("median_epoch_s", ".2f"))]
# What each row had of the machine (cpu_time.py): a row marked busy is quoted in no ratio.
SHARE = [("CPU share", 10, figure("cpu_share", ".2f")), ("others", 8, figure("others", ".2f"))]


def marked(key):
    """A row's name cell, with ``*`` where it ran beside other work."""
    return lambda row: row[key] + " *" * bool(row.get("busy"))


def quiet(*rows):
    """None of ``rows`` ran beside other work: a ratio of their times is a result."""
    return not any(r and r.get("busy") for r in rows)


def share_remarks(rows):
    """The lines under a table that say what its CPU columns mean and what ``*`` marks."""
    lines = ["CPU share: the row's processes' CPU time over its wall time x the machine's CPUs; others: what "
             "everything else took of the machine meanwhile"]
    if not quiet(*rows):
        lines.append(f"* ran beside other work (others above {BUSY_LIMIT:.2f}): its times are no result and no "
                     "ratio quotes them; run the same command again on a quiet machine (see `uptime`)")
    return lines
