"""On-device augmentation (--augment, issue #26): each component does what it says, and
augmented training keeps the framework's promises: the same batches for the same
(seed, epoch) however they are cut, 1 device = 2 devices, and evaluation untouched."""
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from gluon_gpu import DataParallel
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.data import DevicePipeline, LoaderPipeline
from gluon_gpu.data.augment import COMPONENTS, Augment, describe, draw_table, parse_augment
from gluon_gpu.models import init_model
from gluon_gpu.programs import train

from conftest import fashion_transform, param_arrays, read_metrics

ONE, TWO = [mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]


def augmented(text, images, draws, fill=0.0):
    """``images`` (n, C, H, W) through a hybridized Augment with these uniform draws."""
    block = Augment(parse_augment(text), images.shape[1:], [fill] * images.shape[1], clip_max=255)
    block.initialize()
    block.hybridize(static_alloc=True, static_shape=True)
    return block(nd.array(images), nd.array(block.parameters(np.asarray(draws, np.float32)))).asnumpy()


def known_images(n=4, c=1, h=10, w=12, seed=0):
    """Distinct positive values everywhere: any pixel's origin can be recognized."""
    return np.random.default_rng(seed).permutation(n * c * h * w).reshape(n, c, h, w).astype(np.float32) + 1


# -- each component does what it says --------------------------------------------------
def test_flip_mirrors_the_image_when_its_draw_is_below_p_and_leaves_it_otherwise():
    x = known_images(c=3)
    out = augmented("flip", x, [[0.1], [0.49], [0.5], [0.9]])
    np.testing.assert_array_equal(out[:2], x[:2, ..., ::-1])
    np.testing.assert_array_equal(out[2:], x[2:])
    np.testing.assert_array_equal(augmented("vflip=1", x, [[0.99]] * 4), x[..., ::-1, :])


def shift_of(original, out):
    """The (dx, dy) for which ``out`` is ``original`` shifted with zero fill, or None."""
    h, w = original.shape[-2:]
    for dy in range(-h + 1, h):
        for dx in range(-w + 1, w):
            want = np.zeros_like(original)
            want[..., max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
                original[..., max(-dy, 0):h - max(dy, 0), max(-dx, 0):w - max(dx, 0)]
            if np.array_equal(out, want):
                return dx, dy
    return None


def test_crop_is_a_whole_pixel_shift_within_the_padding_covering_every_offset():
    pad, x = 2, known_images(n=60)
    draws = np.random.default_rng(1).random((60, 2), dtype=np.float32)
    out = augmented(f"crop={pad}", x, draws)
    shifts = [shift_of(x[i], out[i]) for i in range(60)]
    assert None not in shifts
    assert all(max(abs(dx), abs(dy)) <= pad for dx, dy in shifts)
    assert {dx for dx, _ in shifts} == set(range(-pad, pad + 1)) == {dy for _, dy in shifts}
    # the draws name the shift: floor(u * (2P+1)) - P, x then y
    assert shifts == [(int(u * 5) - pad, int(v * 5) - pad) for u, v in draws]


def test_rotation_stays_within_its_bounds_and_turns_by_the_drawn_angle():
    """A bright disk 8 pixels right of the centre: after rotate=30 its centroid sits
    within 30 degrees of where it was, at the drawn angle (give or take the pixels)."""
    size, degrees = 21, 30
    rows, cols = np.mgrid[:size, :size]
    x = np.zeros((40, 1, size, size), np.float32)
    x[:, 0][:, (rows - 10) ** 2 + (cols - 18) ** 2 <= 2.5] = 255  # centre (10, 10)
    draws = np.random.default_rng(2).random((40, 1), dtype=np.float32)
    out = augmented(f"rotate={degrees}", x, draws)
    for image, (u,) in zip(out, draws):
        assert set(np.unique(image)) == {0, 255}  # moved, not blended (nearest neighbour)
        r, c = np.nonzero(image[0])
        angle = math.degrees(math.atan2(r.mean() - 10, c.mean() - 10))  # clockwise on screen
        assert abs(angle) <= degrees + 3
        assert angle == pytest.approx((2 * u - 1) * degrees, abs=3)


def test_erasing_sets_one_rectangle_inside_the_image_to_the_fill():
    h, w, fill = 16, 20, 7.0
    x = known_images(n=200, h=h, w=w) + 10  # never equal to the fill
    draws = np.random.default_rng(3).random((200, 5), dtype=np.float32)
    out = augmented("erase=0.5", x, draws, fill=fill)
    erased = out == fill
    np.testing.assert_array_equal(out[~erased], x[~erased])  # the rest untouched
    for image, row in zip(erased[:, 0], draws):
        if row[0] >= 0.5:
            assert not image.any()
            continue
        rows, cols = np.nonzero(image)
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert box == image.sum()  # one filled rectangle, within the image by construction of the mask
        assert 0.02 * h * w * 0.5 <= box <= 0.4 * h * w * 1.6  # the area range, give or take rounding and clipping
    assert 0.35 < np.mean([image.any() for image in erased]) < 0.65


def test_jitter_scales_brightness_within_its_strength_and_stays_in_range():
    x = np.full((3, 3, 8, 8), 100.0, np.float32)
    # brightness 1-0.4, 1, 1+0.4; contrast and saturation at 1 (draw 0.5): a flat grey image only brightens
    out = augmented("jitter=0.4", x, [[0.0, 0.5, 0.5], [0.5, 0.5, 0.5], [1.0, 0.5, 0.5]])
    np.testing.assert_allclose(out[:, 0, 0, 0], [60, 100, 140], rtol=1e-5)
    bright = augmented("jitter=0.9", np.full((1, 3, 8, 8), 250.0, np.float32), [[1.0, 1.0, 1.0]])
    assert bright.max() <= 255


def test_components_parse_with_defaults_presets_and_one_line_errors():
    assert describe(parse_augment("crop,flip")) == "flip=0.5,crop=4"  # applied in the registry's order
    assert describe(parse_augment("basic")) == "flip=0.5,crop=4" and parse_augment("none") == {}
    assert Augment(parse_augment("flip,crop,rotate,erase"), (1, 8, 8), [0]).draws == 1 + 2 + 1 + 5
    for text, message in [("blur", "unknown component"), ("crop=1.5", "crop=1.5 is not valid"),
                          ("flip=2", "flip=2 is not valid"), ("rotate=x", "rotate=x is not valid"),
                          ("basic,strong", r"basic is a preset: give it alone, or spell it out among the "
                                           r"components \(flip,crop=4\)"),
                          # the last one won, and an empty value took the default (#62)
                          ("flip=0.2,flip=0.9", "flip is given twice"), ("crop=", "crop= is not valid")]:
        with pytest.raises(UserError, match=message):
            parse_augment(text)
    with pytest.raises(UserError, match=r"applies to images \(C, H, W\)"):
        Augment(parse_augment("flip"), (20,), [0])
    assert set(COMPONENTS) == {"flip", "vflip", "crop", "translate", "rotate", "jitter", "erase"}


# -- the framework's promises -----------------------------------------------------------
def test_augmentation_is_a_function_of_seed_epoch_and_sample_however_the_batches_are_cut(train_slice):
    x, y = (a[:600] for a in train_slice)
    table = draw_table(600, 3, seed=5, epoch=2)
    np.testing.assert_array_equal(table, draw_table(600, 3, seed=5, epoch=2))
    assert not np.array_equal(table, draw_table(600, 3, seed=5, epoch=3))
    assert not np.array_equal(table, draw_table(600, 3, seed=6, epoch=2))
    augment = Augment(parse_augment("flip,crop=2,erase"), (1, 28, 28), [0])

    def rows(batches):  # sample (recognized by its image) -> its augmentation parameters
        seen = {}
        for data, _, params in batches:
            for xs, ps in zip(data, params):
                for image, row in zip(xs.asnumpy(), ps.asnumpy()):
                    seen[image.tobytes()] = row
        return seen
    one = rows(DevicePipeline(x, y, 64, ONE, seed=5, augment=augment).epoch(2))
    two = rows(DevicePipeline(x, y, 100, TWO, seed=5, augment=augment).epoch(2))
    loader = rows(([b[0]], [b[1]], [b[2]]) for b in LoaderPipeline(
        mx.gluon.data.ArrayDataset(x, y.astype(np.float32)), 64, seed=5, augment=augment).epoch(2))
    assert one.keys() == two.keys() == loader.keys() and len(one) == len(set(map(bytes, x)))
    for key, row in one.items():
        np.testing.assert_array_equal(row, two[key])
        np.testing.assert_array_equal(row, loader[key])
    resumed = list(DevicePipeline(x, y, 64, ONE, seed=5, augment=augment).epoch(2, start_batch=4))
    whole = list(DevicePipeline(x, y, 64, ONE, seed=5, augment=augment).epoch(2))[4:]
    for a, b in zip(resumed, whole):
        np.testing.assert_array_equal(a[2][0].asnumpy(), b[2][0].asnumpy())


def make_dp(ctx, augment="flip,crop=2,erase"):
    net = init_model("lenet", 0, ctx, fused_conv="off")
    block = Augment(parse_augment(augment), (1, 28, 28), [72.9]) if augment else None
    return DataParallel(net, ctx, "sgd", {"learning_rate": 0.05, "momentum": 0.9}, transform=fashion_transform(),
                        batch_size=128, augment=block)


def test_augmented_training_on_two_devices_matches_one_device(train_slice):
    x, y = (a[:1024] for a in train_slice)
    params = []
    for ctx in (ONE, TWO):
        dp = make_dp(ctx)
        for batch in DevicePipeline(x, y, 128, ctx, seed=3, augment=dp.inputs.augment).epoch(0):
            dp.step(*batch, return_loss=False)
        params.append(param_arrays(dp.net))
    plain = make_dp(ONE, augment=None)
    for batch in DevicePipeline(x, y, 128, ONE, seed=3).epoch(0):
        plain.step(*batch, return_loss=False)
    for name in params[0]:
        np.testing.assert_allclose(params[0][name], params[1][name], rtol=1e-4, atol=1e-6, err_msg=name)
    moved = max(np.abs(params[0][k] - param_arrays(plain.net)[k]).max() for k in params[0])
    assert moved > 1e-3  # the augmentation changed what was learned


def test_evaluation_is_not_augmented(train_slice):
    """The same parameters evaluate alike with and without --augment."""
    x, y = (a[:512] for a in train_slice)
    with_aug, without = make_dp(ONE), make_dp(ONE, augment=None)
    for batch in DevicePipeline(x, y, 128, ONE, augment=with_aug.inputs.augment).epoch(0):
        with_aug.step(*batch, return_loss=False)
    for mine, theirs in zip(without.net.collect_params().values(), with_aug.net.collect_params().values()):
        mine.set_data(theirs.data())
    a = with_aug.evaluate(DevicePipeline(x, y, 128, ONE, shuffle=False).epoch(0))
    b = without.evaluate(DevicePipeline(x, y, 128, ONE, shuffle=False).epoch(0))
    assert a == b


def test_a_user_loop_without_draws_gets_them_from_mxnet(train_slice):
    x, y = (nd.array(a[:256]) for a in train_slice)
    dp = make_dp(TWO)
    losses = [float(dp.step(x[:128], y[:128]).asscalar()) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses)


def test_augmented_run_learns_and_says_so_on_its_plan_line(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(["--devices", "cpu*2", "--limit", "2560", "--val-limit", "1000", "--batch-size", "64",
                       "--epochs", "3", "--augment", "flip,crop=2", "--quiet", "--out", out]) == 0
    assert "augment flip=0.5,crop=2" in capsys.readouterr().out.splitlines()[0]
    metrics = read_metrics(out)
    assert metrics["epochs"][-1]["val_acc"] > 0.6 and metrics["config"]["augment"] == "flip,crop=2"


def test_the_accuracy_page_names_every_component_and_preset():
    import os
    from gluon_gpu.data.augment import PRESETS
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "accuracy.md")).read()
    assert all(f"`{name}" in page for name in list(COMPONENTS) + list(PRESETS))


# -- the compiled gather ------------------------------------------------------------------

@pytest.mark.parametrize("text", ["basic", "flip,vflip,crop=3,translate=0.2", "rotate=30,flip", "strong",
                                  "flip,crop=2,jitter=0.3"])
@pytest.mark.parametrize("channels,dtype", [(1, "uint8"), (3, "uint8"), (3, "float32")])
def test_the_compiled_gather_gives_the_graphs_images_exactly(text, channels, dtype):
    from gluon_gpu.models import fused_conv
    assert fused_conv.compiled_gather("auto", ONE)  # builds (or finds) the library here
    images = nd.array(np.random.default_rng(1).integers(0, 256, (64, channels, 20, 24)), dtype=dtype)
    outs = []
    for compiled in (False, True):
        block = Augment(parse_augment(text), images.shape[1:], [80.0] * channels, clip_max=255, compiled=compiled)
        block.initialize()
        block.hybridize(static_alloc=True, static_shape=True)
        outs.append(block(images, nd.array(block.table(64, 3, 2))).asnumpy())
    assert outs[0].dtype == outs[1].dtype == np.float32
    np.testing.assert_array_equal(outs[1], outs[0])
    assert (outs[1] != images.asnumpy().astype(np.float32)).mean() > 0.05  # it moved pixels


def test_a_cpu_run_gathers_with_the_compiled_operator_unless_told_off(tmp_path):
    from gluon_gpu.models import fused_conv
    from gluon_gpu.programs.config import RunConfig
    from gluon_gpu.programs.run import build_run
    assert not fused_conv.compiled_gather("auto", [mx.gpu(0)])  # GPUs: the graph
    with pytest.MonkeyPatch.context() as patch:  # no library: auto takes the graph, on says why
        patch.setattr(fused_conv, "_state", {"loaded": False, "error": "no C++ compiler 'x'", "warned": True})
        assert not fused_conv.compiled_gather("auto", ONE)
        with pytest.raises(UserError, match="^`fused_conv` on: no C\\+\\+ compiler 'x'$"):
            fused_conv.compiled_gather("on", ONE)
    for mode, compiled in (("auto", True), ("off", False)):
        run = build_run(RunConfig(devices="cpu", augment="basic", fused_conv=mode, limit=256, val_limit=64,
                                  quiet=True, out=str(tmp_path / mode)), ONE)
        assert run.dp.inputs.augment.compiled is compiled


def test_blocks_made_one_after_another_say_no_false_initializer_warning():
    """MXNet names a Constant's initializer by the Constant's id: a new one at a freed
    one's address warned 'is overriding existing initializer' (#54, in every suite)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(300):
            Augment(parse_augment("strong"), (1, 8, 8), [0.0])
    assert not [w for w in caught if "overriding existing initializer" in str(w.message)]


def test_the_library_is_asked_for_only_when_the_augmentation_gathers():
    from gluon_gpu.data.augment import make_augment
    asked = []
    spec = type("Spec", (), {"mean": [72.9], "scale": 1.0, "input_shape": (1, 8, 8), "dtype": "uint8"})()
    assert not make_augment("jitter,erase", spec, lambda: asked.append(1) or True).compiled and asked == []
    assert make_augment("basic", spec, lambda: asked.append(1) or True).compiled and asked == [1]
    assert not make_augment("basic", spec).compiled  # a Python API caller: the operators' graph
