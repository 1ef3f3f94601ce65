import gzip
import os
import struct

import numpy as np
import pytest

from gluon_gpu.data import fashion_mnist as data
from gluon_gpu.data import DevicePipeline, epoch_order, pipelines

from conftest import fashion_transform, write_idx
from gluon_gpu.core.platform.errors import DataError


def make_split(directory, split, n, seed=0):
    rng = np.random.default_rng(seed)
    images, labels = data.FILES[split]
    write_idx(os.path.join(directory, images + ".gz"), rng.integers(0, 256, (n, 28, 28)))
    write_idx(os.path.join(directory, labels + ".gz"), rng.integers(0, 10, n))


def test_real_files_have_the_standard_shapes(data_dir):
    x, y = data.load_split("train", data_dir)
    assert x.shape == (60000, 28, 28) and x.dtype == np.uint8
    assert y.shape == (60000,) and set(np.unique(y)) == set(range(10))
    tx, ty = data.load_split("test", data_dir)
    assert tx.shape == (10000, 28, 28) and ty.shape == (10000,)


def test_idx_round_trip(tmp_path):
    arr = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    write_idx(tmp_path / "x.gz", arr)
    assert (data.read_idx(str(tmp_path / "x.gz"), 3) == arr).all()


@pytest.mark.parametrize("kind,message", [
    ("magic", "magic"), ("count", "truncated or corrupt"), ("shape", "expected 28x28"),
    ("truncated_gzip", "cannot read"), ("tiny", "not an IDX file"), ("not_gzip", "cannot read"),
])
def test_corrupt_idx_files_fail_clearly(tmp_path, kind, message):
    path = str(tmp_path / "bad.gz")
    arr = np.zeros((4, 28, 28))
    if kind == "magic":
        write_idx(path, arr, magic=0x0801)
    elif kind == "count":
        write_idx(path, arr, count=5)
    elif kind == "shape":
        write_idx(path, np.zeros((4, 27, 28)))
    elif kind == "truncated_gzip":
        write_idx(path, arr)
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[: len(raw) // 2])
    elif kind == "tiny":
        with gzip.open(path, "wb") as f:
            f.write(b"\x00\x00")
    else:
        open(path, "wb").write(b"this is not gzip at all")
    with pytest.raises(DataError, match=message):
        data.read_idx(path, 3)


def test_label_count_must_match_images(tmp_path):
    make_split(str(tmp_path), "test", 5)
    write_idx(str(tmp_path / "t10k-labels-idx1-ubyte.gz"), np.zeros(4))
    with pytest.raises(DataError, match="5 images but 4 labels"):
        data.load_split("test", str(tmp_path))


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No env dir, an empty MXNet cache, no Debian dir, and no network."""
    monkeypatch.delenv("GLUON_GPU_DATA", raising=False)
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxhome"))
    monkeypatch.setattr(data, "DEBIAN_DIR", str(tmp_path / "no-debian"))
    monkeypatch.setattr(data, "_download", lambda directory, split: False)
    return tmp_path


def test_search_order(isolated, monkeypatch):
    env_dir, cache = isolated / "env", isolated / "mxhome" / "datasets" / "fashion-mnist"
    debian = isolated / "no-debian"
    for d, seed in ((env_dir, 1), (cache, 2), (debian, 3)):
        d.mkdir(parents=True)
        make_split(str(d), "test", 3, seed)
    monkeypatch.setenv("GLUON_GPU_DATA", str(env_dir))
    assert data.find_data_dir(None, "test") == str(env_dir)
    monkeypatch.delenv("GLUON_GPU_DATA")
    assert data.find_data_dir(None, "test") == str(cache)
    for f in cache.iterdir():
        f.unlink()
    assert data.find_data_dir(None, "test") == str(debian)
    assert data.find_data_dir(str(env_dir), "test") == str(env_dir)


def test_download_is_the_last_resort(isolated, monkeypatch):
    calls = []

    def fake_download(directory, split):
        calls.append(directory)
        os.makedirs(directory, exist_ok=True)
        make_split(directory, split, 2)
        return True
    monkeypatch.setattr(data, "_download", fake_download)
    assert data.find_data_dir(None, "test") == data.mxnet_cache_dir()
    assert calls == [data.mxnet_cache_dir()]


def test_missing_data_names_both_ways(isolated):
    with pytest.raises(DataError) as e:
        data.find_data_dir(None, "train")
    assert "apt-get install dataset-fashion-mnist" in str(e.value)
    assert "`data_dir`" in str(e.value)  # the parameter: the CLI shows it as --data-dir


def test_explicit_data_dir_must_hold_the_files(tmp_path):
    with pytest.raises(DataError, match="does not hold"):
        data.find_data_dir(str(tmp_path), "train")


def test_epoch_order_is_seeded_and_changes_per_epoch():
    a, b = epoch_order(100, 3, 0), epoch_order(100, 3, 0)
    assert (a == b).all() and sorted(a) == list(range(100))
    assert (a != epoch_order(100, 3, 1)).any()
    assert (a != epoch_order(100, 4, 0)).any()
    assert (epoch_order(5, 3, 0, shuffle=False) == np.arange(5)).all()


@pytest.mark.parametrize("n_ctx", [1, 2])
def test_device_and_loader_pipelines_agree(train_slice, n_ctx):
    """Same samples, same order, same values for the same seed."""
    import mxnet as mx
    x, y = train_slice[0][:600], train_slice[1][:600]
    ctx = [mx.cpu(i) for i in range(n_ctx)]
    dev = pipelines.make_pipeline("device", x, y, 256, ctx, seed=7)
    loader = pipelines.make_pipeline("loader", x, y, 256, ctx, seed=7, num_workers=0)
    assert len(dev) == len(loader) == 3
    for epoch in (0, 1):
        dev_batches, loader_batches = list(dev.epoch(epoch)), list(loader.epoch(epoch))
        assert len(dev_batches) == len(loader_batches) == 3
        for (dx, dy), (lx, ly) in zip(dev_batches, loader_batches):
            got_x = np.concatenate([s.asnumpy() for s in dx])
            got_y = np.concatenate([s.asnumpy() for s in dy])
            np.testing.assert_array_equal(got_x, lx.asnumpy())
            np.testing.assert_array_equal(got_y, ly.asnumpy())
    first = np.concatenate([s.asnumpy() for s in list(dev.epoch(0))[0][1]])
    second = np.concatenate([s.asnumpy() for s in list(dev.epoch(1))[0][1]])
    assert (first != second).any(), "a new epoch must reshuffle"


def test_in_graph_normalization_is_the_tutorials(train_slice):
    """The in-graph transform gives the tutorial's ToTensor() then Normalize(0.13, 0.31)."""
    from mxnet import nd
    from mxnet.gluon.data.vision import transforms
    x = train_slice[0][:16]
    tutorial = transforms.Compose([transforms.ToTensor(), transforms.Normalize(0.13, 0.31)])
    expected = np.stack([tutorial(nd.array(img.transpose(1, 2, 0), dtype="uint8")).asnumpy() for img in x])
    got = fashion_transform()(nd.array(x, dtype="uint8")).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_device_pipeline_shards_live_on_their_devices(train_slice):
    import mxnet as mx
    ctx = [mx.cpu(0), mx.cpu(1)]
    pipe = DevicePipeline(train_slice[0][:300], train_slice[1][:300], 256, ctx)
    shapes = [[s.shape[0] for s in xs] for xs, _ in pipe.epoch(0)]
    assert shapes == [[128, 128], [22, 22]]
    xs, _ = next(pipe.epoch(0))
    assert [s.context for s in xs] == ctx and xs[0].dtype == np.uint8


# -- every pixel format Pillow opens, in the range the model expects -------------------------
RAMP = np.linspace(0, 1, 16 * 16).reshape(16, 16)  # black to white


def _write(path, array, mode=None):
    from PIL import Image
    image = Image.fromarray(array) if mode is None else Image.fromarray(array).convert(mode)
    image.save(path)
    return str(path)


@pytest.mark.parametrize("name, make", [
    ("gray8.png", lambda: (RAMP * 255).round().astype(np.uint8)),
    ("gray16.png", lambda: (RAMP * 65535).round().astype(np.uint16)),  # Pillow: mode I;16
    ("int32.tiff", lambda: (RAMP * 65535).round().astype(np.int32)),  # mode I, 16-bit values
    ("float.tiff", lambda: RAMP.astype(np.float32)),  # mode F, white at 1.0
    ("rgb8.png", lambda: np.repeat((RAMP * 255).round().astype(np.uint8)[..., None], 3, axis=2)),
])
def test_every_pixel_format_decodes_to_the_same_8_bit_ramp(tmp_path, name, make):
    """A 16-bit or float image is scaled to 0..255, never clipped: a dark 16-bit image
    stays dark (Pillow's convert('L') made every 16-bit value above 255 white)."""
    from gluon_gpu.data.images import decode
    path = _write(tmp_path / name, make())
    expected = (RAMP * 255).round()
    for channels in (1, 3):
        pixels = decode(path, channels)
        assert pixels.dtype == np.uint8 and pixels.shape == (channels, 16, 16)
        assert np.abs(pixels.astype(float) - expected).max() <= 1, name
    dark = make()
    dark = (dark // 8) if dark.dtype != np.float32 else dark / 8  # an eighth of the range
    assert decode(_write(tmp_path / ("dark-" + name), dark.astype(make().dtype)), 1).max() <= 33


@pytest.mark.parametrize("array, mode, span", [
    (np.full((16, 16), 70000, np.int32), "I", "70000..70000"),  # beyond 16 bits: no white point
    (np.full((16, 16), -1, np.int32), "I", "-1..-1"),
    (np.full((16, 16), 2.0, np.float32), "F", "2..2"),
    (np.full((16, 16), np.nan, np.float32), "F", "nan..nan"),
])
def test_pixels_that_cannot_be_scaled_are_refused_naming_the_mode(tmp_path, array, mode, span):
    from gluon_gpu.data.images import decode
    path = _write(tmp_path / "x.tiff", array)
    with pytest.raises(DataError, match=f"mode {mode} pixels span {span}, outside the 0..") as e:
        decode(path, 1)
    assert str(e.value).startswith(path)


@pytest.mark.parametrize("y_train, message", [
    (np.array(["cat"] * 8), "y_train is <U3, not numbers"),
    (np.array(3), "y_train is a single value"),
    (np.array([True, False] * 4), "y_train is bool: give class labels as integers"),  # trained as a regression
    (np.arange(8) + 1j, "y_train is complex128: complex values are not taken"),
    (np.array([0] * 7 + [10 ** 9]), "y_train's largest label is 1000000000"),
])
def test_labels_are_checked_where_they_are_read(y_train, message):
    from gluon_gpu.data import from_arrays
    x = np.zeros((8, 4), np.float32)
    with pytest.raises(DataError, match=message):
        from_arrays(x, y_train, x, np.zeros(8, np.int64))


def test_complex_inputs_are_refused_not_cast():
    from gluon_gpu.data import from_arrays
    x, y = np.zeros((8, 4), np.complex64), np.zeros(8, np.int64)
    with pytest.raises(DataError, match="x_train is complex64: complex values are not taken"):
        from_arrays(x, y, x.real, y)
