"""Write the measured part of docs/serving.md (between its ``inference`` markers) and
README.md's serving headline: LeNet and ResNet-20 trained on FashionMNIST, their
validation figures in float32 and INT8 (``evaluate --int8``, the full test set), and one
``bench --inference`` invocation each, stamped with the date, the CPU, its cores and
the commit. Nothing in either is typed by hand.

    .venv/bin/python scripts/inference_page.py --torch-python /path/to/python-with-torch   # about 10 minutes
    .venv/bin/python scripts/inference_page.py --limit 4096 --resnet-epochs 1 --docs DIR --readme FILE  # quick

``--torch-python``: an interpreter with PyTorch for the PyTorch eager row (gluoncv will
not import beside PyTorch 2, so it cannot be gluon_gpu's own).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from performance_page import REPO, page_parser, run_bench, stamp, write_between

START, END = "<!-- inference:start (scripts/inference_page.py writes this) -->", "<!-- inference:end -->"
FIGURES = re.compile(r"validation loss \S+  acc (\S+).*\n?int8 against float32 \(fused\): acc (\S+)")


def program(name, *flags):
    proc = subprocess.run([sys.executable, "-m", f"gluon_gpu.{name}", *flags], cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"inference_page: {name} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def trained(out, flags):
    """``(the command as a person types it, INT8 val-acc, float32 val-acc)`` of one run."""
    program("train", "--quiet", "--out", out, *flags)
    int8, float32 = FIGURES.search(program("evaluate", "--params", out, "--int8")).groups()
    return " ".join(["gluon-gpu-train"] + flags), float(int8), float(float32)


def table(report):
    rows = ["| engine | OpenMP threads | samples/s | val-acc | vs the training graph |",
            "| --- | --- | --- | --- | --- |"]
    for r in report["inference"]:
        acc = "-" if r["acc"] is None else f"{r['acc']:.4f}"
        rows.append(f"| {r['name']} | {r['omp_threads']} | {r['samples_per_s']:.0f} | {acc} | {r['vs_graph']:.2f}x |")
    return rows


def main(argv=None):
    p = page_parser(__doc__)
    p.add_argument("--limit", type=int, default=None, help="training samples (default: all 60,000)")
    p.add_argument("--resnet-epochs", type=int, default=5)
    p.add_argument("--torch-python", default=None)
    args = p.parse_args(argv)
    limit = ["--limit", str(args.limit)] if args.limit else []
    sections, headline = [], []
    with tempfile.TemporaryDirectory() as out:
        for name, flags in (("LeNet", ["--devices", "cpu*2"] + limit),
                            ("ResNet-20", ["--model", "cifar_resnet20_v1", "--devices", "cpu*2", "--epochs",
                                           str(args.resnet_epochs)] + limit)):
            run = os.path.join(out, name)
            command, int8, float32 = trained(run, flags)
            torch = ["--torch-python", args.torch_python] if args.torch_python and name == "LeNet" else []
            bench, report, _ = run_bench(["--inference", run, "--repeats", "3"] + torch, os.path.join(out, name + "-b"))
            bench = bench.replace(run, "RUN").replace(args.torch_python or "PY", "PY")
            shutil.copyfile(os.path.join(out, name + "-b", "inference.png"),
                            os.path.join(args.docs, f"inference-{name.lower()}.png"))
            rows = {r["key"]: r for r in report["inference"]}
            sections += [f"### {name}", "",
                         f"`{command}`, then `gluon-gpu-evaluate --params RUN --int8` on the 10,000 test images: "
                         f"val-acc **{int8:.4f}** in INT8 against {float32:.4f} in float32 "
                         f"(**{100 * (int8 - float32):+.2f} points**).", "",
                         f"`{bench}`: {stamp(report['machine'])}.", "", *table(report), "",
                         f"![samples/s of each engine](inference-{name.lower()}.png)", ""]
            headline.append(f"{name}: INT8 {rows['int8']['vs_graph']:.2f}x and the fused graph "
                            f"{rows['fused']['vs_graph']:.2f}x the training graph's samples/s, onnxruntime "
                            f"{rows['onnxruntime']['vs_graph']:.2f}x"
                            + (f", PyTorch eager {rows['pytorch']['vs_graph']:.2f}x" if "pytorch" in rows else "")
                            + f"; INT8 val-acc {100 * (int8 - float32):+.2f} points"
                            + (" (evaluate keeps its training graph)" if rows["fused"]["vs_graph"] < 1 else ""))
    write_between(os.path.join(args.docs, "serving.md"), START, END, "\n".join(sections))
    write_between(args.readme, START.replace("inference:", "serving:"), END.replace("inference:", "serving:"),
                  "Measured ([docs/serving.md](docs/serving.md), generated): " + "; ".join(headline) + ".")
    print(f"wrote {args.docs}/serving.md's measurements, its plots and the headline in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
