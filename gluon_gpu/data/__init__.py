"""The data layer: datasets (FashionMNIST, image folders, npz files, arrays, Gluon
datasets), what a run records of them (:class:`DataSpec`), and the input pipelines."""
from collections import namedtuple

from ..core.errors import DataError
from .arrays import Dataset, from_arrays, from_gluon, read_npz
from .fashion_mnist import read_fashion_mnist
from .images import read_folder
from .pipelines import PIPELINES, DevicePipeline, LoaderPipeline, epoch_order, make_pipeline
from .spec import DataSpec

DatasetKind = namedtuple("DatasetKind", "read what")
DatasetKind.__doc__ = """A dataset kind: ``read(data_dir, image_size, task) -> Dataset``, and what
``data_dir`` names for it (the --dataset help is built from these)."""

# The dataset kinds by name (--dataset): a new kind is its reader module and a line here.
DATASETS = {
    "fashion-mnist": DatasetKind(read_fashion_mnist, "the folder of FashionMNIST's IDX files, found if not given"),
    "folder": DatasetKind(read_folder, "an image folder DIR with train/<class>/ and val/<class>/"),
    "npz": DatasetKind(read_npz, "a FILE.npz with x_train, y_train, x_val, y_val"),
}


def load_dataset(name="fashion-mnist", data_dir=None, image_size=None, task=None, limit=None, val_limit=None):
    """The training and validation data of the dataset kind ``name`` (:data:`DATASETS`),
    its first ``limit`` training and ``val_limit`` validation samples."""
    if name not in DATASETS:
        raise DataError(f"unknown `dataset` {name!r}: choose one of {', '.join(DATASETS)}")
    return DATASETS[name].read(data_dir, image_size, task).limited(limit, val_limit)


__all__ = ["DATASETS", "Dataset", "DatasetKind", "DataSpec", "DevicePipeline", "LoaderPipeline", "PIPELINES",
           "epoch_order", "from_arrays", "from_gluon", "load_dataset", "make_pipeline", "read_folder",
           "read_npz"]
