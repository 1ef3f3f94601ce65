"""A flag that changes nothing in the mode chosen is refused by one rule
(config.FLAG_MODES), not case by case (issue #53); the other silent surprises of round 5:
--out a folder of the user's own files, predict --index with image files, a decay
epoch past the last, the no-compiler warning said twice by a re-executed evaluate."""
import os
import subprocess
import sys

import pytest

from gluon_gpu.programs import predict, train
from gluon_gpu.programs.config import FLAG_MODES, RunConfig, check_flag_modes

from failure_table import table_exit
from test_checkpoints import REPO

DRY = ["--devices", "cpu", "--limit", "256", "--val-limit", "64", "--dry-run", "--quiet"]


@pytest.mark.parametrize("flags,message", [
    (["--bfloat16-kernels", "onednn"], "--bfloat16-kernels applies with --dtype bfloat16 only"),
    (["--bfloat16-kernels", "amp"], "--bfloat16-kernels applies with --dtype bfloat16 only"),
    (["--lr-decay-epoch", "3"], "--lr-decay-epoch applies with --lr-mode step only"),
    (["--lr-decay", "0.5"], "--lr-decay applies with --lr-mode step only"),
    (["--warmup-lr", "0.01"], "--warmup-lr applies with --warmup-epochs only"),
    (["--optimizer", "adam", "--momentum", "0.9"], "--momentum applies with --optimizer sgd or nag only"),
    (["--mixup-off-epochs", "1"], "--mixup-off-epochs applies with --mixup or --cutmix only"),
    (["--sweep-random", "3"], "--sweep-random applies with --sweep only"),
    (["--prune-warmup", "2"], "--prune-warmup applies with --prune only"),
    (["--ensemble-layout", "fused"], "--ensemble-layout applies with --ensemble K or --sweep only")])
def test_a_flag_outside_its_mode_is_one_line(flags, message, capsys, tmp_path):
    assert table_exit("a flag that changes nothing", train.main(DRY + flags + ["--out", str(tmp_path / "run")]))
    assert capsys.readouterr().err.strip() == f"gluon_gpu.train: error: {message}; this run has none of it: " \
        f"leave {flags[-2]} out"


def test_every_flag_of_the_rule_is_a_flag_and_in_its_mode_accepted():
    config = RunConfig(dtype="bfloat16", lr_mode="step", warmup_epochs=1, optimizer="nag", mixup=0.2,
                       sweep="lr=0.1,0.2", prune="median", ensemble=2)
    check_flag_modes(config, set(FLAG_MODES))  # nothing refused
    assert set(FLAG_MODES) <= set(RunConfig().to_dict())


def test_a_recipe_s_own_flags_are_not_the_user_s(capsys, tmp_path):
    """The rule judges only what was typed: resnet20's recipe sets --momentum, which its
    optimizer (sgd) keeps in mode, and no user flag is out of its mode."""
    assert train.main(["--devices", "cpu", "--limit", "2048", "--val-limit", "64", "--dry-run", "--quiet",
                       "--recipe", "resnet20", "--out", str(tmp_path / "run")]) == 0


def test_a_decay_epoch_after_the_last_is_said(capsys, tmp_path):
    assert train.main(DRY + ["--lr-mode", "step", "--lr-decay-epoch", "2,99", "--epochs", "2", "--out",
                             str(tmp_path / "run")]) == 0
    assert "warning: --lr-decay-epoch 99 comes after the last epoch (2): this run never decays there" in \
        capsys.readouterr().err


def test_out_a_folder_of_the_user_s_files_is_refused(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("mine")
    assert train.main(DRY[:-2] + ["--epochs", "1", "--quiet", "--out", str(tmp_path / "mine")]) == 2
    assert "--out " + str(tmp_path / "mine") + " holds files that are not a run's (thesis.tex)" in \
        capsys.readouterr().err
    assert os.listdir(tmp_path / "mine") == ["thesis.tex"]


def test_predict_index_with_image_files_is_refused(tmp_path, capsys):
    from PIL import Image
    Image.new("L", (28, 28)).save(tmp_path / "one.png")
    assert predict.main(["--params", str(tmp_path / "none.params"), str(tmp_path / "one.png"), "--index",
                         "0:3"]) == 2
    assert "--index picks rows of --idx or --npz" in capsys.readouterr().err


def test_a_missing_compiler_is_said_once_by_a_re_executed_program(tmp_path):
    run = str(tmp_path / "run")
    assert train.main(["--devices", "cpu", "--epochs", "1", "--limit", "256", "--val-limit", "64", "--quiet",
                       "--fused-conv", "off", "--out", run]) == 0
    env = {**os.environ, "CXX": "no-such-compiler", "GLUON_GPU_CACHE": str(tmp_path / "cache")}
    env.pop("OMP_NUM_THREADS", None)  # evaluate sets its own, so it re-executes itself
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.evaluate", "--params", run], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("fused conv operator unavailable") == 1, done.stderr
