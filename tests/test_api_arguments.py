"""The public Python API checks its arguments (issue #53): DataParallel, its step and
evaluate say in one TypeError or ValueError what was wrong and what they take, instead
of MXNet's error from inside a step or a run that learns nothing."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd

from gluon_gpu import Batch, DataParallel
from gluon_gpu.core.loop.callbacks import Callback
from gluon_gpu.core.loop.fit import fit
from gluon_gpu.core.step.heads import Classification, Head

from failure_table import table_exit
from test_checkpoints import REPO

CPU2 = [mx.cpu(0), mx.cpu(1)]


def dense(outputs=3):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(outputs, in_units=4))
    net.initialize(ctx=CPU2)
    return net


@pytest.mark.parametrize("ctx,error,message", [
    ([], ValueError, "ctx: at least one device, got an empty list"),
    ([mx.cpu(0), mx.cpu(0)], ValueError, r"ctx: cpu\(0\) given twice"),
    ("cpu", TypeError, "ctx: a list of MXNet contexts"),
    ([mx.cpu(0), "cpu(1)"], TypeError, "ctx: a list of MXNet contexts")])
def test_bad_devices_are_one_error_naming_ctx(ctx, error, message):
    with pytest.raises(error, match=message):
        DataParallel(dense(), ctx, "sgd", {"learning_rate": 0.1})


def test_a_network_is_a_block_with_parameters():
    with pytest.raises(ValueError, match="net: HybridSequential has no parameters to train"):
        DataParallel(gluon.nn.HybridSequential(), CPU2)
    with pytest.raises(TypeError, match="net: a gluon.Block"):
        DataParallel(lambda x: x, CPU2)


def test_a_numpy_batch_trains_float64_as_float32():
    dp = DataParallel(dense(), CPU2, "sgd", {"learning_rate": 0.1}, head=Classification(3))
    x = np.random.default_rng(0).standard_normal((8, 4))  # float64, as numpy makes it
    loss = dp.step(x, np.array([0, 1, 2, 0, 1, 2, 0, 1]))
    assert np.isfinite(loss.asscalar()) and dp.evaluate([(x, np.zeros(8))])["samples"] == 8


@pytest.mark.parametrize("data,label,error,message", [
    (np.zeros((32, 4)), np.zeros(20), ValueError, "32 samples but 20 labels"),
    ([[1.0] * 4] * 8, np.zeros(8), TypeError, "data: an MXNet or numpy array .or a list of per-device shards., got list"),
    (np.zeros((8, 4)), "labels", TypeError, "label: an MXNet or numpy array .or a list of per-device shards., got str"),
    (np.zeros((8, 4)), np.full(8, 7), ValueError, "label: 7 is no class of this head's 3 .0 to 2."),
    (np.zeros((8, 4)), np.full(8, -1), ValueError, "label: -1 is no class"),
    (np.zeros((8, 4)), np.full(8, 0.5), ValueError, "label: 0.5 is no class")])
def test_a_bad_batch_is_one_error_before_any_step(data, label, error, message):
    net = dense()
    before = net[0].weight.data(mx.cpu(0)).asnumpy().copy()
    dp = DataParallel(net, CPU2, "sgd", {"learning_rate": 0.1}, head=Classification(3))
    with pytest.raises(error, match=message):
        dp.step(data, label)
    assert np.array_equal(net[0].weight.data(mx.cpu(0)).asnumpy(), before)  # nothing trained


def test_a_script_that_misuses_the_api_ends_in_one_error_line():
    script = "import mxnet as mx\nfrom mxnet import gluon\nfrom gluon_gpu import DataParallel\n" \
             "DataParallel(gluon.nn.Dense(3, in_units=4), [mx.cpu(0), mx.cpu(0)])\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert table_exit("the Python API given what it cannot take", done.returncode)
    assert done.stderr.strip().splitlines()[-1].startswith("ValueError: ctx: cpu(0) given twice")


def test_shards_come_as_two_lists_of_one_length():
    dp = DataParallel(dense(), CPU2, "sgd", {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="two lists of the same length"):
        dp.step([nd.zeros((4, 4), ctx=c) for c in CPU2], nd.zeros(8))


def mean_loss(out, y):
    return gluon.loss.SoftmaxCrossEntropyLoss()(out, y).mean()


@pytest.mark.parametrize("head,message", [
    (Head(mean_loss), r"head: its loss gave shape \(1,\) for 2 samples"),
    (Head(gluon.loss.SoftmaxCrossEntropyLoss(), {"acc": lambda F, out, y: F.mean(F.argmax(out, axis=-1) == y)}),
     r"head: its metric 'acc' gave shape \(1,\) for 2 samples")])
def test_a_custom_head_gives_one_value_per_sample_or_one_error(head, message):
    net = dense()
    before = net[0].weight.data(mx.cpu(0)).asnumpy().copy()
    dp = DataParallel(net, CPU2, "sgd", {"learning_rate": 0.1}, head=head)
    with pytest.raises(ValueError, match=message):
        dp.step(np.zeros((8, 4)), np.zeros(8))
    assert np.array_equal(net[0].weight.data(mx.cpu(0)).asnumpy(), before)  # nothing trained


def test_a_custom_head_per_sample_trains():
    head = Head(gluon.loss.SoftmaxCrossEntropyLoss(), {"acc": lambda F, out, y: F.argmax(out, axis=-1) == y})
    dp = DataParallel(dense(), CPU2, "sgd", {"learning_rate": 0.5}, head=head)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)  # learnable from the first feature
    for _ in range(30):
        dp.step(x, y)
    assert dp.evaluate([(x, y)])["acc"] > 0.9


@pytest.mark.parametrize("fields,message", [
    (("pixels", np.zeros(8)), "Batch data: an MXNet or numpy array or a list of per-device shards, got str"),
    ((np.zeros((8, 4)), None), "Batch label: an MXNet or numpy array or a list of per-device shards, got NoneType"),
    ((np.zeros((8, 4)), np.zeros(8), 0.5), r"Batch augmentation: .* \(or None\), got float")])
def test_a_batch_takes_arrays_or_shards(fields, message):
    with pytest.raises(TypeError, match=message):
        Batch(*fields)


def test_augmentation_for_a_data_parallel_without_augment_is_refused():
    dp = DataParallel(dense(), CPU2, "sgd", {"learning_rate": 0.1}, head=Classification(3))
    with pytest.raises(ValueError, match="augmentation: parameters for a DataParallel made without `augment`"):
        dp.step(np.zeros((8, 4)), np.zeros(8), augmentation=np.zeros((8, 3)))


@pytest.mark.parametrize("callbacks,message", [
    (Callback, "callbacks: a list of Callback objects, got type"),
    ([Callback], r"callbacks: each a Callback object .*, got the class Callback \(an object of it is wanted\)"),
    ([print], "callbacks: each a Callback object .*, got builtin_function_or_method")])
def test_callbacks_are_callback_objects_or_one_error_before_any_step(callbacks, message):
    net = dense()
    before = net[0].weight.data(mx.cpu(0)).asnumpy().copy()
    dp = DataParallel(net, CPU2, "sgd", {"learning_rate": 0.1}, head=Classification(3))
    with pytest.raises(TypeError, match=message):
        fit(dp, [(np.zeros((8, 4)), np.zeros(8))], [], 1, callbacks=callbacks)
    assert np.array_equal(net[0].weight.data(mx.cpu(0)).asnumpy(), before)
