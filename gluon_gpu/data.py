"""FashionMNIST: finding the IDX files, reading them, and feeding batches to devices.

Two input pipelines yield the same samples in the same order for the same seed:

* ``device`` (default): the uint8 images are decoded once and kept on every device;
  each batch is a ``take`` by index, normalized inside the hybridized graph
  (:class:`Normalize`). No Python work per sample.
* ``loader``: Gluon's ``DataLoader`` with the MXNet tutorial's per-sample transforms
  ``ToTensor()`` then ``Normalize(0.13, 0.31)``, for data that does not fit in memory.
"""
import gzip
import os
import struct

import numpy as np
from mxnet import gluon, nd
from mxnet.gluon.data.vision import transforms

from .errors import DataError, UserError

MEAN, STD = 0.13, 0.31
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SIZES = {"train": 60000, "test": 10000}
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL_HINT = ("install Debian's copy with `apt-get install dataset-fashion-mnist` "
                "or pass --data-dir DIR holding the four IDX .gz files")
_IDX_MAGIC = {1: 0x00000801, 3: 0x00000803}  # unsigned byte data, 1 or 3 dimensions


def read_idx(path, ndim):
    """Read one IDX file (gzipped or not) of unsigned bytes into a numpy array.

    Checks the magic number, the dimension count, 28x28 images and that the data
    length matches the header, so a truncated or foreign file fails with DataError.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is not an IDX file: only {len(raw)} bytes")
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != _IDX_MAGIC[ndim]:
        raise DataError(f"{path} is not a {ndim}-d uint8 IDX file (magic {magic:#010x}, "
                        f"expected {_IDX_MAGIC[ndim]:#010x})")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    if ndim == 3 and shape[1:] != (28, 28):
        raise DataError(f"{path} holds {shape[1]}x{shape[2]} images, expected 28x28")
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(f"{path} is truncated or corrupt: header says {shape[0]} items "
                        f"({expected} bytes), file has {len(raw) - header} bytes of data")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find_file(directory, name):
    for candidate in (name + ".gz", name):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def _has_split(directory, split):
    return all(_find_file(directory, n) for n in FILES[split])


def mxnet_cache_dir():
    """Where MXNet's own FashionMNIST dataset downloads to."""
    home = os.environ.get("MXNET_HOME", os.path.join(os.path.expanduser("~"), ".mxnet"))
    return os.path.join(home, "datasets", "fashion-mnist")


def _download(directory, split):
    """MXNet's own download (with its SHA-1 check) into ``directory``; False on failure."""
    try:
        gluon.data.vision.FashionMNIST(root=directory, train=(split == "train"))
    except Exception:  # no network, blocked host, bad checksum: all mean "not here"
        return False
    return _has_split(directory, split)


def find_data_dir(data_dir=None, split="train", download=True):
    """The directory holding ``split``'s two IDX files.

    Order: ``data_dir`` (if given it must hold them), ``$GLUON_GPU_DATA``, the MXNet
    cache, Debian's ``dataset-fashion-mnist``, then MXNet's download into the cache.
    """
    if data_dir:
        if not _has_split(data_dir, split):
            raise DataError(f"--data-dir {data_dir} does not hold the FashionMNIST {split} files "
                            f"({', '.join(n + '.gz' for n in FILES[split])})")
        return data_dir
    candidates = [os.environ.get("GLUON_GPU_DATA"), mxnet_cache_dir(), DEBIAN_DIR]
    for directory in candidates:
        if directory and _has_split(directory, split):
            return directory
    if download and _download(mxnet_cache_dir(), split):
        return mxnet_cache_dir()
    raise DataError(f"FashionMNIST {split} data not found (looked in $GLUON_GPU_DATA, "
                    f"{mxnet_cache_dir()}, {DEBIAN_DIR}; download failed): {INSTALL_HINT}")


def load_split(split, data_dir=None, limit=None, download=True):
    """``(images uint8 (N, 28, 28), labels int32 (N,))`` for 'train' or 'test'."""
    directory = find_data_dir(data_dir, split, download)
    image_file, label_file = (_find_file(directory, n) for n in FILES[split])
    images, labels = read_idx(image_file, 3), read_idx(label_file, 1)
    if len(images) != len(labels):
        raise DataError(f"{directory}: {len(images)} images but {len(labels)} labels")
    if labels.size and labels.max() >= len(CLASSES):
        raise DataError(f"{label_file}: label {labels.max()} is not a FashionMNIST class")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return images, labels.astype(np.int32)


def epoch_order(n, seed, epoch, shuffle=True):
    """The sample order of one epoch: a permutation drawn from (seed, epoch) alone,
    so a resumed run and every pipeline see the same order without saved RNG state."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


class Normalize(gluon.HybridBlock):
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28): ToTensor then Normalize(MEAN, STD),
    as graph ops, so the device pipeline normalizes inside the hybridized step.
    ``add_channel=False`` keeps the shape (ensembles: (N, K, 28, 28), a channel a member)."""

    def __init__(self, add_channel=True, **kwargs):
        super().__init__(**kwargs)
        self._add_channel = add_channel

    def hybrid_forward(self, F, x):
        if self._add_channel:
            x = F.expand_dims(x, axis=1)
        # One multiply and one add: MXNet's scalar division does not vectorize, and the
        # three-op form (x / 255 - MEAN) / STD was 5% of a fused LeNet step on the CPU.
        return x.astype("float32") * (1 / (255 * STD)) + (-MEAN / STD)


def tutorial_transform():
    """The MXNet 'Use GPUs' tutorial's per-sample preprocessing."""
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


class DevicePipeline:
    """Images kept as uint8 on every device; batches gathered by index on the device.

    ``epoch(e)`` yields ``(data_shards, label_shards)``: one uint8 shard per device,
    split of the batch's indices by ``split_and_load(..., even_split=False)``.
    With ``members=K`` (an ensemble) member k draws its own order from seed ``seed + k``
    and shards are ``(b, K, 28, 28)`` / ``(b, K)``: member k's samples in column k.
    """
    normalize_in_graph = True

    def __init__(self, images, labels, batch_size, ctx, seed=0, shuffle=True, members=1, shard=(0, 1)):
        self.n, self.batch_size, self.ctx = len(images), batch_size, list(ctx)
        self.seed, self.shuffle, self.members = seed, shuffle, members
        self.rank, self.workers = shard
        if self.workers > 1:  # equal steps on every worker: whole global batches only
            self.n -= self.n % (batch_size * self.workers)
            if self.n == 0:
                raise UserError(f"{len(images)} samples do not fill one global batch of "
                                f"{batch_size} x {self.workers} workers")
        self._images = [nd.array(images, ctx=c, dtype="uint8") for c in self.ctx]
        self._labels = [nd.array(labels, ctx=c, dtype="float32") for c in self.ctx]

    def __len__(self):
        return -(-self.n // (self.batch_size * self.workers))

    def epoch(self, epoch, start_batch=0):
        """Batches of epoch ``epoch``, from batch ``start_batch`` on (to resume mid-epoch).

        With ``shard=(rank, workers)`` (a distributed job) every worker draws the same
        global order and takes the rank-th slice of each global batch of
        ``batch_size x workers``: the job sees exactly the batches one process with
        ``workers`` times the devices would."""
        total = len(self._images[0])
        order = np.stack([epoch_order(total, self.seed + k, epoch, self.shuffle)[:self.n]
                          for k in range(self.members)], axis=1).astype(np.int32)
        if self.members == 1:
            order = order[:, 0]
        # The epoch's order goes to every device once; a batch is then views of it,
        # partitioned by gluon's own split (even_split=False): no copy per batch.
        on_device = [nd.array(order, ctx=c, dtype="int32") for c in self.ctx]
        step = self.batch_size * self.workers
        for start in range(start_batch * step, self.n, step):
            lo = min(start + self.rank * self.batch_size, self.n)
            hi = min(lo + self.batch_size, self.n)
            used = min(len(self.ctx), hi - lo)  # a tiny last batch uses fewer devices
            shards = [gluon.utils.split_data(idx[lo:hi], used, even_split=False)[i]
                      for i, idx in enumerate(on_device[:used])]
            yield ([im.take(i) for im, i in zip(self._images, shards)],
                   [lb.take(i) for lb, i in zip(self._labels, shards)])


class _EpochSampler(gluon.data.Sampler):
    """Batch sampler over :func:`epoch_order`; ``set_epoch`` picks the permutation."""

    def __init__(self, n, batch_size, seed, shuffle):
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch, start_batch=0):
        self.epoch, self.start_batch = epoch, start_batch

    def __iter__(self):
        order = epoch_order(self.n, self.seed, self.epoch, self.shuffle)
        for start in range(self.start_batch * self.batch_size, self.n, self.batch_size):
            yield order[start:start + self.batch_size].tolist()

    def __len__(self):
        return -(-self.n // self.batch_size)


class LoaderPipeline:
    """Gluon ``DataLoader`` with the tutorial's transforms; yields host batches
    ``(data float32 (B, 1, 28, 28), label)`` that the step splits over devices."""
    normalize_in_graph = False

    def __init__(self, images, labels, batch_size, ctx=None, seed=0, shuffle=True, num_workers=0):
        dataset = gluon.data.ArrayDataset(nd.array(images[..., None], dtype="uint8"),
                                          labels.astype(np.float32))
        self.n = len(images)
        self._sampler = _EpochSampler(len(images), batch_size, seed, shuffle)
        self._loader = gluon.data.DataLoader(dataset.transform_first(tutorial_transform()),
                                             batch_sampler=self._sampler, num_workers=num_workers)

    def __len__(self):
        return len(self._sampler)

    def epoch(self, epoch, start_batch=0):
        self._sampler.set_epoch(epoch, start_batch)
        return iter(self._loader)


PIPELINES = ("device", "loader")


def make_pipeline(kind, images, labels, batch_size, ctx, seed=0, shuffle=True, num_workers=0,
                  members=1, shard=(0, 1)):
    if kind == "loader":
        if members > 1:
            raise UserError("--ensemble needs --pipeline device")
        if shard[1] > 1:
            raise UserError("a distributed kvstore needs --pipeline device")
        return LoaderPipeline(images, labels, batch_size, ctx, seed, shuffle, num_workers)
    return DevicePipeline(images, labels, batch_size, ctx, seed, shuffle, members, shard)
