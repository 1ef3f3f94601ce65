"""bench --sweep SPEC: a hyperparameter sweep trained as one job against its K
configurations trained one after another on one context, in one invocation.

Each configuration alone trains ``--epochs`` epochs on the first device of the first
``--devices`` spec (as a person without the sweep would run them); then the sweep trains
as one job on every spec (its layout chosen as the trainer chooses it). The sweep's
member-samples/s (K x samples per second) is compared with the K runs one after
another: the sum of their median epochs against the sweep's median epoch. The
configurations are timed right before the sweeps (this machine drifts 10-20% between
minutes). Writes a table, ``OUT/bench.json`` and ``OUT/sweep.png``.
"""
import os

from tqdm import tqdm

from ...core.loop.callbacks import save_figure, subplots
from ...core.platform.devices import parse_devices
from ...core.platform.files import write_json
from ...data import load_dataset
from ...models.init import ensemble_layout
from ...models.zoo import model_for
from ..cli import progress_enabled, text_table
from ..config import SWEEPABLE, RunConfig
from ..sweep import member_configs, member_label, varied
from .timing import (SHARE, TIMES, figure, machine_info, marked, peak_rss_mib, quiet, share_remarks, summarize,
                     time_ours)


def run_sweep(args):
    members = member_configs(RunConfig(lr=args.lr, sweep=args.sweep, sweep_random=args.sweep_random))
    data = load_dataset(args.dataset, args.data_dir, args.image_size, limit=args.limit, val_limit=args.val_limit)
    model = model_for(args.model, data.spec.input_shape)
    first = parse_devices(args.devices[0])[0]
    one = "cpu" if first.device_type == "cpu" else f"gpu:{first.device_id}"  # its spec
    labels = [member_label(m, varied(members)) for m in members]
    rows = []
    with tqdm(total=args.epochs * args.repeats * (len(members) + len(args.devices)), desc="bench", unit="epoch",
              disable=not progress_enabled(args)) as bar:
        for member, label in zip(members, labels):
            runs, info = time_ours(args, one, bar, data, **{n: getattr(member, n) for n in SWEEPABLE})
            rows.append({**summarize(f"{one} {label}", runs, info["samples"], 1, info["share"]), "kind": "alone"})
        alone = sum(r["median_epoch_s"] for r in rows)
        for spec in args.devices:
            layout = ensemble_layout("auto", model, parse_devices(spec))
            runs, info = time_ours(args, spec, bar, data, members=len(members), ensemble=1, sweep=args.sweep,
                                   sweep_random=args.sweep_random)
            row = summarize(f"{spec} sweep of {len(members)} ({layout})", runs, info["samples"], info["devices"],
                            info["share"])
            rows.append({**row, "kind": "sweep", "spec": spec, "layout": layout,
                         "member_samples_per_s": row["samples_per_s"] * len(members)})
            if quiet(row, *rows):
                rows[-1]["vs_one_after_another"] = alone / row["median_epoch_s"]
    for row in rows:
        row.setdefault("member_samples_per_s", row["samples_per_s"])
    return report(args, rows, model, len(members), one, alone)


def report(args, rows, model, k, one, alone):
    columns = [("job", 44, marked("name")), *TIMES, *SHARE,
               ("member-samples/s", 18, figure("member_samples_per_s", ".0f")),
               ("vs one after another", 22, figure("vs_one_after_another", ".2f", "x"))]
    print(text_table(columns, rows, f"{model}: a sweep of {k} configurations as one job against the {k} trained one "
                                    f"after another on {one} ({alone:.2f} s an epoch in all)"))
    print("\n".join(share_remarks(rows)))
    rss = max(peak_rss_mib())
    print(f"peak RSS: {rss:.0f} MiB")
    write_json(os.path.join(args.out, "bench.json"), {"config": vars(args), "machine": machine_info(), "sweep": rows,
                                                      "one_after_another_epoch_s": alone, "peak_rss_mib": rss})
    plot(rows, k, one, os.path.join(args.out, "sweep.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/sweep.png")
    return 0


def plot(rows, k, one, path):
    """Member-samples/s: the K configurations one after another, then each sweep job."""
    alone = [r for r in rows if r["kind"] == "alone"]
    sweeps = [r for r in rows if r["kind"] == "sweep"]
    names = [f"{k} one after another\non {one}"] + [r["name"].replace(" sweep", "\nsweep") for r in sweeps]
    one_by_one = k / sum(1 / r["member_samples_per_s"] for r in alone)  # the harmonic mean: K epochs in turn
    speeds = [one_by_one] + [r["member_samples_per_s"] for r in sweeps]
    fig, ax = subplots(figsize=(7, 4.5))
    bars = ax.bar(names, speeds, color=["C7"] + ["C0"] * len(sweeps))
    ax.bar_label(bars, labels=["1.00x"] + [f"{r['vs_one_after_another']:.2f}x" if "vs_one_after_another" in r
                                           else "busy" for r in sweeps])
    ax.set_ylabel("member-samples/s (median epoch)")
    ax.set_title(f"a sweep of {k} as one job")
    save_figure(fig, path)
