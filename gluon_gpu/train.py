"""python -m gluon_gpu.train (programs/train.py)."""
import sys

from .programs.train import main

if __name__ == "__main__":
    sys.exit(main())
