"""The models layer: LeNet (standard, fused), gluoncv's zoo, seed-parallel ensembles of
any of them (laid out over devices, or fused), seeded initialization and loading saved
parameters."""
from .init import SeededXavier, ensemble, fused_for, init_model
from .loading import load_model, params_in, recorded_run
from .member_stack import pipeline_layout
from .zoo import ZOO_EXAMPLES, get_model

__all__ = ["SeededXavier", "ZOO_EXAMPLES", "ensemble", "fused_for", "get_model", "init_model", "load_model",
           "params_in", "pipeline_layout", "recorded_run"]
