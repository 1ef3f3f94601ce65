"""gluon-gpu-bench: the program (program.py) and its comparisons, one module each."""
