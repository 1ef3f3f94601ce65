"""Write docs/speedrun.md (and docs/speedrun.png) from the `fast94` recipe trained over
several seeds and one `bench --to-accuracy 0.94 --recipe fast94 --torch-python PY`
invocation, stamped with the date, the CPU, its cores and the commit, and README.md's
headline between its ``speedrun`` markers. Nothing in either is typed by hand.

    .venv/bin/python scripts/speedrun_page.py --torch-python PY     # about 80 minutes on 2 cores
    .venv/bin/python scripts/speedrun_page.py --seeds 1 --epochs 1 --limit 2048 --target 0.5 --docs DIR --readme FILE

Without ``--torch-python`` (or $GLUON_GPU_TORCH_PYTHON) the PyTorch rows are left out and
the page says so. ``--work DIR`` keeps what was measured (the benchmark's report, each
seed's run) and measures only what DIR lacks: a run cut short goes on where it stopped.
"""
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from performance_page import REPO, cpu_words, page_parser, run_bench, stamp, write_between

sys.path.insert(0, REPO)
from gluon_gpu.programs.bench.accuracy import report_text  # noqa: E402

START, END = "<!-- speedrun:start (scripts/speedrun_page.py writes this) -->", "<!-- speedrun:end -->"
RECIPE = "fast94"


def seed_run(seed, out, extra):
    """``metrics.json`` of ``gluon-gpu-train --recipe fast94 --seed SEED`` (a finished one
    in ``out`` is taken as it is; one cut short is resumed)."""
    metrics = os.path.join(out, "metrics.json")
    started = os.path.exists(os.path.join(out, "checkpoints"))
    if started and os.path.exists(metrics):
        with open(metrics) as f:
            if json.load(f).get("status") == "finished":
                return seed_metrics(metrics)
    flags = ["--resume", out] if started else ["--recipe", RECIPE, "--seed", str(seed), "--devices", "cpu*2",
                                               "--out", out, *extra]
    proc = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--quiet", *flags], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"speedrun_page: seed {seed} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return seed_metrics(metrics)


def seed_metrics(path):
    with open(path) as f:
        return json.load(f)


def bench_report(flags, out):
    """``(the command as a person types it, accuracy.json)`` of the benchmark, run only
    if ``out`` holds no report of it."""
    command = " ".join(["gluon-gpu-bench"] + flags)
    path = os.path.join(out, "accuracy.json")
    if not os.path.exists(path):
        command = run_bench(flags, out, "accuracy.json")[0]
    with open(path) as f:
        return command, json.load(f)


def accuracy(epoch):
    """An epoch's val-acc as best.params judges it (the weights' or, with --ema, their
    average's, the better), None for an epoch --val-every did not validate."""
    figures = [epoch[k] for k in ("val_acc", "ema_val_acc") if epoch.get(k) is not None]
    return max(figures) if figures else None


def seeds_table(runs):
    """The seeds' rows and their summary line."""
    last = [accuracy(m["epochs"][-1]) for m in runs]
    seconds = [sum(e["seconds"] for e in m["epochs"]) for m in runs]
    first = [next((e["epoch"] for e in m["epochs"] if (accuracy(e) or 0) >= 0.94), None) for m in runs]
    lines = ["| seed | last val-acc | first epoch at 0.94 | seconds (training and validation) |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {m['config']['seed']} | {a:.4f} | {f or '-'} | {s:.0f} |" for m, a, f, s in
              zip(runs, last, first, seconds)]
    summary = (f"over {len(runs)} seeds the last val-acc is {statistics.mean(last):.4f} on average "
               f"(lowest {min(last):.4f}, highest {max(last):.4f}), in {statistics.mean(seconds):.0f} s a run on "
               "average")
    return lines, summary, {"mean": statistics.mean(last), "min": min(last), "seconds": statistics.mean(seconds)}


def headline(report, seeds, machine):
    """README's sentence: the time to 0.94 beside PyTorch's."""
    ours = report["results"][0]
    others = [r for r in report["results"][1:] if r.get("seconds_to_target")]
    compared = "; ".join(f"{r['name']} {r['seconds_to_target']:.0f} s"
                         + (f" ({r['ours_sooner']:.2f}x ours)" if "ours_sooner" in r else "")
                         for r in others) or "no other row reached it"
    reached = (f"**{ours['seconds_to_target']:.0f} s**" if ours.get("seconds_to_target")
               else f"not within its {ours['epochs']} epochs")
    return (f"Time to val-acc {report['target']} on the full FashionMNIST test set, training and validation "
            f"counted, `--recipe {RECIPE}` on `cpu*2`: {reached}; {compared} "
            f"({cpu_words(machine)}; [docs/speedrun.md](docs/speedrun.md), generated). Over {seeds['count']} seeds "
            f"it ends at {seeds['mean']:.4f} on average (lowest {seeds['min']:.4f}). Seconds depend on the CPU; "
            "epochs do not.")


def page(command, report, seed_lines, summary, made, torch):
    return "\n".join([
        f"# The soonest 0.94 on FashionMNIST: `--recipe {RECIPE}`",
        "",
        f"Generated by `scripts/speedrun_page.py`: {made}.",
        "",
        "`gluon-gpu-train --recipe fast94` trains GluonCV's CIFAR ResNet-20 for the fewest seconds to val-acc "
        "0.94 on the 10,000 test images that we found: nesterov SGD with one warm-up epoch then cosine decay "
        "per step, flips and 2-pixel crops on the device, label smoothing 0.1, weight decay off BatchNorm and "
        "biases, validation on each image and its mirror (`--tta flip`, [accuracy.md](accuracy.md)), in "
        "bfloat16 on the CPU's fastest kernels where it has bfloat16 instructions "
        "([bfloat16.md](bfloat16.md)). `gluon-gpu-train --recipe list` prints it.",
        "",
        "## Against PyTorch, one invocation",
        "",
        f"`{command}`" + ("" if torch else " (no interpreter with PyTorch was given: no PyTorch row)") + ":",
        "",
        "```text", report_text(report), "```",
        "",
        "Rows: gluon_gpu with the recipe; PyTorch eager with the same network and recipe (float32, and "
        "bfloat16 autocast where the CPU has bfloat16 instructions), test-time augmentation included; and the "
        "standard recipe a PyTorch user runs for ResNet-20 (random 2-pixel crops and flips, nesterov SGD 0.9, "
        "weight decay 5e-4 off BatchNorm and biases, one warm-up epoch then cosine per step, label smoothing "
        "0.1, batch 128, 20 epochs) at the CPU's best precision, with PyTorch's own optimizer update (the rows of "
        "our recipe take MXNet's). Each loop is a process of its own, timed from its start to the line that "
        "reports the target (start-up, data and compiles counted), validating where its recipe does. `CPU "
        "share` and `others` say what each row had of the machine: a row that ran beside other work is marked "
        "and quoted in no ratio, and this page is made only from an invocation with none. `ours sooner`: each "
        "row's seconds to the target over gluon_gpu's.",
        "",
        "![validation accuracy against seconds](speedrun.png)",
        "",
        "## Over seeds",
        "",
        f"`gluon-gpu-train --recipe {RECIPE} --seed K --devices cpu*2`, one run after another: {summary}.",
        "",
        *seed_lines,
        "",
        "The seconds are the runs' own epochs (training and validation), on a machine that may be shared.",
        ""])


def main(argv=None):
    p = page_parser(__doc__)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--target", default="0.94")
    p.add_argument("--torch-python", default=os.environ.get("GLUON_GPU_TORCH_PYTHON"))
    p.add_argument("--epochs", type=int, default=None, help="a quick page: epochs of every run")
    p.add_argument("--limit", type=int, default=None, help="a quick page: training samples")
    p.add_argument("--work", default=None, help="keep the measurements here, and measure only what it lacks")
    args = p.parse_args(argv)
    extra = (["--epochs", str(args.epochs)] if args.epochs else []) + (["--limit", str(args.limit)] if args.limit
                                                                      else [])
    torch = ["--torch-python", args.torch_python] if args.torch_python else []
    with (contextlib.nullcontext(args.work) if args.work else tempfile.TemporaryDirectory()) as out:
        command, report = bench_report(["--to-accuracy", args.target, "--recipe", RECIPE, *torch, "--baseline",
                                        "none", "--devices", "cpu*2", *extra], os.path.join(out, "bench"))
        runs = [seed_run(seed, os.path.join(out, f"seed{seed}"), extra) for seed in range(args.seeds)]
        made = stamp(report["machine"])  # before anything is written: the commit as it was
        os.makedirs(args.docs, exist_ok=True)
        shutil.copyfile(os.path.join(out, "bench", "accuracy.png"), os.path.join(args.docs, "speedrun.png"))
    command = command.replace(args.torch_python or "\0", "PY")
    machine = report["machine"]
    seed_lines, summary, seeds = seeds_table(runs)
    with open(os.path.join(args.docs, "speedrun.md"), "w") as f:
        f.write(page(command, report, seed_lines, summary, made, bool(torch)))
    write_between(args.readme, START, END, headline(report, {**seeds, "count": len(runs)}, machine))
    print(f"wrote {args.docs}/speedrun.md, speedrun.png and the headline in {args.readme}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
