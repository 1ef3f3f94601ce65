"""python -m gluon_gpu.predict (programs/predict.py)."""
import sys

from .programs.predict import main

if __name__ == "__main__":
    sys.exit(main())
