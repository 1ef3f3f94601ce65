"""Gradient accumulation and clipping (issue #16) through DataParallel: exact against
their definitions, on one device and on two."""
import mxnet as mx
import numpy as np
import pytest

from gluon_gpu import DataParallel
from gluon_gpu.data import DevicePipeline
from gluon_gpu.models import init_model

from conftest import fashion_transform, param_arrays

ONE, TWO = [mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]


def make_dp(ctx, batch_size, **kw):
    net = init_model("lenet", 0, ctx, fused_conv="off")  # no BatchNorm: accumulation is exact
    return DataParallel(net, ctx, "sgd", {"learning_rate": 0.05, "momentum": 0.9}, transform=fashion_transform(),
                        batch_size=batch_size, **kw)


def run(dp, train_slice, batch_size, n, flush_last=False):
    x, y = train_slice
    batches = list(DevicePipeline(x[:n], y[:n], batch_size, dp.ctx).epoch(0))
    for i, (xs, ys) in enumerate(batches, 1):
        dp.step(xs, ys, return_loss=False, flush=flush_last and i == len(batches))
    return param_arrays(dp.net)


def assert_close(a, b, rtol=2e-5, atol=2e-6):
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("ctx", [ONE, TWO], ids=["cpu", "cpu*2"])
def test_four_accumulated_batches_of_64_are_one_step_of_256(train_slice, ctx):
    """Three updates each way, and an epoch end that flushes a short group (1000 samples:
    3 full groups, then 232 = 3 batches and a part) scaled as the big batch's short last one."""
    accumulated = run(make_dp(ctx, 64, accumulate=4), train_slice, 64, 1000, flush_last=True)
    big = run(make_dp(ctx, 256), train_slice, 256, 1000)
    assert_close(accumulated, big)
    plain = run(make_dp(ctx, 64), train_slice, 64, 1000)  # not the same as 16 small steps
    assert not np.allclose(plain["0.weight"], big["0.weight"], rtol=1e-3)


def test_an_update_happens_every_n_batches_only(train_slice):
    dp = make_dp(ONE, 64, accumulate=3)
    before = param_arrays(dp.net)
    after_two = run(dp, train_slice, 64, 128)
    assert_close(after_two, before, rtol=0, atol=0)  # two batches summed, nothing applied
    assert dp.pending_batches == 2
    dp.step(*next(iter(DevicePipeline(*[a[:64] for a in train_slice], 64, ONE).epoch(0))), return_loss=False)
    assert dp.pending_batches == 0 and not np.array_equal(param_arrays(dp.net)["0.weight"], before["0.weight"])


def test_clipping_bounds_the_update_and_keeps_replicas_identical(train_slice):
    """SGD without momentum, lr 1: an update is -(clipped mean gradient), so its global
    norm is the clip norm when the gradient is larger; both devices hold the same."""
    norm = 0.01
    net = init_model("lenet", 0, TWO, fused_conv="off")
    dp = DataParallel(net, TWO, "sgd", {"learning_rate": 1.0}, transform=fashion_transform(), batch_size=128,
                      clip_grad=norm)
    for _ in range(3):
        before = param_arrays(dp.net)
        after = run(dp, train_slice, 128, 128)
        moved = np.sqrt(sum(np.sum((after[k] - before[k]) ** 2) for k in before))
        assert moved == pytest.approx(norm, rel=1e-3)
    for p in dp.net.collect_params().values():
        np.testing.assert_array_equal(p.data(TWO[0]).asnumpy(), p.data(TWO[1]).asnumpy(), err_msg=p.name)
    unclipped = DataParallel(init_model("lenet", 0, TWO, fused_conv="off"), TWO, "sgd", {"learning_rate": 1.0},
                             transform=fashion_transform(), batch_size=128)
    before = param_arrays(unclipped.net)
    after = run(unclipped, train_slice, 128, 128)
    assert np.sqrt(sum(np.sum((after[k] - before[k]) ** 2) for k in before)) > 10 * norm  # it did clip


# -- through the train CLI: schedules, resume, early stopping, logs, bad input -----------
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from gluon_gpu.programs import evaluate, train  # noqa: E402
from gluon_gpu.programs.config import RunConfig  # noqa: E402
from gluon_gpu.programs.run import lr_scheduler  # noqa: E402

from conftest import read_metrics  # noqa: E402
from test_checkpoints import REPO, SMALL, assert_same_run, checkpoint_names, stopped_after  # noqa: E402

FEATURES = ["--accumulate", "3", "--warmup-epochs", "1", "--warmup-lr", "0.01", "--clip-grad", "0.5",
            "--label-smoothing", "0.1", "--wd", "1e-3", "--no-wd", "--augment", "flip,crop=2,erase", "--mixup", "0.2",
            "--mixup-off-epochs", "1", "--ema", "0.9"]


@pytest.mark.parametrize("mode", ["constant", "step", "cosine"])
def test_warmup_is_linear_then_the_schedule_as_without_it(mode):
    """Update t (from 1) of W = warmup epochs x updates per epoch: warmup_lr + (lr -
    warmup_lr) * t / (W - 1) up to t = W - 1, then --lr-mode laid over the epochs after
    warmup, starting at --lr."""
    iters, lr, warmup_lr = 10, 0.1, 0.02
    config = RunConfig(lr=lr, lr_mode=mode, epochs=5, warmup_epochs=2, warmup_lr=warmup_lr,
                       lr_decay_epoch="4", lr_decay=0.5)
    schedule = lr_scheduler(config, iters)
    w = 2 * iters
    for t in range(1, w):
        assert schedule(t) == pytest.approx(warmup_lr + (lr - warmup_lr) * t / (w - 1)), t
    assert schedule(w) == pytest.approx(lr)
    after = [schedule(t) for t in range(w, 5 * iters + 1)]
    if mode == "constant":
        assert after == pytest.approx([lr] * len(after))
    elif mode == "step":  # the decay at absolute epoch 4: update 4 x iters on
        assert [schedule(t) for t in (4 * iters - 1, 4 * iters, 4 * iters + 1)] == pytest.approx([lr, lr * 0.5, lr * 0.5])
    else:
        assert all(a >= b for a, b in zip(after, after[1:])) and after[-1] < 0.01 * lr


def test_the_new_flags_resume_exactly_from_a_stop_mid_epoch(tmp_path):
    """Accumulation, warmup, clipping, label smoothing, --no-wd, --augment, --mixup (off in epoch 3) and --ema
    together: a run stopped by SIGINT in epoch 2 (at an update boundary) and resumed ends with the straight run's
    parameters, moving average and figures."""
    straight, out = str(tmp_path / "straight"), str(tmp_path / "run")
    assert train.main(SMALL + FEATURES + ["--epochs", "3", "--out", straight]) == 0
    proc, _, err = stopped_after(SMALL + FEATURES + ["--epochs", "3", "--log-interval", "1", "--out", out], 25,
                                 signal.SIGINT, str(tmp_path / "held"))  # epoch 2, batch 5 of 20: inside a sum
    assert proc.returncode == 130, err
    newest = checkpoint_names(out)[-1]
    assert newest == "epoch-00001-batch-0000006"  # at the next update, never inside a sum
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(straight, out)


@pytest.fixture(scope="module")
def plateau(tmp_path_factory):
    """A run whose validation figure cannot move (lr 1e-9), with early stopping and logs."""
    out = str(tmp_path_factory.mktemp("plateau") / "run")
    code = train.main(["--devices", "cpu", "--limit", "640", "--batch-size", "64", "--quiet", "--lr", "1e-9",
                       "--epochs", "10", "--early-stop", "2", "--monitor", "val-loss", "--tensorboard",
                       "--log-steps", "--log-interval", "4", "--out", out])
    assert code == 0
    return out


def test_early_stopping_stops_a_plateau_and_keeps_the_best(plateau, capsys):
    m = read_metrics(plateau)
    assert m["status"] == "early-stopped" and len(m["epochs"]) == 3  # epoch 1 best, then 2 without gain
    assert m["best"] == {"monitor": "val-loss", "epoch": 1, "value": m["epochs"][0]["val_loss"], "weights": "raw"}
    assert evaluate.main(["--params", os.path.join(plateau, "best.params"), "--devices", "cpu"]) == 0
    capsys.readouterr()
    assert train.main(["--resume", plateau]) == 0  # says so, trains nothing
    said = capsys.readouterr().out
    assert "stopped early after epoch 3: val-loss has not improved since epoch 1" in said
    assert len(read_metrics(plateau)["epochs"]) == 3


def test_best_params_follow_the_best_epoch(tmp_path):
    out = str(tmp_path / "run")
    assert train.main(SMALL + ["--epochs", "3", "--out", out]) == 0
    m = read_metrics(out)
    best = max(m["epochs"], key=lambda r: r["val_acc"])
    assert m["best"]["epoch"] == best["epoch"]
    if best["epoch"] == 3:
        want = mx.nd.load(os.path.join(out, "net.params"))
    else:
        want = mx.nd.load(os.path.join(out, "checkpoints", f"epoch-{best['epoch']:05d}-batch-0000000", "net.params"))
    got = mx.nd.load(os.path.join(out, "best.params"))
    for k in want:
        np.testing.assert_array_equal(got[k].asnumpy(), want[k].asnumpy(), err_msg=k)


def read_events(directory):
    """``{tag: [(step, value)]}`` from tensorboardX's event files (TFRecord framing)."""
    from tensorboardX.proto import event_pb2
    found = {}
    for name in os.listdir(directory):
        data, pos = open(os.path.join(directory, name), "rb").read(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_tensorboard_events_and_metrics_csv_read_back(plateau):
    events = read_events(os.path.join(plateau, "tb"))
    for tag in ("train/loss", "train/acc", "val/loss", "val/acc", "val/top5", "lr", "samples_per_s"):
        assert [step for step, _ in events[tag]] == [1, 2, 3], tag
    history = read_metrics(plateau)["epochs"]
    assert [v for _, v in events["val/loss"]] == pytest.approx([r["val_loss"] for r in history])
    assert [s for s, _ in events["step/train_loss"]] == [4, 8, 10, 14, 18, 20, 24, 28, 30]  # 10 batches an epoch
    import csv
    rows = list(csv.DictReader(open(os.path.join(plateau, "metrics.csv"))))
    assert [(r["kind"], r["epoch"], r["batch"]) for r in rows[:4]] == [("step", "1", "4"), ("step", "1", "8"),
                                                                       ("step", "1", "10"), ("epoch", "1", "")]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert [float(r["val_loss"]) for r in epochs] == pytest.approx([r["val_loss"] for r in history])


@pytest.mark.parametrize("flags, message", [
    (["--accumulate", "0"], "--accumulate: must be a positive integer"),
    (["--warmup-epochs", "3", "--epochs", "3"], "--warmup-epochs 3 leaves no epoch"),
    (["--clip-grad", "-1"], "--clip-grad: must be a positive number"),
    (["--monitor", "val-mse"], "--monitor val-mse: this run reports val-loss, val-acc, val-top5"),
    # the accuracy flags (test_augment, test_mixing, test_ema, test_recipes)
    (["--augment", "blur"], "--augment 'blur': unknown component"),
    (["--augment", "flip", "--ensemble", "2", "--mixup", "0.2"], "--augment with --mixup or --cutmix applies to one"),
    (["--mixup", "0.2", "--cutmix", "1"], "--mixup and --cutmix are two ways to mix; choose one"),
    (["--mixup-off-epochs", "1"], "--mixup-off-epochs needs --mixup or --cutmix"),
    (["--mixup", "0.2", "--mixup-off-epochs", "3", "--epochs", "3"], "--mixup-off-epochs 3 leaves no epoch mixed"),
    (["--ema", "1"], "--ema: must be from 0 to below 1"),
    (["--ema", "0.99", "--ensemble", "2"], "--ema does not apply to an --ensemble or a --sweep yet"),
    (["--recipe", "resnet9000"], "unknown --recipe 'resnet9000': choose one of lenet"),
])
def test_bad_training_flags_are_one_line_and_exit_2(flags, message, capsys, tmp_path):
    assert train.main(["--devices", "cpu", "--limit", "640", "--dry-run", "--out", str(tmp_path / "r")] + flags) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_an_unwritable_tensorboard_directory_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "tb").write_text("a file where the directory goes")  # unwritable even for root
    assert train.main(["--devices", "cpu", "--limit", "640", "--epochs", "1", "--quiet", "--tensorboard",
                       "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tensorboard: cannot write to" in err, err


def test_sync_bn_on_a_model_without_batchnorm_is_a_warning(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--devices", "cpu*2", "--limit", "640",
                           "--sync-bn", "--model", "lenet", "--dry-run", "--out", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == ["gluon_gpu.train: warning: --sync-bn: lenet has no BatchNorm "
                                                "layer; nothing to synchronize"]


def test_sync_bn_on_two_devices_matches_one_device_with_the_whole_batch(tmp_path, capsys):
    """ResNet-20 (BatchNorm after every conv), one step of 64: on cpu*2 each device
    normalizes its 32 alone unless --sync-bn makes the statistics those of all 64. The
    synced run's file then evaluates as the plain network's."""
    def run(devices, *flags):
        out = str(tmp_path / (devices.replace("*", "x") + "".join(flags)))
        done = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--model", "cifar_resnet20_v1",
                               "--devices", devices, "--batch-size", "64", "--limit", "64", "--val-limit", "256",
                               "--epochs", "1", "--lr", "0.1", "--quiet", "--out", out, *flags], cwd=REPO, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
        assert done.returncode == 0, done.stderr
        return out, {k: v.asnumpy() for k, v in mx.nd.load(os.path.join(out, "net.params")).items()}
    (_, whole), (synced_run, synced), (_, apart) = run("cpu"), run("cpu*2", "--sync-bn"), run("cpu*2")

    def distance(a):
        return max(float(np.max(np.abs(a[k] - whole[k]))) for k in whole)
    assert distance(synced) < 5e-3 and distance(apart) > 10 * distance(synced), (distance(synced), distance(apart))
    assert evaluate.main(["--params", os.path.join(synced_run, "net.params"), "--devices", "cpu"]) == 0
    assert "acc" in capsys.readouterr().out


def test_sync_bn_resumes_exactly(tmp_path):
    """--sync-bn on cpu*2: 2 epochs straight, and 1 epoch then --resume to 2, end alike."""
    def train_cli(*args):
        done = subprocess.run([sys.executable, "-m", "gluon_gpu.train", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
        assert done.returncode == 0, done.stderr
    flags = ["--model", "cifar_resnet20_v1", "--devices", "cpu*2", "--sync-bn", "--batch-size", "64",
             "--limit", "128", "--val-limit", "256", "--lr", "0.05", "--momentum", "0.9", "--quiet"]
    straight, out = str(tmp_path / "straight"), str(tmp_path / "run")
    train_cli(*flags, "--epochs", "2", "--out", straight)
    train_cli(*flags, "--epochs", "1", "--out", out)
    train_cli("--resume", out, "--epochs", "2", "--quiet")
    assert_same_run(straight, out)


def test_profile_writes_a_chrome_trace_of_n_steps_after_warm_up(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(["--devices", "cpu*2", "--limit", "1280", "--batch-size", "64", "--epochs", "1", "--quiet",
                       "--profile", "5", "--out", out]) == 0  # 20 steps: 10 of warm-up, 5 profiled
    assert f"profile of 5 steps in {out}/profile.json" in capsys.readouterr().out
    trace = json.load(open(os.path.join(out, "profile.json")))
    names = {e.get("name") or "" for e in trace["traceEvents"]}
    assert any("FullyConnected" in n for n in names), sorted(names)  # LeNet's operators (fused in the graph)
    assert "KVStoreReduce" in names  # and the exchange between the two devices
    table = open(os.path.join(out, "profile.txt")).read()
    assert table.startswith("5 steps after 10 of warm-up") and "operator" in table.lower()


def test_profile_0_is_one_line(capsys, tmp_path):
    assert train.main(["--devices", "cpu", "--profile", "0", "--dry-run", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--profile: must be a positive integer" in err


def test_logs_of_a_resumed_run_are_those_of_a_straight_one(tmp_path):
    """--log-steps rows and TensorBoard steps survive a Ctrl-C and --resume: the same
    positions as an uninterrupted run, the same figures."""
    import csv
    flags = SMALL + ["--epochs", "3", "--log-steps", "--log-interval", "5", "--tensorboard"]
    straight, out = str(tmp_path / "straight"), str(tmp_path / "run")
    assert train.main(flags + ["--out", straight]) == 0
    proc, _, err = stopped_after(flags + ["--out", out], 25, signal.SIGINT, str(tmp_path / "held"))  # epoch 2
    assert proc.returncode == 130, err
    assert train.main(["--resume", out, "--quiet"]) == 0

    def rows(run):
        return [(r["kind"], r["epoch"], r["batch"], float(r["train_loss"]))
                for r in csv.DictReader(open(os.path.join(run, "metrics.csv")))]
    want, got = rows(straight), rows(out)
    assert [r[:3] for r in got] == [r[:3] for r in want] and len(want) == 3 * 4 + 3  # 4 reads an epoch, 3 epochs
    assert [r[3] for r in got] == pytest.approx([r[3] for r in want], rel=1e-4)
    steps = sorted(s for s, _ in read_events(os.path.join(out, "tb"))["step/train_loss"])
    assert steps == sorted(s for s, _ in read_events(os.path.join(straight, "tb"))["step/train_loss"])


# -- label smoothing and --no-wd (GluonCV's recipes) ------------------------------------
def test_label_smoothing_is_the_smoothed_cross_entropy_in_training_only():
    """The training loss is cross-entropy against 1-EPS+EPS/K on the class and EPS/K on
    each class; evaluation's loss and every metric keep the labels as they are."""
    from gluon_gpu.core.step.heads import Classification, head_for
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(0, 3, (6, 10)).astype(np.float32), np.array([0, 3, 9, 1, 1, 5], np.float32)
    head, plain = Classification(10, label_smoothing=0.1), Classification(10)
    smoothed, metrics = head.per_sample(mx.nd, mx.nd.array(logits), mx.nd.array(labels), training=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    target = np.full((6, 10), 0.01)
    target[np.arange(6), labels.astype(int)] = 0.91
    np.testing.assert_allclose(smoothed.asnumpy(), -(target * log_p).sum(axis=1), rtol=1e-5)
    for training in (False, True):
        for a, b in zip(metrics, plain.per_sample(mx.nd, mx.nd.array(logits), mx.nd.array(labels), training)[1]):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    np.testing.assert_allclose(head.per_sample(mx.nd, mx.nd.array(logits), mx.nd.array(labels))[0].asnumpy(),
                               -log_p[np.arange(6), labels.astype(int)], rtol=1e-5)
    with pytest.raises(ValueError, match="classification"):
        head_for("regress", label_smoothing=0.1)


def test_a_smoothed_run_learns_and_its_validation_loss_is_evaluate_s(tmp_path, capsys):
    """Trained with --label-smoothing 0.1, LeNet learns on a slice, and the run's last
    validation loss is the plain cross-entropy evaluate reports for its parameters."""
    out = str(tmp_path / "run")
    assert train.main(["--devices", "cpu*2", "--limit", "2560", "--batch-size", "64", "--epochs", "3",
                       "--label-smoothing", "0.1", "--quiet", "--out", out]) == 0
    last = read_metrics(out)["epochs"][-1]
    assert last["val_acc"] > 0.6 and read_metrics(out)["config"]["label_smoothing"] == 0.1
    capsys.readouterr()
    assert evaluate.main(["--params", os.path.join(out, "net.params"), "--devices", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert float(printed.split("validation loss ")[1].split()[0]) == pytest.approx(last["val_loss"], abs=1e-4)


def test_no_wd_takes_biases_and_batchnorm_out_of_weight_decay(tmp_path):
    """--no-wd: the optimizer decays ResNet-20's convolution and dense weights by --wd,
    and its biases, BatchNorm gammas and betas not at all."""
    from gluon_gpu.programs.run import build_run
    from gluon_gpu.core.platform.devices import parse_devices
    config = RunConfig(model="cifar_resnet20_v1", devices="cpu", limit=64, val_limit=64, wd=1e-4, no_wd=True,
                       out=str(tmp_path / "r"))
    trainer = build_run(config, parse_devices("cpu")).dp.trainer
    optimizer = trainer._optimizer  # pylint: disable=protected-access
    decay = {param.name: optimizer._get_wd(i) for i, param in enumerate(trainer._params)}  # noqa
    spared = {name for name, wd in decay.items() if wd == 0}
    assert spared == {name for name in decay if name.endswith(("bias", "gamma", "beta"))}
    assert {name.rsplit("_", 1)[1] for name in spared} == {"bias", "gamma", "beta"}
    assert all(wd == pytest.approx(1e-4) for name, wd in decay.items() if name not in spared)
    assert any(name.endswith("weight") for name in decay if name not in spared)
