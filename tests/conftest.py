import json
import os

import numpy as np
import pytest
import mxnet as mx

from gluon_gpu.data.fashion_mnist import fashion_spec, find_data_dir, load_split


@pytest.fixture(scope="session")
def data_dir():
    """The real FashionMNIST (CI installs Debian's dataset-fashion-mnist); never downloads."""
    return find_data_dir(None, "train", download=False)


@pytest.fixture(scope="session")
def train_slice(data_dir):
    """2048 training images as the data layer stores them, (N, 1, 28, 28) uint8, and labels."""
    x, y = load_split("train", data_dir, limit=2048)
    return x[:, None], y


def fashion_transform(members=1):
    """FashionMNIST's in-graph normalization (uint8 -> the tutorial's normalized float)."""
    return fashion_spec().transform(members)


def read_metrics(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def param_arrays(net):
    return {k: p.data(p.list_ctx()[0]).asnumpy() for k, p in net._collect_params_with_prefix().items()}


@pytest.fixture(autouse=True)
def _seeded():
    mx.random.seed(0)
    np.random.seed(0)
