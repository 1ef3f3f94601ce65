"""Mixup and CutMix (``--mixup ALPHA``, ``--cutmix ALPHA``, ``--mixup-off-epochs N``).

Each training sample is mixed with a partner: mixup blends the two images with weight
``lam`` ~ Beta(alpha, alpha) (Zhang et al. 2018); CutMix pastes a box of the partner
covering a ``1 - lam`` share of the image (Yun et al. 2019), ``lam`` then being the share
actually left. The loss is ``lam`` times the loss against the sample's label plus
``1 - lam`` times the loss against the partner's; accuracy and top-5 count the sample's
own label.

GluonCV mixes a batch with itself reversed, one ``lam`` per batch: which samples meet
then depends on how the batch is cut over devices and workers. Here the partner and
``lam`` are drawn per sample from (seed, epoch) (:meth:`Mixing.table`), so a run on 1 or
2 devices, a resumed run and a distributed job mix alike, as they augment alike.
The pipelines take the pair ``(sample, partner)`` by index: a batch's data gains a pair
axis, ``(n, 2, C, H, W)``, and its labels ``(n, 2)``.
"""
import numpy as np
from mxnet import gluon

from ..core.platform.errors import UserError
from .augment import box_mask, pixel_indices

MIX_STREAM = 2  # the rng of [seed, epoch, MIX_STREAM]; augment.py draws from stream 1
KINDS = ("mixup", "cutmix")


class Mixing(gluon.HybridBlock):
    """``(pairs (n, 2, C, H, W), params (n, width)) -> mixed images (n, C, H, W)``; column
    0 of ``params`` is ``lam``, the weight of the sample's own label.

    ``kind``: mixup or cutmix; ``alpha``: Beta(alpha, alpha); ``off_from``: the epoch
    (0-based) from which batches are not mixed (``--mixup-off-epochs``)."""

    def __init__(self, kind, alpha, sample_shape, off_from=None):
        super().__init__(prefix="mixing_")
        if kind not in KINDS:
            raise UserError(f"unknown mixing {kind!r}: choose one of {', '.join(KINDS)}")
        if not alpha > 0:
            raise UserError(f"`{kind}` {alpha}: alpha must be positive")
        if kind == "cutmix" and len(sample_shape) != 3:
            raise UserError(f"`cutmix` applies to images (C, H, W); these samples are {tuple(sample_shape)}")
        self.kind, self.alpha, self.off_from = kind, alpha, off_from
        self.sample_shape = tuple(sample_shape)
        self.width = 1 if kind == "mixup" else 5
        if kind == "cutmix":
            self.cols, self.rows = pixel_indices(self, *sample_shape[1:])

    def mixes(self, epoch):
        return self.off_from is None or epoch < self.off_from

    def table(self, samples, seed, epoch, alpha=None):
        """``(partner (samples,), params (samples, width))`` of an epoch, from (seed, epoch)
        alone; None in the epochs without mixing. ``alpha``: another Beta(alpha, alpha) than
        the block's (a sweep member's own)."""
        if not self.mixes(epoch):
            return None
        rng = np.random.default_rng([seed, epoch, MIX_STREAM])
        partner = rng.permutation(samples)
        alpha = self.alpha if alpha is None else alpha
        lam = rng.beta(alpha, alpha, samples)
        if self.kind == "mixup":
            return partner, lam[:, None].astype(np.float32)
        h, w = self.sample_shape[1:]
        cut = np.sqrt(1 - lam)  # the box's sides are this share of the image's
        cy, cx = rng.random(samples) * h, rng.random(samples) * w
        top, bottom = np.clip(np.round(cy - cut * h / 2), 0, h), np.clip(np.round(cy + cut * h / 2), 0, h)
        left, right = np.clip(np.round(cx - cut * w / 2), 0, w), np.clip(np.round(cx + cut * w / 2), 0, w)
        lam = 1 - (bottom - top) * (right - left) / (h * w)  # the share the box really leaves
        return partner, np.stack([lam, top, left, bottom, right], axis=1).astype(np.float32)

    def member_tables(self, samples, seeds, epoch, alphas=None):
        """An ensemble's or sweep's tables: member k's (its ``seeds[k]``, ``alphas[k]``) in
        column k, ``(partner (samples, K), params (samples, K, width))``, as member k alone
        draws them; None in the epochs without mixing."""
        tables = [self.table(samples, seed, epoch, alpha) for seed, alpha in zip(seeds, alphas or [None] * len(seeds))]
        if tables[0] is None:
            return None
        return np.stack([t[0] for t in tables], axis=1), np.stack([t[1] for t in tables], axis=1)

    def hybrid_forward(self, F, pairs, params, cols=None, rows=None):  # pylint: disable=arguments-differ
        pairs = pairs.astype("float32")
        own, partner = (F.squeeze(p, axis=1) for p in F.split(pairs, num_outputs=2, axis=1))
        if self.kind == "mixup":
            lam = F.reshape(F.slice_axis(params, axis=1, begin=0, end=1), shape=(-1,) + (1,) * len(self.sample_shape))
            return F.broadcast_add(F.broadcast_mul(own, lam), F.broadcast_mul(partner, 1 - lam))
        top, left, bottom, right = (F.reshape(F.slice_axis(params, axis=1, begin=k, end=k + 1), shape=(-1, 1, 1, 1))
                                    for k in range(1, 5))
        box = box_mask(F, rows, cols, top, left, bottom, right)
        return F.broadcast_add(own, F.broadcast_mul(box, partner - own))


def make_mixing(mixup, cutmix, mixup_off_epochs, epochs, spec):
    """The :class:`Mixing` the flags ask for, or None."""
    if mixup and cutmix:
        raise UserError("`mixup` and `cutmix` are two ways to mix; choose one")
    if not (mixup or cutmix):
        if mixup_off_epochs:
            raise UserError("`mixup_off_epochs` needs `mixup` or `cutmix`")
        return None
    if spec.task != "classify":
        raise UserError(f"`{'mixup' if mixup else 'cutmix'}` mixes class labels; this data is task {spec.task}")
    if mixup_off_epochs >= epochs:
        raise UserError(f"`mixup_off_epochs` {mixup_off_epochs} leaves no epoch mixed (`epochs` {epochs})")
    kind, alpha = ("mixup", mixup) if mixup else ("cutmix", cutmix)
    return Mixing(kind, alpha, spec.input_shape, epochs - mixup_off_epochs if mixup_off_epochs else None)


def describe(mixing, alphas=None):
    """'mixup 0.2 (off from epoch 9)' for the plan line; a sweep's alphas that differ:
    'mixup 0.2/0.4 ...', member by member."""
    off = f" (off from epoch {mixing.off_from + 1})" if mixing.off_from is not None else ""
    shown = "/".join(f"{a:g}" for a in alphas) if alphas and len(set(alphas)) > 1 else f"{mixing.alpha:g}"
    return f"{mixing.kind} {shown}{off}"

