"""python -m gluon_gpu.launch (programs/launch.py)."""
import sys

from .entry import program

main = program("launch")

if __name__ == "__main__":
    sys.exit(main())
