"""Training-time image augmentation, on the device inside the hybridized step.

``--augment flip,crop=4`` names components (:data:`COMPONENTS`), each with an optional
parameter, or a preset (:data:`PRESETS`). :class:`Augment` applies them to a batch of
images as stored (before normalization) from one row of parameters per sample, which
the host makes from uniform draws of (seed, epoch) indexed by sample (:meth:`Augment.table`,
:func:`draw_table`), so a sample's augmentation depends on (seed, epoch, sample) alone:
a resumed run, a 1-device and a 2-device run, and every worker of a job see the same
augmented batches. Evaluation never augments (the evaluation graph has no parameters).

The geometric components compose into one inverse map per sample, read by
nearest-neighbour gather (one ``take``; outside the image: 0, as a zero-padded crop).
Integer shifts and flips are exact. MXNet's ``BilinearSampler`` did the same in 7x the
time of a LeNet step's whole input path (1.95 ms against 0.26 ms for a ``take`` of a
128-image batch on this CPU), and torchvision's rotations and affine maps default to
nearest too.
"""
import math
from collections import namedtuple

import numpy as np
from mxnet import gluon

from ..core.platform.errors import UserError
from .spec import constant

Component = namedtuple("Component", "default check draws what")
# name -> its parameter's default, validity, uniform draws per sample, and help. Applied in
# this order: the geometric ones as one map, then jitter, then erase.
COMPONENTS = {
    "flip": Component(0.5, lambda p: 0 < p <= 1, 1, "horizontal flip with probability P"),
    "vflip": Component(0.5, lambda p: 0 < p <= 1, 1, "vertical flip with probability P"),
    "crop": Component(4, lambda p: p >= 1 and p == int(p), 2,
                      "random crop of the image padded by P pixels (GluonCV's CIFAR: 4): a whole-pixel shift "
                      "of -P..P each way"),
    "translate": Component(0.1, lambda p: 0 < p < 1, 2, "shift of up to P x the side each way"),
    "rotate": Component(15, lambda p: 0 < p <= 180, 1, "rotation by up to P degrees either way"),
    "jitter": Component(0.4, lambda p: 0 < p < 1, 3,
                        "brightness, contrast and (RGB) saturation, each scaled by 1-P..1+P"),
    "erase": Component(0.5, lambda p: 0 < p <= 1, 5,
                       "random erasing (Zhong et al.) with probability P: a rectangle of 2-40% of the "
                       "image, aspect 0.3-3.3, set to the mean"),
}
GEOMETRIC = ("flip", "vflip", "crop", "translate", "rotate")


def gathers(components):
    """Whether ``components`` (parsed) move pixels: the gather (compiled or not) runs."""
    return any(name in components for name in GEOMETRIC)
PRESETS = {"none": "", "basic": "flip,crop=4", "strong": "flip,crop=4,erase=0.5"}
ERASE_AREA, ERASE_ASPECT = (0.02, 0.4), (0.3, 1 / 0.3)
MAX_GATHER = 2 ** 24  # elements of one device's batch: float32 indices are exact up to here
DRAW_STREAM = 1  # draw_table's rng: [seed, epoch, DRAW_STREAM], apart from epoch_order's [seed, epoch]


def parse_augment(text):
    """``'flip,crop=4'`` (or a preset) -> ``{component: parameter}`` in application order."""
    text = PRESETS.get((text or "").strip(), text or "")
    chosen = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        if name in chosen:  # flip=0.2,flip=0.9 ran as flip=0.9
            raise UserError(f"`augment` {text!r}: {name} is given twice")
        if name in PRESETS:
            raise UserError(f"`augment` {text!r}: {name} is a preset: give it alone, or spell it out "
                            f"among the components ({PRESETS[name] or 'none'})")
        if name not in COMPONENTS:
            raise UserError(f"`augment` {item!r}: unknown component; choose from {', '.join(COMPONENTS)}, "
                            f"or a preset: {', '.join(PRESETS)}")
        try:
            param = float(value) if equals else COMPONENTS[name].default  # an empty value (crop=) is an error
        except ValueError:
            param = None
        if param is None or not COMPONENTS[name].check(param):
            raise UserError(f"`augment` {item!r}: {name}={value} is not valid ({COMPONENTS[name].what})")
        chosen[name] = int(param) if name == "crop" else param
    return {name: chosen[name] for name in COMPONENTS if name in chosen}


def describe(components):
    """The canonical spelling, every parameter written out: ``flip=0.5,crop=4``."""
    return ",".join(f"{name}={param:g}" for name, param in components.items()) or "none"


def augment_help():
    return ("training images augmented on the device: a comma list of " +
            ", ".join(f"{name}[=P] ({c.what}; P={c.default:g})" for name, c in COMPONENTS.items()) +
            "; or a preset: " + ", ".join(f"{name} ({spell or 'nothing'})" for name, spell in PRESETS.items()))


def draw_table(samples, width, seed, epoch):
    """One row of ``width`` uniform [0, 1) draws per sample of the epoch: a function of
    (seed, epoch) indexed by sample, so batches cut any way get the same rows."""
    return np.random.default_rng([seed, epoch, DRAW_STREAM]).random((samples, width), dtype=np.float32)


class Augment(gluon.HybridBlock):
    """``(images (n, C, H, W) as stored, parameters (n, width)) -> augmented images``.

    The host turns each sample's uniform draws into its parameters (:meth:`parameters`:
    the source map, jitter factors, the erased box), so the graph does no per-sample
    arithmetic, only the per-pixel work. ``components``: :func:`parse_augment`'s dict.
    ``fill``: per-channel value of erased areas, in stored units (the data's mean: zero
    after normalization). ``clip_max``: jitter clips to ``[0, clip_max]`` (255: uint8).
    ``compiled``: the geometric gather as ``gg_gather_map``, one compiled CPU operator
    (models/kernels/gather_map.cc, loaded by the caller: models/fused_conv.py's
    ``compiled_gather``), in place of five passes of MXNet operators; the same images.
    """

    def __init__(self, components, sample_shape, fill, clip_max=None, compiled=False):
        super().__init__(prefix="augment_")
        if len(sample_shape) != 3:
            raise UserError(f"`augment` applies to images (C, H, W); these samples are {tuple(sample_shape)}")
        self.components, self.clip_max = dict(components), clip_max
        self.channels, self.height, self.width_px = c, h, w = sample_shape
        self.geometric = gathers(self.components)
        self.compiled = compiled and self.geometric
        self.draws = sum(COMPONENTS[name].draws for name in self.components)  # uniform draws per sample
        self.width = 6 * self.geometric + 3 * ("jitter" in self.components) + 4 * ("erase" in self.components)
        # Pixel indices along each axis, and the fill per channel: only those used (Gluon
        # warns of a constant no computation reads).
        if (self.geometric and not self.compiled) or "erase" in self.components:
            self.cols, self.rows = pixel_indices(self, h, w)
        if "erase" in self.components:
            self.fill = constant(self, "fill", np.array(fill, dtype=np.float32).reshape(1, c, 1, 1))

    def table(self, samples, seed, epoch):
        """The epoch's parameters, one row per sample, from (seed, epoch) alone."""
        return self.parameters(draw_table(samples, self.draws, seed, epoch))

    def parameters(self, draws):
        """Per-sample parameters ``(n, width)`` float32 from uniform ``draws`` ``(n, self.draws)``."""
        columns, draws = [], iter(np.asarray(draws, np.float64).T)
        taken = {name: [next(draws) for _ in range(COMPONENTS[name].draws)] for name in self.components}
        if self.geometric:
            columns += self._source_map(taken)
        if "jitter" in taken:
            columns += [1 + (2 * u - 1) * self.components["jitter"] for u in taken["jitter"]]
        if "erase" in taken:
            columns += self._erased_box(taken["erase"])
        return np.stack(columns, axis=1).astype(np.float32)

    def _source_map(self, taken):
        """``[a, b, c, d, e, f]``: output pixel (row i, column j) reads source column
        ``a j + b i + c`` and row ``d j + e i + f``: the inverse of flip, then rotation
        about the centre, then shift. Without rotation the shift is rounded here, so a
        map of whole pixels needs no rounding on the device (and flips stay exact)."""
        p, n = self.components, len(next(iter(taken.values()))[0])
        h, w = self.height, self.width_px
        cx, cy = (w - 1) / 2, (h - 1) / 2
        dx, dy, angle = np.zeros(n), np.zeros(n), np.zeros(n)
        if "crop" in p:  # whole pixels -P..P: a zero-padded random crop
            dx += np.floor(taken["crop"][0] * (2 * p["crop"] + 1)) - p["crop"]
            dy += np.floor(taken["crop"][1] * (2 * p["crop"] + 1)) - p["crop"]
        if "translate" in p:
            dx += (2 * taken["translate"][0] - 1) * p["translate"] * w
            dy += (2 * taken["translate"][1] - 1) * p["translate"] * h
        if "rotate" in p:
            angle = (2 * taken["rotate"][0] - 1) * math.radians(p["rotate"])
        else:
            dx, dy = np.round(dx), np.round(dy)
        fx = np.where(taken["flip"][0] < p["flip"], -1.0, 1.0) if "flip" in p else np.ones(n)
        fy = np.where(taken["vflip"][0] < p["vflip"], -1.0, 1.0) if "vflip" in p else np.ones(n)
        cos, sin = np.cos(angle), np.sin(angle)
        return [fx * cos, fx * sin, fx * (-cos * (cx + dx) - sin * (cy + dy)) + cx,
                -fy * sin, fy * cos, fy * (sin * (cx + dx) - cos * (cy + dy)) + cy]

    def _erased_box(self, draws):
        """``[top, left, bottom, right]`` (rows top..bottom-1): Zhong et al.'s random
        erasing, an empty box where the sample is not erased."""
        h, w = self.height, self.width_px
        apply, area, aspect, y, x = draws
        area = (area * (ERASE_AREA[1] - ERASE_AREA[0]) + ERASE_AREA[0]) * h * w
        aspect = np.exp(aspect * math.log(ERASE_ASPECT[1] / ERASE_ASPECT[0]) + math.log(ERASE_ASPECT[0]))
        eh = np.clip(np.round(np.sqrt(area * aspect)), 1, h)
        ew = np.clip(np.round(np.sqrt(area / aspect)), 1, w)
        eh = np.where(apply < self.components["erase"], eh, 0)
        top, left = np.floor(y * (h - eh + 1)), np.floor(x * (w - ew + 1))
        return [top, left, top + eh, left + ew]

    def hybrid_forward(self, F, x, params, cols=None, rows=None, fill=None):  # pylint: disable=arguments-differ
        columns = F.split(F.reshape(params, shape=(0, 0, 1, 1)), num_outputs=self.width, axis=1, squeeze_axis=False)
        columns = list(columns) if self.width > 1 else [columns]  # each (n, 1, 1, 1)
        if self.compiled:  # reads the stored images, writes float32
            x = F.gg_gather_map(x, F.slice_axis(params, axis=1, begin=0, end=6), rounded=int("rotate" in self.components))
        elif self.geometric:
            x = self._gather(F, x.astype("float32"), columns[:6], cols, rows)
        else:
            x = x.astype("float32")
        columns = columns[6 * self.geometric:]
        if "jitter" in self.components:
            x = self._jitter(F, x, columns[:3])
            columns = columns[3:]
        if "erase" in self.components:
            x = self._erase(F, x, columns, cols, rows, fill)
        return x

    def _gather(self, F, x, source_map, cols, rows):
        """Each output pixel takes the source pixel the map names (nearest neighbour),
        0 outside the image. Without rotation the map is separable: source columns
        ``(n, 1, 1, W)`` and rows ``(n, 1, H, 1)``; the one full-size index is their
        broadcast sum, negative where the source is outside, which also gives the mask."""
        a, b, c, d, e, f = source_map
        h, w = self.height, self.width_px
        col = F.broadcast_add(F.broadcast_mul(cols, a), c)
        row = F.broadcast_add(F.broadcast_mul(rows, e), f)
        if "rotate" in self.components:  # full planes, and rounding to the nearest pixel
            col = F.round(F.broadcast_add(col, F.broadcast_mul(rows, b)))
            row = F.round(F.broadcast_add(row, F.broadcast_mul(cols, d)))
        outside_col = (col < 0) + (col > w - 1)
        outside_row = (row < 0) + (row > h - 1)
        # float32 indices: exact below 2**24 elements in a device's batch (check_batch)
        first = F.reshape(F.contrib.arange_like(x, axis=0), shape=(-1, 1, 1, 1)) * (self.channels * h * w)
        row = F.broadcast_add(row * w - outside_row * (2 * MAX_GATHER), first)
        if self.channels > 1:
            row = F.broadcast_add(row, F.reshape(F.contrib.arange_like(x, axis=1), shape=(1, -1, 1, 1)) * (h * w))
        index = F.broadcast_add(row, col - outside_col * (2 * MAX_GATHER))  # (n, C, H, W)
        return F.take(F.reshape(x, shape=(-1,)), index, mode="clip") * (index >= 0)

    def check_batch(self, shape):
        """Refuse a device batch whose gather indices float32 cannot hold exactly."""
        if int(np.prod(shape)) > MAX_GATHER and self.geometric:
            raise UserError(f"`augment`: one device's batch of {shape[0]} images of {shape[1:]} is over the "
                            f"{MAX_GATHER} elements the on-device augmentation indexes exactly; choose a smaller "
                            "`batch_size` per device")

    def _jitter(self, F, x, factors):
        brightness, contrast, saturation = factors
        x = F.broadcast_mul(x, brightness)
        mean = F.mean(self._gray(F, x), axis=(1, 2, 3), keepdims=True)
        x = F.broadcast_add(F.broadcast_mul(F.broadcast_sub(x, mean), contrast), mean)
        if self.channels == 3:
            gray = self._gray(F, x)
            x = F.broadcast_add(F.broadcast_mul(F.broadcast_sub(x, gray), saturation), gray)
        return F.clip(x, 0, self.clip_max) if self.clip_max else x

    def _gray(self, F, x):
        """ITU-R 601 luma, ``(n, 1, H, W)``, of RGB images; the image itself if gray."""
        if self.channels != 3:
            return F.mean(x, axis=1, keepdims=True)
        r, g, b = F.split(x, num_outputs=3, axis=1)
        return 0.299 * r + 0.587 * g + 0.114 * b

    def _erase(self, F, x, box, cols, rows, fill):
        mask = box_mask(F, rows, cols, *box)
        return F.broadcast_add(F.broadcast_mul(x, 1 - mask), F.broadcast_mul(mask, fill))


def pixel_indices(block, h, w):
    """Constants of ``block``: column indices ``(1, 1, 1, W)`` and row indices ``(1, 1, H, 1)``."""
    return (constant(block, "cols", np.arange(w, dtype=np.float32).reshape(1, 1, 1, w)),
            constant(block, "rows", np.arange(h, dtype=np.float32).reshape(1, 1, h, 1)))


def box_mask(F, rows, cols, top, left, bottom, right):
    """1 inside each sample's box (rows top..bottom-1, columns left..right-1), else 0:
    ``(n, 1, H, W)`` from pixel indices ``rows (1, 1, H, 1)``, ``cols (1, 1, 1, W)`` and
    bounds ``(n, 1, 1, 1)``, separable until the one full-size product."""
    inside_rows = F.broadcast_greater_equal(rows, top) * F.broadcast_lesser(rows, bottom)
    inside_cols = F.broadcast_greater_equal(cols, left) * F.broadcast_lesser(cols, right)
    return F.broadcast_mul(inside_rows, inside_cols)


def make_augment(text, spec, compiled_gather=None):
    """The :class:`Augment` ``--augment text`` asks for on data ``spec``, or None.
    ``compiled_gather``: a function saying whether the gather may run as the compiled
    operator here (loading it), asked only when the components gather."""
    components = parse_augment(text)
    if not components:
        return None
    fill = [m / spec.scale for m in spec.mean]  # the mean, in stored units
    return Augment(components, spec.input_shape, fill, clip_max=255 if spec.dtype == "uint8" else None,
                   compiled=gathers(components) and compiled_gather is not None and compiled_gather())
