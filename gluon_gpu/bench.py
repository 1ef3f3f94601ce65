"""python -m gluon_gpu.bench (programs/bench.py)."""
import sys

from .entry import program

main = program("bench")

if __name__ == "__main__":
    sys.exit(main())
