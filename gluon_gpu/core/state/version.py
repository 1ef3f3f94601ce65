"""The version of gluon_gpu (the one place it is written: pyproject.toml reads it here)."""
__version__ = "0.9.2"
