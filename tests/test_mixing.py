"""Mixup and CutMix (issue #26): the loss equals a hand computation, the partners and
weights are a function of (seed, epoch, sample), and mixed training keeps 1 device = 2
devices; evaluation and the metrics use the samples' own labels."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd

from gluon_gpu import Batch, DataParallel
from gluon_gpu.core.step.graph import make_step_graph
from gluon_gpu.core.step.heads import Classification
from gluon_gpu.core.step.precision import precision_for
from gluon_gpu.data import DevicePipeline, LoaderPipeline
from gluon_gpu.data.mixing import Mixing
from gluon_gpu.models import init_model

from conftest import fashion_transform, param_arrays

ONE, TWO = [mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]


def smoothed_cross_entropy(logits, label, eps, classes=10):
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    target = np.full(logits.shape, eps / classes)
    target[np.arange(len(label)), label.astype(int)] += 1 - eps
    return -(target * log_p).sum(axis=1)


def mixed_step(kind, pairs, labels, params, eps=0.1):
    """The loss sum and accuracy sum a training graph computes for a mixed batch."""
    net = gluon.nn.Dense(10, in_units=int(np.prod(pairs.shape[2:])))
    net.initialize(mx.init.Normal(0.5))
    mixing = Mixing(kind, 1.0, pairs.shape[2:])
    mixing.initialize()
    graph = make_step_graph(net, Classification(10, label_smoothing=eps), None, precision_for("float32"), 1, False,
                            True, mixing=mixing)
    loss, stats = graph(nd.array(pairs), nd.array(labels), nd.array(params))
    return net, loss.asscalar(), stats.asnumpy()


def test_mixup_loss_is_lam_times_each_labels_smoothed_loss():
    rng = np.random.default_rng(0)
    pairs = rng.random((6, 2, 1, 4, 4)).astype(np.float32)
    labels = rng.integers(0, 10, (6, 2)).astype(np.float32)
    lam = rng.random((6, 1)).astype(np.float32)
    net, loss, stats = mixed_step("mixup", pairs, labels, lam)
    mixed = lam[:, :, None, None] * pairs[:, 0] + (1 - lam[:, :, None, None]) * pairs[:, 1]
    logits = net(nd.array(mixed)).asnumpy()
    want = lam[:, 0] * smoothed_cross_entropy(logits, labels[:, 0], 0.1) \
        + (1 - lam[:, 0]) * smoothed_cross_entropy(logits, labels[:, 1], 0.1)
    assert loss == pytest.approx(want.sum(), rel=1e-5)
    assert stats[1] == (logits.argmax(axis=1) == labels[:, 0]).sum()  # accuracy: the own, hard label


def test_cutmix_pastes_the_partners_box_and_weighs_by_the_area_left():
    rng = np.random.default_rng(1)
    pairs = rng.random((4, 2, 3, 6, 8)).astype(np.float32)
    labels = rng.integers(0, 10, (4, 2)).astype(np.float32)
    boxes = np.array([[0, 0, 6, 8], [1, 2, 4, 5], [0, 0, 0, 0], [5, 7, 6, 8]], np.float32)  # top left bottom right
    lam = 1 - (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / 48
    net, loss, _ = mixed_step("cutmix", pairs, labels, np.column_stack([lam, boxes]), eps=0.0)
    mixed = pairs[:, 0].copy()
    for i, (t, l, b, r) in enumerate(boxes.astype(int)):
        mixed[i, :, t:b, l:r] = pairs[i, 1, :, t:b, l:r]
    logits = net(nd.array(mixed)).asnumpy()
    want = lam * smoothed_cross_entropy(logits, labels[:, 0], 0) + (1 - lam) * smoothed_cross_entropy(
        logits, labels[:, 1], 0)
    assert loss == pytest.approx(want.sum(), rel=1e-5)


def test_partners_and_weights_are_a_function_of_seed_epoch_and_sample():
    mixing = Mixing("cutmix", 1.0, (1, 28, 28), off_from=3)
    partner, params = mixing.table(500, seed=4, epoch=1)
    again = mixing.table(500, seed=4, epoch=1)
    np.testing.assert_array_equal(partner, again[0])
    np.testing.assert_array_equal(params, again[1])
    assert not np.array_equal(partner, mixing.table(500, seed=4, epoch=2)[0])
    assert sorted(partner) == list(range(500)) and mixing.table(500, 4, 3) is None  # off from epoch 4
    lam, top, left, bottom, right = params.T
    np.testing.assert_allclose(lam, 1 - (bottom - top) * (right - left) / 784, atol=1e-6)
    assert ((0 <= top) & (top <= bottom) & (bottom <= 28) & (0 <= left) & (left <= right) & (right <= 28)).all()


def test_device_and_loader_pipelines_pair_the_same_samples(train_slice):
    x, y = (a[:300] for a in train_slice)
    mixing = Mixing("mixup", 0.4, (1, 28, 28))

    def pairs(batches):  # own image -> (partner image, mixing row)
        seen = {}
        for data, _, _, mix in batches:
            for xs, ms in zip(data, mix):
                for pair, row in zip(xs.asnumpy(), ms.asnumpy()):
                    seen[pair[0].tobytes()] = (pair[1].tobytes(), row[0])
        return seen
    one = pairs(DevicePipeline(x, y, 64, ONE, seed=2, mixing=mixing).epoch(1))
    two = pairs(DevicePipeline(x, y, 100, TWO, seed=2, mixing=mixing).epoch(1))
    loader = pairs(([b[0]], [b[1]], None, [b[3]]) for b in LoaderPipeline(
        gluon.data.ArrayDataset(x, y.astype(np.float32)), 64, seed=2, mixing=mixing).epoch(1))
    assert one == two == loader and len(one) == len(set(map(bytes, x)))


def test_pipelines_yield_batches_by_name_and_a_plain_one_unpacks_as_a_pair(train_slice):
    x, y = (a[:256] for a in train_slice)
    mixing = Mixing("mixup", 0.4, (1, 28, 28))
    dataset = gluon.data.ArrayDataset(x, y.astype(np.float32))
    for pipeline in (DevicePipeline(x, y, 64, TWO), LoaderPipeline(dataset, 64)):
        batch = next(iter(pipeline.epoch(0)))
        data, label = batch  # a user loop's `for x, y in pipeline.epoch(e)`
        assert isinstance(batch, Batch) and (data, label) == (batch.data, batch.label)
        assert batch.augmentation is None and batch.mixing is None
    for pipeline in (DevicePipeline(x, y, 64, TWO, seed=2, mixing=mixing),
                     LoaderPipeline(dataset, 64, seed=2, mixing=mixing)):
        batch = next(iter(pipeline.epoch(1)))
        assert len(batch) == 4 and batch.augmentation is None and batch.mixing is batch[3] is not None


def test_mixed_training_on_two_devices_matches_one_device(train_slice):
    x, y = (a[:1024] for a in train_slice)
    params = []
    for ctx in (ONE, TWO):
        mixing = Mixing("mixup", 0.4, (1, 28, 28))
        dp = DataParallel(init_model("lenet", 0, ctx, fused_conv="off"), ctx, "sgd",
                          {"learning_rate": 0.05, "momentum": 0.9}, transform=fashion_transform(), batch_size=128,
                          mixing=mixing)
        for batch in DevicePipeline(x, y, 128, ctx, seed=3, mixing=mixing).epoch(0):
            dp.step(*batch, return_loss=False)
        params.append(param_arrays(dp.net))
    for name in params[0]:
        np.testing.assert_allclose(params[0][name], params[1][name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_mixing_is_refused_for_regression():
    from gluon_gpu.core.platform.errors import UserError
    from gluon_gpu.data import DataSpec
    from gluon_gpu.data.mixing import make_mixing
    spec = DataSpec("npz", "regress", (1, 8, 8), 1, [0.0], [1.0], "float32")
    with pytest.raises(UserError, match="`mixup` mixes class labels; this data is task regress"):
        make_mixing(0.2, 0.0, 0, 10, spec)
    assert make_mixing(0.0, 0.0, 0, 10, spec) is None
