"""python -m gluon_gpu.bench: real training epochs per device spec, timed side by side.

For each ``--devices`` spec it trains ``--epochs`` epochs ``--repeats`` times and reports
the first epoch apart (it includes graph building), the median of the others, samples/s,
speedup over the first spec and scaling efficiency (speedup / device count). With several
``--fused-conv`` modes (``--fused-conv auto off``) every spec runs in each, speedups
counted within a mode, so the fused operator's gain is measured side by side. With
``--baseline tutorial`` the MXNet tutorial's loop is timed in the same invocation and
every spec gets the ratio tutorial epoch / our epoch. Writes a table to stdout,
``OUT/bench.json`` and ``OUT/scaling.png``. Any ``--model``: the baseline is then the
same loop training gluoncv's network as GluonCV's CIFAR script does. Several ``--dtype``
or ``--omp-threads`` values: each combination in a process of its own
(bench_variants.py), in one table and ``OUT/variants.png`` with the learning curves.
"""
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import mxnet as mx
from mxnet import nd
from tqdm import tqdm

from .. import __version__
from ..core.callbacks import save_figure, subplots
from ..core.devices import cpu_contexts, gpu_count, parse_devices, require_thread_settings, thread_settings
from ..core.errors import UserError
from ..core.files import write_json
from ..core.precision import check_precision, precision_for
from ..core.loop import train_epoch
from ..data import load_dataset
from ..models import get_model
from ..models.zoo import model_for
from ..models.fused_conv import is_fused
from . import tutorial_loop
from . import bench_variants
from .cli import Parser, main_guard, positive_int, progress_enabled
from .config import COMMON_FLAGS, RunConfig, add_flags
from .run import build_run
from .train import check_writable


def build_parser():
    p = Parser(prog="gluon_gpu.bench", description=__doc__)
    add_flags(p, COMMON_FLAGS + ("model", "bucket_mb", "pipeline", "num_workers", "limit", "dtype", "amp"),
              many=("devices", "fused_conv") + bench_variants.PROCESS_WIDE, defaults={"devices": None})
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs per run (the first is reported apart)")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs per spec; medians pool them")
    p.add_argument("--baseline", choices=("tutorial", "none"), default="tutorial",
                   help="time MXNet's tutorial loop (LeNet; other models: GluonCV's loop) beside ours")
    p.add_argument("--ensemble", type=positive_int, nargs="+", default=None, metavar="K",
                   help="ensemble mode: time K fused LeNets per K (on the first --devices spec) "
                        "against K x the K=1 epoch")
    p.add_argument("--workers", type=positive_int, nargs="+", default=None, metavar="W",
                   help="distributed mode: time a dist_sync job of W local workers (same global "
                        "batch, the first --devices spec each) against one plain process")
    p.add_argument("--out", default="bench-out", help="directory for bench.json and scaling.png")
    return p


def default_specs():
    n = gpu_count()
    return [f"gpu*{k}" for k in _powers_of_two(n)] + ["cpu"] if n else ["cpu", "cpu*2"]


def _powers_of_two(n):
    k, out = 1, []
    while k <= n:
        out.append(k)
        k *= 2
    return out + ([n] if out[-1] != n else [])


def time_ours(args, spec, bar, data, members=1, fused_conv=None):
    """Epoch seconds of gluon_gpu on ``spec`` and the validation accuracy after training."""
    ctx = parse_devices(spec)
    config = RunConfig(devices=spec, batch_size=args.batch_size, model=args.model, pipeline=args.pipeline,
                       num_workers=args.num_workers, quiet=True, ensemble=members,
                       fused_conv=fused_conv or args.fused_conv[0], bucket_mb=args.bucket_mb,
                       limit=args.limit, data_dir=args.data_dir, dtype=args.dtype[0], amp=args.amp)
    runs = []
    for _ in range(args.repeats):
        run = build_run(config, ctx, data=data)
        dp, train_pipe = run.dp, run.train
        # Several devices: each epoch is followed by one of the same steps without the
        # gradient exchange, so what the exchange costs is measured epoch by epoch.
        alone = build_run(config, ctx, exchange=False, data=data).dp if len(ctx) > 1 and members == 1 else None
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
    return runs, {"devices": len(ctx), "samples": train_pipe.n, "fused_conv": is_fused(dp.net)}


def time_tutorial(args, data, bar):
    ctx = parse_devices(args.devices[0])
    model = model_for(args.model, data.spec.input_shape)
    runs = []
    for _ in range(args.repeats):
        mx.random.seed(0)
        seconds, acc = tutorial_loop.run(data.train_x, data.train_y, data.val_x, data.val_y, ctx, args.epochs,
                                         args.batch_size, args.num_workers, on_epoch=lambda *_: bar.update(1),
                                         model=model, classes=data.spec.outputs)
        runs.append({"seconds": seconds, "val_acc": acc})
    return runs


def summarize(name, runs, samples, devices):
    first = [r["seconds"][0] for r in runs]
    rest = [s for r in runs for s in r["seconds"][1:]] or first
    median = statistics.median(rest)
    row = {"name": name, "devices": devices, "first_epoch_s": statistics.median(first),
           "median_epoch_s": median, "epochs_timed": len(rest), "samples_per_s": samples / median,
           "val_acc": statistics.median(r["val_acc"] for r in runs), "runs": runs}
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


def training_flops(model, samples, input_shape, outputs):
    """Multiply-adds of the conv and dense layers x 2 (FLOPs) x 3 (forward, and the two
    backward products), less the first layer's data gradient (its input, the images,
    needs none), per epoch: the work any implementation must do."""
    net = get_model(model, outputs, input_shape[0])
    net.initialize()
    macs = []

    def hook(block, _inputs, output):
        weight = block.weight.data()
        macs.append(output.size / output.shape[0] * weight.size / weight.shape[0])
    for block in _descendants(net):
        if isinstance(block, (mx.gluon.nn.Conv2D, mx.gluon.nn.Dense)):
            block.register_forward_hook(hook)
    net(nd.zeros((1,) + tuple(input_shape)))
    return 2 * (3 * sum(macs) - macs[0]) * samples


def _descendants(block):
    children = list(block._children.values())  # pylint: disable=protected-access
    return [block] + [d for c in children for d in _descendants(c)]


def matmul_gflops(ctx=mx.cpu(), n=1024, repeats=7):
    """float32 GEMM speed of one device (a CPU context: with this process's OpenMP threads
    per operator), median of ``repeats``: the faster of MXNet's two GEMMs, ``dot`` (BLAS)
    and ``FullyConnected`` (oneDNN on CPUs)."""
    a, b = nd.random.uniform(shape=(n, n), ctx=ctx), nd.random.uniform(shape=(n, n), ctx=ctx)
    best = 0.0
    for gemm in (lambda: nd.dot(a, b), lambda: nd.FullyConnected(a, b, no_bias=True, num_hidden=n)):
        gemm().wait_to_read()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            gemm().wait_to_read()
            times.append(time.perf_counter() - start)
        best = max(best, 2 * n ** 3 / statistics.median(times) / 1e9)
    return best


def concurrent_contexts(ctx):
    """How many of these contexts can compute at once: every GPU; CPU contexts up to
    the cores their OpenMP threads fill (the floor of cpu*2 on 2 cores is half of cpu's)."""
    return len(ctx) if ctx[0].device_type == "gpu" else min(len(ctx), cpu_contexts())


def machine_info():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = []
    if gpu_count():
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20).stdout.split("\n")
        except (OSError, subprocess.SubprocessError):
            gpus = ["unknown"] * gpu_count()
    features = [f.name for f in mx.runtime.Features().values() if f.enabled]
    return {"cpu": cpu, "cores": os.cpu_count(), "gpus": [g for g in gpus if g],
            "mxnet": mx.__version__, "mxnet_features": features, "python": platform.python_version(),
            "gluon_gpu": __version__, "threads": thread_settings()}


def peak_rss_mib():
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return self_kib / 1024, child_kib / 1024


def format_table(rows, tutorial):
    head = (f"{'devices':<16}{'first s':>9}{'median s':>10}{'samples/s':>11}{'speedup':>9}"
            f"{'eff.':>7}{'exchange':>10}{'cores busy':>12}{'vs tutorial':>13}{'val-acc':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        vs = f"{r['vs_tutorial']:.2f}x" if r.get("vs_tutorial") else "-"
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        eff = f"{r['efficiency']:.0%}" if "efficiency" in r else "-"
        busy = f"{r['cores_busy']:.2f}" if "cores_busy" in r else "-"
        exchange = f"{r['exchange_share']:.1%}" if "exchange_share" in r else "-"
        lines.append(f"{r['name']:<16}{r['first_epoch_s']:>9.2f}{r['median_epoch_s']:>10.2f}"
                     f"{r['samples_per_s']:>11.0f}{speed:>9}{eff:>7}{exchange:>10}{busy:>12}{vs:>13}"
                     f"{r['val_acc']:>9.4f}")
    if tutorial:
        lines.append(f"{'tutorial (' + tutorial['name'] + ')':<16}"[:16] + f"{tutorial['first_epoch_s']:>9.2f}"
                     f"{tutorial['median_epoch_s']:>10.2f}{tutorial['samples_per_s']:>11.0f}{'':>9}{'':>7}"
                     f"{'-':>10}{'-':>12}{'1.00x':>13}{tutorial['val_acc']:>9.4f}")
    return "\n".join(lines)


def plot(rows, tutorial, path):
    names = [r["name"] for r in rows] + (["tutorial"] if tutorial else [])
    speeds = [r["samples_per_s"] for r in rows] + ([tutorial["samples_per_s"]] if tutorial else [])
    fig, (ax_speed, ax_eff) = subplots(1, 2, figsize=(10, 4))
    bars = ax_speed.bar(names, speeds, color=["C0"] * len(rows) + (["C7"] if tutorial else []))
    ax_speed.tick_params(axis="x", labelrotation=20)
    ax_speed.bar_label(bars, fmt="%.0f")
    ax_speed.set_ylabel("samples/s (median epoch)")
    ax_speed.set_title("throughput")
    for number, mode in enumerate(dict.fromkeys(r["fused_conv_mode"] for r in rows)):
        same = [r for r in rows if r["fused_conv_mode"] == mode]
        ax_eff.plot([r["devices"] for r in same], [r["efficiency"] for r in same], marker="o",
                    color=f"C{number}", label=f"--fused-conv {mode}")
        alone = [(r["devices"], r["efficiency"] * r["median_epoch_s"] / r["no_exchange_epoch_s"])
                 for r in same if "no_exchange_epoch_s" in r]
        if alone:
            ax_eff.plot(*zip(*alone), marker="x", linestyle="none", color=f"C{number}",
                        label=f"--fused-conv {mode}, no gradient exchange")
    ax_eff.legend()
    ax_eff.axhline(1.0, color="grey", linestyle=":")
    ax_eff.set_xlabel("devices")
    ax_eff.set_ylabel("scaling efficiency (speedup / devices)")
    ax_eff.set_ylim(0, 1.2)
    ax_eff.set_title("scaling")
    save_figure(fig, path)


def bench_ensembles(args, bar, data):
    """Rows per ensemble size K: epoch time, member-samples/s, and the speedup over
    training the K members one after another (K x the K=1 epoch, same invocation)."""
    spec = args.devices[0]
    sizes = sorted(set([1] + args.ensemble))
    rows = []
    for k in sizes:
        runs, info = time_ours(args, spec, bar, data, members=k)
        row = summarize(f"K={k}", runs, info["samples"], info["devices"])
        row.update(members=k, member_samples_per_s=row["samples_per_s"] * k)
        rows.append(row)
    single = rows[0]["median_epoch_s"]
    for row in rows:
        row["speedup_vs_sequential"] = row["members"] * single / row["median_epoch_s"]
    return rows


def format_ensemble_table(rows, spec):
    head = f"{'ensemble':<10}{'first s':>9}{'median s':>10}{'member-samples/s':>18}{'vs sequential':>15}"
    lines = [f"ensembles on {spec}", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['name']:<10}{r['first_epoch_s']:>9.2f}{r['median_epoch_s']:>10.2f}"
                     f"{r['member_samples_per_s']:>18.0f}{r['speedup_vs_sequential']:>14.2f}x")
    return "\n".join(lines)


def plot_ensembles(rows, path):
    fig, ax = subplots(figsize=(6, 4))
    ks = [r["members"] for r in rows]
    ax.plot(ks, [r["speedup_vs_sequential"] for r in rows], marker="o", label="fused ensemble")
    ax.axhline(1.0, color="grey", linestyle=":", label="K members one after another")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("ensemble size K")
    ax.set_ylabel("speedup (member-samples/s vs K=1)")
    ax.legend()
    save_figure(fig, path)


def run_ensembles(args):
    sizes = sorted(set([1] + args.ensemble))
    with tqdm(total=args.epochs * args.repeats * len(sizes), desc="bench", unit="epoch",
              disable=not progress_enabled(args)) as bar:
        rows = bench_ensembles(args, bar, load_dataset(data_dir=args.data_dir, limit=args.limit))
    rss = peak_rss_mib()[0]
    print(format_ensemble_table(rows, args.devices[0]))
    print(f"peak RSS: {rss:.0f} MiB")
    write_json(os.path.join(args.out, "bench.json"),
               {"config": vars(args), "machine": machine_info(), "ensembles": rows, "peak_rss_mib": rss})
    plot_ensembles(rows, os.path.join(args.out, "ensemble.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/ensemble.png")
    return 0


def time_job(args, workers, out):
    """Median epoch seconds of a real training run: one plain process (``workers=0``) or a
    dist_sync job of that many local workers started by gluon_gpu.launch."""
    per_worker = args.batch_size // max(workers, 1)
    cmd = [sys.executable, "-m", "gluon_gpu.train", "--devices", args.devices[0], "--quiet",
           "--epochs", str(args.epochs), "--batch-size", str(per_worker), "--out", out,
           "--save-period", str(args.epochs)] + (["--limit", str(args.limit)] if args.limit else []) \
        + (["--data-dir", args.data_dir] if args.data_dir else [])
    if workers:
        cmd = [sys.executable, "-m", "gluon_gpu.launch", "-n", str(workers), "-s", "1", "--"] + \
            cmd + ["--kvstore", "dist_sync"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"benchmark job failed ({' '.join(cmd)}): {last}")
    import json
    with open(os.path.join(out, "metrics.json")) as f:
        epochs = json.load(f)["epochs"]
    seconds = [e["seconds"] for e in epochs]
    return {"seconds": seconds, "val_acc": epochs[-1]["val_acc"]}


def run_workers(args):
    rows = []
    sizes = [0] + sorted(set(args.workers))
    with tqdm(total=len(sizes), desc="bench", unit="job", disable=not progress_enabled(args)) as bar:
        for w in sizes:
            run = time_job(args, w, tempfile.mkdtemp(prefix=f"job-{w}-workers-", dir=args.out))
            samples = args.limit or 60000
            name = "1 process" if w == 0 else f"{w} worker{'s' if w > 1 else ''}"
            rows.append({**summarize(name, [run], samples, len(parse_devices(args.devices[0]))), "workers": w})
            bar.update(1)
    base = rows[0]["median_epoch_s"]
    head = f"{'job':<12}{'first s':>9}{'median s':>10}{'samples/s':>11}{'time vs 1 process':>20}"
    lines = [f"distributed dist_sync jobs on {args.devices[0]} per worker, global batch {args.batch_size}",
             head, "-" * len(head)]
    for r in rows:
        r["overhead_ratio"] = r["median_epoch_s"] / base
        lines.append(f"{r['name']:<12}{r['first_epoch_s']:>9.2f}{r['median_epoch_s']:>10.2f}"
                     f"{r['samples_per_s']:>11.0f}{r['overhead_ratio']:>19.2f}x")
    print("\n".join(lines))
    write_json(os.path.join(args.out, "bench.json"),
               {"config": vars(args), "machine": machine_info(), "workers": rows})
    print(f"wrote {args.out}/bench.json")
    return 0


@main_guard("gluon_gpu.bench")
def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    args.devices = args.devices or default_specs()
    for spec in args.devices:  # every spec and precision checked before any work
        for dtype in args.dtype:
            check_precision(precision_for(dtype, args.amp), parse_devices(spec))
    check_writable(args.out)
    combinations = bench_variants.variants(args)
    if len(combinations) > 1:
        with tqdm(total=len(combinations), desc="bench", unit="process", disable=not progress_enabled(args)) as bar:
            return bench_variants.report_variants(parser, args, bar, machine_info())
    require_thread_settings(args.omp_threads[0], args.engine_threads, restart=argv is None)
    if args.ensemble:
        return run_ensembles(args)
    if args.workers:
        return run_workers(args)
    data = load_dataset(data_dir=args.data_dir, limit=args.limit)
    modes = list(dict.fromkeys(args.fused_conv))
    total = args.epochs * args.repeats * (len(args.devices) * len(modes) + (args.baseline == "tutorial"))
    rows, tutorial = [], None
    with tqdm(total=total, desc="bench", unit="epoch", disable=not progress_enabled(args)) as bar:
        for mode in modes:
            for spec in args.devices:
                runs, info = time_ours(args, spec, bar, data, fused_conv=mode)
                name = spec if len(modes) == 1 else f"{spec} {'fused' if info['fused_conv'] else 'unfused'}"
                rows.append({**summarize(name, runs, info["samples"], info["devices"]), "spec": spec,
                             "fused_conv_mode": mode, "fused_conv": info["fused_conv"]})
        if args.baseline == "tutorial":
            tutorial = summarize(args.devices[0], time_tutorial(args, data, bar), len(data.train_x),
                                 len(parse_devices(args.devices[0])))
    for r in rows:  # speedup and efficiency against the first spec in the same mode
        base = next(b for b in rows if b["fused_conv_mode"] == r["fused_conv_mode"])
        r["speedup"] = base["median_epoch_s"] / r["median_epoch_s"]
        r["efficiency"] = r["speedup"] / (r["devices"] / base["devices"])
        if tutorial:
            r["vs_tutorial"] = tutorial["median_epoch_s"] / r["median_epoch_s"]
    flops = training_flops(model_for(args.model, data.spec.input_shape), len(data.train_x), data.spec.input_shape,
                           data.spec.outputs)
    gflops = {}  # per device kind
    for r in rows:
        ctx = parse_devices(r["spec"])
        kind = ctx[0].device_type
        if kind not in gflops:
            gflops[kind] = matmul_gflops(ctx[0])
        r["floor_s"] = flops / (gflops[kind] * 1e9 * concurrent_contexts(ctx))
        r["of_floor"] = r["floor_s"] / r["median_epoch_s"]
    rss, child_rss = peak_rss_mib()
    threads = thread_settings()
    print(format_table(rows, tutorial))
    if any("exchange_share" in r for r in rows):
        print("exchange: the share of the epoch the gradient exchange costs (the data-parallel overhead): "
              "each epoch alternated with the same steps minus the exchange, median of the pairs")
    print(f"threads: {threads['omp_threads']} OpenMP per operator, {threads['engine_threads']} engine "
          f"worker(s) per CPU context, {threads['cpu_temp_copy']} CPU scratch buffers")
    print(f"compute floor: {flops / 1e9:.1f} GFLOP per epoch / "
          + ", ".join(f"{g:.1f} GFLOP/s per {kind} device" for kind, g in gflops.items())
          + " (1024^2 matmul) / devices computing at once; "
          + ", ".join(f"{r['name']} reaches {r['of_floor']:.0%} of its floor ({r['floor_s']:.2f} s)" for r in rows))
    print(f"peak RSS: {rss:.0f} MiB (largest DataLoader worker: {child_rss:.0f} MiB)")
    report = {"config": {k: v for k, v in vars(args).items()}, "machine": machine_info(),
              "results": rows, "tutorial": tutorial,
              "compute_floor": {"gflop_per_epoch": flops / 1e9, "matmul_gflops": gflops},
              "peak_rss_mib": rss, "peak_child_rss_mib": child_rss}
    write_json(os.path.join(args.out, "bench.json"), report)
    plot(rows, tutorial, os.path.join(args.out, "scaling.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/scaling.png")
    return 0

