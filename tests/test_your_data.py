"""Your own data and task through the CLIs: image folders, npz classification and
regression, zoo models for the data's shape, the examples, and every bad input."""
import json
import os
import shutil
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from gluon_gpu.core.step.parallel import DataParallel
from gluon_gpu.data import sources
from gluon_gpu.models import init_model
from gluon_gpu.programs import evaluate, predict, train

from conftest import FOLDER_CLASSES, make_image_folder, read_metrics
from failure_table import table_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["--devices", "cpu*2", "--quiet", "--batch-size", "32"]


def run_cli(module, argv, capsys):
    code = module.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


@pytest.fixture(scope="module")
def folder_run(image_folder, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("folder") / "run")
    assert train.main(["--dataset", "folder", "--data-dir", image_folder, "--epochs", "6", "--lr", "0.05",
                       "--out", out] + QUICK) == 0
    return out


def test_an_image_folder_of_colour_images_trains_well_above_chance(folder_run):
    record = read_metrics(folder_run)
    assert record["data"]["input_shape"] == [3, 32, 32] and record["data"]["classes"] == list(FOLDER_CLASSES)
    assert record["epochs"][-1]["val_acc"] > 0.8  # chance is 1/3
    assert "val_top5" not in record["epochs"][-1]  # 3 classes: no top-5


def test_evaluate_and_predict_need_no_data_flags(folder_run, image_folder, capsys, monkeypatch):
    """They find the run's data themselves; evaluate decodes nothing of the training split
    and reads the validation split as it evaluates, never decoded whole in one array."""
    decoded, decode_all = [], sources.ImageSource.decode_all
    monkeypatch.setattr(sources.ImageSource, "decode_all",
                        lambda self, *a, **k: decoded.append((os.path.basename(self.where), len(self)))
                        or decode_all(self, *a, **k))
    code, out, _ = run_cli(evaluate, ["--params", os.path.join(folder_run, "net.params"), "--devices", "cpu"], capsys)
    assert code == 0
    assert decoded == [("train", 0)], decoded
    assert float(out.split(" acc ")[1].split()[0]) == pytest.approx(read_metrics(folder_run)["epochs"][-1]["val_acc"],
                                                                    abs=1e-4)
    files = [os.path.join(image_folder, "val", c, "0.png") for c in FOLDER_CLASSES]
    code, out, _ = run_cli(predict, ["--params", os.path.join(folder_run, "net.params")] + files, capsys)
    assert code == 0
    named = [line.split(": ", 1)[1].split(" (")[0] for line in out.strip().splitlines()]
    assert sum(n == c for n, c in zip(named, FOLDER_CLASSES)) >= 2 and set(named) <= set(FOLDER_CLASSES)


@pytest.mark.parametrize("flags", [["--pipeline", "loader"], ["--inference", "fused"]])
def test_evaluate_streams_the_validation_images_batch_by_batch(folder_run, capsys, monkeypatch, flags):
    """The loader pipeline (for validation splits larger than memory) and the oneDNN
    graph read the validation images a batch at a time and give the figures of the
    validation split held on the device."""
    decoded, decode_all = [], sources.ImageSource.decode_all
    monkeypatch.setattr(sources.ImageSource, "decode_all",
                        lambda self, *a, **k: decoded.append(len(self)) or decode_all(self, *a, **k))
    params = ["--params", os.path.join(folder_run, "net.params"), "--devices", "cpu"]
    figures = {}
    for name, extra in (("held", ["--pipeline", "device", "--inference", "graph"]), ("streamed", flags)):
        code, out, err = run_cli(evaluate, params + extra, capsys)
        assert code == 0, err
        figures[name] = [float(out.split(f" {n} ")[1].split()[0]) for n in ("loss", "acc")]
    assert figures["streamed"] == pytest.approx(figures["held"], abs=1e-5)
    assert decoded == [0, 0]  # of the training split, nothing


def test_a_folder_run_resumes_with_no_data_flags(folder_run, tmp_path, capsys):
    out = str(tmp_path / "copy")
    shutil.copytree(folder_run, out)
    code, printed, err = run_cli(train, ["--resume", out, "--epochs", "7", "--quiet"], capsys)
    assert code == 0, err
    assert "folder 3x32x32, 3 classes" in printed
    assert len(read_metrics(out)["epochs"]) == 7


def test_other_image_sizes_resize_with_image_size(tmp_path, capsys):
    root = make_image_folder(tmp_path / "mixed", per_class=(6, 3), size=32)
    Image.fromarray(np.zeros((40, 24, 3), np.uint8)).save(os.path.join(root, "train", "square", "odd.png"))
    code, _, err = run_cli(train, ["--dataset", "folder", "--data-dir", root, "--out", str(tmp_path / "a"),
                                   "--epochs", "1"] + QUICK, capsys)
    assert code == 2 and "differ in size" in err and "--image-size" in err
    code, out, _ = run_cli(train, ["--dataset", "folder", "--data-dir", root, "--image-size", "28",
                                   "--out", str(tmp_path / "b"), "--epochs", "1"] + QUICK, capsys)
    assert code == 0 and "folder 3x28x28" in out


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def linear_data(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    return x, x @ rng.normal(size=10)


def test_npz_classification_trains(tmp_path, capsys):
    x, score = linear_data()
    y = (score > 0).astype(np.int64) + (x[:, 0] > 1)
    path = write_npz(tmp_path / "c.npz", x_train=x[:1600], y_train=y[:1600], x_val=x[1600:], y_val=y[1600:])
    out = str(tmp_path / "run")
    code, printed, _ = run_cli(train, ["--dataset", "npz", "--data-dir", path, "--epochs", "4", "--out", out]
                               + QUICK, capsys)
    assert code == 0 and "mlp" in printed and "3 classes" in printed
    assert read_metrics(out)["epochs"][-1]["val_acc"] > 0.7  # chance is at most 0.5
    code, printed, _ = run_cli(predict, ["--params", os.path.join(out, "net.params"), "--npz", path,
                                         "--index", "0:4", "--json"], capsys)
    assert code == 0 and [r["class"] for r in json.loads(printed)][0] in ("0", "1", "2")


def test_npz_regression_loss_falls_and_reports_mse(tmp_path, capsys):
    x, score = linear_data()
    y = (score + 0.05 * np.random.default_rng(1).normal(size=len(score))).astype(np.float32)
    path = write_npz(tmp_path / "r.npz", x_train=x[:1600], y_train=y[:1600], x_val=x[1600:], y_val=y[1600:])
    out = str(tmp_path / "run")
    code, printed, _ = run_cli(train, ["--dataset", "npz", "--data-dir", path, "--epochs", "4", "--optimizer", "adam",
                                       "--lr", "0.01", "--out", out] + QUICK, capsys)
    assert code == 0 and "regression of 1" in printed and "val-mse" in printed
    epochs = read_metrics(out)["epochs"]
    assert epochs[-1]["train_loss"] < 0.3 * epochs[0]["train_loss"]
    assert epochs[-1]["val_mse"] < 0.2 * np.var(y[1600:])
    code, printed, _ = run_cli(evaluate, ["--params", os.path.join(out, "net.params")], capsys)
    assert code == 0 and " mse " in printed and " mae " in printed
    code, _, err = run_cli(train, ["--dataset", "npz", "--data-dir", path, "--label-smoothing", "0.1",
                                   "--out", str(tmp_path / "smoothed")] + QUICK, capsys)
    assert code == 2 and err.strip() == ("gluon_gpu.train: error: --label-smoothing applies to classification; "
                                         "this data is task regress")
    code, printed, _ = run_cli(predict, ["--params", os.path.join(out, "net.params"), "--npz", path,
                                         "--index", "0:3", "--json"], capsys)
    predictions = [r["prediction"][0] for r in json.loads(printed)]
    np.testing.assert_allclose(predictions, y[1600:1603], atol=1.0)


@pytest.mark.parametrize("name", ["resnet18_v1", "mobilenet_v2_1.0", "cifar_resnet20_v1"])
def test_zoo_models_take_the_datas_channels_and_classes(name):
    ctx = [mx.cpu(0), mx.cpu(1)]
    net = init_model(name, 0, ctx, input_shape=(3, 32, 32), outputs=3)
    dp = DataParallel(net, ctx, "sgd", {"learning_rate": 0.01}, head="classify")
    x = mx.nd.random.uniform(shape=(8, 3, 32, 32))
    y = mx.nd.array([0, 1, 2, 0, 1, 2, 0, 1])
    assert net(x.as_in_context(ctx[0])).shape == (8, 3)
    dp.step(x, y)
    assert np.isfinite(dp.read_metrics()["loss"])


@pytest.mark.parametrize("script,args,expect", [
    ("tutorial_numpy.py", ["6000"], "reloaded: val-acc"),
    ("regression_arrays.py", ["6"], "val-mse"),
    ("own_model_folder.py", [None, "6"], "val-acc"),
])
def test_examples_run_and_learn(script, args, expect, image_folder, tmp_path):
    args = [a or image_folder for a in args]
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", script)] + args, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    assert set(os.listdir(tmp_path)) <= {"runs"}  # an example writes under runs/, never beside you
    lines = proc.stdout.strip().splitlines()
    assert expect in lines[-1]
    figures = [float(l.rsplit(" ", 1)[1]) for l in lines if expect.split(":")[-1].strip() in l]
    if "acc" in expect:
        assert figures[-1] > 0.6
    else:
        assert figures[-1] < 0.5 * figures[0]


# -- bad input: one line, exit 2 ---------------------------------------------------------

def bad_case(kind, tmp_path, image_folder, folder_run):
    """(module, argv, expected words) for one bad input."""
    out = ["--out", str(tmp_path / "out"), "--epochs", "1"] + QUICK
    folder = ["--dataset", "folder", "--data-dir"]
    npz = ["--dataset", "npz", "--data-dir"]
    x = np.zeros((20, 4), np.float32)
    if kind == "empty-folder":
        (tmp_path / "empty" / "train").mkdir(parents=True)
        return train, folder + [str(tmp_path / "empty")] + out, "holds no class folders"
    if kind == "class-without-images":
        root = make_image_folder(tmp_path / "f", per_class=(3, 2), size=16)
        (tmp_path / "f" / "train" / "ghost").mkdir()
        (tmp_path / "f" / "train" / "ghost" / "notes.txt").write_text("no image here")
        return train, folder + [root] + out, "ghost holds no images"
    if kind == "mixed-sizes":
        root = make_image_folder(tmp_path / "f", per_class=(3, 2), size=16)
        Image.fromarray(np.zeros((20, 16, 3), np.uint8)).save(os.path.join(root, "val", "square", "big.png"))
        return train, folder + [root] + out, "--image-size"
    if kind == "huge-image":
        root = make_image_folder(tmp_path / "f", per_class=(3, 2), size=16)
        Image.new("L", (9000, 9000)).save(os.path.join(root, "train", "square", "huge.png"))
        return train, folder + [root] + out, "over the 40M pixels"
    if kind == "npz-missing-array":
        return train, npz + [write_npz(tmp_path / "m.npz", x_train=x, y_train=x[:, 0], x_val=x)] + out, "lacks y_val"
    if kind == "npz-not-npz":
        (tmp_path / "n.npz").write_text("hello")
        return train, npz + [str(tmp_path / "n.npz")] + out, "cannot read"
    if kind == "labels-out-of-range":
        return train, npz + [write_npz(tmp_path / "l.npz", x_train=x, y_train=np.arange(20) % 3, x_val=x,
                                       y_val=np.full(20, 7))] + out, "y_val holds label 7, outside 0..2"
    if kind == "negative-labels":
        return train, npz + [write_npz(tmp_path / "l.npz", x_train=x, y_train=np.arange(20) - 1, x_val=x,
                                       y_val=np.zeros(20, int))] + out, "holds label -1"
    if kind == "lengths-differ":
        return train, npz + [write_npz(tmp_path / "d.npz", x_train=x, y_train=np.zeros(19, int), x_val=x,
                                       y_val=np.zeros(20, int))] + out, "x_train has 20 samples but y_train has 19"
    if kind == "float-labels-classify":
        return train, npz + [write_npz(tmp_path / "f.npz", x_train=x, y_train=x[:, 0], x_val=x, y_val=x[:, 0]),
                             "--task", "classify"] + out, "task classify needs integer labels"
    if kind == "empty-split":
        return train, npz + [write_npz(tmp_path / "e.npz", x_train=x[:0], y_train=np.zeros(0, int), x_val=x,
                                       y_val=np.zeros(20, int))] + out, "the train split has no samples"
    if kind == "conv-model-on-features":
        return train, npz + [write_npz(tmp_path / "c.npz", x_train=x, y_train=np.arange(20) % 2, x_val=x,
                                       y_val=np.arange(20) % 2), "--model", "lenet"] + out, "use --model mlp"
    if kind == "params-of-another-datas-shape":
        alone = tmp_path / "alone"
        alone.mkdir()
        shutil.copy(os.path.join(folder_run, "net.params"), alone / "net.params")  # no run: FashionMNIST's shape
        return evaluate, ["--params", str(alone / "net.params")], "for 1x28x28 inputs"
    if kind == "predict-wrong-kind":
        return predict, ["--params", os.path.join(folder_run, "net.params"), "--idx",
                         "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"], "this run takes (3, 32, 32)"
    raise AssertionError(kind)


BAD = ["empty-folder", "class-without-images", "mixed-sizes", "huge-image", "npz-missing-array", "npz-not-npz",
       "labels-out-of-range", "negative-labels", "lengths-differ", "float-labels-classify", "empty-split",
       "conv-model-on-features", "params-of-another-datas-shape", "predict-wrong-kind"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_data_is_one_line_and_exit_2(kind, tmp_path, image_folder, folder_run, capsys):
    module, argv, words = bad_case(kind, tmp_path, image_folder, folder_run)
    code, _, err = run_cli(module, argv, capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, err


def test_files_that_are_not_images_are_skipped_and_counted(tmp_path, capsys):
    root = make_image_folder(tmp_path / "f", per_class=(6, 3), size=16)
    (tmp_path / "f" / "train" / "square" / "README.txt").write_text("not an image")
    code, out, _ = run_cli(train, ["--dataset", "folder", "--data-dir", root, "--out", str(tmp_path / "r"),
                                   "--epochs", "1"] + QUICK, capsys)
    assert code == 0
    assert "skipped 1 file(s) that are not images" in out and "README.txt" in out


def test_any_gluon_dataset_becomes_a_dataset_with_its_spec():
    """Gluon's vision datasets give (H, W, C) uint8 images and integer labels."""
    from mxnet import gluon, nd
    from gluon_gpu.data import from_gluon
    rng = np.random.default_rng(0)
    images = nd.array(rng.integers(0, 256, (40, 16, 16, 3)), dtype="uint8")
    labels = rng.integers(0, 4, 40).astype(np.int64)
    train_set = gluon.data.ArrayDataset(images[:30], labels[:30])
    val_set = gluon.data.ArrayDataset(images[30:], labels[30:])
    data = from_gluon(train_set, val_set)
    assert data.train_x.shape == (30, 3, 16, 16) and data.train_x.dtype == np.uint8
    np.testing.assert_array_equal(data.train_x[3], images[3].asnumpy().transpose(2, 0, 1))
    assert data.spec.task == "classify" and data.spec.outputs == int(labels[:30].max()) + 1
    assert len(data.spec.mean) == 3 and data.spec.input_shape == (3, 16, 16)


def test_images_at_the_documented_minimum_work_or_say_which_size_does(tmp_path, capsys):
    """8x8 images (the smallest a folder takes) are too small for LeNet's two convolutions
    and poolings: one line naming the model and the size, exit 2; resized to 12 (LeNet's
    smallest) they train, and a zoo network takes them as they are."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("a", "b"):
            os.makedirs(tmp_path / "d" / split / name)
            for i in range(4):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(tmp_path / "d" / split / name / f"{i}.png")
    common = ["--dataset", "folder", "--data-dir", str(tmp_path / "d"), "--devices", "cpu", "--epochs", "1", "--quiet"]
    for fused in ("auto", "off"):
        assert table_exit("images a model cannot take",
                          train.main(common + ["--fused-conv", fused, "--out", str(tmp_path / f"r-{fused}")]))
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("gluon_gpu.train: error: --model lenet cannot take inputs of 1x8x8: "), err
        assert err[0].endswith("resize the images (--image-size) or choose another --model")
    assert train.main(common + ["--image-size", "12", "--out", str(tmp_path / "r12")]) == 0
    assert train.main(common + ["--model", "cifar_resnet20_v1", "--out", str(tmp_path / "zoo")]) == 0
