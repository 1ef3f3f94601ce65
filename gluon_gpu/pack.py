"""python -m gluon_gpu.pack (programs/pack.py)."""
import sys

from .entry import program

main = program("pack")

if __name__ == "__main__":
    sys.exit(main())
