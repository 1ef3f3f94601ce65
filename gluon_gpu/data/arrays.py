"""Data from arrays: the checks and the spec every array source shares (npz files,
numpy arrays and Gluon datasets in Python, image folders once decoded)."""
import zipfile
from dataclasses import dataclass, replace

import numpy as np

from ..core.platform.errors import DataError
from .checks import check_classes
from ..core.platform.memory import check_fits
from ..core.step.heads import TASKS
from .spec import DataSpec, channel_stats, input_scale

NPZ_ARRAYS = ("x_train", "y_train", "x_val", "y_val")  # what an npz dataset holds
MAX_CLASSES = 2 ** 20  # far above any real label set (ImageNet-21k: 21,841), far below 10**9


@dataclass
class Dataset:
    """Training and validation inputs, their targets and their :class:`DataSpec`. The
    inputs are numpy arrays, or image sources (sources.py) read from disk per sample
    until :meth:`decoded`."""
    train_x: object
    train_y: np.ndarray
    val_x: object
    val_y: np.ndarray
    spec: DataSpec

    @property
    def on_disk(self):
        """Whether the inputs are read from disk per sample (not yet decoded)."""
        return hasattr(self.train_x, "decode_all")

    def class_counts(self):
        """The training labels of each class (a classification's), in the spec's order."""
        return np.bincount(np.asarray(self.train_y, dtype=np.int64).ravel(), minlength=len(self.spec.classes)).tolist()

    def limited(self, limit=None, val_limit=None):
        """The first ``limit`` training and ``val_limit`` validation samples only (quick
        runs, tests; None: all)."""
        def first(x, n):
            return x.first(n) if hasattr(x, "first") else x[:n]
        train_y = self.train_y[:limit]
        return Dataset(first(self.train_x, limit), train_y, first(self.val_x, val_limit), self.val_y[:val_limit],
                       replace(self.spec, samples=len(train_y)))

    def decoded(self, num_workers=0, val=True):
        """This data with its inputs in memory (images on disk decoded by ``num_workers``
        processes); ``val=False``: the validation images stay on disk (read as used)."""
        if not self.on_disk:
            return self
        val_x = self.val_x.decode_all(num_workers) if val else self.val_x
        return Dataset(self.train_x.decode_all(num_workers), self.train_y, val_x, self.val_y, self.spec)


def from_arrays(x_train, y_train, x_val, y_val, task=None, classes=None, mean=None, std=None,
                dataset="arrays", source="arrays"):
    """A :class:`Dataset` from numpy arrays.

    Inputs: ``(N, F)`` features, ``(N, H, W)`` grayscale or ``(N, C, H, W)`` images;
    uint8 images are scaled to [0, 1] first. Targets: integer labels (classification) or
    floats ``(N,)``/``(N, T)`` (regression); ``task`` overrides the guess, and float
    labels with ``task='classify'`` are refused. ``classes``: class names (default the
    label numbers). ``mean``/``std``: per channel (default: from the training inputs)."""
    x_train, x_val = _inputs(x_train, "x_train"), _inputs(x_val, "x_val")
    y_train, y_val = _targets(y_train, "y_train"), _targets(y_val, "y_val")
    for x, y, split in ((x_train, y_train, "train"), (x_val, y_val, "val")):
        if len(x) != len(y):
            raise DataError(f"x_{split} has {len(x)} samples but y_{split} has {len(y)}")
        if len(x) == 0:
            raise DataError(f"the {split} split has no samples")
    if x_train.shape[1:] != x_val.shape[1:]:
        raise DataError(f"x_train samples are {x_train.shape[1:]} but x_val samples are {x_val.shape[1:]}")
    integer = np.issubdtype(y_train.dtype, np.integer) and np.issubdtype(y_val.dtype, np.integer)
    task = task or ("classify" if integer else "regress")
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    dtype = "uint8" if x_train.dtype == np.uint8 else "float32"
    if task == "classify":
        if not integer:
            raise DataError(f"task classify needs integer labels; these are {y_train.dtype} "
                            "(use `task` regress for real-valued targets)")
        classes = _classes(y_train, y_val, classes)
        check_classes(classes, y_train, y_val, source)
        outputs = len(classes)
    else:
        classes, outputs = None, _regression_outputs(y_train, y_val)
    if mean is None or std is None:
        mean, std = channel_stats(x_train, input_scale(dtype))
    spec = DataSpec(dataset=dataset, task=task, input_shape=tuple(int(d) for d in x_train.shape[1:]),
                    outputs=outputs, mean=list(map(float, np.atleast_1d(mean))),
                    std=list(map(float, np.atleast_1d(std))), dtype=dtype, classes=classes, source=source,
                    samples=len(x_train))
    targets = (lambda y: y.astype(np.int32)) if task == "classify" else (lambda y: y.astype(np.float32))
    return Dataset(x_train, targets(y_train), x_val, targets(y_val), spec)


def _classes(y_train, y_val, classes):
    """The class names of integer labels (given, or the label numbers), the labels checked."""
    if y_train.ndim != 1 or y_val.ndim != 1:
        raise DataError("classification labels must be one integer per sample")
    count = len(classes) if classes else int(y_train.max()) + 1  # the classes are the training labels
    if count > MAX_CLASSES:
        raise DataError(f"y_train's largest label is {count - 1}: labels are classes 0..K-1, and K is at most "
                        f"{MAX_CLASSES} here (the class table and the output layer grow with K)")
    for y, split in ((y_train, "y_train"), (y_val, "y_val")):
        if y.min() < 0 or y.max() >= count:
            raise DataError(f"{split} holds label {y.min() if y.min() < 0 else y.max()}, outside "
                            f"0..{count - 1}")
    return [str(c) for c in classes] if classes else [str(c) for c in range(count)]


def _regression_outputs(y_train, y_val):
    """The outputs of regression targets, checked."""
    if y_train.ndim > 2 or y_train.shape[1:] != y_val.shape[1:]:
        raise DataError(f"regression targets must be (N,) or (N, T) alike in both splits, got "
                        f"{y_train.shape} and {y_val.shape}")
    if not (np.isfinite(y_train).all() and np.isfinite(y_val).all()):
        raise DataError("regression targets hold NaN or infinite values")
    return int(np.prod(y_train.shape[1:]))


def _targets(y, name):
    y = np.asarray(y)
    if y.ndim == 0:
        raise DataError(f"{name} is a single value, not one target per sample")
    if y.dtype == bool:
        raise DataError(f"{name} is bool: give class labels as integers (0, 1) to classify, or floats to regress")
    if not np.issubdtype(y.dtype, np.number):
        raise DataError(f"{name} is {y.dtype}, not numbers: integer labels classify, floats regress")
    _real(y, name)
    return y


def _real(array, name):
    if np.issubdtype(array.dtype, np.complexfloating):
        raise DataError(f"{name} is {array.dtype}: complex values are not taken (their imaginary part would be "
                        "dropped); give real numbers")


def _inputs(x, name):
    x = np.asarray(x)
    if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{name} is {x.dtype}, not numbers")
    _real(x, name)
    if x.ndim == 3:
        x = x[:, None]  # grayscale images: one channel
    if x.ndim not in (2, 4):
        raise DataError(f"{name} has shape {x.shape}: expected (N, F) features, (N, H, W) or "
                        "(N, C, H, W) images")
    if x.dtype != np.uint8:
        x = x.astype(np.float32, copy=False)  # no second copy of a float32 set
        if not np.isfinite(x).all():
            raise DataError(f"{name} holds NaN or infinite values")
    return x


def from_gluon(train, val, **kwargs):
    """A :class:`Dataset` from two ``gluon.data.Dataset`` s of ``(input, label)`` samples,
    read into memory. Images laid out ``(H, W, C)`` with C in 1, 3 or 4, as Gluon's
    vision datasets give them, become ``(C, H, W)``."""
    def arrays(dataset):
        xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
        x = np.stack([v.asnumpy() if hasattr(v, "asnumpy") else np.asarray(v) for v in xs])
        if x.ndim == 4 and x.shape[-1] in (1, 3, 4):
            x = x.transpose(0, 3, 1, 2)
        return x, np.array([v.asnumpy() if hasattr(v, "asnumpy") else v for v in ys]).squeeze()
    kwargs.setdefault("dataset", "gluon")
    kwargs.setdefault("source", type(train).__name__)
    return from_arrays(*arrays(train), *arrays(val), **kwargs)


def read_npz(path, image_size=None, task=None):
    """A :class:`Dataset` from an ``.npz`` holding ``x_train, y_train, x_val, y_val``
    (as they are: no ``image_size``)."""
    if not path:
        raise DataError("an npz dataset needs `data_dir` FILE.npz")
    if image_size:
        raise DataError("`image_size` applies to image folders, not to an npz")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in NPZ_ARRAYS if k not in f.files]
            if missing:
                raise DataError(f"{path} lacks {', '.join(missing)} (it has {', '.join(f.files) or 'nothing'})")
            sizes = {info.filename: info.file_size for info in f.zip.infolist()}
            check_fits({"host": sum(sizes.get(f"{k}.npy", 0) for k in NPZ_ARRAYS)},
                       f"loading the arrays of {path}", "train on a smaller file")
            arrays = [f[k] for k in NPZ_ARRAYS]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot read {path} as .npz: {e or type(e).__name__}") from None
    return from_arrays(*arrays, task=task, dataset="npz", source=path)
