"""FashionMNIST: finding the four IDX files and reading them.

Search order: ``--data-dir``, ``$GLUON_GPU_DATA``, the MXNet dataset cache, Debian's
``dataset-fashion-mnist``, then MXNet's own download. Our own IDX reader checks every
header (Debian's files are recompressed, so MXNet's SHA-1 check would reject them).
"""
import gzip
import os
import struct

import numpy as np
from mxnet import gluon

from ..core.platform.errors import DataError
from .arrays import from_arrays
from .spec import DataSpec

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
MEAN, STD = 0.13, 0.31  # the MXNet 'Use GPUs' tutorial's Normalize(0.13, 0.31)
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL_HINT = ("install Debian's copy with `apt-get install dataset-fashion-mnist` "
                "or pass `data_dir` DIR holding the four IDX .gz files")
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
            raise DataError(f"`data_dir` {data_dir} does not hold the FashionMNIST {split} files "
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


def read_fashion_mnist(data_dir=None, image_size=None, task=None):
    """FashionMNIST's training and test splits as a Dataset (the test split validates)."""
    if image_size or task not in (None, "classify"):
        raise DataError("FashionMNIST is 28x28 classification: no `image_size`, no `task` regress")
    train_dir = find_data_dir(data_dir, "train")
    train_x, train_y = load_split("train", train_dir)
    val_x, val_y = load_split("test", find_data_dir(data_dir, "test"))
    return from_arrays(train_x, train_y, val_x, val_y, task="classify", classes=CLASSES,
                       mean=[MEAN], std=[STD], dataset="fashion-mnist", source=train_dir)


def fashion_spec(source=""):
    """The DataSpec of FashionMNIST as gluon_gpu trains on it (the tutorial's normalization)."""
    return DataSpec(dataset="fashion-mnist", task="classify", input_shape=(1, 28, 28), outputs=len(CLASSES),
                    mean=[MEAN], std=[STD], classes=list(CLASSES), source=source)
