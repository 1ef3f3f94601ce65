"""python -m gluon_gpu.train (programs/train.py)."""
import sys

from .entry import program

main = program("train")

if __name__ == "__main__":
    sys.exit(main())
