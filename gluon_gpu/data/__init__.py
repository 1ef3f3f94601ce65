"""The data layer: datasets (FashionMNIST, image folders, RecordIO, npz files, arrays,
Gluon datasets), what a run records of them (:class:`DataSpec`), and the input pipelines."""
from collections import namedtuple

from ..core.platform.errors import DataError
from .arrays import Dataset, from_arrays, from_gluon, read_npz
from .batch_order import epoch_order
from .device_pipeline import DevicePipeline
from .fashion_mnist import read_fashion_mnist
from .folders import read_folder
from .loader_pipeline import LoaderPipeline
from .pipelines import PIPELINES, make_pipeline
from .recordio import read_rec
from .spec import DataSpec

DatasetKind = namedtuple("DatasetKind", "read what")
DatasetKind.__doc__ = """A dataset kind: ``read(data_dir, image_size, task) -> Dataset``, and what
``data_dir`` names for it (the --dataset help is built from these)."""

# The dataset kinds by name (--dataset): a new kind is its reader module and a line here.
DATASETS = {
    "fashion-mnist": DatasetKind(read_fashion_mnist, "the folder of FashionMNIST's IDX files, found if not given"),
    "folder": DatasetKind(read_folder, "an image folder DIR with train/<class>/ and val/<class>/"),
    "npz": DatasetKind(read_npz, "a FILE.npz with x_train, y_train, x_val, y_val"),
    "rec": DatasetKind(read_rec, "a folder DIR with train.rec, train.idx, val.rec, val.idx (gluon_gpu.pack's or "
                                 "im2rec's)"),
}


def load_dataset(name="fashion-mnist", data_dir=None, image_size=None, task=None, limit=None, val_limit=None,
                 decoded=True, num_workers=0):
    """The training and validation data of the dataset kind ``name`` (:data:`DATASETS`),
    its first ``limit`` training and ``val_limit`` validation samples; ``decoded=False``:
    images stay on disk, read per sample, until the run decides (``Dataset.decoded``)."""
    if name not in DATASETS:
        raise DataError(f"unknown `dataset` {name!r}: choose one of {', '.join(DATASETS)}")
    data = DATASETS[name].read(data_dir, image_size, task).limited(limit, val_limit)
    return data.decoded(num_workers) if decoded else data


__all__ = ["DATASETS", "Dataset", "DatasetKind", "DataSpec", "DevicePipeline", "LoaderPipeline", "PIPELINES",
           "epoch_order", "from_arrays", "from_gluon", "load_dataset", "make_pipeline", "read_folder",
           "read_npz", "read_rec"]
