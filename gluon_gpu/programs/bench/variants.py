"""Benchmark rows for settings that hold for a whole process: ``--dtype`` (MXNet's
contrib.amp is process-wide), ``--omp-threads`` and ``--engine-threads`` (MXNet reads
both once, at start), and ``--pipeline`` (each pipeline's peak memory is its process's).

With several values of any, every combination runs as a child ``gluon_gpu.bench`` of
its own, one after another in the same invocation (so the rows share the machine's
minute), and its rows come back tagged with the values that vary; the first child alone
times the baseline loop. ``child_report`` runs such a child (the ensemble bench's
variants and its K=1 on one engine worker too).
"""
import argparse
import json
import os
import sys

from ...core.loop.callbacks import save_figure, subplots
from ...core.platform.devices import thread_variables
from ...core.platform.files import write_json
from ...models.member_stack import ensemble_variables
from ..config import RunConfig
from ..sweep import member_count
from . import children
from ..cli import text_table
from .timing import SHARE, TIMES, figure, marked, quiet, share_remarks

PROCESS_WIDE = ("dtype", "omp_threads", "engine_threads", "pipeline")


def variants(args):
    """``[(dtype, omp_threads, engine_threads, pipeline)]`` the flags ask for, in their order."""
    return [(d, t, w, p) for d in dict.fromkeys(args.dtype) for t in dict.fromkeys(args.omp_threads)
            for w in dict.fromkeys(args.engine_threads) for p in dict.fromkeys(args.pipeline)]


def variant_tag(args, report):
    """What tells a child's rows apart: its dtype, ``t<OpenMP threads>``, ``w<engine
    workers>``, its pipeline, each only when the flags give it several values."""
    threads = report["machine"]["threads"]
    parts = [(args.dtype, report["config"]["dtype"][0]), (args.omp_threads, f"t{threads['omp_threads']}"),
             (args.engine_threads, f"w{threads['engine_threads']}"), (args.pipeline, report["config"]["pipeline"][0])]
    return " ".join(value for values, value in parts if len(set(values)) > 1)


def run_children(parser, args, bar, **values):
    """Each variant in a child bench (``values``: more flags for all of them); returns
    ``[(tag, report)]``."""
    reports = []
    for number, (dtype, threads, workers, pipeline) in enumerate(variants(args)):
        out = os.path.join(args.out, f"{dtype}-omp{threads or 'default'}" + (f"-w{workers}" if workers else "")
                           + (f"-{pipeline}" if len(set(args.pipeline)) > 1 else ""))
        report = child_report(parser, args, label(dtype, threads, workers, pipeline), dtype=[dtype],
                              omp_threads=[threads], engine_threads=[workers], pipeline=[pipeline], out=out, quiet=True,
                              baseline=args.baseline if number == 0 else "none", **values)
        reports.append((variant_tag(args, report), report))
        bar.update(1)
    return reports


def child_argv(parser, args, **values):
    """The command line that gives ``parser`` the namespace ``args`` with ``values`` in
    place of some of its entries."""
    argv = []
    for action in parser._actions:  # pylint: disable=protected-access
        if not action.option_strings or action.default == argparse.SUPPRESS:  # --help, --help-all
            continue
        value = values.get(action.dest, getattr(args, action.dest))
        if value is None or value is False or value == "":  # '' is the default's spelling, which a flag refuses
            continue
        flag = action.option_strings[-1]
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag] + [str(v) for v in value]
        else:
            argv += [flag, str(value)]
    return argv


def child_report(parser, args, what, **values):
    """Run ``gluon_gpu.bench`` in a child process with ``values`` in place of some of
    ``args`` (``out`` among them) and return its ``bench.json``; a failed child is a
    one line naming ``what`` and the child's last line (children.failure)."""
    argv = child_argv(parser, args, **values)
    proc = children.run([sys.executable, "-m", "gluon_gpu.bench"] + argv, f"the {what} benchmark", args.timeout,
                        env={**os.environ, **start_variables(parser.parse_args(argv))})
    if proc.returncode:
        raise children.failure(f"the {what} benchmark failed: {children.last_words(proc.stderr, proc.returncode)}",
                               proc.returncode)
    with open(os.path.join(values["out"], "bench.json")) as f:
        return json.load(f)


def start_variables(args):
    """The variables MXNet must start with for the bench ``args`` (its thread counts, an
    ensemble's pool of random states): set for a child before it starts, so that it runs
    at once instead of re-executing itself to set them (an import of MXNet saved)."""
    members = max(args.ensemble) if args.ensemble else member_count(
        RunConfig(sweep=args.sweep, sweep_random=args.sweep_random))
    pool = ensemble_variables(members, args.model, args.fused_conv[0])
    return {**thread_variables(args.omp_threads[0], args.engine_threads[0]), **pool}


def label(dtype, threads, workers, pipeline):
    return (f"{dtype}, {threads or 'default'} OMP thread{'s' * (threads != 1)}, "
            f"{workers or 'default'} engine worker{'s' * (workers != 1)}, pipeline {pipeline}")


def run_variants(parser, args, bar):
    """Each combination in a child bench; returns ``(rows, tutorial)`` with every row
    tagged by the values that vary."""
    rows, tutorial = [], None
    for tag, report in run_children(parser, args, bar):
        threads = report["machine"]["threads"]
        for row in report["results"]:
            row.update(dtype=report["config"]["dtype"][0], omp_threads=threads["omp_threads"],
                       engine_threads=threads["engine_threads"], name=f"{row['name']} {tag}",
                       peak_rss_mib=report["peak_rss_mib"], peak_worker_rss_mib=report["peak_child_rss_mib"])
            rows.append(row)
        tutorial = tutorial or report.get("tutorial")
    for row in rows:  # against the first row, and the baseline, across processes
        if quiet(row, rows[0]):
            row["vs_first"] = rows[0]["median_epoch_s"] / row["median_epoch_s"]
        if tutorial and quiet(row, tutorial):
            row["vs_tutorial"] = tutorial["median_epoch_s"] / row["median_epoch_s"]
    return rows, tutorial


def format_variants(rows, tutorial):
    columns = [("run", 30, marked("name")), *TIMES, *SHARE, ("samples/s", 11, figure("samples_per_s", ".0f")),
               ("vs first", 10, figure("vs_first", ".2f", "x")), ("vs baseline", 13, figure("vs_tutorial", ".2f", "x")),
               ("val-acc", 9, figure("val_acc", ".4f")), ("peak RSS MiB", 14, figure("peak_rss_mib", ".0f")),
               ("worker RSS MiB", 16, figure("peak_worker_rss_mib", ".0f"))]
    baseline = [{**tutorial, "name": "baseline loop", "vs_first": "", "vs_tutorial": 1.0}] if tutorial else []
    return text_table(columns, rows + baseline)


def plot_variants(rows, tutorial, path):
    """Throughput per row, and each row's training loss per epoch (do the precisions'
    curves track each other?)."""
    fig, (ax_speed, ax_loss) = subplots(1, 2, figsize=(11, 4))
    names = [r["name"] for r in rows] + (["baseline loop"] if tutorial else [])
    speeds = [r["samples_per_s"] for r in rows] + ([tutorial["samples_per_s"]] if tutorial else [])
    bars = ax_speed.bar(names, speeds, color=[f"C{i}" for i in range(len(rows))] + (["C7"] if tutorial else []))
    ax_speed.bar_label(bars, fmt="%.0f")
    ax_speed.tick_params(axis="x", labelrotation=20)
    ax_speed.set_ylabel("samples/s (median epoch)")
    ax_speed.set_title("throughput")
    for i, r in enumerate(rows):
        loss = r["runs"][0]["loss"]
        ax_loss.plot(range(1, len(loss) + 1), loss, marker="o", color=f"C{i}", label=r["name"])
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("training loss (first run)")
    ax_loss.set_title("learning curves")
    ax_loss.legend()
    save_figure(fig, path)


def report_variants(parser, args, bar, machine):
    rows, tutorial = run_variants(parser, args, bar)
    print(format_variants(rows, tutorial))
    print("\n".join(share_remarks([*rows, tutorial])))
    write_json(os.path.join(args.out, "bench.json"),
               {"config": vars(args), "machine": machine, "results": rows, "tutorial": tutorial})
    plot_variants(rows, tutorial, os.path.join(args.out, "variants.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/variants.png")
    return 0
