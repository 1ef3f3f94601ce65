"""One batch as the pipelines yield it and the step takes it, by name."""
import numpy as np

from .arguments import ARRAYS


class Batch(tuple):
    """``data`` and ``label`` (each a whole batch, or a list of per-device shards), then
    ``augmentation`` and ``mixing``, the parameters of on-device augmentation and of
    mixup/CutMix (training_inputs.py), or None where the pipeline has none.

    Read it by name: ``dp.step(b.data, b.label, b.augmentation, b.mixing)``. It is also
    the tuple of its fields up to the last one present, so a plain batch unpacks as
    ``for x, y in pipeline.epoch(e)``, as before the type had names."""

    __slots__ = ()

    def __new__(cls, data, label, augmentation=None, mixing=None):
        fields = [data, label, augmentation, mixing]
        for name, value in zip(_NAMES, fields):
            if not (isinstance(value, BATCH_TYPES) or value is None and name in _OPTIONAL):
                raise TypeError(f"Batch {name}: an MXNet or numpy array or a list of per-device shards"
                                f"{' (or None)' if name in _OPTIONAL else ''}, got {type(value).__name__}")
        while len(fields) > 2 and fields[-1] is None:
            fields.pop()
        return super().__new__(cls, fields)

    def _field(self, i):
        return self[i] if i < len(self) else None

    data = property(lambda self: self[0])
    label = property(lambda self: self[1])
    augmentation = property(lambda self: self._field(2))
    mixing = property(lambda self: self._field(3))

    def __repr__(self):
        return f"Batch({', '.join(f'{n}={type(v).__name__}' for n, v in zip(_NAMES, self))})"


_NAMES = ("data", "label", "augmentation", "mixing")
_OPTIONAL = ("augmentation", "mixing")
BATCH_TYPES = ARRAYS + (np.ndarray, list, tuple)
