"""Regenerate the measured pages at the current version, one script after another (each
runs its own benchmark invocations and stamps its page with the date, the CPU, the
version and the commit):

    .venv/bin/python scripts/pages.py                      # every page (about two hours on 2 cores)
    .venv/bin/python scripts/pages.py performance sweeps   # the ones named

``make pages`` runs the first. The performance, serving and speed-run pages' PyTorch rows need an
interpreter with PyTorch, named by $GLUON_GPU_TORCH_PYTHON; without it those rows are
left out. tests/test_docs.py checks that no page is older than the version's
minor release.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> (the script, the page it writes: its stamp names the version it was made with)
PAGES = {"demo": ("demo_page.py", "README.md"),
         "performance": ("performance_page.py", "docs/performance.md"),
         "data-scale": ("data_scale_page.py", "docs/data-at-scale.md"),
         "sweeps": ("sweep_page.py", "docs/sweeps.md"),
         "serving": ("inference_page.py", "docs/serving.md"),
         "bfloat16": ("bfloat16_page.py", "docs/bfloat16.md"),
         "speedrun": ("speedrun_page.py", "docs/speedrun.md")}  # after bfloat16: auto reads its measurement


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="PAGE", help=f"pages to make: {', '.join(PAGES)} (default: all)")
    names = p.parse_args(argv).names or list(PAGES)
    unknown = [n for n in names if n not in PAGES]
    if unknown:
        p.error(f"unknown page {unknown[0]!r}: choose from {', '.join(PAGES)}")
    for name in names:
        script, page = PAGES[name]
        extra = []
        if name in ("performance", "serving", "speedrun") and os.environ.get("GLUON_GPU_TORCH_PYTHON"):
            extra = ["--torch-python", os.environ["GLUON_GPU_TORCH_PYTHON"]]
        print(f"pages: {name}: {script} -> {page}", flush=True)
        if subprocess.run([sys.executable, os.path.join(HERE, script), *extra]).returncode:
            return f"pages: {script} failed; the pages before it are written"
    return 0


if __name__ == "__main__":
    sys.exit(main())
