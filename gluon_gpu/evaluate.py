"""python -m gluon_gpu.evaluate (programs/evaluate.py)."""
import sys

from .programs.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
