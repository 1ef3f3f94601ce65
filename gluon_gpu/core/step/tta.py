"""Test-time augmentation (``--tta flip,shift=1``): a classifier judged on several views
of each validation image, as airbench's multi-crop evaluation does.

The views are the image, its mirror (``flip``) and, for ``shift=P``, each of those moved
P pixels down-right and P pixels up-left (zero-filled, as a zero-padded crop). The
network runs once on all views of a batch (one larger batch); the prediction is the mean
of the views' log-probabilities (the normalized geometric mean of their probabilities),
and loss, accuracy and top-5 are computed on it. A network that outputs
log-probabilities already (the exported and oneDNN graphs) gives the same mean.
"""
from typing import NamedTuple

import numpy as np

from ..platform.environment import whole_number
from ..platform.errors import UserError

MAX_SHIFT = 8  # pixels: past that a shifted view loses most of a 28x28 image


class TestTimeAugmentation(NamedTuple):
    flip: bool = False
    shift: int = 0

    @property
    def views(self):
        return (1 + self.flip) * (1 + 2 * bool(self.shift))

    def spelled(self):
        return ",".join(["flip"] * self.flip + [f"shift={self.shift}"] * bool(self.shift)) or "none"

    def view_batch(self, F, x):
        """``x`` (n, C, H, W) as stored -> its views stacked, (views * n, C, H, W) float32."""
        x = x.astype("float32")
        views = [x, F.flip(x, axis=3)] if self.flip else [x]
        if self.shift:
            s = self.shift
            padded = [F.pad(v, mode="constant", pad_width=(0, 0, 0, 0, s, s, s, s)) for v in views]
            views += [F.slice_like(p, x, axes=(2, 3)) for p in padded]  # moved down-right by s
            views += [F.slice(p, begin=(None, None, 2 * s, 2 * s), end=(None,) * 4) for p in padded]  # up-left
        return F.concat(*views, dim=0) if len(views) > 1 else views[0]

    def combine(self, F, out):
        """The views' outputs (views * n, classes) -> the mean of their log-probabilities (n, classes)."""
        logp = F.log_softmax(out, axis=-1)
        return F.mean(F.reshape(logp, shape=(-4, self.views, -1, -2)), axis=0)

    def numpy_views(self, x):
        """The views of a host batch (n, C, H, W), in :meth:`view_batch`'s order and
        ``x``'s dtype (flips and zero-filled shifts keep every value)."""
        x = np.asarray(x)
        views = [x, x[..., ::-1]] if self.flip else [x]
        if self.shift:
            s, (h, w) = self.shift, x.shape[2:]
            padded = [np.pad(v, ((0, 0), (0, 0), (s, s), (s, s))) for v in views]
            views += [p[:, :, :h, :w] for p in padded] + [p[:, :, 2 * s:, 2 * s:] for p in padded]
        return views

    def host_mean(self, log_probabilities, x):
        """The mean over the views of a host batch ``x`` of ``log_probabilities(view)``
        (an NDArray (n, classes)): what :meth:`combine` gives inside a graph."""
        return sum(log_probabilities(view) for view in self.numpy_views(x)) / self.views


def parse_tta(text):
    """``--tta``: '', 'none', or a comma list of ``flip`` and ``shift=P`` -> a
    TestTimeAugmentation, or None for none."""
    if not text or text == "none":
        return None
    flip, shift, seen = False, 0, set()
    for item in text.split(","):
        name, equals, value = item.strip().partition("=")
        if name in seen:  # flip,flip ran as flip; shift=1,shift=2 as shift=2
            raise UserError(f"`tta` {text!r}: {name} is given twice")
        seen.add(name)
        if name == "flip" and not equals:
            flip = True
        elif name == "shift":
            shift = whole_number(value if equals else "1")  # 'shift=' ran as shift=1
            if shift is None or not 1 <= shift <= MAX_SHIFT:
                raise UserError(f"`tta` {text!r}: shift takes a whole number of pixels from 1 to {MAX_SHIFT}")
        else:
            raise UserError(f"`tta` {text!r}: expected a comma list of flip and shift=P (pixels), or none")
    return TestTimeAugmentation(flip, shift)


def tta_for(tta, head, members):
    """A TestTimeAugmentation (or None) from ``tta`` (one, its text, or None) for a
    network of ``members`` under ``head``; ValueError where it means nothing."""
    if isinstance(tta, str):
        try:
            tta = parse_tta(tta)
        except UserError as e:
            raise ValueError(str(e)) from None
    if tta is None:
        return None
    if not isinstance(tta, TestTimeAugmentation):
        raise TypeError(f"tta: expected 'flip,shift=P' or a TestTimeAugmentation, got {type(tta).__name__}")
    if head.task != "classify":
        raise ValueError("tta averages class log-probabilities: it takes a classification head")
    if members > 1:
        raise ValueError("tta evaluates one network, not an ensemble or a sweep")
    return tta


def check_tta(tta, input_shape, task):
    """Refuse test-time augmentation of data it does not fit (UserError, one line)."""
    if tta is None:
        return
    if task != "classify":
        raise UserError(f"`tta` averages class log-probabilities; this data is task {task}")
    if len(input_shape) != 3:
        raise UserError(f"`tta` flips and shifts images (C, H, W); this data has {input_shape[0]} features")
    if 2 * tta.shift >= min(input_shape[1:]):
        raise UserError(f"`tta` shift={tta.shift} moves a {input_shape[1]}x{input_shape[2]} image out of its frame")
