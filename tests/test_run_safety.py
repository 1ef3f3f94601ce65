"""Nothing lost, nothing mixed (issue #13, first part): one writer per run directory,
unique default run names, and resume that finds the most advanced checkpoint that loads."""
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

import mxnet as mx
import pytest

from gluon_gpu.core.platform import pools
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.core.state.checkpoint import complete_checkpoints
from gluon_gpu.programs import train

from test_checkpoints import REPO, SMALL, assert_same_run, start, wait_for, checkpoint_names
from conftest import read_metrics
from failure_table import table_exit


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 4-epoch run, and a copy of it stopped after 3 epochs (checkpoints of epochs 1-3)."""
    root = tmp_path_factory.mktemp("safety")
    straight, three = str(root / "straight"), str(root / "three")
    assert train.main(SMALL + ["--epochs", "4", "--out", straight]) == 0
    assert train.main(SMALL + ["--epochs", "3", "--keep", "3", "--out", three]) == 0
    return straight, three


# what a checkpoint's state.json may claim that the run contradicts (issue #42)
LIES = {"a-batch-past-the-epoch": {"batch": 40}, "an-epoch-past-its-history": {"epoch": 7},
        "an-empty-history": {"history": []}, "a-negative-batch": {"batch": -1}}


def damage(directory, kind):
    if kind == "truncated-params":
        path = os.path.join(directory, "net.params")
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[: len(raw) // 2])
    elif kind == "truncated-optimizer-state":
        path = os.path.join(directory, "optimizer.params")
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[: len(raw) // 2])
    elif kind == "state-with-wrong-fields":
        with open(os.path.join(directory, "state.json"), "w") as f:
            json.dump({"complete": True, "epoch": "three", "history": {}}, f)
    elif kind in LIES:  # a state.json edited by hand: every field readable, their figures wrong
        path = os.path.join(directory, "state.json")
        with open(path) as f:
            state = json.load(f)
        state.update(LIES[kind])
        with open(path, "w") as f:
            json.dump(state, f)
    elif kind == "another-models-params":
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(3))
        net.initialize()
        net(mx.nd.zeros((1, 5)))
        net.save_parameters(os.path.join(directory, "net.params"))


@pytest.mark.parametrize("kind", ["truncated-params", "truncated-optimizer-state", "state-with-wrong-fields",
                                  "another-models-params", *LIES])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(runs, tmp_path, capsys, kind):
    straight, three = runs
    out = str(tmp_path / "run")
    shutil.copytree(three, out)
    newest, _ = complete_checkpoints(out)[-1]
    damage(newest, kind)
    assert table_exit("newest checkpoint damaged", train.main(["--resume", out, "--epochs", "4", "--quiet"]))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    skipped = [l for l in captured.err.splitlines() if "skipping checkpoint" in l]
    assert len(skipped) == 1 and os.path.basename(newest) in skipped[0], captured.err
    assert "resuming from" in captured.out and "epoch-00002-batch-0000000" in captured.out
    assert_same_run(straight, out)  # epoch 3 redone from epoch 2's checkpoint, then epoch 4


def test_no_checkpoint_that_loads_is_one_line(runs, tmp_path, capsys):
    out = str(tmp_path / "run")
    shutil.copytree(runs[1], out)
    for directory, _ in complete_checkpoints(out):
        damage(directory, "truncated-params")
    assert train.main(["--resume", out, "--epochs", "4", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("gluon_gpu.train: error: --resume")


def test_checkpoints_order_by_progress_not_by_step_count(runs, tmp_path):
    """Names sort by (epoch, batch): a mid-epoch checkpoint of epoch 3 comes after epoch 2's
    end, whatever batch size or worker count wrote them."""
    out = str(tmp_path / "run")
    shutil.copytree(runs[1], out)
    directory, state = complete_checkpoints(out)[-1]
    mid = os.path.join(os.path.dirname(directory), "epoch-00002-batch-0000007")
    shutil.copytree(complete_checkpoints(out)[-2][0], mid)
    with open(os.path.join(mid, "state.json")) as f:
        mid_state = json.load(f)
    mid_state["batch"] = 7
    with open(os.path.join(mid, "state.json"), "w") as f:
        json.dump(mid_state, f)
    order = [(s["epoch"], s["batch"]) for _, s in complete_checkpoints(out)]
    assert order == sorted(order) and order[-2:] == [(2, 7), (3, 0)]


def test_one_writer_per_run_directory(tmp_path, capsys):
    out = str(tmp_path / "run")
    proc = start(SMALL + ["--epochs", "200", "--out", out])
    try:
        wait_for(lambda: len(checkpoint_names(out)) >= 2)  # training is under way
        assert table_exit("a second `train`", train.main(["--resume", out, "--quiet"]))  # would have trained beside it
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"in use by process {proc.pid}" in err, err
        assert train.main(SMALL + ["--seed", "7", "--epochs", "1", "--out", out]) == 2  # a second fresh run
        assert "already holds a run" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # the holder died: its lock is taken over, and the run resumes
    assert table_exit("a lock left", train.main(["--resume", out, "--epochs", "3", "--quiet"]))


def test_default_run_names_are_unique_within_a_second(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "gluon_gpu.train", "--epochs", "1", "--limit", "256",
                               "--devices", "cpu", "--quiet"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 2
    for run in runs:
        assert os.path.isfile(tmp_path / "runs" / run / "net.params")


def test_the_run_lock_refuses_a_second_holder_and_is_free_after(tmp_path):
    """Two writers that both passed the 'no run here yet' check: the lock decides."""
    from gluon_gpu.core.platform.errors import UserError
    from gluon_gpu.core.platform.files import RunLock
    with RunLock(str(tmp_path)):
        with pytest.raises(UserError, match=f"in use by process {os.getpid()}"):
            with RunLock(str(tmp_path)):
                pass
    assert not os.path.exists(tmp_path / ".lock")  # removed at a clean exit
    with RunLock(str(tmp_path)):  # released on exit
        pass


def test_a_writer_that_opened_a_lock_file_removed_meanwhile_locks_the_new_one(tmp_path, monkeypatch):
    """The file a holder removes at its exit may have been opened by the next writer
    already: that writer must not hold a lock nobody else can see."""
    from gluon_gpu.core.platform import files
    from gluon_gpu.core.platform.errors import UserError
    opened = []
    real_open = os.open

    def open_then_lose_the_race(path, *args):
        fd = real_open(path, *args)
        if path.endswith(".lock") and not opened:  # the first open: the old file is removed under us
            opened.append(fd)
            os.remove(path)
        return fd
    monkeypatch.setattr(files.os, "open", open_then_lose_the_race)
    with files.RunLock(str(tmp_path)):
        monkeypatch.setattr(files.os, "open", real_open)
        with pytest.raises(UserError, match="in use"):  # a third writer sees the held file
            with files.RunLock(str(tmp_path)):
                pass


def _mapped(pid, library):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("program, args", [("train", SMALL + ["--epochs", "2"]), ("evaluate", ["--devices", "cpu"])])
def test_ctrl_c_at_any_moment_of_start_up_is_130_and_at_most_one_line(tmp_path, program, args):
    """At once (the interpreter not yet running: SIGINT's default ends it, nothing printed)
    and while MXNet imports (libmxnet.so mapped, its Python package still loading: the
    slowest second of start-up): the shell sees 130 both times, and the second prints
    "interrupted"; the same command then runs."""
    out = str(tmp_path / "run")
    argv = [sys.executable, "-m", f"gluon_gpu.{program}"] + args + (["--out", out] if program == "train" else [])
    for moment in ("at once", "while MXNet imports"):
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": REPO})
        if moment != "at once":
            wait_for(lambda: _mapped(proc.pid, "libmxnet.so") or proc.poll() is not None)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert table_exit("Ctrl-C (or SIGTERM, SIGHUP) during start-up", proc.returncode), (moment, err)
        assert err.strip().splitlines() == ([] if moment == "at once" else [f"gluon_gpu.{program}: interrupted"]), err
    assert not os.path.exists(out)
    if program == "train":
        assert train.main(SMALL + ["--epochs", "1", "--out", out]) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("program", ["train", "evaluate", "pack"])
def test_sigterm_and_sighup_at_start_up_are_one_line_as_ctrl_c_is(tmp_path, image_folder, program, signum):
    """Every program handles them from its first instruction: while MXNet imports, the
    one line and the shell's 128 + N; no traceback, nothing left behind."""
    out = str(tmp_path / "out")
    args = {"train": SMALL + ["--epochs", "2", "--out", out], "evaluate": ["--devices", "cpu"],
            "pack": [image_folder, out]}[program]
    proc = subprocess.Popen([sys.executable, "-m", f"gluon_gpu.{program}"] + args, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    wait_for(lambda: _mapped(proc.pid, "libmxnet.so") or proc.poll() is not None)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    if program == "train":
        assert table_exit("Ctrl-C (or SIGTERM, SIGHUP) during start-up", proc.returncode), err
    else:
        assert table_exit("SIGTERM or SIGHUP to", proc.returncode), err
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines() == [f"gluon_gpu.{program}: stopped by {signal.Signals(signum).name}"], err
    assert not os.path.exists(out) or not [n for n in os.listdir(out) if n.endswith(".partial")]


def test_ctrl_c_inside_the_first_checkpoint_leaves_a_run_that_starts_afresh(tmp_path, runs):
    out = str(tmp_path / "run")
    proc = start(SMALL + ["--epochs", "4", "--out", out], pause=60)
    wait_for(lambda: checkpoint_names(out, hidden=True))  # inside the step-0 write
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert table_exit("Ctrl-C (or SIGTERM, SIGHUP) during start-up", proc.returncode), err
    assert err.strip().splitlines() == ["gluon_gpu.train: interrupted"], err
    assert complete_checkpoints(out) == []
    assert train.main(SMALL + ["--epochs", "4", "--out", out]) == 0  # the same command again
    assert checkpoint_names(out, hidden=True) == []
    assert_same_run(runs[0], out)


def test_cpu_contexts_are_bounded_up_front(capsys):
    assert table_exit("an empty dataset", train.main(["--devices", "cpu*1000", "--dry-run"]))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "at most" in err and "CPU contexts" in err


def test_outputs_get_the_umasks_modes(tmp_path):
    out = str(tmp_path / "run")
    old = os.umask(0o022)
    try:
        assert train.main(SMALL + ["--epochs", "1", "--out", out]) == 0
    finally:
        os.umask(old)
    for name in ("net.params", "metrics.json", "curves.png"):
        assert os.stat(os.path.join(out, name)).st_mode & 0o777 == 0o644, name
    directory, _ = complete_checkpoints(out)[-1]
    assert os.stat(directory).st_mode & 0o777 == 0o755
    assert os.stat(os.path.join(directory, "net.params")).st_mode & 0o777 == 0o644


class _Exploit:
    """What a crafted trainer.states holds: unpickling it would run a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_pickle_in_a_checkpoint_runs_nothing(runs, tmp_path, capsys):
    """Optimizer state is arrays and JSON; an older version's pickle is read by an
    unpickler that builds arrays and optimizers only. A malicious one is refused in one
    line, nothing runs, and resume falls back to the previous checkpoint."""
    import pickle
    out = str(tmp_path / "run")
    shutil.copytree(runs[1], out)
    newest, _ = complete_checkpoints(out)[-1]
    for name in ("optimizer.json", "optimizer.params"):
        os.remove(os.path.join(newest, name))
    marker = tmp_path / "pwned"
    with open(os.path.join(newest, "trainer.states"), "wb") as f:
        pickle.dump(({0: _Exploit(str(marker))}, None), f)
    assert train.main(["--resume", out, "--epochs", "4", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert not marker.exists()
    refused = [l for l in err.splitlines() if "skipping checkpoint" in l]
    assert len(refused) == 1 and "posix.system" in refused[0] and "refused" in refused[0], err
    assert_same_run(runs[0], out)


def test_an_unreadable_state_json_is_skipped_with_a_line(runs, tmp_path, capsys):
    out = str(tmp_path / "run")
    shutil.copytree(runs[1], out)
    newest, _ = complete_checkpoints(out)[-1]
    with open(os.path.join(newest, "state.json"), "w") as f:
        f.write('{"epoch": 3, "bat')  # cut short by a crash of an older version
    assert train.main(["--resume", out, "--epochs", "4", "--quiet"]) == 0
    skipped = [l for l in capsys.readouterr().err.splitlines() if "skipping checkpoint" in l]
    assert skipped == [f"gluon_gpu.train: skipping checkpoint {newest}: state.json is not valid JSON"]
    assert_same_run(runs[0], out)


def test_the_printed_resume_command_works_when_pasted(tmp_path):
    """A run directory with a space and a quote: the command printed after Ctrl-C is
    shell-quoted, names this interpreter (a bare ``python`` on the PATH is not the
    virtualenv's), and pasted into a shell that activated nothing, elsewhere, it
    continues the run."""
    out = str(tmp_path / "my run's dir")
    proc = start(SMALL + ["--epochs", "50", "--out", out])
    wait_for(lambda: "epoch-00001-batch-0000000" in checkpoint_names(out))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    command = err.strip().splitlines()[-1].split("resume with: ", 1)[1]
    assert shlex.split(command) == [sys.executable, "-m", "gluon_gpu.train", "--resume", out]
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}  # no venv, no PYTHONPATH
    resumed = subprocess.run(["bash", "-c", command + " --epochs 3 --quiet"], cwd=tmp_path, capture_output=True,
                             text=True, env=bare)
    assert resumed.returncode == 0, resumed.stderr
    assert len(json.load(open(os.path.join(out, "metrics.json")))["epochs"]) == 3


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MB tmpfs: room for the step-0 checkpoint and two epoch checkpoints of SMALL
    (0.25 + 2 x 0.49 MB) but not a third. Root only (CI runs as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_is_one_line_leaves_no_temporary_and_resumes(runs, small_disk, capsys):
    out = str(small_disk / "run")
    assert table_exit("disk full", train.main(SMALL + ["--epochs", "4", "--keep", "10", "--out", out]))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gluon_gpu.train: error: cannot write "), err
    assert "No space left on device" in err[0]
    assert f"continue from its epoch 2, batch 0 with: {sys.executable} -m gluon_gpu.train --resume {out}" in err[0]
    leftovers = [os.path.join(d, n) for d, dirs, files in os.walk(out) for n in dirs + files
                 if n.startswith(".") and n != ".lock"]
    assert leftovers == []  # every temporary removed
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["status"] == "failed" and "No space left on device" in metrics["reason"]
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)  # space freed
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(runs[0], out)


def test_temporaries_of_a_killed_write_are_removed_by_the_next_writer(runs, tmp_path):
    out = str(tmp_path / "run")
    shutil.copytree(runs[1], out)
    leftover = os.path.join(out, ".metrics.json.k3j2_x.tmp")  # what a kill inside atomic_write leaves
    with open(leftover, "w") as f:
        f.write('{"half')
    assert train.main(["--resume", out, "--epochs", "4", "--quiet"]) == 0
    assert not os.path.exists(leftover)
    assert_same_run(runs[0], out)


LOADER_PROBE = """
import glob, os, numpy as np
from mxnet import gluon
from gluon_gpu.data import LoaderPipeline
dataset = gluon.data.ArrayDataset(np.zeros((512, 1, 8, 8), np.float32), np.zeros(512, np.float32))
pipeline = LoaderPipeline(dataset, 64, num_workers=4)
for _ in pipeline.epoch(0):
    pass
print(len(glob.glob(os.path.join(os.environ["TMPDIR"], "**", "pymp-*"), recursive=True)))
"""


def test_the_loader_s_workers_leave_no_temporary_files():
    """The DataLoader's workers make pymp-* directories (sockets passing shared memory)
    and, stopped at exit, never removed them: now they share the main process's one,
    which multiprocessing removes at exit (inside TMPDIR/gluon_gpu-PID, gone too)."""
    # A short TMPDIR: the sockets inside it must fit AF_UNIX's 108 bytes, which pytest's
    # tmp_path under an xdist worker (pytest-N/popen-gwK/<test name>/) did not always.
    tmp = tempfile.mkdtemp(prefix="pymp-test-", dir="/tmp")
    try:
        done = subprocess.run([sys.executable, "-c", LOADER_PROBE], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": REPO, "TMPDIR": tmp})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert int(done.stdout) == 1  # one directory, the main process's
        assert os.listdir(tmp) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_workers_under_a_tmpdir_too_long_for_their_sockets_use_tmp():
    """Worker sockets live under TMPDIR, and an AF_UNIX path holds 107 bytes: a TMPDIR
    of 90 characters failed in the first DataLoader worker; /tmp is used instead, and
    left as it was found: its own gluon_gpu-PID gone (the other tests' programs running
    beside it make theirs in /tmp too)."""
    tmp = tempfile.mkdtemp(prefix="long-tmpdir-", dir="/tmp")
    deep = os.path.join(tmp, "d" * (90 - len(tmp) - 1))
    os.makedirs(deep)
    try:
        proc = subprocess.Popen([sys.executable, "-c", LOADER_PROBE.replace('os.environ["TMPDIR"]', '"/tmp"')],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": REPO, "TMPDIR": deep})
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Traceback" not in err, err
        assert int(out) >= 1  # its pymp-* went under /tmp
        assert os.listdir(deep) == [] and not os.path.exists(f"/tmp/gluon_gpu-{proc.pid}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_tmpdir_too_long_with_no_writable_tmp_is_one_line_naming_the_length(monkeypatch):
    monkeypatch.setattr(pools.os, "access", lambda path, mode: path != "/tmp")
    base = "/" + "t" * 80
    with pytest.raises(UserError, match=r"TMPDIR '/t+' is too long for the sockets .* \(at most \d+ characters here\)"):
        pools._socket_base(base)
    assert pools._socket_base("/short") == "/short"


def test_a_reader_that_goes_away_does_not_end_the_run(tmp_path):
    """``train | head -1``: the pipe closes after the plan line; the run trains on to the
    end with no traceback, every line in train.log."""
    out = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "gluon_gpu.train", "--devices", "cpu", "--limit", "1280",
                             "--val-limit", "200", "--batch-size", "64", "--epochs", "2", "--quiet", "--out", out],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("gluon_gpu ")  # the plan line
    proc.stdout.close()  # the reader goes away
    err = proc.stderr.read()
    assert table_exit("the reader of the output goes away", proc.wait(timeout=120))
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert read_metrics(out)["status"] == "finished"
    assert "best: epoch" in open(os.path.join(out, "train.log")).read().splitlines()[-1]


def test_every_program_removes_the_temporaries_of_a_killed_one(tmp_path):
    """A program killed by SIGKILL (a bench's scratch runs, a loader's sockets) leaves its
    TMPDIR/gluon_gpu-PID behind; the next program of any kind removes it at its start,
    and leaves a live process's alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{pools.TEMP_PREFIX}{gone.pid}"
    (dead / "scratch").mkdir(parents=True)
    live = tmp_path / f"{pools.TEMP_PREFIX}{os.getpid()}"
    live.mkdir()
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.evaluate", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert not dead.exists() and live.exists()


def test_the_bench_s_scratch_runs_live_in_its_own_temporary_folder():
    probe = ("import os, tempfile\nfrom gluon_gpu.core.platform.pools import process_temp_dir\n"
             "with tempfile.TemporaryDirectory(dir=process_temp_dir()) as d:\n"
             "    open(os.path.join(d, 'f'), 'w').close()\n    print(process_temp_dir())\n")
    tmp = tempfile.mkdtemp(prefix="scratch-", dir="/tmp")  # short: worker sockets fit under it
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": REPO, "TMPDIR": tmp})
        assert done.stdout.strip().startswith(os.path.join(tmp, pools.TEMP_PREFIX)), done.stderr
        assert os.listdir(tmp) == []  # removed at exit, folder and all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
