"""Write README.md's demo output (between its ``demo`` markers): the README's first
block, run as a person pastes it into a new shell (scripts/pasted.py), and what it
printed, stamped with the date, the CPU, its cores and the commit. Nothing in it is
typed by hand; tests/test_docs.py checks that the block still learns what it shows.

    .venv/bin/python scripts/demo_page.py                  # about 30 seconds on 2 cores
    .venv/bin/python scripts/demo_page.py --readme FILE    # elsewhere
"""
import re
import sys
import tempfile

from pasted import run_pasted
from performance_page import machine_stamp, page_parser, write_between

START, END = "<!-- demo:start (scripts/demo_page.py writes this) -->", "<!-- demo:end -->"
ACCURACY = re.compile(r"validation loss \S+  acc (\S+)")
PREDICTION = re.compile(r"^\S+\[\d+\]: .*$", re.M)


def figures(stdout):
    """``(val-acc, [prediction lines])`` of the demo's output."""
    found = ACCURACY.search(stdout)
    if not found:
        raise SystemExit(f"demo_page: no evaluation in the demo's output:\n{stdout}")
    return float(found[1]), PREDICTION.findall(stdout)


def demo_block(readme):
    """The README's first shell block that runs (not marked ``<!-- not run: ... -->``): its demo."""
    with open(readme) as f:
        blocks = re.findall(r"(<!-- not run:[^>]*-->\n)?```sh\n(.*?)```", f.read(), re.S)
    return next(body for not_run, body in blocks if not not_run)


def main(argv=None):
    args = page_parser(__doc__).parse_args(argv)
    body = demo_block(args.readme)
    with tempfile.TemporaryDirectory() as folder:
        proc = run_pasted("sh", body, folder)
    if proc.returncode:
        raise SystemExit(f"demo_page: the demo failed: {proc.stderr.strip().splitlines()[-1:]}")
    accuracy, predictions = figures(proc.stdout)
    text = "\n".join([f"What it printed ({machine_stamp()}; the first test images are an ankle boot, a "
                      "pullover and trousers):", "", "```text", proc.stdout.strip(), "```"])
    write_between(args.readme, START, END, text)
    print(f"wrote the demo's output to {args.readme}: val-acc {accuracy}, {len(predictions)} predictions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
