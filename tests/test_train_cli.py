"""The train and evaluate CLIs end to end on real FashionMNIST slices, and their errors."""
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from gluon_gpu import load_model
from gluon_gpu.programs import evaluate, train
from gluon_gpu.data.fashion_mnist import load_split

from conftest import fashion_transform, read_metrics
from failure_table import table_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["--epochs", "1", "--batch-size", "64", "--limit", "12800", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real epoch (200 batches) on cpu and on cpu*2."""
    runs = {}
    for spec in ("cpu", "cpu*2"):
        out = str(tmp_path_factory.mktemp("run") / "out")
        assert train.main(["--devices", spec, "--out", out] + QUICK) == 0
        runs[spec] = out
    return runs


@pytest.mark.parametrize("spec", ["cpu", "cpu*2"])
def test_one_epoch_learns_on_real_data(trained, spec):
    out = trained[spec]
    m = read_metrics(out)
    assert m["status"] == "finished"
    assert m["devices"] == (["cpu(0)"] if spec == "cpu" else ["cpu(0)", "cpu(1)"])
    assert m["mxnet"] == mx.__version__ and m["config"]["devices"] == spec
    (epoch,) = m["epochs"]
    assert epoch["val_acc"] > 0.65, epoch  # chance is 0.10
    assert epoch["train_loss"] < 1.5  # log(10) = 2.30 at chance
    assert epoch["samples_per_s"] > 0 and epoch["seconds"] > 0
    with open(os.path.join(out, "curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_loss_falls_over_epochs(tmp_path):
    out = str(tmp_path / "run")
    assert train.main(["--devices", "cpu*2", "--out", out, "--epochs", "3", "--limit", "3200",
                       "--batch-size", "64", "--quiet"]) == 0
    losses = [e["train_loss"] for e in read_metrics(out)["epochs"]]
    assert losses[2] < losses[1] < losses[0], losses


def test_epoch_line_is_printed(tmp_path, capsys):
    assert train.main(["--devices", "cpu", "--out", str(tmp_path / "r"), "--epochs", "1",
                       "--limit", "512", "--quiet"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("epoch")]
    assert len(lines) == 1
    for word in ("loss", "train-acc", "val-acc", "samples/s"):
        assert word in lines[0]


def test_val_limit_validates_on_the_first_n_validation_samples(tmp_path, capsys, data_dir):
    """--val-limit 300: validation figures over the first 300 test images, exactly what
    evaluating the saved parameters on those 300 gives."""
    from gluon_gpu.data import load_dataset
    out = str(tmp_path / "r")
    assert train.main(["--devices", "cpu", "--out", out, "--epochs", "1", "--limit", "512", "--val-limit", "300",
                       "--quiet"]) == 0
    assert "512 samples (300 to validate) from" in capsys.readouterr().out
    data = load_dataset(data_dir=data_dir, val_limit=300)
    assert data.val_x.shape[0] == 300 and data.train_x.shape[0] == 60000
    x = fashion_transform()(nd.array(data.val_x, dtype="uint8"))
    predicted = load_model(os.path.join(out, "net.params"), mx.cpu(0))(x).asnumpy().argmax(1)
    accuracy = float((predicted == data.val_y).mean())
    assert read_metrics(out)["epochs"][0]["val_acc"] == pytest.approx(accuracy, abs=1e-6)


def test_loader_pipeline_trains_too(tmp_path):
    out = str(tmp_path / "r")
    assert train.main(["--devices", "cpu*2", "--pipeline", "loader", "--loader-workers", "0",
                       "--out", out] + QUICK) == 0
    assert read_metrics(out)["epochs"][0]["val_acc"] > 0.65


def test_saved_params_load_onto_another_context_with_identical_predictions(trained, data_dir):
    path = os.path.join(trained["cpu*2"], "net.params")
    test_x, _ = load_split("test", data_dir)
    x = fashion_transform()(nd.array(test_x[:64, None], dtype="uint8"))
    on_cpu0 = load_model(path, mx.cpu(0))(x).asnumpy()
    on_cpu1 = load_model(path, mx.cpu(1))(x.as_in_context(mx.cpu(1))).asnumpy()
    np.testing.assert_array_equal(on_cpu0, on_cpu1)
    assert (on_cpu0.argmax(1) != 0).any()  # a trained net, not a constant


def test_evaluate_cli_reports_the_trained_accuracy(trained, capsys):
    out = trained["cpu"]
    assert evaluate.main(["--params", os.path.join(out, "net.params"), "--devices", "cpu*2"]) == 0
    printed = capsys.readouterr().out
    acc = float(printed.split(" acc ")[1].split()[0])
    assert acc == pytest.approx(read_metrics(out)["epochs"][0]["val_acc"], abs=1e-4)


def _bad_params(tmp_path, kind, good):
    path = tmp_path / f"{kind}.params"
    raw = open(good, "rb").read()
    if kind == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "random":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "other-arch":
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(7))
        net.initialize()
        net(nd.zeros((1, 784)))
        net.save_parameters(str(path))
    return str(path)


@pytest.mark.parametrize("kind,message", [
    ("missing", "does not exist"),
    ("truncated", "Invalid NDArray file format"),
    ("random", "Invalid NDArray file format"),
    ("empty", "cannot load"),
    ("other-arch", "it lacks 2.bias"),
])
def test_evaluate_rejects_bad_parameter_files(trained, tmp_path, capsys, kind, message):
    path = str(tmp_path / "nope.params") if kind == "missing" else \
        _bad_params(tmp_path, kind, os.path.join(trained["cpu"], "net.params"))
    assert evaluate.main(["--params", path, "--devices", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_evaluate_rejects_parameters_of_another_zoo_model(trained, capsys):
    path = os.path.join(trained["cpu"], "net.params")
    assert evaluate.main(["--params", path, "--model", "cifar_resnet20_v1", "--devices", "cpu"]) == 2
    assert "cannot load" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--devices", "gpu"], "has none"),
    (["--devices", "gpu:3"], "GPU 3 does not exist"),
    (["--devices", "cpu*x"], "bad device spec"),
    (["--devices", "cpu*4", "--batch-size", "3"], "smaller than the 4 devices"),
    (["--epochs", "0"], "--epochs: must be a positive integer"),
    (["--epochs", "-2"], "--epochs: must be a positive integer"),
    (["--lr", "0"], "--lr: must be a positive number"),
    (["--lr", "nan"], "--lr: must be a positive number"),
    (["--batch-size", "0"], "--batch-size: must be a positive integer"),
    (["--batch-size", "ten"], "not a whole number"),
    (["--model", "vgg99"], "unknown --model 'vgg99'"),
    (["--dataset", "folder"], "an image folder needs --data-dir DIR"),
    (["--dataset", "npz", "--data-dir", "x.npz", "--image-size", "32"], "--image-size applies to image folders"),
    (["--seed", "-1"], "--seed: must be between 0 and 4294967295"),
    (["--seed", "4294967295", "--ensemble", "2"], "member seeds pass 4294967295"),
    (["--kvstore", "nccl"], "nccl needs GPU devices"),
    (["--dtype", "float16"], "float16 training needs GPU devices"),
    (["--amp"], "--amp (float16 mixed precision) needs GPU devices"),
    (["--amp", "--dtype", "bfloat16"], "pass one of them"),
    (["--optimizer", "adam", "--momentum", "0.9"], "--momentum applies to sgd"),
    (["--lr-mode", "step"], "needs --lr-decay-epoch"),
    (["--lr-mode", "step", "--lr-decay-epoch", "0,-3"], "--lr-decay-epoch: epochs count from 1, got '0,-3'"),
    (["--lr-mode", "step", "--lr-decay-epoch", "3,1"], "--lr-decay-epoch: epochs must increase, got '3,1'"),
    (["--lr-mode", "step", "--lr-decay-epoch", "1,,2"], "--lr-decay-epoch: an empty item in '1,,2'"),
    (["--lr-mode", "step", "--lr-decay-epoch", "2,2"], "epochs must increase"),
    (["--lr-mode", "step", "--lr-decay-epoch", "1.5"], "not a whole number: '1.5'"),
    (["--data-dir", "/nonexistent/fmnist"], "does not hold the FashionMNIST"),
    # a flag given twice: argparse kept the last silently
    (["--lr", "0.1", "--epochs", "1", "--lr", "0.2"], "--lr is given twice: give it once"),
    (["--lr=0.1", "--lr", "0.2"], "--lr is given twice"),
    (["--hybridize", "--no-hybridize"], "--hybridize and --no-hybridize are both given: give one"),
    (["--quiet"], "--quiet is given twice"),
])
def test_train_user_errors_exit_2_with_one_line(tmp_path, capsys, args, message):
    out = str(tmp_path / "r")
    devices = [] if "--devices" in args else ["--devices", "cpu"]  # the cases' own, given once
    code = train.main(["--out", out, "--limit", "256", "--quiet"] + devices + args)
    if "given" in message:
        assert table_exit("a flag given twice", code)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err and "Traceback" not in err


def test_a_flag_given_twice_is_refused_by_every_program_but_not_in_a_command_passed_on(capsys):
    """The Parser every program shares refuses a repeat; launch's worker command (after
    ``--``, or from its first word) is the worker's to parse, whatever flags it repeats."""
    from gluon_gpu.programs import launch, pack
    assert pack.main(["folder", "out", "--quality", "90", "--quality", "80"]) == 2
    assert capsys.readouterr().err.strip() == ("gluon_gpu.pack: error: --quality is given twice: give it once "
                                               "(see --help)")
    parser = launch.build_parser()
    for command in (["--", "train", "-n", "3", "--quiet", "--quiet"], ["train", "-n", "3"]):
        assert parser.parse_args(["-n", "2"] + command).command[-2:] == command[-2:]
    with pytest.raises(SystemExit):
        parser.parse_args(["-n", "2", "--num-workers", "3", "--", "train"])
    assert "-n and --num-workers are both given: give one" in capsys.readouterr().err


def test_unwritable_out_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert train.main(["--out", str(blocker / "run"), "--devices", "cpu", "--quiet"]) == 2
    assert "cannot write to run directory" in capsys.readouterr().err


def test_existing_run_is_not_overwritten(trained, capsys):
    out = trained["cpu"]
    before = open(os.path.join(out, "net.params"), "rb").read()
    assert train.main(["--out", out, "--devices", "cpu", "--limit", "256", "--quiet"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert open(os.path.join(out, "net.params"), "rb").read() == before


def test_nan_loss_stops_names_the_step_and_keeps_last_good_parameters(tmp_path, capsys):
    """--lr 1e6 diverges; the step is found on the device, so any log interval names the same one."""
    steps = []
    for interval in ("1", "50"):
        out = str(tmp_path / interval)
        code = train.main(["--out", out, "--devices", "cpu*2", "--lr", "1e6", "--epochs", "3",
                           "--limit", "2560", "--quiet", "--log-interval", interval])
        assert table_exit("NaN/inf loss", code)
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "loss became NaN/inf at step " in err, err
        assert "net.params" in err and "lower --lr" in err
        steps.append(int(err.split("at step ")[1].split()[0]))
        m = read_metrics(out)
        assert m["status"] == "diverged"
        net = load_model(os.path.join(out, "net.params"), mx.cpu())
        for p in net.collect_params().values():
            assert np.isfinite(p.data().asnumpy()).all()
    assert steps[0] == steps[1] >= 1


def test_an_exploding_loss_is_a_divergence_not_a_finish(tmp_path, capsys):
    """--lr 3: the loss stays finite but reaches thousands (chance is ln 10 = 2.3): the
    run stops as diverged, keeping the last good parameters (here the initialization)."""
    out = str(tmp_path / "run")
    code = train.main(["--out", out, "--devices", "cpu", "--lr", "3", "--epochs", "3", "--limit", "2048",
                       "--quiet", "--log-interval", "2"])
    err = capsys.readouterr().err.strip()
    assert table_exit("an exploding loss", code) and len(err.splitlines()) == 1, err
    assert "gluon_gpu.train: error: train-loss exploded to " in err, err
    assert " in epoch 1; kept the parameters of the initialization" in err and "lower --lr" in err
    assert read_metrics(out)["status"] == "diverged"
    assert os.path.isfile(os.path.join(out, "net.params"))


def test_a_non_finite_validation_figure_is_a_divergence(tmp_path, capsys, monkeypatch):
    """A NaN validation loss after epoch 2 (a train loss that stayed finite) stops the run
    as diverged; epoch 1's parameters are kept in net.params."""
    from gluon_gpu.core.loop import fit as loop
    validate, calls = loop.validate, []

    def nan_from_the_second(dp, pipeline):
        calls.append(1)
        return {**validate(dp, pipeline), **({"val_loss": float("nan")} if len(calls) > 1 else {})}
    monkeypatch.setattr(loop, "validate", nan_from_the_second)
    out = str(tmp_path / "run")
    code = train.main(["--out", out, "--devices", "cpu", "--epochs", "3", "--limit", "1024", "--val-limit", "256",
                       "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err], err
    assert "error: val-loss became nan in epoch 2; kept the parameters of epoch 1" in err, err
    metrics = read_metrics(out)
    assert metrics["status"] == "diverged" and [e["epoch"] for e in metrics["epochs"]] == [1]


def test_cli_as_a_real_process_prints_no_traceback(tmp_path):
    """The module entry point, as users run it: exit status 2 and one stderr line."""
    proc = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--devices", "gpu*2",
                           "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "gluon_gpu.train: error: device spec 'gpu*2' asks for GPUs but this machine has none "
        "(or MXNet is the CPU wheel); use --devices cpu"]


def test_train_parses_its_command_line_once(tmp_path, monkeypatch):
    """A new run, a recipe's and a resumed one each parse the command line once: the
    flags the user typed (which a recipe and --resume honour) come from that one parse."""
    import argparse
    calls, parse = [], argparse.ArgumentParser.parse_known_args

    def counted(self, *args, **kwargs):
        calls.append(self.prog)
        return parse(self, *args, **kwargs)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", counted)
    base = ["--devices", "cpu", "--limit", "512", "--val-limit", "256", "--quiet"]
    out = str(tmp_path / "run")
    for flags in (base + ["--epochs", "1", "--out", out],
                  base + ["--recipe", "lenet", "--epochs", "2", "--out", str(tmp_path / "recipe"), "--dry-run"],
                  ["--resume", out, "--epochs", "2", "--quiet"]):
        calls.clear()
        assert train.main(flags) == 0, flags
        assert len(calls) == 1, (flags, calls)
    assert read_metrics(out)["epochs"][-1]["epoch"] == 2  # the resume took --epochs from that one parse


def test_the_command_line_path_runs_in_process(tmp_path, capsys):
    """``restart=True`` is the command line's path (it may re-execute itself for MXNet's
    start-up variables; here they already hold, so it goes on in this process)."""
    assert train.main(["--devices", "cpu", "--limit", "512", "--val-limit", "256", "--epochs", "1", "--quiet",
                       "--out", str(tmp_path / "r"), "--dry-run"], restart=True) == 0
    assert "dry run" in capsys.readouterr().out


@pytest.mark.parametrize("program, old, new, value", [
    ("train", "--num-workers", "--loader-workers", "loader_workers"),
    ("pack", "--num-workers", "--processes", "processes")])
def test_a_renamed_flag_works_under_its_old_name_and_says_so(program, old, new, value, capsys):
    """One meaning per word: "workers" are a job's (launch --num-workers, --kvstore dist_*);
    train's DataLoader processes and pack's are named for what they are, and the old
    spelling still works, with one warning line; both spellings at once are refused."""
    from gluon_gpu.programs import pack
    parser = {"train": train, "pack": pack}[program].build_parser()
    given = ["in", "out"] if program == "pack" else []
    assert getattr(parser.parse_args(given + [old, "3"]), value) == 3
    assert capsys.readouterr().err.strip() == f"gluon_gpu.{program}: warning: {old} is deprecated: it is {new} now"
    assert getattr(parser.parse_args(given + [new, "2"]), value) == 2
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        parser.parse_args(given + [old, "3", new, "2"])
    assert f"{old} and {new} are both given: give one" in capsys.readouterr().err


def test_a_run_saved_before_the_rename_resumes_with_its_loader_workers():
    from gluon_gpu.programs.config import RunConfig
    assert RunConfig.from_dict({"num_workers": 3}).loader_workers == 3
