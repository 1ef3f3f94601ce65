"""LeNet's conv -> ReLU -> max-pool stages as one compiled CPU operator each.

Why: on a CPU, oneDNN spends most of a LeNet step in layers far too small for it (conv1
has one input channel; the training-mode max-pool writes a workspace): 10.6 ms of a 20 ms
step went to conv1 + pool1 alone. ``gg_conv_relu_pool`` (kernels/conv_relu_pool.cc)
computes each pool window's four conv outputs together, vectorized over output channels,
and keeps only their maximum and its position for the backward pass. A LeNet step on one
CPU context: 20.7 -> 7.2 ms; on cpu*2: 11.9 -> 5.3 ms (README "Performance").

The operator is compiled once per machine with the C++ compiler (``$CXX``, else g++)
against the headers MXNet's wheel ships, cached under ``$GLUON_GPU_CACHE`` (default
``~/.cache/gluon_gpu``), and loaded with ``mx.library.load``. It has CPU kernels only:
networks for GPUs are built with the standard layers, and ``--fused-conv auto`` (the
default) falls back to them, with a one-line warning, wherever the operator cannot be
built. The fused network (LeNet, or an ensemble with ``groups=K``) has the standard one's
parameters, names and file keys, so parameters and checkpoints move freely between the two.
"""
import os
import sys

import mxnet as mx
from mxnet.gluon import nn

from ..core.platform.devices import CpuOnly
from ..core.platform.environment import cpu_flags
from ..core.platform.errors import UserError
from ..core.platform.walk import descendants
from ..core.step.array_api import legacy, to_api
from .compiled import KernelUnavailable, build_library, cached_path, compiler

MODES = ("auto", "on", "off")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "conv_relu_pool.cc")
# built into the same library: the augmentation's gather (gg_gather_map, data/augment.py)
GATHER_SOURCE = os.path.join(os.path.dirname(SOURCE), "gather_map.cc")
# -fassociative-math lets the compiler vectorize the gradient sums; no -ffinite-math-only,
# so NaNs still propagate (a diverged run must still be seen as one). -Bsymbolic: the
# library's calls to its own functions (MXNet's lib_api.cc, compiled in) bind to them,
# not to same-named ones a library loaded before with RTLD_GLOBAL exports (Horovod's).
CXXFLAGS = ["-shared", "-fPIC", "-std=c++17", "-O3", "-march=native", "-fno-math-errno",
            "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-Wl,-Bsymbolic"]

_state = {"loaded": False, "error": None, "warned": False}
WARNED_ENV = "GLUON_GPU_SAID_NO_FUSED_CONV"


class FusedConvUnavailable(KernelUnavailable):
    """The operator cannot be built or loaded here; the message says why, in one line."""


def _mxnet_paths():
    root = os.path.dirname(os.path.abspath(mx.__file__))
    return os.path.join(root, "include"), os.path.join(root, "src", "lib_api.cc")


def library_path(compiler_name):
    # -march=native code runs only on CPUs with the same features: part of the key
    return cached_path("conv_relu_pool", (SOURCE, GATHER_SOURCE, _mxnet_paths()[1]),
                       (" ".join(CXXFLAGS), compiler_name, mx.__version__, " ".join(sorted(cpu_flags()))))


def build():
    """The compiled library's path, compiling it first if it is not cached."""
    try:
        name = compiler()
    except KernelUnavailable as e:
        raise FusedConvUnavailable(str(e)) from None
    include, lib_api = _mxnet_paths()
    if not os.path.isfile(os.path.join(include, "mxnet", "lib_api.h")) or not os.path.isfile(lib_api):
        raise FusedConvUnavailable(f"this MXNet install has no extension headers ({include})")
    return build_library(library_path(name), [name, *CXXFLAGS, SOURCE, GATHER_SOURCE, lib_api, "-I", include],
                         "the fused conv+relu+pool CPU operator", FusedConvUnavailable)


def load():
    """Build (if needed) and load the operator into MXNet, once per process."""
    if _state["loaded"]:
        return
    if _state["error"] is None:
        try:
            mx.library.load(build(), verbose=False)
            _state["loaded"] = True
            return
        except FusedConvUnavailable as e:
            _state["error"] = str(e)
        except (OSError, mx.base.MXNetError) as e:
            _state["error"] = f"cannot load the compiled operator: {str(e).strip().splitlines()[-1][:200]}"
    raise FusedConvUnavailable(_state["error"])


def use_fused(mode, ctx):
    """Whether to build LeNet with the fused operator for the contexts ``ctx``.

    ``off``: never. ``on``: always, or a UserError saying why it cannot. ``auto``: when
    every context is a CPU and the operator builds here; otherwise the standard layers
    (with a one-line warning, once, if the operator failed to build)."""
    if mode not in MODES:
        raise UserError(f"unknown `fused_conv` {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        return False
    if any(c.device_type != "cpu" for c in ctx):
        if mode == "on":
            raise UserError("`fused_conv` on needs CPU devices: the fused operator has no GPU kernels")
        return False
    why = _why_unloaded(mode)
    if why is None:
        return True
    if not _state["warned"] and not os.environ.get(WARNED_ENV):
        print(f"gluon_gpu: warning: fused conv operator unavailable ({why}); using the standard layers",
              file=sys.stderr)
        os.environ[WARNED_ENV] = "1"  # said once per program: a re-executed one (devices.py) inherits it
    _state["warned"] = True
    return False


def compiled_gather(mode, ctx):
    """Whether ``--augment``'s gather runs as ``gg_gather_map`` (its library is this
    operator's) on ``ctx``: every context a CPU, ``mode`` not off, and the library loads
    (``on``: or a UserError saying why not). Otherwise the graph of MXNet operators,
    which gives the same images."""
    return mode != "off" and all(c.device_type == "cpu" for c in ctx) and _why_unloaded(mode) is None


def _why_unloaded(mode):
    """None once the library is loaded; else why it cannot be (``on``: a UserError)."""
    try:
        load()
        return None
    except FusedConvUnavailable as e:
        if mode == "on":
            raise UserError(f"`fused_conv` on: {e}") from None
        return str(e)


class ConvReluPool(CpuOnly, nn.HybridBlock):
    """``Conv2D(channels, kernel, activation='relu')`` then ``MaxPool2D(2, 2)`` as one
    operator, with the Conv2D's parameters (``weight``, ``bias``; named ``conv<N>_``).

    ``groups``: independent convolutions over channel groups, as ``Conv2D(groups=)``
    (``in_channels`` counts all groups; an ensemble's members). ``data_grad=False`` skips
    the gradient with respect to the input (MXNet's extension API does not say which
    gradients are wanted): only for a network's first layer, whose input is the image
    batch. With a parameter's ``grad_req='add'`` (which the extension API cannot honour)
    the block runs the standard operators instead."""

    cpu_only = ("this LeNet uses the fused conv operator, which has CPU kernels only: "
                "build it with fused=False (`fused_conv` off) for GPUs")

    def __init__(self, channels, kernel, in_channels, groups=1, data_grad=True, **kwargs):
        super().__init__(**kwargs)
        self.groups, self.data_grad = groups, data_grad
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(channels, in_channels // groups, kernel, kernel),
                                          allow_deferred_init=True)
            self.bias = self.params.get("bias", shape=(channels,), init="zeros", allow_deferred_init=True)

    def _alias(self):
        return "conv"

    def __repr__(self):
        f, c, k, _ = self.weight.shape
        groups = f", groups={self.groups}" if self.groups > 1 else ""
        return f"{type(self).__name__}({c * self.groups} -> {f}, kernel_size=({k}, {k}){groups}, relu, max-pool 2x2)"

    def hybrid_forward(self, F, x, weight, bias):  # pylint: disable=arguments-differ
        is_np = mx.util.is_np_array()  # an extension operator takes legacy arrays only
        with mx.util.np_array(False):
            out = self._legacy_forward(F, legacy(x), legacy(weight), legacy(bias))
        return to_api(out, is_np)

    def _legacy_forward(self, F, x, weight, bias):
        if "add" in (self.weight.grad_req, self.bias.grad_req):
            z = F.Convolution(x, weight, bias, kernel=self.weight.shape[2:], num_filter=self.weight.shape[0],
                              num_group=self.groups)
            return F.Pooling(F.relu(z), kernel=(2, 2), stride=(2, 2), pool_type="max")
        return F.gg_conv_relu_pool(x, weight, bias, data_grad=int(self.data_grad), groups=self.groups)[0]


class PooledAbove(nn.HybridBlock):
    """Stands where the standard LeNet has its MaxPool2D (the ConvReluPool before it has
    pooled already), so every layer keeps its index, name and parameter-file key."""

    def _alias(self):
        return "pool"

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return x


def is_fused(net):
    """Whether ``net`` runs the fused operator (a LeNet built with ``fused=True``, or an
    ensemble of such members)."""
    return any(isinstance(b, ConvReluPool) for b in descendants(net))
