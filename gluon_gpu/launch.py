"""python -m gluon_gpu.launch (programs/launch.py)."""
import sys

from .programs.launch import main

if __name__ == "__main__":
    sys.exit(main())
