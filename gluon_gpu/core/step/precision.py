"""Training precision: float32; float16 with the network cast (GPUs, float32 master
weights through the optimizer's ``multi_precision``); and mixed precision through MXNet's
``contrib.amp``: ``bfloat16`` on CPUs with AVX-512 BF16, ``float16`` (``--amp``) on GPUs
with dynamic loss scaling. Under AMP the parameters, the optimizer and the metric sums
stay float32; convolutions and dense layers compute in the low precision.

Two limits of MXNet 1.9's AMP shape this module. ``amp.init`` rewrites the operator
functions of ``mx.nd`` and ``mx.sym`` for the whole process, for good: a process trains
in one AMP precision, and a second network asking for another (or for plain float32
after AMP) is refused rather than silently converted. And it rewrites the legacy API
only: a numpy-API network (``npx.set_np()``) would train in float32 under a bfloat16
flag, so it is refused too.
"""
import contextlib
import json
import os
from dataclasses import dataclass

from ..platform.environment import bfloat16_isa, cpu_flags  # a module name here: tests play another CPU by replacing it
from ..platform.errors import UserError
from ..platform.walk import descendants

DTYPES = ("float32", "float16", "bfloat16")
# What scripts/bfloat16_page.py measured: bfloat16 training against float32 (docs/bfloat16.md)
BFLOAT16_MEASURED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bfloat16_measured.json")
BF16_CPU_FLAGS = frozenset(("avx512_bf16", "amx_bf16"))
_amp_state = {"target": None}  # the process's AMP precision, once amp.init ran


class OwnBfloat16:
    """A block that computes in bfloat16 with kernels of its own (models/amx_features.py):
    a network holding one trains in ``dtype`` bfloat16 without contrib.amp around it."""

    kernels = "its own kernels"  # what the plan line names


@dataclass(frozen=True)
class Precision:
    """``dtype``: what the network computes in. ``amp``: through contrib.amp (bfloat16
    unless the network has kernels of its own). ``loss_scaling``: AMP's dynamic loss
    scaling (float16 AMP needs it; a bfloat16 run may ask for it, which is how its code
    path is tested on CPUs). ``kernels``: the OwnBfloat16 blocks' description, or ''."""
    dtype: str = "float32"
    amp: bool = False
    loss_scaling: bool = False
    kernels: str = ""

    @property
    def param_dtype(self):
        """The parameters' dtype: float16 only when the whole network is cast."""
        return "float16" if self.dtype == "float16" and not self.amp else "float32"

    def optimizer_params(self, params):
        """The optimizer's parameters for this precision: a network cast to float16
        keeps float32 master weights (``multi_precision``) unless told otherwise. A list
        (one per member): each."""
        if isinstance(params, (list, tuple)):
            return [self.optimizer_params(p) for p in params]
        params = dict(params or {})
        if self.param_dtype == "float16":
            params.setdefault("multi_precision", True)
        return params

    def describe(self):
        if self.dtype == "float32":
            return "float32"
        if self.kernels:
            return f"{self.dtype} ({self.kernels})"
        how = "contrib.amp" + (", dynamic loss scaling" if self.loss_scaling else "") if self.amp else \
            "network cast, float32 master weights"
        return f"{self.dtype} ({how})"


def own_bfloat16(net):
    """The network's OwnBfloat16 block, or None."""
    return next((b for b in descendants(net) if isinstance(b, OwnBfloat16)), None)


def has_bfloat16(flags=None):
    """Whether this CPU (or ``flags``) has bfloat16 instructions: AVX-512 BF16 or AMX."""
    return bool((cpu_flags() if flags is None else flags) & BF16_CPU_FLAGS)


def bfloat16_class(flags=None):
    """This CPU's (or ``flags``') class as measured figures name it (environment.bfloat16_isa)."""
    return bfloat16_isa(cpu_flags() if flags is None else flags)


def bfloat16_measured(flags=None, path=None):
    """What scripts/bfloat16_page.py measured on this CPU's class (``flags``: another
    CPU's), ``{'class', 'cpu', 'date', 'version', 'model', 'page', 'amp', 'onednn'}`` (the
    ratios of each bfloat16 path's samples/s to float32's; ``onednn`` may be absent), or
    None where nothing was measured on that class. Figures never cross classes: a CPU
    without AVX-512 BF16 runs bfloat16 another way altogether."""
    kind = bfloat16_class(flags)
    try:
        with open(path or BFLOAT16_MEASURED) as f:
            measured = json.load(f)
        entry = dict(measured["classes"][kind])
        for ratio in ("amp", "onednn") if "onednn" in entry else ("amp",):  # every field its readers take
            entry[ratio] = float(entry[ratio])
        entry["date"], entry["cpu"] = str(entry["date"]), str(entry["cpu"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a damaged table: as if unmeasured
        return None
    return {**entry, "class": kind, "model": measured.get("model", "ResNet-20"),
            "page": measured.get("page", "docs/bfloat16.md")}


def measured_words(measured):
    """'measured 2026-12-07 on AMD EPYC (AVX-512 BF16), docs/bfloat16.md'."""
    return f"measured {measured['date']} on {measured['cpu']} ({measured['class']}), {measured['page']}"


def bfloat16_warning(measured):
    """The plan line's warning for bfloat16 through contrib.amp where it was measured
    slower than float32 on this CPU class (``measured``: :func:`bfloat16_measured`), with
    the ratio; '' where it was not."""
    if not measured or float(measured["amp"]) >= 1:
        return ""
    return (f"warning: slower than float32: {measured['model']} trained at {float(measured['amp']):.2f}x float32's "
            f"samples/s through contrib.amp ({measured_words(measured)})")


def precision_for(dtype="float32", amp=False, loss_scaling=None, own=None):
    """The Precision of the flags ``--dtype`` and ``--amp`` (which means float16 AMP);
    ``loss_scaling`` None: on for float16 AMP only. ``own``: the network's OwnBfloat16
    block, if it has one: bfloat16 then runs on it, with no AMP."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if own is not None:
        if dtype != "bfloat16" or amp or loss_scaling:
            raise UserError(f"this network computes in bfloat16 on {own.kernels}: train it with `dtype` bfloat16 "
                            "(no `amp`, no `loss_scaling`)")
        return Precision("bfloat16", kernels=own.kernels)
    if amp and dtype == "bfloat16":
        raise UserError("`amp` is float16 mixed precision for GPUs; bfloat16 (`dtype` bfloat16) is mixed "
                        "precision already: pass one of them")
    amp = amp or dtype == "bfloat16"
    dtype = "float16" if amp and dtype == "float32" else dtype
    return Precision(dtype, amp, amp and dtype == "float16" if loss_scaling is None else bool(loss_scaling))


def check_precision(precision, ctx):
    """Refuse a precision these devices cannot train in (UserError, one line)."""
    on_gpu = all(c.device_type == "gpu" for c in ctx)
    on_cpu = all(c.device_type == "cpu" for c in ctx)
    if precision.dtype == "float16" and not on_gpu:
        what = "`amp` (float16 mixed precision)" if precision.amp else "float16 training"
        raise UserError(f"{what} needs GPU devices: MXNet has no float16 GEMM on CPUs; on CPUs with "
                        "AVX-512 BF16 use `dtype` bfloat16")
    if precision.dtype == "bfloat16":
        if not on_cpu:
            raise UserError("`dtype` bfloat16 runs on CPUs (oneDNN's bfloat16 kernels); on GPUs use `amp`")
        if not has_bfloat16():
            raise UserError("`dtype` bfloat16 needs a CPU with AVX-512 BF16 or AMX instructions "
                            "(/proc/cpuinfo lists neither avx512_bf16 nor amx_bf16); train in float32")


def enable_amp(precision, net_is_np):
    """Switch the process to ``precision``'s AMP (amp.init), once; refuse what it cannot
    honour (see the module docstring)."""
    current = _amp_state["target"]
    if not precision.amp:
        if current is not None:
            raise UserError(f"this process already trains in {current} mixed precision (MXNet's amp.init "
                            "is process-wide): a float32 network needs a process of its own")
        return
    if net_is_np:
        raise UserError(f"{precision.dtype} mixed precision: MXNet 1.9's AMP converts legacy-API (mx.nd) "
                        "networks only, and this one uses the numpy API (npx.set_np); it would train in float32")
    if current is None:
        from mxnet.contrib import amp
        amp.init(target_dtype=precision.dtype)
        _amp_state["target"] = precision.dtype
    elif current != precision.dtype:
        raise UserError(f"this process already trains in {current} mixed precision (MXNet's amp.init is "
                        f"process-wide): {precision.dtype} needs a process of its own")


def init_loss_scaling(precision, trainer):
    if precision.loss_scaling:
        from mxnet.contrib import amp
        amp.init_trainer(trainer)


def scaled_losses(trainer, losses):
    """``amp.scale_loss`` when the trainer scales its loss (inside ``autograd.record``),
    else the losses as they are."""
    if getattr(trainer, "_amp_loss_scaler", None) is None:
        return contextlib.nullcontext(losses)
    from mxnet.contrib import amp
    return amp.scale_loss(losses, trainer)


def loss_scale(trainer):
    """The factor the gradients carry (1 without loss scaling)."""
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    return scaler.loss_scale if scaler is not None else 1.0


_SCALER_FIELDS = ("_loss_scale", "_next_loss_scale", "_unskipped")


def loss_scaler_state(trainer):
    """The dynamic loss scaler's state for a checkpoint (None without one)."""
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    return None if scaler is None else {name.lstrip("_"): getattr(scaler, name) for name in _SCALER_FIELDS}


def load_loss_scaler_state(trainer, state):
    scaler = getattr(trainer, "_amp_loss_scaler", None)
    if scaler is not None and state:
        for name in _SCALER_FIELDS:
            setattr(scaler, name, state[name.lstrip("_")])

