"""python -m gluon_gpu.bench (programs/bench/program.py)."""
import sys

from .entry import program

main = program("bench", "bench.program")

if __name__ == "__main__":
    sys.exit(main())
