import importlib

import mxnet as mx
import pytest

import gluon_gpu
from gluon_gpu.errors import DeviceError

# The package exports the context manager as gluon_gpu.devices, shadowing the module name.
dev = importlib.import_module("gluon_gpu.devices")


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(dev, "gpu_count", lambda: n)
    return set_count


def test_cpu_specs():
    assert dev.parse_devices("cpu") == [mx.cpu(0)]
    assert dev.parse_devices("cpu*3") == [mx.cpu(0), mx.cpu(1), mx.cpu(2)]
    assert dev.parse_devices(" CPU*2 ") == [mx.cpu(0), mx.cpu(1)]


def test_all_without_gpus_is_one_cpu(gpus):
    gpus(0)
    assert dev.parse_devices("all") == [mx.cpu(0)]


def test_gpu_specs_with_four_gpus(gpus):
    gpus(4)
    assert dev.parse_devices("all") == [mx.gpu(i) for i in range(4)]
    assert dev.parse_devices("gpu") == [mx.gpu(i) for i in range(4)]
    assert dev.parse_devices("gpu*2") == [mx.gpu(0), mx.gpu(1)]
    assert dev.parse_devices("gpu:0,2") == [mx.gpu(0), mx.gpu(2)]
    assert dev.parse_devices("gpu:3") == [mx.gpu(3)]


@pytest.mark.parametrize("spec,gpu_count,message", [
    ("gpu", 0, "has none"),
    ("gpu*1", 0, "has none"),
    ("gpu*3", 2, "asks for 3 GPUs: this machine has 2 GPUs"),
    ("gpu:2", 2, "GPU 2 does not exist"),
    ("gpu:0", 0, "GPU 0 does not exist: this machine has no GPU"),
    ("gpu:1,1", 4, "repeated"),
    ("cpu*0", 0, "at least 1"),
    ("gpu*0", 4, "at least 1"),
    ("cpu:1", 0, "chosen by count"),
    ("tpu", 0, "bad device spec"),
    ("gpu:", 4, "bad device spec"),
    ("cpu*x", 0, "bad device spec"),
    ("", 0, "bad device spec"),
])
def test_bad_specs(gpus, spec, gpu_count, message):
    gpus(gpu_count)
    with pytest.raises(DeviceError, match=message):
        dev.parse_devices(spec)


def test_context_manager_yields_list_and_syncs():
    with gluon_gpu.devices("cpu*2") as ctx:
        assert ctx == [mx.cpu(0), mx.cpu(1)]
        x = mx.nd.ones((4,), ctx=ctx[1]) * 3
    assert x.asnumpy().tolist() == [3, 3, 3, 3]
