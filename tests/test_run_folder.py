"""What a person meets around a run: the run folder explains itself (train.log, the last
line naming the best epoch, no lock left), run folders stand for their parameters in
evaluate and predict, every program's --help shows defaults, and every program is a
console script."""
import ast
import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from gluon_gpu.programs import evaluate, predict, train

from conftest import read_metrics, trained_run, with_flags
from failure_table import table_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("train", "evaluate", "predict", "bench", "launch", "pack", "export")
SHORT = ["--devices", "cpu", "--epochs", "2", "--limit", "1024", "--val-limit", "500", "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return trained_run(tmp_path_factory, SHORT, leaf="out")


def test_a_finished_run_folder_holds_its_log_and_no_lock(finished, capsys):
    names = set(os.listdir(finished))
    assert {"net.params", "best.params", "metrics.json", "metrics.csv", "curves.png", "train.log"} <= names
    assert ".lock" not in names
    log = open(os.path.join(finished, "train.log")).read().splitlines()
    assert log[0].startswith("gluon_gpu ") and f"out {finished}" in log[0]  # the plan line
    assert [l.split()[1] for l in log if l.startswith("epoch")] == ["1/2", "2/2"]
    best = read_metrics(finished)["best"]
    assert log[-1] == f"best: epoch {best['epoch']}, val-acc {best['value']:.4f}: {finished}/best.params"


def test_the_last_printed_line_names_the_best_epoch_and_its_file(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(SHORT + ["--out", out, "--monitor", "val-loss"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    epochs = read_metrics(out)["epochs"]
    best = min(epochs, key=lambda e: e["val_loss"])
    assert last == f"best: epoch {best['epoch']}, val-loss {best['val_loss']:.4f}: {out}/best.params"


def test_a_resumed_run_appends_to_its_log(tmp_path):
    out = str(tmp_path / "run")
    assert train.main(SHORT + ["--out", out]) == 0
    assert train.main(["--resume", out, "--epochs", "3", "--quiet"]) == 0
    log = open(os.path.join(out, "train.log")).read()
    assert [l.split()[1] for l in log.splitlines() if l.startswith("epoch")] == ["1/2", "2/2", "3/3"]
    assert "resuming from" in log and log.count("gluon_gpu 0.") == 2


def test_evaluate_and_predict_take_a_run_folder(finished, capsys):
    assert evaluate.main(["--params", finished, "--devices", "cpu"]) == 0
    assert capsys.readouterr().out.startswith(f"{finished}/best.params: lenet validation")
    idx = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    assert predict.main(["--params", finished, "--idx", idx, "--index", "0:2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_a_folder_that_is_no_finished_run_is_one_line(tmp_path, capsys):
    assert evaluate.main(["--params", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"gluon_gpu.evaluate: error: {tmp_path} is a folder without best.params or net.params: "
                   "not a finished run (a stopped one continues with --resume)")


def test_a_dry_run_says_it_creates_nothing(tmp_path, capsys):
    out = str(tmp_path / "never")
    assert train.main(SHORT + ["--out", out, "--dry-run"]) == 0
    plan, memory = capsys.readouterr().out.strip().splitlines()
    assert plan.endswith(f"out {out} (dry run: not created)") and memory.startswith("memory: about "), memory
    assert not os.path.exists(out)


def test_a_batch_larger_than_the_data_is_warned_about(tmp_path, capsys):
    assert train.main(with_flags(SHORT, "--out", str(tmp_path / "r"), "--batch-size", "2048", "--epochs", "1")) == 0
    warning = ("gluon_gpu.train: warning: --batch-size 2048 is larger than the 1024 training samples: "
               "every epoch is one update of 1024 samples")
    assert warning in capsys.readouterr().err
    assert open(tmp_path / "r" / "train.log").read().splitlines()[1] == warning  # the log keeps it too


@pytest.mark.parametrize("flags, warning", [
    (["--lr-mode", "cosine", "--lr-decay-epoch", "6,8"],
     "--lr-decay-epoch 6,8 changes nothing with --lr-mode cosine (it sets the decay epochs of --lr-mode step)"),
    # the rest of the class: settings of a schedule or of pruning that the run does not use
    (["--lr-decay", "0.5"], "--lr-decay 0.5 changes nothing with --lr-mode constant (it is the factor at each decay "
                            "epoch of --lr-mode step)"),
    (["--warmup-lr", "0.01"], "--warmup-lr 0.01 changes nothing with --warmup-epochs 0 (it is the rate a warmup "
                              "starts from)"),
    (["--prune-warmup", "2"], "--prune-warmup 2 changes nothing with --prune off (it is how long a member trains "
                              "before --prune judges it)"),
])
def test_a_flag_the_mode_chosen_does_not_use_is_warned_about(tmp_path, capsys, flags, warning):
    assert table_exit("a flag the mode chosen does not use",
                      train.main(SHORT + ["--out", str(tmp_path / "r"), "--dry-run"] + flags))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"gluon_gpu.train: warning: {warning}"], warnings


def test_a_flag_is_not_warned_about_where_it_counts(tmp_path, capsys):
    """Used by the mode chosen, or by some members of a sweep that varies the mode."""
    for flags in (["--lr-mode", "step", "--lr-decay-epoch", "2", "--lr-decay", "0.5"],
                  ["--warmup-epochs", "1", "--warmup-lr", "0.01"],
                  ["--sweep", "lr-mode=constant,step", "--lr-decay-epoch", "2", "--lr-decay", "0.5"]):
        assert train.main(SHORT + ["--out", str(tmp_path / "r"), "--dry-run"] + flags) == 0
        assert "warning" not in capsys.readouterr().err, flags


def test_a_scheduled_run_prints_no_mxnet_warning(tmp_path, capsys):
    assert train.main(SHORT + ["--out", str(tmp_path / "r"), "--lr-mode", "cosine", "--warmup-epochs", "1"]) == 0
    assert "overwritten" not in capsys.readouterr().out


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_help_shows_its_defaults(program):
    module = {"bench": "bench.program"}.get(program, program)  # the bench programs are one package
    parser = __import__(f"gluon_gpu.programs.{module}", fromlist=["build_parser"]).build_parser()
    every = "--help" if parser.brief is None else "--help-all"  # a brief --help shows the most used flags only
    proc = subprocess.run([sys.executable, "-m", f"gluon_gpu.{program}", every], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m gluon_gpu.{program} ")  # named as invoked
    assert "``" not in proc.stdout  # docstring markup is not shown raw
    with_default = [a for a in parser._actions if a.option_strings and a.default not in (None, False, "==SUPPRESS==")
                    and a.default is not False]
    assert with_default
    assert proc.stdout.count("(default:") >= len(with_default)
    if program == "train":
        for group in ("data:", "model:", "training:", "regularization:", "distribution:", "precision:",
                      "ensembles and sweeps:", "speed:", "checkpoints:", "logging:", "examples:"):
            assert f"\n{group}\n" in proc.stdout, group
        assert re.search(r"--batch-size BATCH_SIZE\s+global batch size, split over the devices\s+\(default:\s+256\)",
                         proc.stdout)
        assert "\n  gluon-gpu-train --resume runs/RUN" in proc.stdout  # an example on a line of its own


def test_trains_help_fits_two_screens_and_help_all_lists_every_flag():
    parser = train.build_parser()
    short, full = parser.format_help(), parser.format_help(full=True)
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    assert len(short.splitlines()) <= 80 and len(full.splitlines()) > 2 * len(short.splitlines())
    assert [f for f in flags if f not in full] == []
    shown = [f for f in flags if re.search(rf"^  {re.escape(f)}\b", short, re.M)]
    assert {"--devices", "--epochs", "--lr", "--batch-size", "--recipe", "--resume", "--help-all"} <= set(shown)
    assert "--omp-threads" not in short and "--bucket-mb" not in short
    assert f"--help-all lists all {sum(1 for a in parser._actions if a.option_strings) - 1}." in short  # not -h
    assert "\ndevices:\n" not in full  # --kvstore, --dtype and --amp no longer sit under "devices"
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "gluon-gpu-train"), "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == short.replace("python -m gluon_gpu.train", "gluon-gpu-train")


def test_every_program_is_a_console_script():
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {f"gluon-gpu-{p}": f"gluon_gpu.{p}:main" for p in PROGRAMS}
    for program in PROGRAMS:  # each target exists
        module = __import__(f"gluon_gpu.{program}", fromlist=["main"])
        assert callable(module.main)


def test_the_installed_console_scripts_run():
    bin_dir = os.path.dirname(sys.executable)
    missing = [p for p in PROGRAMS if not os.path.exists(os.path.join(bin_dir, f"gluon-gpu-{p}"))]
    if missing:
        pytest.skip(f"gluon_gpu is not installed in {bin_dir} (pip install .): {missing}")
    proc = subprocess.run([os.path.join(bin_dir, "gluon-gpu-bench"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: gluon-gpu-bench"), proc.stderr


def test_an_ensemble_epoch_line_says_what_its_spread_is():
    from gluon_gpu.core.loop.callbacks import format_epoch
    record = {"epoch": 1, "train_loss": 0.5, "train_acc": 0.8, "train_top5": 0.99, "val_loss": 0.4,
              "member_val_loss": [0.5, 0.4, 0.6], "val_acc": 0.85, "member_val_acc": [0.8, 0.84, 0.82],
              "val_top5": 0.99, "member_val_top5": [0.98, 0.99, 0.97], "seconds": 1.0, "samples_per_s": 100.0}
    line = format_epoch(record, 10)
    assert "members val-acc min/median/max 0.8000/0.8200/0.8400" in line
    assert "ensemble val-acc 0.8500" in line and "ensemble val-top5 0.9900" in line
    assert line.count("min/median/max") == 1 and len(line) < 250


def test_a_run_that_learns_nothing_says_so_once_and_metrics_json_keeps_it():
    from gluon_gpu.core.loop.callbacks import GuessingWatch
    said, history = [], []
    watch = GuessingWatch([40, 41, 39], 0.1, lambda line, stream=None: said.append(line))
    for epoch, loss in enumerate([1.0990, 1.0979, 1.0986, 1.0986], 1):  # ln 3 = 1.0986: guessing
        history.append({"epoch": epoch, "train_loss": loss})
        watch.on_epoch_end(history[-1], history)
    assert len(said) == 1 and "warning" in history[1] and "warning" not in history[2]
    assert said[0].startswith("gluon_gpu.train: warning: the training loss has stayed at 1.0979 for 2 epochs, the "
                              "cost of guessing among 3 classes (ln 3 = 1.0986)") and "--lr 0.1" in said[0]
    learning = GuessingWatch([40, 41, 39], 0.1, lambda line, stream=None: said.append(line))
    for losses in ([1.09, 0.7], [1.12, 1.08]):  # a loss that falls, even near ln 3, says nothing
        history = [{"epoch": e, "train_loss": loss} for e, loss in enumerate(losses, 1)]
        learning.on_epoch_end(history[-1], history)
    assert len(said) == 1


def test_uneven_classes_have_two_costs_of_guessing_and_balanced_ones_one():
    from gluon_gpu.core.loop.callbacks import GuessingWatch
    said = []
    for losses in ([0.6400, 0.6395], [1.0990, 1.0986]):  # the frequencies predicted (entropy 0.6390); an even spread
        history = [{"epoch": e, "train_loss": loss} for e, loss in enumerate(losses, 1)]
        watch = GuessingWatch([80, 10, 10], 0.1, lambda line, stream=None: said.append(line))
        watch.on_epoch_end(history[-1], history)
    assert len(said) == 2 and "ln 3 = 1.0986" in said[1] and "classes apart" not in said[1], said
    assert "class frequencies whatever the input (their entropy, 0.6390), so always the most frequent class" in said[0]
    assert said[0].endswith("(--lr 0.1): try a tenth of it, or inputs that do not tell the classes apart"), said[0]
    assert len(watch.levels) == 2 and len(GuessingWatch([50, 49, 51], 0.1, print).levels) == 1


@pytest.mark.parametrize("smoothing", [[], ["--label-smoothing", "0.3"]], ids=["plain", "label-smoothing"])
def test_a_run_whose_inputs_tell_nothing_collapses_to_one_class_and_is_warned_about(tmp_path, capsys, smoothing):
    """Blank inputs, uneven labels: the network can only learn the class frequencies, and
    always predicts the most frequent class (val-acc is its share). Validation counts the
    classes predicted: one for two epochs is the warning, also where label smoothing keeps
    the training loss off every cost of guessing."""
    y = np.random.default_rng(0).choice(3, size=1536, p=[0.8, 0.1, 0.1]).astype(np.int32)
    x = np.zeros((1536, 1, 28, 28), np.float32)
    np.savez(tmp_path / "blank.npz", x_train=x[:1280], y_train=y[:1280], x_val=x[1280:], y_val=y[1280:])
    out = str(tmp_path / "r")
    assert table_exit("a run that learns nothing", train.main([
        "--dataset", "npz", "--data-dir", str(tmp_path / "blank.npz"), "--devices", "cpu", "--epochs", "3",
        "--batch-size", "64", "--lr", "0.3", "--quiet", "--out", out] + smoothing))
    err = capsys.readouterr().err
    assert ("gluon_gpu.train: warning: every validation sample has been predicted as one class for 2 epochs "
            "(val-acc 0.7773): the network learns nothing") in err and "classes apart" in err, err
    epochs = read_metrics(out)["epochs"]
    assert ["warning" in e for e in epochs] == [False, True, False] and epochs[-1]["val_predicted_classes"] == 1
    assert epochs[-1]["val_acc"] == pytest.approx(np.mean(y[1280:] == 0)) == pytest.approx(0.7773, abs=1e-4)
    assert evaluate.main(["--params", out, "--devices", "cpu"]) == 0
    assert "(256 samples, 1 class predicted, graph inference)" in capsys.readouterr().out


def test_one_predicted_class_is_warned_about_unless_it_was_right_about_every_sample():
    """Two validations in a row of one class warn (the loss falling, off any cost of
    guessing); a class count of 2, a validation right about every sample (all of one
    class), and an epoch without the count do not."""
    from gluon_gpu.core.loop.callbacks import GuessingWatch
    warned = {}
    for case, (predicted, acc) in enumerate((([3, 1, 1], 0.4), ([1, 2, 1], 0.4), ([1, 1, 1], 1.0),
                                             ([1, None, 1], 0.4))):
        history, said = [], []
        watch = GuessingWatch([40, 41, 39], 0.1, lambda line, stream=None, said=said: said.append(line))
        for epoch, count in enumerate(predicted, 1):
            history.append({"epoch": epoch, "train_loss": 2.0 / epoch, "val_acc": acc})
            history[-1].update({} if count is None else {"val_predicted_classes": count})
            watch.on_epoch_end(history[-1], history)
        warned[case] = (said, [e for e in history if "warning" in e])
    said, records = warned.pop(0)
    assert [r["epoch"] for r in records] == [3] and len(said) == 1 and said[0].startswith(
        "gluon_gpu.train: warning: every validation sample has been predicted as one class for 2 epochs "
        "(val-acc 0.4000): the network learns nothing; the likely cause is the learning rate (--lr 0.1)"), said
    assert all(said == [] and records == [] for said, records in warned.values()), warned


def test_a_real_run_at_a_learning_rate_that_cannot_move_it_is_warned_about(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert table_exit("a run that learns nothing", train.main(with_flags(SHORT, "--out", out, "--lr", "1e-9",
                                                                         "--epochs", "2")))
    err = capsys.readouterr().err
    assert "gluon_gpu.train: warning: the training loss has stayed at" in err and "(--lr 1e-09)" in err
    assert "the network learns nothing" in read_metrics(out)["epochs"][1]["warning"]
    assert "learns nothing" in open(os.path.join(out, "train.log")).read()


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_programs_help_fits_two_screens_and_help_all_lists_every_flag(program):
    """--help at most 80 lines, as train's (#54: bench's was 192, launch's grew to 93)."""
    module = importlib.import_module(f"gluon_gpu.programs.{program}" if program != "bench"
                                     else "gluon_gpu.programs.bench.program")
    parser = module.build_parser()
    short, full = parser.format_help(), parser.format_help(full=True)
    assert len(short.splitlines()) <= 80, program
    assert [s for a in parser._actions for s in a.option_strings if s not in full] == []


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_flag_of_every_program_refuses_an_empty_value(program, capsys):
    """#62, class 'input silently replaced': `--out ''` trained into runs/<timestamp>,
    `--recipe ''` ran no recipe, without a word. An empty value is one line, exit 2, for
    every flag that takes one (a flag that can be off is left out, or spelled none or 0)."""
    module = importlib.import_module(f"gluon_gpu.programs.{program}" if program != "bench"
                                     else "gluon_gpu.programs.bench.program")
    parser = module.build_parser()
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        flag = action.option_strings[0]
        with pytest.raises(SystemExit) as stopped:
            parser.parse_args([flag, " "] if program != "launch" else [flag, " ", "--", "true"])
        assert table_exit("an empty value for any flag of any program", stopped.value.code), flag
        assert capsys.readouterr().err == f"gluon_gpu.{program}: error: {'/'.join(action.option_strings)} is empty: " \
                                          "give a value, or leave it out (see --help)\n", flag


@pytest.mark.parametrize("program,several", [("bench", 11)])  # the other programs' flags take one value
def test_every_flag_that_takes_several_values_refuses_one_given_twice(program, several, capsys):
    """#62: `bench --devices cpu cpu` timed cpu twice; other lists dropped the repeat silently."""
    module = importlib.import_module(f"gluon_gpu.programs.{program}" if program != "bench"
                                     else "gluon_gpu.programs.bench.program")
    parser = module.build_parser()
    lists = [action for action in parser._actions if action.option_strings and action.nargs in ("+", "*")]
    assert len(lists) == several
    for action in lists:
        value = next(v for v in ([str(action.choices[0])] if action.choices else []) + ["1", "cpu", "none", "a.png"]
                     if _takes(action, v))
        args = [action.option_strings[0], value, value]
        with pytest.raises(SystemExit) as stopped:
            parser.parse_args(args)
        assert stopped.value.code == 2
        name = "/".join(action.option_strings)
        assert capsys.readouterr().err == f"gluon_gpu.{program}: error: {name} gives a value twice: give each " \
                                          "once (see --help)\n", name


def _takes(action, value):
    try:
        (action.type or str)(value)
        return True
    except Exception:  # pylint: disable=broad-except
        return False
