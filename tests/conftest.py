import gzip
import json
import os
import signal
import struct
import sys

import numpy as np
import pytest
import mxnet as mx

from gluon_gpu.core.step.precision import cpu_flags
from gluon_gpu.data.fashion_mnist import fashion_spec, find_data_dir, load_split

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

# A suite started in the background by a non-interactive shell (`make test &`) inherits
# SIGINT ignored, and so would every program it starts, which the Ctrl-C tests need to
# receive it: a handler here becomes the default again in each child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

needs_bf16 = pytest.mark.skipif(not cpu_flags() & {"avx512_bf16", "amx_bf16"},
                                reason="this CPU has no AVX-512 BF16 instructions")


@pytest.fixture(scope="session")
def data_dir():
    """The real FashionMNIST (CI installs Debian's dataset-fashion-mnist); never downloads."""
    return find_data_dir(None, "train", download=False)


@pytest.fixture(scope="session")
def train_slice(data_dir):
    """2048 training images as the data layer stores them, (N, 1, 28, 28) uint8, and labels."""
    x, y = load_split("train", data_dir, limit=2048)
    return x[:, None], y


def write_idx(path, array, magic=None, count=None):
    """An IDX file (gzipped) of ``array`` as uint8; ``magic``/``count``: a header that lies."""
    array = np.asarray(array, dtype=np.uint8)
    magic = magic if magic is not None else 0x800 + array.ndim
    dims = list(array.shape)
    if count is not None:
        dims[0] = count
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *dims) + array.tobytes())


@pytest.fixture(scope="session")
def small_fashion(tmp_path_factory, data_dir):
    """A FashionMNIST folder of the real data's first 4096 training and 2000 test samples:
    evaluate and predict on it read 2000 validation samples, not 10000."""
    from gluon_gpu.data.fashion_mnist import FILES
    root = tmp_path_factory.mktemp("small-fashion")
    for split, n in (("train", 4096), ("test", 2000)):
        x, y = load_split(split, data_dir, limit=n)
        images, labels = FILES[split]
        write_idx(root / (images + ".gz"), x)
        write_idx(root / (labels + ".gz"), y)
    return str(root)


def fashion_transform(members=1):
    """FashionMNIST's in-graph normalization (uint8 -> the tutorial's normalized float)."""
    return fashion_spec().transform(members)


def trained_run(tmp_path_factory, args, folder="run", leaf="run"):
    """A run of ``train`` with ``args`` trained to its end in a fresh folder, for module
    fixtures: its path."""
    from gluon_gpu.programs import train
    out = str(tmp_path_factory.mktemp(folder) / leaf)
    assert train.main(args + ["--out", out]) == 0
    return out


def with_flags(base, *flags):
    """The command line ``base`` with ``flags`` added, each flag of ``flags`` replacing
    the same flag (and its value) in ``base``: the programs refuse a flag given twice."""
    names = {f for f in flags if f.startswith("--")}
    kept, skip_value = [], False
    for arg in base:
        if skip_value and not arg.startswith("--"):
            skip_value = False
            continue
        skip_value = arg in names
        if not skip_value:
            kept.append(arg)
    return kept + list(flags)


def read_metrics(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def param_arrays(net):
    return {k: p.data(p.list_ctx()[0]).asnumpy() for k, p in net._collect_params_with_prefix().items()}


@pytest.fixture(autouse=True)
def _seeded():
    mx.random.seed(0)
    np.random.seed(0)


FOLDER_CLASSES = ("hstripes", "square", "vstripes")


def pattern(kind, size, rng):
    """A noisy colour image of one of three patterns, uint8 (size, size, 3)."""
    yy, xx = np.mgrid[:size, :size]
    period = rng.integers(4, 8)
    if kind == "hstripes":
        mask = (yy // (period // 2)) % 2 == 0
    elif kind == "vstripes":
        mask = (xx // (period // 2)) % 2 == 0
    else:
        lo, hi = rng.integers(4, size // 3), rng.integers(2 * size // 3, size - 4)
        mask = (yy >= lo) & (yy < hi) & (xx >= lo) & (xx < hi)
    colour = rng.integers(120, 256, 3)
    img = np.where(mask[..., None], colour, rng.integers(0, 60, 3)) + rng.normal(0, 20, (size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_image_folder(root, per_class=(60, 20), size=32, seed=0):
    """DIR/train/<class>/*.png and DIR/val/<class>/*.png of three learnable patterns."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    for split, count in zip(("train", "val"), per_class):
        for kind in FOLDER_CLASSES:
            os.makedirs(os.path.join(root, split, kind), exist_ok=True)
            for i in range(count):
                Image.fromarray(pattern(kind, size, rng)).save(os.path.join(root, split, kind, f"{i}.png"))
    return str(root)


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("folder") / "shapes")


@pytest.fixture(scope="session")
def fashion_folder(tmp_path_factory, train_slice):
    """1536 training and 512 validation images of real FashionMNIST as a PNG image folder."""
    from gluon_gpu.data.fashion_mnist import CLASSES
    from image_folders import write_images
    root = tmp_path_factory.mktemp("fashion") / "png"
    x, y = train_slice
    names = [c.replace("/", "-") for c in CLASSES]
    write_images(os.path.join(root, "train"), x[:1536], y[:1536], names)
    write_images(os.path.join(root, "val"), x[1536:], y[1536:], names)
    return str(root)


# `make check`: modules that together cover every layer in under 2 minutes.
QUICK_MODULES = ("test_architecture", "test_devices", "test_blocks", "test_data", "test_run_folder",
                 "test_parallel", "test_train_cli", "test_install_script", "test_augment", "test_mixing",
                 "test_export", "test_elastic_supervisor")
QUICK_TESTS = ("test_every_path_the_page_names_exists", "test_the_readme_is_a_front_door")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__ in QUICK_MODULES or item.originalname in QUICK_TESTS:
            item.add_marker(pytest.mark.quick)
