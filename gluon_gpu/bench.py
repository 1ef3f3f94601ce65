"""python -m gluon_gpu.bench (programs/bench.py)."""
import sys

from .programs.bench import main

if __name__ == "__main__":
    sys.exit(main())
