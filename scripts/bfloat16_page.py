"""Write docs/bfloat16.md: what bfloat16 training gives against float32 on this CPU, for
ResNet-20 on `cpu*2`, by both paths: oneDNN 3's kernels (`--bfloat16-kernels onednn`:
AMX where the CPU has it, else AVX-512 BF16) and MXNet's through contrib.amp (`amp`).
Each ratio comes from one benchmark invocation (each precision in a process of its
own); then MXNet's per-operator profile of the three (bulk execution off, so that every
operator is timed apart) and the convolution kernels oneDNN chose (its verbose mode).
Also writes this CPU class's row of gluon_gpu/core/step/bfloat16_measured.json (the
other classes' rows stay): both ratios, from which `--bfloat16-kernels auto` chooses on
that class and which the plan line of a bfloat16 run cites. Nothing is typed by hand.

    .venv/bin/python scripts/bfloat16_page.py                       # about 7 minutes on 2 cores
    .venv/bin/python scripts/bfloat16_page.py --limit 2048 --docs DIR --measured FILE   # a quick one
"""
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

from performance_page import REPO, cpu_words, page_parser, run_bench, stamp, write_between

sys.path.insert(0, REPO)
from gluon_gpu.core.step.precision import BFLOAT16_MEASURED  # noqa: E402

MODEL = "cifar_resnet20_v1"
START, END = "<!-- bfloat16:start (scripts/bfloat16_page.py writes this) -->", "<!-- bfloat16:end -->"
PROFILED_STEPS = 20
# (name, train flags) of the runs compared; the last two are bfloat16's two paths
RUNS = (("float32", ["--dtype", "float32"]),
        ("bfloat16 amp", ["--dtype", "bfloat16", "--bfloat16-kernels", "amp"]),
        ("bfloat16 onednn", ["--dtype", "bfloat16", "--bfloat16-kernels", "onednn"]))


def profile(name, flags, limit, out):
    """``{operator: (calls, ms)}`` of PROFILED_STEPS training steps."""
    env = {**os.environ, "MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_EXEC_BULK_EXEC_INFERENCE": "0"}
    run = os.path.join(out, "profile-" + name.replace(" ", "-"))
    proc = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--model", MODEL, "--devices", "cpu*2", *flags,
                           "--limit", str(limit), "--val-limit", "256", "--epochs", "1", "--profile",
                           str(PROFILED_STEPS), "--quiet", "--out", run], cwd=REPO, env=env, capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"bfloat16_page: the profiled run failed: {proc.stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(run, "profile.txt")) as f:
        text = f.read()
    operators = {}
    for line in text.split("\noperator\n", 1)[1].splitlines():
        found = re.match(r"(\S+)\s+(\d+)\s+([\d.]+)\s", line)
        if found:
            operators[found[1]] = (int(found[2]), float(found[3]))
    return operators


def kernels(name, flags, out):
    """``{(library, primitive, implementation, propagation): (count, ms)}`` of what oneDNN
    ran in a short training run: MXNet's oneDNN 2 prints ``dnnl_verbose``, the features'
    oneDNN 3 ``onednn_verbose``, each line with the primitive's time."""
    proc = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--model", MODEL, "--devices", "cpu", *flags,
                           "--limit", "512", "--val-limit", "64", "--epochs", "1", "--quiet", "--out",
                           os.path.join(out, "verbose-" + name.replace(" ", "-"))], cwd=REPO,
                          env={**os.environ, "DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}, capture_output=True, text=True)
    found = collections.defaultdict(lambda: [0, 0.0])
    for line in proc.stdout.splitlines():
        cells = line.split(",")
        library = {"dnnl_verbose": "oneDNN 2", "onednn_verbose": "oneDNN 3"}.get(cells[0])
        if library and len(cells) > 6 and cells[1] == "exec":
            entry = found[(library, cells[3], cells[4], cells[5])]
            entry[0] += 1
            entry[1] += float(cells[-1])
    return found


def kernel_lines(convs):
    """What each run's convolutions ran on, by library: '- float32 (oneDNN 2): `impl` prop (count), ...'."""
    lines = []
    for name, found in convs.items():
        for library in ("oneDNN 2", "oneDNN 3"):
            used = sorted((impl, prop, count) for (lib, kind, impl, prop), (count, _) in found.items()
                          if lib == library and kind == "convolution")
            if used:
                lines.append(f"- {name} ({library}): " + ", ".join(f"`{i}` {p} ({c})" for i, p, c in used))
    return lines


def onednn3_table(found):
    """The features' oneDNN 3 primitives in the verbose run, by kind and propagation, with their time."""
    rows = collections.defaultdict(lambda: [0, 0.0])
    for (library, kind, _, prop), (count, ms) in found.items():
        if library == "oneDNN 3":
            rows[(kind, prop)][0] += count
            rows[(kind, prop)][1] += ms
    total = sum(ms for _, ms in rows.values())
    return (["| oneDNN 3 primitive | propagation | calls | ms | share |", "| --- | --- | --- | --- | --- |"]
            + [f"| {kind} | {prop} | {count} | {ms:.1f} | {ms / total:.0%} |"
               for (kind, prop), (count, ms) in sorted(rows.items(), key=lambda kv: -kv[1][1])]
            + [f"| all | | | {total:.1f} | |"])


def profile_table(profiles):
    names = list(profiles)
    totals = {n: sum(ms for _, ms in p.values()) for n, p in profiles.items()}
    top = sorted({op for p in profiles.values() for op in p},
                 key=lambda op: -max(p.get(op, (0, 0.0))[1] for p in profiles.values()))[:16]
    head = ["| operator | " + " | ".join(f"{n} calls | {n} ms" for n in names) + " |",
            "| --- | " + " | ".join("--- | ---" for _ in names) + " |"]
    rows = ["| `" + op + "` | " + " | ".join(f"{p.get(op, (0, 0.0))[0]} | {p.get(op, (0, 0.0))[1]:.1f}"
                                          for p in profiles.values()) + " |" for op in top]
    rows.append("| all operators | " + " | ".join(f" | {totals[n]:.1f}" for n in names) + " |")
    return head + rows, totals


def bench_lines(command, stdout):
    return [f"`{command}`:", "", "```text", stdout.strip(), "```", ""]


def page(benches, profiles, convs, machine, measured):
    table, totals = profile_table(profiles)
    onednn, amp = benches["onednn"][1], benches["amp"][1]
    conv = {n: sum(p.get(op, (0, 0.0))[1] for op in ("Convolution", "_backward_Convolution"))
            for n, p in profiles.items()}
    return "\n".join([
        "# bfloat16 training on this CPU",
        "",
        f"Generated by `scripts/bfloat16_page.py`: {stamp(machine)}.",
        "",
        "`--dtype bfloat16` has two paths. A CIFAR ResNet v1 (`cifar_resnet20_v1`, ...) or a network of "
        "the zoo marked for it runs its features (every convolution, BatchNorm, ReLU and residual add) on "
        "oneDNN 3's kernels (AMX where the CPU has it, else AVX-512 BF16) as one operator whose activations "
        "stay bfloat16 from the first layer to the last (`--bfloat16-kernels onednn`). Any network trains "
        "through MXNet's `contrib.amp` on MXNet's own oneDNN 2 kernels (`--bfloat16-kernels amp`). Each "
        "ratio below comes from one invocation, each precision in a process of its own. "
        "`--bfloat16-kernels auto` (the default) takes whichever path measured faster on the CPU's class "
        "(AMX, AVX-512 BF16 without AMX): the table below, kept in "
        "`gluon_gpu/core/step/bfloat16_measured.json`, one row per class, each written by this script on a "
        "CPU of that class; on a class with no row, oneDNN 3 with AMX and contrib.amp without. Figures "
        "depend on the CPU: a row is never quoted for another class.",
        "",
        "| CPU class | CPU | measured | contrib.amp vs float32 | oneDNN 3 vs float32 | auto takes |",
        "| --- | --- | --- | --- | --- | --- |",
        *[f"| {cls} | {row['cpu']} | {row['date']}, gluon_gpu {row['version']} | {row['amp']:.2f}x | "
          f"{row['onednn']:.2f}x | {'oneDNN 3' if row['onednn'] > row['amp'] else 'contrib.amp'} |"
          for cls, row in sorted(measured["classes"].items())],
        "",
        f"## oneDNN 3 on this CPU ({machine.get('cpu_isa', '')})",
        "",
        *bench_lines(*benches["onednn"][::2]),
        f"**bfloat16 on oneDNN 3 trains ResNet-20 at {onednn['ratio']:.2f}x float32's samples/s** here; val-acc "
        f"after the same epochs: float32 {onednn['rows']['float32']['val_acc']:.4f}, bfloat16 "
        f"{onednn['rows']['bfloat16']['val_acc']:.4f}.",
        "",
        "## contrib.amp on MXNet's kernels",
        "",
        *bench_lines(*benches["amp"][::2]),
        f"**Through contrib.amp bfloat16 trains ResNet-20 at {amp['ratio']:.2f}x float32's samples/s** here: "
        "the plan line of such a run says so when it is below 1.",
        "",
        f"## Where the time goes: {PROFILED_STEPS} steps of each, per operator",
        "",
        "MXNet's profiler (`--profile`), bulk execution off so that each operator is timed apart. MXNet's "
        f"convolutions take {conv['float32']:.0f} ms in float32 and {conv['bfloat16 amp']:.0f} ms through "
        "contrib.amp. On oneDNN 3 the features are one `Custom` operator, which MXNet's profiler does not "
        "time: what remains in its column is the head (pooling, dense layer, loss) and the exchange.",
        "",
        *table,
        "",
        "The features' own time on oneDNN 3, primitive by primitive (its verbose mode, a 512-sample run on one "
        "CPU context):",
        "",
        *onednn3_table(convs["bfloat16 onednn"]),
        "",
        "The convolution kernels each run used (verbose mode, the same short runs; oneDNN 2's include the "
        "first pass that infers the shapes):",
        "",
        *kernel_lines(convs),
        "",
        "MXNet 1.9.1 bundles oneDNN 2.4, whose bfloat16 convolutions run on AVX-512 BF16 kernels (`jit_bf16`); "
        "oneDNN 3 (the `onednn-cpu-gomp` wheel) runs them on AMX (`brgconv...:avx512_core_amx`) or its newer "
        "AVX-512 BF16 kernels (`brgconv...:avx512_core_bf16`). Converting between MXNet's float32 layout and "
        "oneDNN's bfloat16 ones around each convolution took 59% of the time on an AMX Xeon "
        "(docs/maintainers/measurements.md): hence the whole features as one operator.",
        ""]), amp["ratio"]


def measure(args, out):
    benches = {}
    for path, extra in (("onednn", ["--bfloat16-kernels", "onednn"]), ("amp", ["--bfloat16-kernels", "amp"])):
        flags = ["--model", MODEL, "--devices", "cpu*2", "--dtype", "float32", "bfloat16", *extra, "--limit",
                 str(args.limit), "--val-limit", "1000", "--epochs", str(args.epochs), "--baseline", "none"]
        command, report, stdout = run_bench(flags, os.path.join(out, path))
        rows = {r["dtype"]: r for r in report["results"]}
        report["rows"] = rows
        report["ratio"] = rows["bfloat16"]["samples_per_s"] / rows["float32"]["samples_per_s"]
        benches[path] = (command, report, stdout)
    profiles = {name: profile(name, flags, args.limit, out) for name, flags in RUNS}
    convs = {name: kernels(name, flags, out) for name, flags in RUNS}
    return benches, profiles, convs


def measured_table(path, machine, amp, onednn):
    """bfloat16_measured.json with this CPU class's row (re)written, the others kept."""
    try:
        with open(path) as f:
            measured = json.load(f)
        classes = dict(measured["classes"])
    except (OSError, ValueError, KeyError, TypeError):
        classes = {}
    classes[machine["cpu_isa"]] = {"cpu": machine["cpu"], "date": datetime.date.today().isoformat(),
                                   "version": machine["gluon_gpu"], "amp": round(amp, 2), "onednn": round(onednn, 2)}
    return {"model": "ResNet-20", "page": "docs/bfloat16.md", "classes": classes}


def readme_lines(measured):
    """The README's bfloat16 paragraph: each measured CPU class's figures."""
    rows = [f"{row['onednn']:.2f}x on oneDNN 3 and {row['amp']:.2f}x through contrib.amp on {row['cpu']} ({cls}, "
            f"{row['date']})" for cls, row in sorted(measured["classes"].items())]
    return ("`--dtype bfloat16` trains ResNet-20 on `cpu*2` at " + "; ".join(rows) + " (float32's samples/s = 1x; "
            "[docs/bfloat16.md](docs/bfloat16.md), generated by the benchmark). `--bfloat16-kernels auto` takes "
            "the faster path measured on the CPU's class. Figures depend on the CPU.")


def main(argv=None):
    p = page_parser(__doc__)
    p.add_argument("--limit", type=int, default=8192, help="training samples of the benchmarks and the profiles")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--measured", default=BFLOAT16_MEASURED)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        benches, profiles, convs = measure(args, out)
    onednn, amp, machine = benches["onednn"][1], benches["amp"][1], benches["onednn"][1]["machine"]
    measured = measured_table(args.measured, machine, amp["ratio"], onednn["ratio"])
    text, amp_ratio = page(benches, profiles, convs, machine, measured)  # stamped before files change
    os.makedirs(args.docs, exist_ok=True)
    with open(os.path.join(args.docs, "bfloat16.md"), "w") as f:
        f.write(text)
    with open(args.measured, "w") as f:
        json.dump(measured, f, indent=2)
        f.write("\n")
    write_between(args.readme, START, END, readme_lines(measured))
    print(f"wrote {args.docs}/bfloat16.md, {args.measured} and {args.readme}: bfloat16 at "
          f"{benches['onednn'][1]['ratio']:.2f}x float32 on oneDNN 3, {amp_ratio:.2f}x through contrib.amp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
