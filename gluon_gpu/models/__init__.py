"""The models layer: LeNet (standard, fused, ensembles), gluoncv's zoo, seeded
initialization and loading saved parameters."""
from .init import SeededXavier, fused_for, init_model
from .loading import load_model, recorded_run
from .zoo import ZOO_EXAMPLES, get_model

__all__ = ["SeededXavier", "ZOO_EXAMPLES", "fused_for", "get_model", "init_model", "load_model",
           "recorded_run"]
