"""The version of gluon_gpu (setup.py reads it here)."""
__version__ = "0.9.1"
