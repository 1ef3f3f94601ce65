"""Images read from disk one sample at a time: image folders and RecordIO files.

An :class:`ImageSource` is a ``gluon.data.Dataset`` of ``(uint8 (C, H, W), label)``
whose labels, shape and class names are known without decoding the images. The run
either decodes it whole into memory (:meth:`ImageSource.decode_all`, when the copies
fit) or lets the loader pipeline's ``DataLoader`` workers decode each batch from disk
(streamed: memory bounded by workers x prefetch x batch, whatever the dataset's size).

Normalization statistics come from at most :data:`STATS_SAMPLES` images (and
:data:`STATS_BYTES` of them decoded) spread evenly over the training split, the same
whichever pipeline runs, so a streamed and an in-memory run of one folder train alike.
"""
import numpy as np
from mxnet import gluon

from ..core.platform.errors import DataError
from .checks import check_classes
from ..core.platform.memory import check_fits
from .arrays import Dataset
from .images import decode
from .loader_pipeline import WatchedLoader
from .spec import DataSpec, channel_stats, input_scale

STATS_SAMPLES = 1024  # images that give the mean and std: exact below it, a close estimate above
STATS_BYTES = 2 ** 26  # and no more of them than this decoded (large images: fewer, at least one)


class ImageSource(gluon.data.Dataset):
    """Samples ``(uint8 (C, H, W) image, float32 label)`` read by :meth:`read`.
    ``labels``: int32, one per sample; ``shape``: one sample's ``(C, H, W)``."""

    dtype = np.dtype(np.uint8)

    def __init__(self, labels, shape, where):
        self.labels, self.sample_shape, self.where = np.asarray(labels, dtype=np.int32), tuple(shape), where

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.read(int(i)), np.float32(self.labels[i])

    def read(self, i):
        raise NotImplementedError

    def first(self, n):
        """The first ``n`` samples (None: all) as a source of their own."""
        raise NotImplementedError

    @property
    def shape(self):
        return (len(self),) + self.sample_shape

    @property
    def size(self):  # elements, as numpy's (uint8: bytes), so the pipelines size it as they size arrays
        return int(np.prod(self.shape))

    def stats_sample(self):
        """The images the normalization statistics come from (:data:`STATS_SAMPLES`)."""
        image_bytes = int(np.prod(self.sample_shape))
        count = min(len(self), STATS_SAMPLES, max(1, STATS_BYTES // image_bytes))
        check_fits({"host": count * image_bytes},
                   f"decoding {count} image{'s' * (count > 1)} of {self.where} for the mean and std",
                   "pass a smaller `image_size`")
        picks = np.unique(np.linspace(0, len(self) - 1, count).astype(int))
        images = np.empty((len(picks),) + self.sample_shape, dtype=np.uint8)
        for row, i in enumerate(picks):
            images[row] = self.read(i)
        return images

    def decode_all(self, num_workers=0):
        """Every image decoded into one uint8 array, by ``num_workers`` DataLoader workers."""
        check_fits({"host": self.size}, f"decoding the {len(self)} images of {self.where}",
                   "pass a smaller `image_size`, or `pipeline` loader to read batches from disk")
        images = np.empty(self.shape, dtype=np.uint8)  # filled in place: one copy
        for start, batch in self.batches(num_workers):
            images[start:start + len(batch)] = batch
        return images

    def batches(self, num_workers=0, batch_size=256):
        """``(start, uint8 images)`` over every sample in order, decoded by ``num_workers``
        DataLoader workers (0: in this process)."""
        start = 0
        for batch in WatchedLoader(_Images(self), num_workers=num_workers, batch_size=batch_size):
            yield start, batch.asnumpy()
            start += len(batch)


def sample_batches(x, batch_size, num_workers=0):
    """``(start, batch)`` over the samples ``x`` in order, ``batch_size`` at a time: an
    array's slices, or an image source's images decoded a batch at a time (never all)."""
    if isinstance(x, ImageSource):
        return x.batches(num_workers, batch_size)
    return ((start, x[start:start + batch_size]) for start in range(0, len(x), batch_size))


class _Images(gluon.data.Dataset):
    """The images of a source without their labels."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        return self.source.read(int(i))


class FolderSource(ImageSource):
    """An image folder's files, ``items``: ``[(path, label)]``, decoded with Pillow to
    ``channels`` and resized to ``size`` (H, W)."""

    def __init__(self, items, channels, size, where):
        super().__init__([label for _, label in items], (channels,) + tuple(size), where)
        self.paths = [path for path, _ in items]

    def read(self, i):
        return decode(self.paths[i], self.sample_shape[0], self.sample_shape[1:])

    def first(self, n):
        return FolderSource(list(zip(self.paths, self.labels))[:n], self.sample_shape[0], self.sample_shape[1:],
                            self.where)


def from_sources(train, val, classes, dataset, source):
    """A :class:`Dataset` of two image sources of a classification task (``classes``:
    the class names); the mean and std from :meth:`ImageSource.stats_sample`."""
    for split, images in (("train", train), ("val", val)):
        if len(images) == 0:
            raise DataError(f"the {split} split of {source} has no samples")
        if images.labels.max() >= len(classes):
            raise DataError(f"the {split} split of {source} holds label {images.labels.max()}, outside the "
                            f"{len(classes)} classes 0..{len(classes) - 1}")
    check_classes(classes, train.labels, val.labels, source)
    mean, std = channel_stats(train.stats_sample(), input_scale("uint8"))
    spec = DataSpec(dataset=dataset, task="classify", input_shape=train.sample_shape, outputs=len(classes),
                    mean=mean, std=std, dtype="uint8", classes=[str(c) for c in classes], source=source,
                    samples=len(train))
    return Dataset(train, train.labels, val, val.labels, spec)
