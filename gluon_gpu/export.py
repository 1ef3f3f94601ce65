"""python -m gluon_gpu.export (programs/export.py)."""
import sys

from .entry import program

main = program("export")

if __name__ == "__main__":
    sys.exit(main())
