"""What a run must know of its data, saved with the run so that evaluate, predict and
--resume need no data flags: input shape, task, classes, normalization."""
import warnings
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

import numpy as np
from mxnet import gluon

from ..core.platform.errors import DataError


@dataclass
class DataSpec:
    """``input_shape``: one sample as stored, channels first: ``(C, H, W)`` images or
    ``(F,)`` features. ``dtype``: as stored, ``uint8`` (images: scaled by 1/255 first, as
    ``ToTensor``) or ``float32``. ``mean``/``std``: per channel (per feature), after that
    scaling. ``classes``: class names (classification); ``outputs``: the network's output
    width (the class count, or the regression target's width). ``samples``: the training
    samples a run trains on (a resumed run must find as many)."""
    dataset: str
    task: str
    input_shape: Tuple[int, ...]
    outputs: int
    mean: List[float]
    std: List[float]
    dtype: str = "uint8"
    classes: Optional[List[str]] = None
    source: str = field(default="", compare=False)
    samples: Optional[int] = field(default=None, compare=False)

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, values):
        values = dict(values)
        values["input_shape"] = tuple(values["input_shape"])
        return cls(**values)

    @property
    def channels(self):
        return self.input_shape[0]

    def transform(self, members=1):
        """The in-graph input transform: stored sample -> normalized float32."""
        return Standardize(self.mean, self.std, self.scale, len(self.input_shape), members)

    @property
    def scale(self):
        return input_scale(self.dtype)

    def check_compatible(self, other, what):
        """Refuse data of another shape, task or class count than this run's (DataError)."""
        for name in ("input_shape", "task", "outputs"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise DataError(f"{what} has {name.replace('_', ' ')} {theirs}, this run's is {mine}")


    def check_same_data(self, other, what):
        """Refuse other data than this run's (DataError): :meth:`check_compatible`, and
        the same classes and number of training samples (``--resume``)."""
        self.check_compatible(other, what)
        if self.classes != other.classes:
            raise DataError(f"{what} has classes {', '.join(other.classes or [])}; this run's are "
                            f"{', '.join(self.classes or [])}")
        if self.samples is not None and self.samples != other.samples:
            raise DataError(f"{what} has {other.samples} training samples; this run trained on {self.samples}: a run "
                            "resumes on the data it started with")


def input_scale(dtype):
    """uint8 images are scaled to [0, 1] before normalization, as ToTensor does."""
    return 1 / 255 if dtype == "uint8" else 1.0


def channel_stats(x, scale, chunk_bytes=2 ** 24):
    """Per-channel (axis 1) mean and std of ``x`` scaled by ``scale``; std 1 where constant.
    Two passes over chunks of at most ``chunk_bytes`` as float64 (runs of samples, or
    pieces of one sample's plane when a sample is larger): memory stays bounded whatever
    the size of ``x``."""
    mean, std = np.empty(x.shape[1]), np.empty(x.shape[1])
    plane = max(1, int(np.prod(x.shape[2:])))
    step = max(1, chunk_bytes // 8)

    def chunks(c):
        if plane <= step:  # whole samples at a time
            samples = step // plane
            return (x[i:i + samples, c].astype(np.float64) * scale for i in range(0, len(x), samples))
        return (x[i, c].reshape(-1)[j:j + step].astype(np.float64) * scale
                for i in range(len(x)) for j in range(0, plane, step))
    count = len(x) * plane
    for c in range(x.shape[1]):
        mean[c] = sum(chunk.sum() for chunk in chunks(c)) / count
        std[c] = np.sqrt(sum(((chunk - mean[c]) ** 2).sum() for chunk in chunks(c)) / count)
    std[std == 0] = 1.0
    return mean.tolist(), std.tolist()


class Standardize(gluon.HybridBlock):
    """``(x * scale - mean) / std`` per channel as one multiply and one add (MXNet's scalar
    division does not vectorize: the three-op form was 5% of a fused LeNet step on the CPU).
    One value for all channels runs as scalar operators; otherwise per-channel constants.
    ``members > 1``: inputs ``(n, K, C, ...)`` of an ensemble become ``(n, K*C, ...)``."""

    def __init__(self, mean, std, scale, sample_ndim, members=1):
        super().__init__(prefix="standardize_")
        self._members = members
        mul = [scale / s for s in std]
        add = [-m / s for m, s in zip(mean, std)]
        self._scalar = (mul[0], add[0]) if len(set(mul)) == 1 and len(set(add)) == 1 else None
        if self._scalar is None:
            shape = (1,) * (1 + (members > 1)) + (len(mul),) + (1,) * (sample_ndim - 1)  # members: (n, K, C, ...)
            self.mul = constant(self, "mul", np.array(mul, dtype=np.float32).reshape(shape))
            self.add = constant(self, "add", np.array(add, dtype=np.float32).reshape(shape))

    def hybrid_forward(self, F, x, **constants):  # pylint: disable=arguments-differ
        x = x.astype("float32")
        if self._scalar is not None:
            x = x * self._scalar[0] + self._scalar[1]
        else:
            x = F.broadcast_add(F.broadcast_mul(x, constants["mul"]), constants["add"])
        return F.reshape(x, shape=(0, -3, -2)) if self._members > 1 else x


def constant(block, name, value):
    """``block.params.get_constant(name, value)`` without MXNet's false alarm: a Constant
    registers its initializer as ``Constant_<name>_<id(constant)>``, and a new Constant at
    a freed one's address warns 'New initializer ... is overriding existing initializer'
    though the one it replaces belonged to no live Constant (ids are unique among live
    objects)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is\\s*overriding existing initializer", category=UserWarning)
        return block.params.get_constant(name, value)
