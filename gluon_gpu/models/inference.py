"""Inference graphs that use what a CPU has: MXNet's oneDNN backend fuses convolution,
BatchNorm and ReLU into one primitive (``optimize_for``), and its quantization tools
run the network in INT8, calibrated on training samples (``contrib.quantization``).

Both are oneDNN's, CPU-only: on other contexts ``auto`` keeps the training graph.
Measured on this package's networks: docs/serving.md.
"""
import contextlib
import logging
import os
import sys
import warnings

import mxnet as mx
from mxnet import gluon

from ..core.errors import UserError
from .servable import servable_model

# --inference: the graph evaluate and predict run (the help text of each)
MODES = {"auto": "fused on CPU contexts, graph on others",
         "graph": "the training graph, over every device",
         "fused": "oneDNN's fused operators (conv+BN+ReLU), CPU",
         "int8": "oneDNN INT8, calibrated on training samples, CPU"}


def inference_mode(mode, ctx):
    """The graph ``mode`` (:data:`MODES`) gives on contexts ``ctx``: ``auto`` decided; the
    oneDNN modes refused on other contexts than the CPU's."""
    on_cpu = all(c.device_type == "cpu" for c in ctx)
    if mode == "auto":
        return "fused" if on_cpu else "graph"
    if mode not in MODES:
        raise UserError(f"unknown `inference` {mode!r}: choose one of {', '.join(MODES)}")
    if mode in ("fused", "int8") and not on_cpu:
        raise UserError(f"`inference` {mode} is oneDNN's, for CPU contexts: use `devices` cpu, or `inference` graph")
    return mode


def inference_model(path, spec, mode, example, model=None, member=None, calibration=None, log=False):
    """The Servable of ``path`` (see servable.py) as ``mode`` runs it on the CPU:
    ``fused`` partitioned for oneDNN, ``int8`` quantized with ``calibration`` (stored
    samples, a few hundred) setting each layer's range. ``example``: a batch of stored
    samples, as the graph will be called."""
    net = servable_model(path, spec, model, member, log)
    batch = mx.nd.array(example, dtype=spec.dtype)
    if mode == "fused":
        net.optimize_for(batch, backend="MKLDNN")
    elif mode == "int8":
        if calibration is None or len(calibration) == 0:
            raise UserError("`inference` int8 needs training samples to calibrate on")
        samples = gluon.data.ArrayDataset(mx.nd.array(calibration, dtype=spec.dtype))
        loader = gluon.data.DataLoader(samples, batch_size=min(len(calibration), 64),
                                       batchify_fn=lambda rows: [mx.nd.stack(*rows)])  # the quantizer wants lists
        quiet = logging.getLogger("gluon_gpu.int8")
        quiet.setLevel(logging.WARNING)
        with _native_log_silenced():
            net = mx.contrib.quantization.quantize_net_v2(net, quantized_dtype="auto", calib_mode="naive",
                                                          calib_data=loader, num_calib_examples=len(calibration),
                                                          ctx=mx.cpu(), logger=quiet)
            net(batch).wait_to_read()
    elif mode != "graph":
        raise UserError(f"`inference` {mode}: not an inference graph of a saved model")
    net(batch).wait_to_read()
    return net


@contextlib.contextmanager
def _native_log_silenced():
    """MXNet's quantization pass logs a line per layer from C++ to file descriptor 2 (no
    setting turns it off), and its SymbolBlock warns that the input type is unknown; a
    failure still raises with its message."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
