"""bfloat16 training on oneDNN 3's kernels: a convolutional network's features (every
convolution, BatchNorm, ReLU and residual add of a CIFAR ResNet v1, or of a network of
this package's zoo marked ``onednn_features``) run as one operator on oneDNN 3, which
uses AMX where the CPU has it and AVX-512 BF16 otherwise. ``--bfloat16-kernels auto``
takes it where bfloat16_measured.json found it faster than contrib.amp on the CPU's
class (:func:`auto_kernels`).

Why: MXNet 1.9.1's bundled oneDNN 2.4 runs bfloat16 convolutions on AVX-512 BF16
kernels that are slower than its float32 ones (docs/bfloat16.md); oneDNN 3 (the
``onednn-cpu-gomp`` wheel) has AMX kernels and asks the kernel for AMX itself. One
operator per layer did not pay: converting MXNet's float32 NCHW arrays to oneDNN's
bfloat16 layouts and back around each convolution ate the gain. Here the activations
stay bfloat16, in oneDNN's layouts, from the first layer to the last
(kernels/amx_features.cc); the weights, their gradients, the running statistics, the
head, the loss and the optimizer stay float32.

The network keeps its blocks, Parameters and their names (checkpoints, export and
evaluation with the standard layers see the same network); only ``features`` runs
differently (AmxFeatures). A Python ``mx.operator.CustomOp`` calls the library: MXNet's
extension API (lib_api.h) has no bfloat16.
"""
import ctypes
import importlib.metadata
import json
import os
import sys
import threading
from collections import OrderedDict

import mxnet as mx
import numpy as np
from mxnet.gluon import nn

from ..core.platform.devices import CpuOnly, thread_settings
from ..core.platform.environment import cpu_flags
from ..core.platform.errors import UserError
from ..core.platform.walk import descendants
from ..core.step.precision import OwnBfloat16, bfloat16_measured, has_bfloat16
from .compiled import KernelUnavailable, build_library, cached_path, compiler

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "amx_features.cc")
# hidden visibility and -Bsymbolic: libmxnet.so exports oneDNN 2's C++ wrappers as weak
# symbols, which would otherwise stand in for oneDNN 3's inline ones in this library
CXXFLAGS = ["-shared", "-fPIC", "-std=c++17", "-O2", "-fopenmp", "-fvisibility=hidden",
            "-fvisibility-inlines-hidden", "-Wl,-Bsymbolic"]
AMX_FLAGS = frozenset(("amx_bf16", "amx_tile"))
MODES = ("auto", "onednn", "amp")  # --bfloat16-kernels
CONV, BN, ADD_RELU = 1, 2, 3  # the program's operations (kernels/amx_features.cc)
OP_LENGTH = {CONV: 8, BN: 7, ADD_RELU: 4}
_state = {"lib": None, "error": None}


def has_amx(flags=None):
    """Whether this CPU (or ``flags``) has AMX's bfloat16 tiles."""
    return AMX_FLAGS <= (cpu_flags() if flags is None else flags)


def _onednn_paths():
    """(include dir, lib dir) of the onednn wheels, or KernelUnavailable."""
    try:
        lib = importlib.metadata.distribution("onednn-cpu-gomp")
        importlib.metadata.distribution("onednn-devel-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        raise KernelUnavailable("the onednn-cpu-gomp and onednn-devel-cpu-gomp wheels are not installed "
                                "(requirements.txt)") from None
    so = next((f for f in lib.files if f.name == "libdnnl.so.3"), None)
    record = next((f for f in lib.files if f.name == "METADATA"), None)
    if so is None or record is None:
        raise KernelUnavailable("the onednn-cpu-gomp wheel holds no libdnnl.so.3")
    # its files lie outside site-packages ("../../libdnnl.so.3"): from the real folder of
    # its metadata, which may be reached through a link
    site = os.path.dirname(os.path.dirname(os.path.realpath(lib.locate_file(record))))
    lib_dir = os.path.dirname(os.path.normpath(os.path.join(site, str(so))))
    include = os.path.join(os.path.dirname(lib_dir), "include")
    if not os.path.isfile(os.path.join(lib_dir, "libdnnl.so.3")):
        raise KernelUnavailable(f"no libdnnl.so.3 in {lib_dir} (onednn-cpu-gomp)")
    if not os.path.isfile(os.path.join(include, "oneapi", "dnnl", "dnnl.hpp")):
        raise KernelUnavailable(f"no oneDNN headers in {include} (onednn-devel-cpu-gomp)")
    return include, lib_dir


def build():
    """The compiled library's path (cached per source, flags, compiler and oneDNN)."""
    name = compiler()
    include, lib_dir = _onednn_paths()
    path = cached_path("amx_features", (SOURCE, os.path.join(include, "dnnl_version.h")),
                       (" ".join(CXXFLAGS), name, lib_dir))
    return build_library(path, [name, *CXXFLAGS, SOURCE, "-I", include, "-L", lib_dir, "-ldnnl",
                                f"-Wl,-rpath,{lib_dir}"], "the oneDNN 3 bfloat16 kernels")


def library():
    """The loaded library (built first if need be), once per process; KernelUnavailable."""
    if _state["lib"] is None and _state["error"] is None:
        try:
            lib = ctypes.CDLL(build())
        except OSError as e:
            _state["error"] = f"cannot load the oneDNN 3 kernels: {str(e)[:200]}"
        except KernelUnavailable as e:
            _state["error"] = str(e)
        else:
            lib.gg_amx_last_error.restype = ctypes.c_char_p
            lib.gg_amx_net_create.restype = ctypes.c_void_p
            lib.gg_amx_net_kernels.restype = ctypes.c_char_p
            _state["lib"] = lib
    if _state["lib"] is None:
        raise KernelUnavailable(_state["error"])
    return _state["lib"]


def supports(net):
    """Whether ``net`` is a CIFAR ResNet v1 (gluoncv's ``cifar_resnet*_v1``) or a network
    marked ``onednn_features`` whose features this library runs; any other network keeps
    MXNet's own layers."""
    if type(net).__name__ != "CIFARResNetV1" and not getattr(net, "onednn_features", False):
        return False
    try:
        Program(net.features)
    except KernelUnavailable:
        return False
    return True


class Program:
    """The features' layers as the library runs them: ``ops`` (ints: kind, input slot,
    output slot, then the kind's own; kernels/amx_features.cc), ``params`` (the
    Parameters it reads, in order), ``aux`` (the running statistics) and ``tail`` (the
    global pooling, left to MXNet). KernelUnavailable names a layer it cannot run."""

    def __init__(self, features):
        self.ops, self.params, self.aux, self._slots = [], [], [], 0
        self.tail = [b for b in features if isinstance(b, (nn.GlobalAvgPool2D, nn.GlobalMaxPool2D))
                     or type(b).__name__ == "GlobalMeanPool"]
        if self.tail != list(features)[len(features) - len(self.tail):]:
            raise KernelUnavailable("a global pooling before the last layer")
        self._sequence([b for b in features if b not in self.tail], 0)

    def _op(self, kind, src, *rest):
        self._slots += 1
        self.ops += [kind, src, self._slots, *rest]
        return self._slots

    def _sequence(self, blocks, x):
        blocks, i = list(blocks), 0
        while i < len(blocks):
            relu = (isinstance(blocks[i], nn.BatchNorm) and i + 1 < len(blocks)
                    and isinstance(blocks[i + 1], nn.Activation) and blocks[i + 1]._act_type == "relu")
            x = self._block(blocks[i], x, relu)
            i += 1 + relu
        return x

    def _block(self, block, x, relu):
        if isinstance(block, nn.HybridSequential):
            return self._sequence(block, x)
        if isinstance(block, nn.Conv2D):
            k = block._kwargs
            if (block.bias is not None or k["num_group"] != 1 or k["layout"] != "NCHW" or set(k["dilate"]) != {1}
                    or len(set(k["kernel"])) != 1 or len(set(k["stride"])) != 1 or len(set(k["pad"])) != 1):
                raise KernelUnavailable(f"{block.name}: a convolution other than square, dense, NCHW, no bias")
            self.params.append(block.weight)
            return self._op(CONV, x, len(self.params) - 1, k["num_filter"], k["kernel"][0], k["stride"][0],
                            k["pad"][0])
        if type(block) is nn.BatchNorm:  # not a subclass: SyncBatchNorm normalizes over the devices
            k = block._kwargs
            if k["eps"] != 1e-5 or k["momentum"] != 0.9 or k["fix_gamma"] or k["use_global_stats"] or k["axis"] != 1:
                raise KernelUnavailable(f"{block.name}: a BatchNorm other than MXNet's defaults")
            self.params += [block.gamma, block.beta]
            self.aux += [block.running_mean, block.running_var]
            return self._op(BN, x, len(self.params) - 2, len(self.params) - 1, len(self.aux) - 2, int(relu))
        if type(block).__name__ == "CIFARBasicBlockV1":  # relu(body(x) + (downsample(x) or x))
            body = self._sequence(block.body, x)
            residual = self._sequence(block.downsample, x) if block.downsample else x
            return self._op(ADD_RELU, body, residual)
        raise KernelUnavailable(f"{block.name}: a layer these kernels do not run")


def output_shapes(ops, in_shape):
    """Every slot's shape from the input's: ``{slot: (n, c, h, w)}``."""
    shapes = {0: tuple(in_shape)}
    for p in _positions(ops):
        kind, src, out, *rest = ops[p:p + OP_LENGTH[ops[p]]]
        if kind == CONV:
            _, oc, k, stride, pad = rest
            n, _, h, w = shapes[src]
            shapes[out] = (n, oc, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
        else:
            shapes[out] = shapes[src]
    return shapes


def _host(array, keep):
    """An input's float32 NCHW bytes. Not the array's own pointer: MXNet's Convolution run
    for inference leaves its weight in oneDNN 2's blocked layout, and the copy a CustomOp
    receives of such an array is not NCHW either; ``asnumpy()`` is."""
    host = np.ascontiguousarray(array.asnumpy(), dtype=np.float32)
    keep.append(host)
    return host.ctypes.data


def _pointer(array):
    """An output's (or a running statistic's, written in place) data pointer."""
    handle = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(handle)))
    return handle.value


# Inference networks, shared by every operator instance with the same key: MXNet makes a
# CustomOp per call of a graph that is not statically allocated (an inference engine's),
# and one oneDNN 3 network each (scratch for the batch: ~150 MiB for ResNet-20 at 256)
# grew a bench --inference of ResNet-20 to 24 GiB and the kernel's OOM killer. At most
# MAX_SHARED_NETS, the least recently used destroyed first (never one in use: each holds
# its lock while it runs). Training networks keep the activations between forward and
# backward, so each operator keeps its own.
MAX_SHARED_NETS = 8
_SHARED = OrderedDict()  # (ops, shape, threads, bfloat16) -> _Shared
_SHARED_LOCK = threading.Lock()


class _Shared:
    def __init__(self, handle):
        self.handle, self.lock = handle, threading.Lock()


def _create(ops, shape, training, threads, bfloat16):
    lib = library()
    handle = lib.gg_amx_net_create((ctypes.c_int * len(ops))(*ops), len(ops), (ctypes.c_int * 4)(*shape),
                                   int(training), threads, int(bfloat16))
    if not handle:
        raise RuntimeError(f"oneDNN 3: {lib.gg_amx_last_error().decode()}")
    return ctypes.c_void_p(handle)


def _shared_net(ops, shape, threads, bfloat16):
    """The inference network of this key, made once, returned locked: the caller runs it,
    then releases its lock (so no other thread destroys it meanwhile)."""
    key = (tuple(ops), tuple(shape), threads, bool(bfloat16))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = _Shared(_create(ops, shape, False, threads, bfloat16))
        _SHARED.move_to_end(key)
        for old in list(_SHARED)[:-MAX_SHARED_NETS]:
            if _SHARED[old].lock.acquire(blocking=False):
                library().gg_amx_net_destroy(_SHARED.pop(old).handle)
        shared = _SHARED[key]
        shared.lock.acquire()
        return shared


class _FeaturesOp(mx.operator.CustomOp):
    """Calls the library: one oneDNN training network per input shape, per operator; the
    inference networks shared (:func:`_shared_net`)."""

    def __init__(self, ops, threads, bfloat16):
        super().__init__()
        self.ops, self.threads, self.bfloat16, self.nets = ops, threads, bfloat16, {}

    def _net(self, shape):
        key = tuple(shape)
        if key not in self.nets:
            self.nets[key] = _create(self.ops, shape, True, self.threads, self.bfloat16)
        return self.nets[key]

    def forward(self, is_train, req, in_data, out_data, aux):
        keep, params = [], in_data[1:]
        read = [_host(p, keep) for p in params]
        stats = [_pointer(a) if is_train else _host(a, keep) for a in aux]
        args = (ctypes.c_void_p(_host(in_data[0], keep)), (ctypes.c_void_p * len(read))(*read),
                (ctypes.c_void_p * len(stats))(*stats), ctypes.c_void_p(_pointer(out_data[0])), self.threads)
        if is_train:
            _check(library().gg_amx_net_forward(self._net(in_data[0].shape), *args))
            return
        shared = _shared_net(self.ops, in_data[0].shape, self.threads, self.bfloat16)
        try:
            _check(library().gg_amx_net_forward(shared.handle, *args))
        finally:
            shared.lock.release()

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        keep, params = [], in_data[1:]
        net = self._net(in_data[0].shape)
        read = [_host(p, keep) for p in params]
        grads = [_pointer(g) if r != "null" else None for g, r in zip(in_grad[1:], req[1:])]
        if req[0] != "null":
            self.assign(in_grad[0], req[0], mx.nd.zeros_like(in_grad[0]))  # the image: no gradient flows back
        _check(library().gg_amx_net_backward(
            net, ctypes.c_void_p(_host(out_grad[0], keep)), (ctypes.c_void_p * len(read))(*read),
            (ctypes.c_void_p * len(grads))(*grads), self.threads))

    def __del__(self):
        if _state["lib"] is not None:
            for handle in self.nets.values():
                _state["lib"].gg_amx_net_destroy(handle)


def _check(code):
    if code:
        raise RuntimeError(f"oneDNN 3: {library().gg_amx_last_error().decode()}")


@mx.operator.register("gg_amx_features")
class _FeaturesProp(mx.operator.CustomOpProp):
    def __init__(self, program, params, aux, threads="1", bfloat16="1"):
        super().__init__(need_top_grad=True)
        self.ops, self.params, self.aux = json.loads(program), int(params), int(aux)
        self.threads, self.bfloat16 = int(threads), bfloat16 == "1"

    def list_arguments(self):
        return ["data"] + [f"param{i}" for i in range(self.params)]

    def list_auxiliary_states(self):
        return [f"stat{i}" for i in range(self.aux)]

    def infer_shape(self, in_shape):
        shapes = output_shapes(self.ops, in_shape[0])
        stats = [(shapes[self.ops[p + 1]][1],) for p in _positions(self.ops) if self.ops[p] == BN]
        return in_shape, [shapes[max(shapes)]], [s for s in stats for _ in range(2)]

    def infer_type(self, in_type):
        return [np.float32] * len(in_type), [np.float32], [np.float32] * self.aux

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [out_grad[0]] + list(in_data)

    def create_operator(self, ctx, shapes, dtypes):
        return _FeaturesOp(self.ops, self.threads, self.bfloat16)


def _positions(ops):
    p = 0
    while p < len(ops):
        yield p
        p += OP_LENGTH[ops[p]]


class AmxFeatures(nn.HybridSequential, OwnBfloat16, CpuOnly):
    """A CIFAR ResNet v1's ``features`` run by the oneDNN 3 library; its children and
    Parameters are the standard ones (see :func:`use`)."""

    cpu_only = "`dtype` bfloat16 on oneDNN 3's kernels runs on CPUs only"
    kernels = "oneDNN 3: the features' convolutions, BatchNorms, ReLUs and adds"

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        program = self._program
        if F is mx.sym:
            params = [p.var() for p in program.params]
            stats = [p.var() for p in program.aux]
        else:
            params = [p.data(x.context) for p in program.params]
            stats = [p.data(x.context) for p in program.aux]
        y = F.Custom(x, *params, *stats, op_type="gg_amx_features", program=json.dumps(program.ops),
                     params=len(params), aux=len(stats), threads=self._threads, bfloat16=int(self._bfloat16))
        for block in program.tail:
            y = block(y)
        return y


def use(net, bfloat16=True):
    """Run ``net``'s features on the library (``bfloat16=False``: in float32, to compare
    with MXNet's layers); the network, its blocks and Parameters stay as they are."""
    library()
    features = net.features
    features._program = Program(features)
    for param in features._program.params + features._program.aux:
        # New arrays, in MXNet's own layout: a first forward pass by MXNet's layers (the
        # shapes' inference) may have left them in oneDNN 2's, which a CustomOp's copy
        # of its inputs does not undo (nor its writes to the running statistics reach).
        param.reset_ctx(param.list_ctx())
    features._threads = thread_settings()["omp_threads"]
    features._bfloat16 = bfloat16
    features.__class__ = AmxFeatures
    return net


def uses(net):
    return any(isinstance(b, AmxFeatures) for b in descendants(net))


def auto_kernels(flags=None):
    """What ``--bfloat16-kernels auto`` takes on this CPU (``flags``: another's): the path
    bfloat16_measured.json found faster on its class; on a class not measured, onednn with
    AMX (where it was built to pay) and amp without."""
    flags = cpu_flags() if flags is None else flags
    measured = bfloat16_measured(flags)
    if measured and "onednn" in measured:
        return "onednn" if float(measured["onednn"]) > float(measured["amp"]) else "amp"
    return "onednn" if has_amx(flags) else "amp"


def choose(net, mode, ctx, members=1, sync_bn=False):
    """Run ``net``'s features here (in bfloat16) where ``mode`` (``--bfloat16-kernels``)
    says: ``auto``, where :func:`auto_kernels` does and the network is one these kernels
    run (else contrib.amp, with a one-line warning if they failed to build); ``onednn``,
    that or a UserError saying why not; ``amp``, never. ``sync_bn``: the run synchronizes
    its BatchNorms over the devices, which these kernels do not."""
    if mode not in MODES:
        raise UserError(f"unknown `bfloat16_kernels` {mode!r}: choose one of {', '.join(MODES)}")
    why = _why_not(net, ctx, members) if mode == "onednn" or (mode == "auto" and auto_kernels() == "onednn") \
        else "asked for"
    if why is None and sync_bn:
        why = "its BatchNorms normalize each device's samples alone, not with `sync_bn`"
    if why is None:
        try:
            return use(net)
        except KernelUnavailable as e:
            why = str(e)
            if mode == "auto":
                print(f"gluon_gpu: warning: bfloat16 through contrib.amp: {why}", file=sys.stderr, flush=True)
    if mode == "onednn":
        raise UserError(f"`bfloat16_kernels` onednn: {why}")
    return net


def runs(net, ctx):
    """Whether ``auto`` runs ``net``'s features here on these kernels."""
    return auto_kernels() == "onednn" and _why_not(net, ctx, 1) is None


def _why_not(net, ctx, members):
    if any(c.device_type != "cpu" for c in ctx):
        return "it runs on CPUs only"
    if not has_bfloat16(cpu_flags()):
        return "this CPU has neither AVX-512 BF16 nor AMX (/proc/cpuinfo lists neither avx512_bf16 nor amx_bf16)"
    if members > 1:
        return "it trains one network, not an `ensemble` or a `sweep`"
    if not supports(net):
        return "it runs gluoncv's CIFAR ResNets v1 (cifar_resnet20_v1, ...) and the zoo's networks marked for it only"
    return None
