"""Checkpoints, exact resume, and runs that survive Ctrl-C, SIGTERM and kill -9."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import mxnet as mx
import numpy as np
import pytest

from gluon_gpu.programs import train
from gluon_gpu.core.state.checkpoint import latest_checkpoint

from conftest import read_metrics, trained_run, with_flags
from failure_table import table_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--devices", "cpu", "--limit", "1280", "--batch-size", "64", "--quiet",
         "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05", "--lr-mode", "step",
         "--lr-decay-epoch", "3", "--lr-decay", "0.5"]
TIMING = ("seconds", "samples_per_s")


def params_of(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(path).items()}


def assert_same_run(a, b):
    files = ["net.params"] + (["ema.params"] if os.path.exists(os.path.join(a, "ema.params")) else [])  # --ema's
    for name in files:
        pa, pb = params_of(os.path.join(a, name)), params_of(os.path.join(b, name))
        assert pa.keys() == pb.keys()
        for k in pa:
            np.testing.assert_allclose(pa[k], pb[k], rtol=1e-5, atol=1e-6, err_msg=f"{name}: {k}")
    ea, eb = read_metrics(a)["epochs"], read_metrics(b)["epochs"]
    assert len(ea) == len(eb)
    for ra, rb in zip(ea, eb):
        assert ra.keys() == rb.keys()
        for key in set(ra) - set(TIMING):  # an ensemble's member figures are lists (None: a member stopped)
            a, b = ra[key], rb[key]
            if isinstance(a, list):
                assert [v is None for v in a] == [v is None for v in b], key
                a, b = [v for v in a if v is not None], [v for v in b if v is not None]
            assert a == pytest.approx(b, rel=1e-5), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The reference: 4 epochs in one go."""
    return trained_run(tmp_path_factory, SMALL + ["--epochs", "4"], "straight")


def test_stop_and_resume_equals_straight_training(straight, tmp_path):
    out = str(tmp_path / "run")
    assert train.main(SMALL + ["--epochs", "2", "--out", out]) == 0
    assert read_metrics(out)["config"]["epochs"] == 2
    assert train.main(["--resume", out, "--epochs", "4", "--quiet"]) == 0
    assert_same_run(straight, out)
    m = read_metrics(out)
    assert m["status"] == "finished" and m["config"]["epochs"] == 4


def test_resume_with_other_gradient_buckets_equals_straight_training(tmp_path):
    """Checkpoints hold per-parameter optimizer states whatever the gradient exchange:
    cpu*2 with buckets resumed with one key per parameter and then with tiny buckets."""
    two = SMALL[SMALL.index("--devices") + 2:] + ["--devices", "cpu*2"]
    straight_two, out = str(tmp_path / "straight"), str(tmp_path / "run")
    assert train.main(two + ["--epochs", "4", "--out", straight_two]) == 0
    assert train.main(two + ["--epochs", "2", "--out", out]) == 0
    assert train.main(["--resume", out, "--epochs", "3", "--bucket-mb", "0", "--quiet"]) == 0
    assert train.main(["--resume", out, "--epochs", "4", "--bucket-mb", "0.01", "--quiet"]) == 0
    assert_same_run(straight_two, out)


def test_trainer_state_order_does_not_depend_on_layers_made_before():
    """gluon.Trainer numbers parameters by sorted name and save_states stores optimizer
    state by number; names must sort the same in every process (conv9 vs conv10 do not)."""
    from gluon_gpu.models.lenet import lenet

    def trainer_order(net):
        structural = {id(p): name for name, p in net._collect_params_with_prefix().items()}
        return [structural[id(p)] for _, p in sorted(net.collect_params().items())]
    reference = trainer_order(lenet())
    for _ in range(120):  # crosses a power of ten of Gluon's global layer counters
        mx.gluon.nn.Conv2D(1, 1), mx.gluon.nn.Dense(1)
        assert trainer_order(lenet()) == reference


def test_checkpoint_holds_everything_to_resume(straight):
    directory, state = latest_checkpoint(straight)
    assert os.path.basename(directory) == "epoch-00004-batch-0000000"  # after epoch 4
    assert sorted(os.listdir(directory)) == ["net.params", "optimizer.json", "optimizer.params", "state.json"]
    assert state["epoch"] == 4 and state["batch"] == 0 and len(state["history"]) == 4
    assert state["config"]["lr"] == 0.05 and state["config"]["momentum"] == 0.9
    assert state["data"]["dataset"] == "fashion-mnist" and state["data"]["input_shape"] == [1, 28, 28]


def test_keep_prunes_old_checkpoints(tmp_path):
    out = str(tmp_path / "run")
    assert train.main(with_flags(SMALL, "--epochs", "4", "--keep", "2", "--limit", "256", "--out", out)) == 0
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["epoch-00003-batch-0000000", "epoch-00004-batch-0000000"]


def test_save_period(tmp_path):
    out = str(tmp_path / "run")
    assert train.main(with_flags(SMALL, "--epochs", "5", "--save-period", "2", "--keep", "9",
                                 "--limit", "256", "--out", out)) == 0
    names = sorted(n for n in os.listdir(os.path.join(out, "checkpoints")) if n.startswith("epoch"))
    assert names == [f"epoch-{e:05d}-batch-0000000" for e in (0, 2, 4, 5)]  # start, epochs 2, 4, end


def test_resume_refuses_changed_flags_and_missing_checkpoints(straight, tmp_path, capsys):
    def files():  # the run's files; .lock is the writer lock, taken by every train or --resume
        return {n: os.path.getmtime(os.path.join(straight, n)) for n in os.listdir(straight) if n != ".lock"}
    before = files()
    assert train.main(["--resume", straight, "--lr", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--lr 0.5 differs from the run's 0.05" in err and "--epochs" in err
    for flags, said in [(["--recipe", "lenet"], "--recipe lenet differs from the run, which ran without --recipe"),
                        (["--no-wd"], "--no-wd differs from the run, which ran without --no-wd")]:
        assert train.main(["--resume", straight] + flags) == 2
        assert said in capsys.readouterr().err  # not "the run's None", "--no-wd True"
    assert train.main(["--resume", str(tmp_path)]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    assert train.main(["--resume", straight, "--quiet"]) == 0  # already finished: nothing to do
    assert "already finished 4 epochs" in capsys.readouterr().out
    assert files() == before


# -- real processes, real signals ------------------------------------------------------

def start(args, pause=None):
    """gluon_gpu.train with ``args``; ``pause``: seconds it sleeps inside every checkpoint
    write (tests/paused_checkpoints.py), for a kill to land there."""
    program = ["-m", "gluon_gpu.train"] if pause is None else [os.path.join(REPO, "tests", "paused_checkpoints.py"),
                                                               str(pause)]
    return subprocess.Popen([sys.executable] + program + args, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})


def wait_for(predicate, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def cpu_seconds(pid):
    """CPU time process ``pid`` has used, None once it is gone: progress to wait on (not
    wall time)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def held_after(args, step, marker, env=None):
    """gluon_gpu.train with ``args`` held right after its ``step``-th step until ``marker``
    is removed (tests/held_step.py): the process, once held (or ended). ``env``: more
    environment variables."""
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "held_step.py"), str(step), marker] + args,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO, **(env or {})})
    wait_for(lambda: os.path.exists(marker) or proc.poll() is not None)
    return proc


def stopped_after(args, step, signum, marker):
    """gluon_gpu.train with ``args``, sent ``signum`` right after its ``step``-th step,
    then waited for: the process, its stdout and its stderr."""
    proc = held_after(args, step, marker)
    proc.send_signal(signum)
    os.remove(marker)
    said, err = proc.communicate(timeout=120)
    return proc, said, err


def let_it_work(proc, seconds):
    """Wait until the process has computed ``seconds`` more CPU time."""
    target = (cpu_seconds(proc.pid) or 0.0) + seconds
    wait_for(lambda: (cpu_seconds(proc.pid) or 0.0) >= target or proc.poll() is not None)


def checkpoint_names(out, hidden=False):
    try:
        names = os.listdir(os.path.join(out, "checkpoints"))
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(".epoch-" if hidden else "epoch-"))


LONGER = with_flags(SMALL, "--limit", "12800", "--epochs", "2")  # 200 batches an epoch


@pytest.fixture(scope="module")
def straight_longer(tmp_path_factory):
    return trained_run(tmp_path_factory, LONGER, "straight")


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_checkpoints_mid_epoch_and_resume_is_exact(straight_longer, tmp_path, signum, code):
    out = str(tmp_path / "run")
    proc, _, err = stopped_after(LONGER + ["--out", out, "--log-interval", "1"], 210, signum,
                                 str(tmp_path / "held"))
    assert proc.returncode == code and table_exit("Ctrl-C / SIGTERM while training", code), err
    assert f"resume with: {sys.executable} -m gluon_gpu.train --resume {out}" in err
    assert "Traceback" not in err
    _, state = latest_checkpoint(out)
    assert state["epoch"] == 1 and state["batch"] == 10, state  # stopped after step 210: epoch 2's 10th of 200
    assert state["metrics"]["samples"] == state["batch"] * 64
    assert read_metrics(out)["status"] == "interrupted"
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(straight_longer, out)


CHAOS_KILLS = int(os.environ.get("CHAOS_KILLS", "5"))  # CI: 5; the long version: CHAOS_KILLS=20
CHAOS_SEED = int(os.environ.get("CHAOS_SEED", "0"))
KILLS = {  # how a kill lands: the signal, and whether it waits until the process is inside a checkpoint write
    "SIGKILL": (signal.SIGKILL, False), "SIGTERM": (signal.SIGTERM, False),
    "SIGKILL in a checkpoint write": (signal.SIGKILL, True), "SIGTERM in a checkpoint write": (signal.SIGTERM, True),
}


# 50 batches an epoch, 2 epochs a kill: long enough that no kill comes after the end
CHAOS = with_flags(SMALL, "--limit", "3200", "--val-limit", "500", "--epochs", str(2 * CHAOS_KILLS))


@pytest.fixture(scope="module")
def straight_chaos(tmp_path_factory):
    return trained_run(tmp_path_factory, CHAOS, "straight")


def test_chaos_kills_in_a_row_end_where_a_straight_run_ends(straight_chaos, tmp_path):
    """CHAOS_KILLS kills in a row, each SIGKILL or SIGTERM, at a random moment (a random
    amount of CPU work: in start-up, training or validation) or inside a checkpoint write
    (a pause is injected there), each followed by the command that continues the run:
    `--resume`, or the first command again when no checkpoint is complete yet. Each exit
    is the one the failure table gives; each time the newest complete checkpoint loads;
    at the end no temporary is left, no process runs, and the run equals the straight one."""
    rng = random.Random(CHAOS_SEED)
    out = str(tmp_path / "run")
    first = CHAOS + ["--out", out]
    diary = []
    kinds = [kind for _ in range(CHAOS_KILLS) for kind in rng.sample(sorted(KILLS), len(KILLS))]  # each in 4 kills
    for how in kinds[:CHAOS_KILLS]:
        signum, in_write = KILLS[how]
        resuming = latest_checkpoint(out)[0] is not None
        cut_before = set(checkpoint_names(out, hidden=True))  # a killed write's temporary, until the next writer
        proc = start(["--resume", out, "--quiet"] if resuming else first, pause=2 if in_write else None)
        if in_write:
            wait_for(lambda: set(checkpoint_names(out, hidden=True)) - cut_before or proc.poll() is not None)
        else:
            let_it_work(proc, rng.uniform(0.2, 3.5))  # start-up takes about 2 CPU s, an epoch 0.2
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        if proc.returncode == 0:  # it finished before the signal came
            assert read_metrics(out)["status"] == "finished"
            break
        if signum == signal.SIGKILL:
            assert table_exit("kill -9, power loss", proc.returncode), (how, err)
        elif resuming:
            assert table_exit("Ctrl-C / SIGTERM while training", proc.returncode), (how, err)
        else:
            assert table_exit("Ctrl-C (or SIGTERM, SIGHUP) during start-up", proc.returncode), (how, err)
        directory, state = latest_checkpoint(out)
        if directory:
            assert_loadable(out, first_epoch=0)
        diary.append(f"{how}: exit {128 - proc.returncode if proc.returncode < 0 else proc.returncode}, newest "
                     f"checkpoint {os.path.basename(directory) if directory else 'none'}")
    for _ in range(3):
        if os.path.exists(os.path.join(out, "metrics.json")) and read_metrics(out)["status"] == "finished":
            break
        proc = start(["--resume", out, "--quiet"] if latest_checkpoint(out)[0] else first)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Traceback" not in err, err
    got, want = params_of(os.path.join(out, "net.params")), params_of(os.path.join(straight_chaos, "net.params"))
    print(f"chaos (seed {CHAOS_SEED}, {len(diary)} kills; largest difference from the straight run's parameters "
          f"{max(float(np.abs(got[k] - want[k]).max()) for k in want)}):", *diary, sep="\n  ")
    assert read_metrics(out)["status"] == "finished"
    assert checkpoint_names(out, hidden=True) == []  # temporaries of killed writes cleaned
    assert_same_run(straight_chaos, out)


def assert_loadable(out, first_epoch=1):
    directory, state = latest_checkpoint(out)
    assert state is not None and state["epoch"] >= first_epoch
    assert set(mx.nd.load(os.path.join(directory, "net.params"))) >= {"0.weight", "6.bias"}
    with open(os.path.join(directory, "state.json")) as f:
        assert json.load(f)["complete"] is True


def test_a_kill_while_an_old_checkpoint_is_pruned_leaves_no_checkpoint_missing_a_file(tmp_path, monkeypatch):
    """Pruning deleted an old checkpoint in place: a kill inside the deletion (seen in an
    elastic Horovod job whose rank 0 was killed) left a checkpoint missing files, which
    every later resume skipped with a line and nothing removed. Renamed first, what a
    kill leaves is a temporary, which the next save removes."""
    from gluon_gpu import DataParallel
    from gluon_gpu.core.state import checkpoint
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize(ctx=[mx.cpu(0)])
    dp = DataParallel(net, [mx.cpu(0)], "sgd", {"learning_rate": 0.1})
    def state(batch):
        return {"epoch": 0, "batch": batch, "seconds": 0.0, "metrics": {}, "history": [], "config": {}}
    for batch in (1, 2):
        checkpoint.save_checkpoint(str(tmp_path), dp, state(batch), keep=1)

    def killed(path, ignore_errors=False):  # one file deleted, then the process is gone
        os.remove(os.path.join(path, sorted(os.listdir(path))[0]))
        raise SystemExit("killed")
    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(SystemExit):
        checkpoint.save_checkpoint(str(tmp_path), dp, state(3), keep=1)
    monkeypatch.undo()
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == [".epoch-00000-batch-0000002.pruned", "epoch-00000-batch-0000003"]
    checkpoint.save_checkpoint(str(tmp_path), dp, state(4), keep=1)
    assert sorted(os.listdir(root)) == ["epoch-00000-batch-0000004"]
