"""A dataset is checked once, as it is read, for what a user gets wrong (issue #53): one
class, a class count out of proportion to the samples, a class with no training sample,
a validation split without a class (a warning), hidden folders taken for classes."""
import os
import shutil

import numpy as np
import pytest

from gluon_gpu.programs import train

from conftest import make_image_folder, read_metrics
from failure_table import table_exit

TINY = ["--devices", "cpu", "--epochs", "1", "--batch-size", "16", "--quiet"]


def npz(path, y_train, y_val, rng=np.random.default_rng(0)):
    np.savez(path, x_train=rng.random((len(y_train), 8), dtype=np.float32), y_train=np.asarray(y_train),
             x_val=rng.random((len(y_val), 8), dtype=np.float32), y_val=np.asarray(y_val))
    return str(path)


@pytest.mark.parametrize("y_train,y_val,message", [
    ([0] * 40, [0] * 10, "has one class (0): a classifier needs two or more"),
    ([0] * 599 + [10 ** 6], [0, 1] * 5, "1000001 classes from 600 training samples (the largest label is 1000000"),
    ([0, 1, 3] * 20, [0, 1, 3] * 4, "no training sample of class 2 of 4"),
])
def test_a_dataset_that_makes_no_sense_is_one_line_before_training(tmp_path, capsys, y_train, y_val, message):
    out = tmp_path / "run"
    code = train.main(["--dataset", "npz", "--data-dir", npz(tmp_path / "d.npz", y_train, y_val), *TINY, "--out",
                       str(out)])
    err = capsys.readouterr().err.strip()
    assert table_exit("a dataset that makes no sense", code) and err.count("\n") == 0 and message in err, err
    assert not os.path.exists(out / "metrics.json")  # nothing trained


def test_a_validation_split_without_a_class_is_a_warning(tmp_path, capsys):
    out = str(tmp_path / "run")
    data = npz(tmp_path / "d.npz", [0, 1, 2] * 20, [0, 1] * 5)
    assert train.main(["--dataset", "npz", "--data-dir", data, *TINY, "--out", out]) == 0
    err = capsys.readouterr().err
    assert "warning: the validation split of" in err and "has no sample of class 2: its accuracy says nothing" in err
    assert read_metrics(out)["epochs"][-1]["val_acc"] >= 0


def test_one_class_folder_and_hidden_folders(tmp_path, capsys):
    root = make_image_folder(tmp_path / "shapes", per_class=(6, 2), size=16)
    for split in ("train", "val"):  # a notebook's checkpoints and a macOS file: not classes, not images
        os.makedirs(os.path.join(root, split, ".ipynb_checkpoints"))
        shutil.copy(os.path.join(root, split, "square", "0.png"), os.path.join(root, split, ".ipynb_checkpoints"))
        shutil.copy(os.path.join(root, split, "square", "0.png"), os.path.join(root, split, "square", "._0.png"))
    out = str(tmp_path / "run")
    assert train.main(["--dataset", "folder", "--data-dir", root, *TINY, "--dry-run", "--out", out]) == 0
    assert "3 classes" in capsys.readouterr().out
    for name in os.listdir(os.path.join(root, "train")):
        if name not in ("square", ".ipynb_checkpoints"):
            for split in ("train", "val"):
                shutil.rmtree(os.path.join(root, split, name))
    assert train.main(["--dataset", "folder", "--data-dir", root, *TINY, "--out", out]) == 2
    assert "has one class (square): a classifier needs two or more" in capsys.readouterr().err
