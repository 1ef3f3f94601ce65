"""The data layer: datasets (FashionMNIST, image folders, npz files, arrays, Gluon
datasets), what a run records of them (:class:`DataSpec`), and the input pipelines."""
from ..core.errors import DataError
from .arrays import Dataset, from_arrays, from_gluon, read_npz
from .fashion_mnist import CLASSES, MEAN, STD, find_data_dir, load_split
from .images import read_folder
from .pipelines import PIPELINES, DevicePipeline, LoaderPipeline, epoch_order, make_pipeline
from .spec import DataSpec

DATASETS = ("fashion-mnist", "folder", "npz")


def load_dataset(name="fashion-mnist", data_dir=None, image_size=None, task=None, limit=None, val_limit=None):
    """The training and validation data of ``--dataset name`` (see README "Data")."""
    if name == "fashion-mnist":
        if image_size or task not in (None, "classify"):
            raise DataError("FashionMNIST is 28x28 classification: no --image-size or --task regress")
        train_dir = find_data_dir(data_dir, "train")
        train_x, train_y = load_split("train", train_dir)
        val_x, val_y = load_split("test", find_data_dir(data_dir, "test"))
        data = from_arrays(train_x, train_y, val_x, val_y, task="classify", classes=CLASSES,
                           mean=[MEAN], std=[STD], dataset=name, source=train_dir)
    elif name in ("folder", "npz"):
        if not data_dir:
            raise DataError(f"--dataset {name} needs --data-dir "
                            + ("DIR (DIR/train/<class>/*, DIR/val/<class>/*)" if name == "folder" else "FILE.npz"))
        if name == "folder":
            data = read_folder(data_dir, image_size, task)
        else:
            if image_size:
                raise DataError("--image-size applies to --dataset folder")
            data = read_npz(data_dir, task)
    else:
        raise DataError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    return data.limited(limit, val_limit)


__all__ = ["DATASETS", "Dataset", "DataSpec", "DevicePipeline", "LoaderPipeline", "PIPELINES",
           "epoch_order", "from_arrays", "from_gluon", "load_dataset", "make_pipeline", "read_folder",
           "read_npz"]
