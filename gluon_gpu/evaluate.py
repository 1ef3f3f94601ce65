"""python -m gluon_gpu.evaluate (programs/evaluate.py)."""
import sys

from .entry import program

main = program("evaluate")

if __name__ == "__main__":
    sys.exit(main())
