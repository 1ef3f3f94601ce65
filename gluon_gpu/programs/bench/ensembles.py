"""bench --ensemble K...: seed-parallel ensembles timed against training their members one
after another.

For every ``--devices`` spec and ``--ensemble-layout``, each ensemble size K trains
``--epochs`` epochs; its member-samples/s (K x samples per second) is compared with K
members trained one after another, that is K x the K=1 epoch on the first spec (one
device). The K=1 epochs it is compared with are timed right before it: this machine's
speed drifts by 10-20% between minutes, which a baseline timed once at the start would
put into every ratio. Each row is timed as the trainer runs it by default: K=1 with one
engine worker per CPU context (a bench given more, ``--engine-threads``, times it in a
child bench, since a single network runs a few percent slower on two workers than on
one: README "Seed-parallel ensembles"); an ensemble the trainer starts with more workers
(on one CPU context: ``ensemble_engine_workers``) in a child bench with that many, rows
marked ``[<workers> workers]``. Several ``--engine-threads`` values: each in a child
ensemble bench, rows tagged ``w<workers>``. Writes a table,
``OUT/bench.json`` and ``OUT/ensemble.png`` (speedup against K, a line per spec and
layout).
"""
import itertools
import math
import os
import tempfile
from typing import NamedTuple

from tqdm import tqdm

from ...core.loop.callbacks import save_figure, subplots
from ...core.platform.devices import parse_devices, thread_settings
from ...core.platform.files import write_json
from ...core.platform.pools import process_temp_dir
from ...data import load_dataset
from ...models.init import ensemble_engine_workers, ensemble_layout
from ...models.zoo import model_for
from ..cli import progress_enabled, text_table
from .timing import (SHARE, TIMES, figure, machine_info, marked, peak_rss_mib, quiet, share_remarks, summarize,
                     time_ours)
from .variants import child_report, run_children


class Planned(NamedTuple):
    """One row to time. ``workers``: the engine workers the trainer would start that
    ensemble with (``ensemble_engine_workers``: one CPU context) when this process runs
    with MXNet's one; 0: as this process runs."""
    spec: str
    asked: str
    resolved: str
    members: int
    workers: int


def plan(args, model):
    """``[Planned]``: K=1 once, on the first spec, then every K > 1 for each spec and each
    distinct resolved layout."""
    sizes = sorted(set(args.ensemble) - {1})
    rows, seen = [Planned(args.devices[0], "-", "-", 1, 0)], set()
    for spec in args.devices:
        ctx = parse_devices(spec)
        for asked in args.ensemble_layout:
            for k in sizes:
                workers = ensemble_engine_workers(k, asked, ctx)
                resolved = ensemble_layout(asked, model, ctx, workers)
                if (spec, resolved, k) not in seen:
                    seen.add((spec, resolved, k))
                    rows.append(Planned(spec, asked, resolved, k, workers))
    return rows


def time_single(args, parser, bar, data):
    """The summary row of K=1 on the first spec, with one engine worker per CPU context
    (in a child bench when this process has more)."""
    spec = args.devices[0]
    if parse_devices(spec)[0].device_type != "cpu" or thread_settings()["engine_threads"] == 1:
        runs, info = time_ours(args, spec, bar, data)
        return summarize(f"{spec} K=1", runs, info["samples"], info["devices"], info["share"])
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as out:
        report = child_report(parser, args, "K=1", devices=[spec], ensemble=None, engine_threads=[1],
                              baseline="none", out=out, quiet=True)
    bar.update(args.epochs * args.repeats)
    return {**report["results"][0], "name": f"{spec} K=1 (1 engine worker)", "engine_threads": 1}


def time_in_child(args, parser, bar, spec, asked, sizes, workers):
    """Ensembles the trainer starts with more engine workers than this process has: a
    child bench with that many times them, each against its own K=1 on one worker."""
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as out:
        report = child_report(parser, args, f"{spec} {asked} ensemble", devices=[spec], ensemble_layout=[asked],
                              ensemble=sizes, engine_threads=[workers], baseline="none", out=out, quiet=True)
    bar.update(2 * len(sizes) * args.epochs * args.repeats)
    tag = f"[{workers} workers]"
    return [{**row, "name": f"{row['name']} {tag}", "variant": tag} for row in report["ensembles"] if row["members"] > 1]


def bench_ensembles(args, parser, bar, data, runs):
    model = model_for(args.model, data.spec.input_shape)
    rows = []
    by_spec_and_layout = itertools.groupby(runs, key=lambda run: (run.spec, run.asked, run.workers))
    for (spec, asked, workers), group in by_spec_and_layout:
        group = list(group)
        if workers:
            rows += time_in_child(args, parser, bar, spec, asked, [run.members for run in group], workers)
            continue
        for _, _, resolved, k, _ in group:
            single = time_single(args, parser, bar, data)  # K=1 just before: the ratio's two sides a minute apart
            if k == 1:
                row = single
            else:
                timed, info = time_ours(args, spec, bar, data, members=k, layout=resolved)
                row = summarize(f"{spec} K={k} {resolved}" + (" (auto)" if asked == "auto" else ""), timed,
                                info["samples"], info["devices"], info["share"])
            seconds = single["median_epoch_s"]
            row.setdefault("engine_threads", thread_settings()["engine_threads"])
            row.update(spec=spec, layout=resolved, auto=asked == "auto", members=k, model=model,
                       member_samples_per_s=row["samples_per_s"] * k, one_epoch_s=seconds, one_by_one_epoch_s=k * seconds)
            if quiet(row, single):
                row["speedup_vs_one_by_one"] = k * seconds / row["median_epoch_s"]
            rows.append(row)
    return rows


def format_ensemble_table(rows):
    columns = [("ensemble", 38, marked("name")), *TIMES, *SHARE,
               ("member-samples/s", 18, figure("member_samples_per_s", ".0f")),
               ("vs one by one", 15, figure("speedup_vs_one_by_one", ".2f", "x"))]
    return text_table(columns, rows, f"{rows[0]['model']}: K members against K x the K=1 epoch on {rows[0]['spec']} "
                                     "(timed just before each row)")


def plot_ensembles(rows, path):
    fig, ax = subplots(figsize=(7, 4.5))
    lines = {}
    for r in rows:
        if r["members"] > 1:
            lines.setdefault(" ".join(filter(None, (r["spec"], r["layout"], r.get("variant")))), []).append(r)
    for label, same in lines.items():
        ax.plot([1] + [r["members"] for r in same], [1.0] + [r.get("speedup_vs_one_by_one", math.nan) for r in same],
                marker="o", label=label)
    ks = sorted({r["members"] for r in rows})
    ax.axhline(1.0, color="grey", linestyle=":", label="K members one after another")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("ensemble size K")
    ax.set_ylabel(f"speedup (member-samples/s vs K=1 on {rows[0]['spec']})")
    ax.set_title(rows[0]["model"])
    ax.legend()
    save_figure(fig, path)


def report_ensembles(args, rows):
    rss = max(peak_rss_mib())  # this process or its largest child bench
    print(format_ensemble_table(rows))
    print("\n".join(share_remarks(rows)))
    print(f"peak RSS: {rss:.0f} MiB")
    write_json(os.path.join(args.out, "bench.json"),
               {"config": vars(args), "machine": machine_info(), "ensembles": rows, "peak_rss_mib": rss})
    plot_ensembles(rows, os.path.join(args.out, "ensemble.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/ensemble.png")
    return 0


def report_ensemble_variants(parser, args, bar):
    """Several engine-worker counts (or dtypes, OpenMP threads): each in a child ensemble
    bench, every row against its own child's K=1 on one engine worker, in one table."""
    rows = []
    for tag, report in run_children(parser, args, bar):
        for row in report["ensembles"]:
            row.update(variant=tag, name=f"{row['name']} {tag}")
            rows.append(row)
    return report_ensembles(args, rows)


def run_ensembles(args, parser):
    data = load_dataset(args.dataset, args.data_dir, args.image_size, limit=args.limit, val_limit=args.val_limit)
    runs = plan(args, model_for(args.model, data.spec.input_shape))
    with tqdm(total=args.epochs * args.repeats * (2 * len(runs) - 1), desc="bench", unit="epoch",
              disable=not progress_enabled(args)) as bar:
        rows = bench_ensembles(args, parser, bar, data, runs)
    return report_ensembles(args, rows)
