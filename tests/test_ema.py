"""--ema (issue #26): the moving average of the weights equals its definition, is
validated and saved beside the weights, resumes exactly (test_training_features'
FEATURES), and best.params takes it when --monitor says it is better."""
import os

import mxnet as mx
import numpy as np
import pytest

from gluon_gpu import DataParallel
from gluon_gpu.core.loop.early_stopping import BestParams, Monitor
from gluon_gpu.core.loop.ema import WeightAverage
from gluon_gpu.core.step.params import read_parameter_file
from gluon_gpu.data import DevicePipeline
from gluon_gpu.models import init_model
from gluon_gpu.programs import evaluate, train

from conftest import fashion_transform, param_arrays, read_metrics

TWO = [mx.cpu(0), mx.cpu(1)]


def test_the_average_moves_after_each_update_only_by_its_definition(train_slice):
    x, y = (a[:512] for a in train_slice)
    dp = DataParallel(init_model("lenet", 0, TWO, fused_conv="off"), TWO, "sgd", {"learning_rate": 0.1},
                      transform=fashion_transform(), batch_size=64, accumulate=2)
    average = WeightAverage(dp, 0.8)
    want = param_arrays(dp.net)
    for i, batch in enumerate(DevicePipeline(x, y, 64, TWO, shuffle=False).epoch(0), 1):
        dp.step(*batch, return_loss=False)
        average.on_step(0, i)
        if i % 2 == 0:  # an update every second batch
            want = {k: 0.8 * want[k] + 0.2 * v for k, v in param_arrays(dp.net).items()}
    got = {k: v.asnumpy() for k, v in average.arrays().items()}
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
    own = param_arrays(dp.net)
    with average.swapped_in():  # every device holds the average inside the block, the weights after it
        for name, p in dp.net._collect_params_with_prefix().items():  # pylint: disable=protected-access
            for c in TWO:
                np.testing.assert_allclose(p.data(c).asnumpy(), want[name], rtol=1e-5, atol=1e-7, err_msg=name)
    for k, v in param_arrays(dp.net).items():
        np.testing.assert_array_equal(v, own[k])


def test_best_params_takes_the_average_when_its_figure_is_better(tmp_path):
    monitor = Monitor("val-acc", ("acc",))
    history = [{"epoch": 1, "val_acc": 0.80, "ema_val_acc": 0.70}, {"epoch": 2, "val_acc": 0.81, "ema_val_acc": 0.85}]
    assert monitor.best(history) is history[1] and monitor.from_average(history[1])
    assert not monitor.from_average(history[0]) and monitor.value(history[0]) == 0.80
    assert monitor.summary(history) == {"monitor": "val-acc", "epoch": 2, "value": 0.85, "weights": "ema"}
    lower = Monitor("val-loss", ())
    assert lower.from_average({"val_loss": 0.5, "ema_val_loss": 0.4}) and lower.value({"val_loss": 0.5}) == 0.5

    class Average:  # what BestParams asks of a WeightAverage
        def arrays(self):
            return {"w": mx.nd.array([1.0, 2.0])}
    path = str(tmp_path / "best.params")
    BestParams(path, net=None, monitor=monitor, average=Average()).on_epoch_end(history[1], history)
    np.testing.assert_array_equal(read_parameter_file(path)["w"].asnumpy(), [1.0, 2.0])


def test_an_ema_run_validates_and_saves_the_average_which_evaluate_loads(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(["--devices", "cpu*2", "--limit", "2560", "--batch-size", "64", "--epochs", "3", "--ema", "0.9",
                       "--quiet", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "ema 0.9" in printed.splitlines()[0] and "ema-val-acc" in printed
    last = read_metrics(out)["epochs"][-1]
    assert last["ema_val_acc"] > 0.6 and os.path.isfile(os.path.join(out, "checkpoints",
                                                                      "epoch-00003-batch-0000000", "ema.params"))
    assert evaluate.main(["--params", os.path.join(out, "ema.params"), "--devices", "cpu"]) == 0
    shown = capsys.readouterr().out
    assert float(shown.split("validation loss ")[1].split()[0]) == pytest.approx(last["ema_val_loss"], abs=1e-4)
