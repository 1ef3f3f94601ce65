"""python -m gluon_gpu.predict (programs/predict.py)."""
import sys

from .entry import program

main = program("predict")

if __name__ == "__main__":
    sys.exit(main())
