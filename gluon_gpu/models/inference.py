"""Inference graphs that use what a CPU has: MXNet's oneDNN backend fuses convolution,
BatchNorm and ReLU into one primitive (``optimize_for``), its quantization tools run the
network in INT8, calibrated on training samples (``contrib.quantization``), and
``contrib.amp`` converts it to bfloat16 (a CIFAR ResNet v1 on a CPU with AMX runs its
features on oneDNN 3 instead, as it trains: amx_features.py).

All three are oneDNN's, CPU-only: on other contexts ``auto`` keeps the training graph.
Measured on this package's networks: docs/serving.md.
"""
import contextlib
import logging
import os
import sys
import warnings

import mxnet as mx
from mxnet import gluon
from mxnet.contrib import amp, quantization

from ..core.platform.environment import usable_cpus
from ..core.platform.errors import UserError
from ..core.step.precision import cpu_flags, has_bfloat16
from . import amx_features
from .init import fused_for
from .servable import servable_model

# --inference: the graph evaluate and predict run (the help text of each)
MODES = {"auto": "fused on CPU contexts (graph for LeNet, whose fused conv operator is faster there), "
                 "graph on others",
         "graph": "the training graph, over every device",
         "fused": "oneDNN's fused operators (conv+BN+ReLU), CPU",
         "int8": "oneDNN INT8, calibrated on training samples, CPU",
         "bfloat16": "bfloat16 on CPUs with AVX-512 BF16: a CIFAR ResNet v1's features on oneDNN 3 where that "
                     "measured faster on the CPU's class (train's --bfloat16-kernels auto), else the fused graph "
                     "through contrib.amp"}
ONEDNN = ("fused", "int8", "bfloat16")


def inference_mode(mode, ctx, model="lenet", fused_conv="auto"):
    """The graph ``mode`` (:data:`MODES`) gives for network ``model`` on contexts ``ctx``:
    ``auto`` is oneDNN's fused graph on CPU contexts, except for a network that has
    gluon_gpu's fused conv operator there (LeNet: its training graph ran 5x faster than
    oneDNN's fused graph, bench --inference); the oneDNN modes refused elsewhere."""
    on_cpu = all(c.device_type == "cpu" for c in ctx)
    if mode == "auto":
        return "fused" if on_cpu and not fused_for(model, ctx, fused_conv) else "graph"
    if mode not in MODES:
        raise UserError(f"unknown `inference` {mode!r}: choose one of {', '.join(MODES)}")
    if mode in ONEDNN and not on_cpu:
        raise UserError(f"`inference` {mode} is oneDNN's, for CPU contexts: use `devices` cpu, or `inference` graph")
    if mode == "bfloat16" and not has_bfloat16(cpu_flags()):
        raise UserError("`inference` bfloat16 needs a CPU with AVX-512 BF16 or AMX instructions (/proc/cpuinfo "
                        "lists neither avx512_bf16 nor amx_bf16)")
    return mode


def inference_threads(mode, omp_threads):
    """OpenMP threads per operator for graph ``mode`` (``omp_threads`` 0: not chosen):
    oneDNN's graphs run on one CPU context, every core working on each operator, as
    inference servers run them; the training graph keeps the process's (one context per
    core's worth of threads: devices.cpu_contexts)."""
    return omp_threads or (usable_cpus() if mode in ONEDNN else 0)


def inference_model(path, spec, mode, example, model=None, member=None, calibration=None, log=False):
    """The Servable of ``path`` (see servable.py) as ``mode`` runs it on the CPU:
    ``fused`` partitioned for oneDNN, ``int8`` quantized with ``calibration`` (stored
    samples, a few hundred) setting each layer's range. ``example``: a batch of stored
    samples, as the graph will be called."""
    net = servable_model(path, spec, model, member, log)
    batch = mx.nd.array(example, dtype=spec.dtype)
    if mode == "bfloat16" and all(amx_features.runs(member_net, [mx.cpu()]) for member_net in net.nets):
        for member_net in net.nets:  # a CIFAR ResNet on an AMX CPU: the features on oneDNN 3, as in training
            amx_features.use(member_net)
        mode = "graph"
    elif mode == "bfloat16":
        net(batch).wait_to_read()  # the converter reads the traced graph
        with warnings.catch_warnings():  # the converted SymbolBlock's unknown input type
            warnings.simplefilter("ignore", UserWarning)
            net = amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    if mode in ("fused", "bfloat16"):
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
            net = quantization.quantize_net_v2(net, quantized_dtype="auto", calib_mode="naive", calib_data=loader,
                                               num_calib_examples=len(calibration), ctx=mx.cpu(), logger=quiet)
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
