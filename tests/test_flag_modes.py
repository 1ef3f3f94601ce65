"""A flag that changes nothing in the mode chosen is said, by the one rule that lists the
flags and their modes (run.IDLE_FLAGS), not case by case (issue #53: --bfloat16-kernels
with float32 was taken silently); the other silent surprises of round 5: a decay epoch
after the last, --out a folder of the user's own files, predict --index with image
files, the no-compiler warning said twice by a re-executed evaluate."""
import os
import subprocess
import sys

import pytest

from gluon_gpu.models import fused_conv
from gluon_gpu.programs import predict, train
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.run import IDLE_FLAGS, idle_flags

from failure_table import table_exit
from test_checkpoints import REPO

DRY = ["--devices", "cpu", "--limit", "256", "--val-limit", "64", "--dry-run", "--quiet"]


@pytest.mark.parametrize("flags,warning", [
    (["--bfloat16-kernels", "onednn"], "--bfloat16-kernels onednn changes nothing with --dtype float32 (it chooses "
                                       "the kernels of --dtype bfloat16)"),
    (["--bfloat16-kernels", "amp"], "--bfloat16-kernels amp changes nothing with --dtype float32"),
    (["--ensemble-layout", "fused"], "--ensemble-layout fused changes nothing with --ensemble 1 (it lays out the "
                                     "members of an --ensemble or a --sweep)"),
    (["--lr-mode", "step", "--lr-decay-epoch", "2,99", "--epochs", "2"],
     "--lr-decay-epoch 99 comes after the last epoch (--epochs 2): this run never decays there")])
def test_a_flag_the_mode_does_not_use_is_said_by_the_one_rule(flags, warning, capsys, tmp_path):
    assert table_exit("a flag the mode chosen does not use", train.main(DRY + flags + ["--out",
                                                                                       str(tmp_path / "run")]))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"gluon_gpu.train: warning: {warning}"), warnings


def test_every_flag_of_the_rule_is_quiet_in_its_mode():
    config = RunConfig(dtype="bfloat16", lr_mode="step", lr_decay_epoch="2", lr_decay=0.5, warmup_epochs=1,
                       warmup_lr=0.01, prune="median", prune_warmup=2, ensemble=2,
                       ensemble_layout="fused", bfloat16_kernels="onednn", sweep="lr=0.1,0.2")
    assert idle_flags(config) == []
    assert {flag for flag, *_ in IDLE_FLAGS} <= set(RunConfig().to_dict())


def test_out_a_folder_of_the_user_s_files_is_refused(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("mine")
    code = train.main(DRY[:-2] + ["--epochs", "1", "--quiet", "--out", str(tmp_path / "mine")])
    assert table_exit("a flag that cannot apply where it is given", code)
    assert "--out " + str(tmp_path / "mine") + " holds files that are not a run's (thesis.tex)" in \
        capsys.readouterr().err
    assert os.listdir(tmp_path / "mine") == ["thesis.tex"]


def test_predict_index_with_image_files_is_refused(tmp_path, capsys):
    from PIL import Image
    Image.new("L", (28, 28)).save(tmp_path / "one.png")
    code = predict.main(["--params", str(tmp_path / "none.params"), str(tmp_path / "one.png"), "--index", "0:3"])
    assert table_exit("a flag that cannot apply where it is given", code)
    assert "--index picks rows of --idx or --npz" in capsys.readouterr().err


def test_a_missing_compiler_is_said_once_by_a_re_executed_program(tmp_path):
    run = str(tmp_path / "run")
    assert train.main(["--devices", "cpu", "--epochs", "1", "--limit", "256", "--val-limit", "64", "--quiet",
                       "--out", run]) == 0
    env = {**os.environ, "CXX": "no-such-compiler", "GLUON_GPU_CACHE": str(tmp_path / "cache")}
    env.pop("OMP_NUM_THREADS", None)  # evaluate sets its own, so it re-executes itself
    env.pop(fused_conv.WARNED_ENV, None)  # as a user's new shell: nothing said yet
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.evaluate", "--params", run, "--inference", "graph"],
                          cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("fused conv operator unavailable") == 1, done.stderr
