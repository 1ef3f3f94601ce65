"""Real training epochs per device spec, timed side by side.

For each ``--devices`` spec it trains ``--epochs`` epochs ``--repeats`` times and reports
the first epoch apart (it includes graph building), the median of the others, samples/s,
speedup over the first spec and scaling efficiency (speedup / device count). With several
``--fused-conv`` modes (``--fused-conv auto off``) every spec runs in each, speedups
counted within a mode, so the fused operator's gain is measured side by side; with
several ``--augment`` settings (``--augment none basic``) likewise, each row then also
giving its epoch time against the first setting's on the same spec. With
``--baseline tutorial`` the MXNet tutorial's loop is timed in the same invocation and
every spec gets the ratio tutorial epoch / our epoch. Writes a table to stdout,
``OUT/bench.json`` and ``OUT/scaling.png``. Any ``--model``: the baseline is then the
same loop training gluoncv's network as GluonCV's CIFAR script does. Several ``--dtype``,
``--omp-threads`` or ``--engine-threads`` values: each combination in a process of its
own (variants.py), in one table and ``OUT/variants.png`` with the learning curves
(with ``--ensemble``: the ensemble table and ``OUT/ensemble.png``).
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

import mxnet as mx
from mxnet import nd
from tqdm import tqdm

from ...core.loop.callbacks import save_figure, subplots
from ...core.platform.cpu_time import CpuMeter
from ...core.platform.devices import cpu_contexts, gpu_count, parse_devices, require_thread_settings, thread_settings
from ...core.platform.errors import UserError
from ...core.platform.files import check_writable
from ...core.platform.files import write_json
from ...core.platform.optional import require_horovod
from ...core.platform.walk import descendants
from ...core.step.precision import check_precision, precision_for
from ...data import load_dataset
from ...models import get_model
from ...models.zoo import model_for
from ..cli import Parser, main_guard, positive_int, progress_enabled, text_table, unit_fraction, wait_seconds
from ..config import COMMON_FLAGS, add_flags
from . import accuracy, children, ensembles, inference, sweep, torch_train, variants
from .timing import (SHARE, TIMES, TORCH_FACTS, figure, machine_info, marked, peak_rss_mib, quiet, scaling_config,
                     share_remarks, summarize, time_ours, time_pytorch, time_tutorial)


def build_parser():
    p = Parser("bench", description=__doc__, brief=True)
    add_flags(p, COMMON_FLAGS + ("model", "lr", "bucket_mb", "dataset", "image_size", "pipeline", "loader_workers",
                                 "limit", "val_limit", "dtype", "amp", "bfloat16_kernels", "ensemble_layout", "augment", "sweep",
                                 "sweep_random", "kvstore"),
              many=("devices", "fused_conv", "ensemble_layout", "augment", "kvstore") + variants.PROCESS_WIDE,
              defaults={"devices": None, "augment": "none"})
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs per run (the first is reported apart)")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs per spec; medians pool them")
    p.add_argument("--baseline", choices=("tutorial", "none"), default="tutorial",
                   help="time MXNet's tutorial loop (LeNet; other models: GluonCV's loop) beside ours")
    p.add_argument("--ensemble", type=positive_int, nargs="+", default=None, metavar="K",
                   help="ensemble mode: time ensembles of K members per --devices spec and "
                        "--ensemble-layout against K x the K=1 epoch on the first spec")
    p.add_argument("--workers", type=positive_int, nargs="+", default=None, metavar="W",
                   help="distributed mode: time a dist_sync job of W local workers (same global "
                        "batch, the first --devices spec each) against one plain process")
    p.add_argument("--to-accuracy", type=unit_fraction, default=None, metavar="ACC",
                   help="time to accuracy: wall time until val-acc >= ACC (validation counted), ours against "
                        "the baseline loop with the same --recipe, on the first --devices spec")
    p.add_argument("--recipe", default=None, metavar="NAME", help="--to-accuracy: the recipe both loops train "
                   "(gluon-gpu-train --recipe list), at most its epochs")
    p.add_argument("--inference", default=None, metavar="RUN",
                   help="inference mode: the trained network of RUN on every engine (training graph, oneDNN fused, "
                        "INT8, bfloat16, onnxruntime; PyTorch with --torch-python), on --val-limit validation samples")
    p.add_argument("--engines", default=None, metavar="LIST",
                   help="--inference: time only these engines, in this process (the benchmark runs each group so)")
    p.add_argument("--torch-python", default=None, metavar="PY",
                   help="an interpreter with PyTorch: its eager rows (the scaling table, --inference, "
                        "--to-accuracy)")
    p.add_argument("--out", default="bench-out", help="directory for bench.json and scaling.png")
    p.add_argument("--timeout", type=wait_seconds, default=children.TIMEOUT_SECONDS, metavar="SECONDS",
                   help="stop a child process of the benchmark (a training job, a variant, PyTorch's loop) that runs "
                        "longer, in one line, exit 1 (0: no limit)")
    p.brief_flags("epochs", "repeats", "baseline", "ensemble", "workers", "to_accuracy", "recipe", "inference",
                  "torch_python", "val_limit", "image_size", "fused_conv")
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
    for block in descendants(net):
        if isinstance(block, (mx.gluon.nn.Conv2D, mx.gluon.nn.Dense)):
            block.register_forward_hook(hook)
    net(nd.zeros((1,) + tuple(input_shape)))
    return 2 * (3 * sum(macs) - macs[0]) * samples


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


def format_table(rows, tutorial, pytorch=None):
    columns = [("devices", 18, marked("name")), *TIMES, *SHARE,
               ("samples/s", 11, figure("samples_per_s", ".0f")), ("speedup", 9, figure("speedup", ".2f", "x")),
               ("eff.", 7, figure("efficiency", ".0%")), ("exchange", 10, figure("exchange_share", ".1%")),
               ("cores busy", 12, figure("cores_busy", ".2f")), ("vs tutorial", 13, figure("vs_tutorial", ".2f", "x"))]
    columns += [("vs PyTorch", 12, figure("vs_pytorch", ".2f", "x"))] if pytorch else []
    columns += [("val-acc", 9, figure("val_acc", ".4f"))]
    baseline = [{**tutorial, "name": f"tutorial ({tutorial['name']})", "speedup": "", "efficiency": "",
                 "vs_tutorial": 1.0}] if tutorial else []
    baseline += [{**pytorch, "name": f"PyTorch ({pytorch['name']})", "speedup": "", "efficiency": "",
                  "vs_pytorch": 1.0}] if pytorch else []
    return text_table(columns, rows + baseline)


def plot(rows, tutorial, path, pytorch=None):
    others = [(name, row) for name, row in (("tutorial", tutorial), ("PyTorch eager", pytorch)) if row]
    names = [r["name"] for r in rows] + [name for name, _ in others]
    speeds = [r["samples_per_s"] for r in rows] + [row["samples_per_s"] for _, row in others]
    fig, (ax_speed, ax_eff) = subplots(1, 2, figsize=(10, 4))
    bars = ax_speed.bar(names, speeds, color=["C0"] * len(rows) + ["C7", "C3"][:len(others)])
    ax_speed.tick_params(axis="x", labelrotation=20)
    ax_speed.bar_label(bars, fmt="%.0f")
    ax_speed.set_ylabel("samples/s (median epoch)")
    ax_speed.set_title("throughput")
    for number, mode in enumerate(dict.fromkeys(r["fused_conv_mode"] for r in rows)):
        same = [r for r in rows if r["fused_conv_mode"] == mode and "efficiency" in r]  # a busy row has none
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


def time_job(args, workers, out, kvstore="dist_sync"):
    """Median epoch seconds of a real training run: one plain process (``workers=0``) or a
    job of that many local workers started by gluon_gpu.launch on ``kvstore``'s engine
    (dist_sync: ps-lite, with one server; horovod: Horovod's allreduce)."""
    per_worker = args.batch_size // max(workers, 1)
    cmd = [sys.executable, "-m", "gluon_gpu.train", "--devices", args.devices[0], "--quiet",
           "--epochs", str(args.epochs), "--batch-size", str(per_worker), "--out", out,
           "--save-period", str(args.epochs), "--model", args.model, "--lr", str(args.lr),
           "--fused-conv", args.fused_conv[0]] + (["--limit", str(args.limit)] if args.limit else []) \
        + (["--val-limit", str(args.val_limit)] if args.val_limit else []) \
        + (["--data-dir", args.data_dir] if args.data_dir else [])
    if workers:
        engine = ["--engine", "horovod"] if kvstore == "horovod" else ["-s", "1"]
        cmd = [sys.executable, "-m", "gluon_gpu.launch", "-n", str(workers), *engine, "--"] + \
            cmd + ["--kvstore", kvstore]
    what = f"the {kvstore} training job of {workers} worker(s)" if workers else "the one-process training job"
    proc = children.run(cmd, what, args.timeout)
    if proc.returncode:
        raise children.failure(f"benchmark job failed ({' '.join(cmd)}): "
                               f"{children.last_words(proc.stderr, proc.returncode)}", proc.returncode)
    import json
    with open(os.path.join(out, "metrics.json")) as f:
        epochs = json.load(f)["epochs"]
    seconds = [e["seconds"] for e in epochs]
    return {"seconds": seconds, "val_acc": epochs[-1]["val_acc"]}


def check_engines(args):
    """--kvstore: the engines --workers compares, dist_sync (ps-lite) and horovod."""
    if args.kvstore and not args.workers:
        raise UserError("--kvstore: only with --workers (the engines of a distributed job)")
    if any(kv not in ("dist_sync", "horovod") for kv in args.kvstore or []):
        raise UserError("--kvstore with --workers: dist_sync (ps-lite) or horovod, the engines a job runs on")
    if "horovod" in (args.kvstore or []):
        require_horovod("--kvstore horovod")


def check_torch_python(args, combinations):
    """--torch-python: only where PyTorch has rows (the scaling table, --inference,
    --to-accuracy)."""
    if not args.torch_python:
        return
    elsewhere = [flag for flag, given in (("--ensemble", args.ensemble), ("--sweep", args.sweep or args.sweep_random),
                                          ("--workers", args.workers), ("several --dtype, --omp-threads or "
                                                                        "--engine-threads values", combinations > 1))
                 if given]
    if elsewhere:
        raise UserError(f"--torch-python: PyTorch has rows in the scaling table, --inference and --to-accuracy, "
                        f"not with {elsewhere[0]}")


def check_modes(args, typed):
    """The flags each mode takes, checked before any work; the variants to time."""
    check_engines(args)
    combinations = variants.variants(args)
    check_torch_python(args, len(combinations))
    if len(combinations) > 1 and args.workers:
        raise UserError("several --dtype, --omp-threads or --engine-threads values compare plain runs and "
                        "ensembles; time --workers once per value")
    warn_idle_timeout(args, typed, len(combinations))
    return combinations


def warn_idle_timeout(args, typed, combinations):
    """--timeout bounds child processes: where the table has none, say it changes nothing."""
    if "timeout" in typed and not (args.workers or args.to_accuracy or args.inference or args.torch_python
                                   or args.ensemble or combinations > 1):
        print("gluon_gpu.bench: warning: --timeout bounds the benchmark's child processes (--workers, --to-accuracy, "
              "--inference, --torch-python, several --dtype or thread counts); this table trains in this process, "
              "which it does not bound", file=sys.stderr)


def run_workers(args):
    """One plain process, then a job of each --workers count on each --kvstore engine."""
    rows, kvstores = [], args.kvstore or ["dist_sync"]
    jobs = [(0, None)] + [(w, kv) for kv in kvstores for w in sorted(set(args.workers))]
    with tqdm(total=len(jobs), desc="bench", unit="job", disable=not progress_enabled(args)) as bar:
        for w, kv in jobs:
            out = tempfile.mkdtemp(prefix=f"job-{w}-workers-", dir=args.out)
            try:
                with CpuMeter() as meter:
                    run = time_job(args, w, out, kv or "dist_sync")
            except BaseException:  # a job that failed or ran past --timeout leaves no folder of its own
                shutil.rmtree(out, ignore_errors=True)
                raise
            samples = args.limit or 60000
            name = "1 process" if w == 0 else f"{w} worker{'s' if w > 1 else ''} {kv}"
            rows.append({**summarize(name, [run], samples, len(parse_devices(args.devices[0])), meter.share),
                         "workers": w, "kvstore": kv or "local"})
            bar.update(1)
    for r in rows:
        if quiet(r, rows[0]):
            r["overhead_ratio"] = r["median_epoch_s"] / rows[0]["median_epoch_s"]
    columns = [("job", 24, marked("name")), *TIMES, *SHARE, ("samples/s", 11, figure("samples_per_s", ".0f")),
               ("time vs 1 process", 20, figure("overhead_ratio", ".2f", "x"))]
    print(text_table(columns, rows, f"distributed jobs ({', '.join(kvstores)}) on {args.devices[0]} per worker, "
                                    f"global batch {args.batch_size}"))
    print("\n".join(share_remarks(rows)))
    write_json(os.path.join(args.out, "bench.json"),
               {"config": vars(args), "machine": machine_info(), "workers": rows})
    print(f"wrote {args.out}/bench.json")
    return 0


@main_guard("gluon_gpu.bench")
def main(argv=None):
    parser = build_parser()
    flags = parser.parse(argv)
    args = flags.values
    args.devices = args.devices or (["all"] if args.inference else default_specs())  # all: evaluate's default
    for spec in args.devices:  # every spec and precision checked before any work
        for dtype in args.dtype:
            check_precision(precision_for(dtype, args.amp), parse_devices(spec))
    check_writable(args.out, "the benchmark's report to `out`")
    combinations = check_modes(args, flags.typed)
    if len(combinations) > 1:
        with tqdm(total=len(combinations), desc="bench", unit="process", disable=not progress_enabled(args)) as bar:
            if args.ensemble:
                return ensembles.report_ensemble_variants(parser, args, bar)
            return variants.report_variants(parser, args, bar, machine_info())
    require_thread_settings(args.omp_threads[0], args.engine_threads[0], restart=argv is None,
                            extra=variants.start_variables(args) if argv is None else None)
    if args.inference:
        inference.check_inference_flags(args)
        return inference.run_inference(args)
    if args.ensemble:
        return ensembles.run_ensembles(args, parser)
    if args.sweep:
        return sweep.run_sweep(args)
    if args.workers:
        return run_workers(args)
    data = load_dataset(args.dataset, args.data_dir, args.image_size, limit=args.limit, val_limit=args.val_limit,
                        decoded=False)  # each run decodes it, or streams it, as its pipeline does
    if args.to_accuracy:
        config = accuracy.bench_config(args, flags.typed)
        epochs = config.epochs * (1 + (args.baseline == "tutorial") + 2 * bool(args.torch_python)) + \
            accuracy.STANDARD["epochs"] * bool(args.torch_python)
        with tqdm(total=epochs, desc="bench", unit="epoch", disable=not progress_enabled(args)) as bar:
            return accuracy.run_to_accuracy(args, config, data.decoded(), bar)
    return run_scaling(args, data)


def run_scaling(args, data):
    """The scaling table: every --devices spec (x --fused-conv x --augment), against the
    first, and the tutorial loop with --baseline tutorial."""
    modes, augments = list(dict.fromkeys(args.fused_conv)), list(dict.fromkeys(args.augment))
    total = args.epochs * args.repeats * (len(args.devices) * len(modes) * len(augments)
                                          + (args.baseline == "tutorial") + bool(args.torch_python))
    rows, tutorial, pytorch = [], None, None
    torch_config = torch_config_for(args, data.spec) if args.torch_python else None  # checked before any training
    with tqdm(total=total, desc="bench", unit="epoch", disable=not progress_enabled(args)) as bar:
        for mode in modes:
            for augment in augments:
                for spec in args.devices:
                    runs, info = time_ours(args, spec, bar, data, fused_conv=mode, augment=augment)
                    name = spec if len(modes) == 1 else f"{spec} {'fused' if info['fused_conv'] else 'unfused'}"
                    name += f" {augment}" if len(augments) > 1 else ""
                    rows.append({**summarize(name, runs, info["samples"], info["devices"], info["share"]),
                                 "spec": spec, "fused_conv_mode": mode, "fused_conv": info["fused_conv"],
                                 "augment": augment})
        devices = len(parse_devices(args.devices[0]))
        if args.baseline == "tutorial":
            with CpuMeter() as meter:
                runs = time_tutorial(args, data.decoded(), bar)
            tutorial = summarize(args.devices[0], runs, len(data.train_x), devices, meter.share)
        if args.torch_python:
            with CpuMeter() as meter:
                runs = time_pytorch(args, torch_config, data.decoded(), bar)
            pytorch = {**summarize(args.devices[0], runs, len(data.train_x), devices, meter.share),
                       **{key: runs[0][key] for key in TORCH_FACTS}}
    _compare(rows, tutorial, pytorch)
    floor = _compute_floor(args, data, rows)
    _print_scaling(rows, tutorial, floor, augments, pytorch)
    rss, child_rss = peak_rss_mib()
    print(f"peak RSS: {rss:.0f} MiB (largest DataLoader worker: {child_rss:.0f} MiB)")
    report = {"config": {k: v for k, v in vars(args).items()}, "machine": machine_info(),
              "results": rows, "tutorial": tutorial, "pytorch": pytorch, "compute_floor": floor,
              "peak_rss_mib": rss, "peak_child_rss_mib": child_rss}
    write_json(os.path.join(args.out, "bench.json"), report)
    plot(rows, tutorial, os.path.join(args.out, "scaling.png"), pytorch)
    print(f"wrote {args.out}/bench.json and {args.out}/scaling.png")
    return 0


def torch_config_for(args, spec):
    """The configuration PyTorch's row trains (ours on the first spec, the network named),
    or a UserError saying what it cannot train."""
    config = scaling_config(args, args.devices[0]).to_dict()
    config["model"] = model_for(args.model, spec.input_shape)
    why = torch_train.refused(config)
    if why:
        raise UserError(f"--torch-python: the PyTorch row cannot train this: {why}")
    return {**config, "epochs": args.epochs}


def _compare(rows, tutorial, pytorch=None):
    """Speedup and efficiency against the first spec in the same mode and augmentation;
    epoch time against the tutorial's loop and PyTorch's, when they ran."""
    for r in rows:
        base = next(b for b in rows if (b["fused_conv_mode"], b["augment"]) == (r["fused_conv_mode"], r["augment"]))
        plain = next(b for b in rows if (b["fused_conv_mode"], b["spec"]) == (r["fused_conv_mode"], r["spec"]))
        if quiet(r, plain):
            r["augment_cost"] = r["median_epoch_s"] / plain["median_epoch_s"] - 1  # against the first --augment
        if quiet(r, base):
            r["speedup"] = base["median_epoch_s"] / r["median_epoch_s"]
            r["efficiency"] = r["speedup"] / (r["devices"] / base["devices"])
        if tutorial and quiet(r, tutorial):
            r["vs_tutorial"] = tutorial["median_epoch_s"] / r["median_epoch_s"]
        if pytorch and quiet(r, pytorch):
            r["vs_pytorch"] = pytorch["median_epoch_s"] / r["median_epoch_s"]


def _compute_floor(args, data, rows):
    """Each row's compute floor (its FLOPs at the matmul rate of its devices)."""
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
    return {"gflop_per_epoch": flops / 1e9, "matmul_gflops": gflops}


def _print_scaling(rows, tutorial, floor, augments, pytorch=None):
    threads = thread_settings()
    print(format_table(rows, tutorial, pytorch))
    print("\n".join(share_remarks([*rows, tutorial, pytorch])))
    if pytorch:
        print(f"PyTorch: {pytorch['torch']} eager, float32, its default threads ({pytorch['threads']}), the same "
              "network, batch, optimizer and data; its epoch is the training steps alone, as ours")
    if any("exchange_share" in r for r in rows):
        print("exchange: the share of the epoch the gradient exchange costs (the data-parallel overhead): "
              "each epoch alternated with the same steps minus the exchange, median of the pairs")
    print(f"threads: {threads['omp_threads']} OpenMP per operator, {threads['engine_threads']} engine "
          f"worker(s) per CPU context, {threads['cpu_temp_copy']} CPU scratch buffers")
    print(f"compute floor: {floor['gflop_per_epoch']:.1f} GFLOP per epoch / "
          + ", ".join(f"{g:.1f} GFLOP/s per {kind} device" for kind, g in floor["matmul_gflops"].items())
          + " (1024^2 matmul) / devices computing at once; "
          + ", ".join(f"{r['name']} reaches {r['of_floor']:.0%} of its floor ({r['floor_s']:.2f} s)" for r in rows))
    if len(augments) > 1:
        print("augmentation: median epoch against the same spec with --augment " + augments[0] + ": "
              + ", ".join(f"{r['name']} " + (format(r["augment_cost"], "+.1%") if "augment_cost" in r else "-")
                          for r in rows if r["augment"] != augments[0]))

