"""What a training step feeds its graph besides ``(x, y)``: each device's augmentation
parameters and mixing parameters (data/augment.py, data/mixing.py), cut as the data."""
import numpy as np
from mxnet import nd

from ..platform.devices import split_batch


class TrainingInputs:
    """The augmentation and mixing blocks of a DataParallel (either may be None).
    ``members``: its batches have a member axis; ``placed``: every device (a group of
    placed members) takes the whole batch."""

    def __init__(self, augment=None, mixing=None, members=False, placed=False):
        self.augment, self.mixing, self.members, self.placed = augment, mixing, members, placed

    @property
    def blocks(self):
        return [b for b in (self.augment, self.mixing) if b is not None]

    def shards(self, xs, ctx, augmentation=None, mixing=None):
        """``(per device: the tuple of extra graph inputs, mixed)``. ``augmentation``: a row
        of parameters per sample (per pair member when mixing), split as the data or, not
        given, drawn here by numpy (then not a function of the sample); ``mixing``: a row
        per pair, from the pipeline (mixed batches hold pairs)."""
        for given, block, name, flag in ((mixing, self.mixing, "mixing", "mixing"),
                                         (augmentation, self.augment, "augmentation", "augment")):
            if given is not None and block is None:
                raise ValueError(f"{name}: parameters for a DataParallel made without `{flag}`")
        mixes = [None] * len(xs) if mixing is None else _split(mixing, ctx, self.placed)
        if self.augment is None:
            augs = [None] * len(xs)
        elif augmentation is None:
            augs = [None if x is None else self._draw(x, mixing is not None) for x in xs]
        else:
            augs = _split(augmentation, ctx, self.placed)
        for x in (x for x in xs if x is not None and self.augment is not None):
            self.augment.check_batch(x.shape)
        return [tuple(a for a in pair if a is not None) for pair in zip(augs, mixes)], mixing is not None

    def _draw(self, x, pairs):
        rows = x.shape[:1 + pairs + self.members]  # a row per sample (per member's, per pair's)
        params = self.augment.parameters(np.random.random((int(np.prod(rows)), self.augment.draws)))
        return nd.array(params.reshape(rows + (-1,)), ctx=x.context)


def _split(batch, ctx, whole=False):
    if isinstance(batch, (list, tuple)):
        return list(batch)
    return [batch.as_in_context(c) for c in ctx] if whole else split_batch(batch, ctx)
