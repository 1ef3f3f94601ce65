"""Every child process of the benchmark has a deadline (issue #53): `bench --timeout`
stops one that runs past it, in one line, exit 1, and leaves no process behind."""
import os
import select
import subprocess
import sys

import pytest

from gluon_gpu.core.platform.errors import ChildFailed, DeadlineError, UserError
from gluon_gpu.programs.bench import children
from gluon_gpu.programs.cli import main_guard
from gluon_gpu.programs.bench import program as bench

from failure_table import table_exit

SLOW = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return not f.read().split(") ")[1].startswith("Z")


def test_a_child_past_its_deadline_is_stopped_in_one_error():
    with pytest.raises(DeadlineError, match=r"^the slow child ran past --timeout 2 s and was stopped"):
        children.run(SLOW, "the slow child", 2)


def test_a_streamed_child_yields_its_lines_then_is_stopped_at_its_deadline():
    got = []
    with pytest.raises(DeadlineError, match="^the slow loop ran past --timeout 2 s"):
        for line in children.lines(SLOW, "the slow loop", 2):
            got.append(line.strip())
    assert got == ["started"]


def test_a_streamed_child_that_fails_names_itself_and_its_last_line():
    with pytest.raises(ChildFailed, match="^the bad loop: ValueError: no$"):
        list(children.lines([sys.executable, "-c", "raise ValueError('no')"], "the bad loop", 60))


def test_a_child_failure_has_the_exit_class_of_its_cause():
    """#62, class 'the wrong exit class': a bench child killed by SIGKILL made the bench
    exit 2, the status of a user's mistake. A child's own exit 2 (it said the user's
    mistake) stays 2; killed, crashed or failed is 1."""
    with pytest.raises(ChildFailed, match="^the killed loop: killed by SIGKILL"):
        list(children.lines([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], "the killed loop", 60))
    with pytest.raises(UserError, match="^the refusing loop: no such flag$"):
        list(children.lines([sys.executable, "-c",
                             "import sys; print('no such flag', file=sys.stderr); sys.exit(2)"], "the refusing loop",
                            60))

    @main_guard("gluon_gpu.bench")
    def failing(argv=None):
        list(children.lines([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], "the killed loop", 60))
    assert table_exit("a child process of the benchmark fails on its own", failing())


def test_no_deadline_with_timeout_zero():
    done = children.run([sys.executable, "-c", "print('done')"], "a child", 0)
    assert done.stdout == "done\n"


def test_bench_stops_a_training_job_past_its_timeout(tmp_path, capsys):
    code = bench.main(["--devices", "cpu", "--workers", "1", "--epochs", "50", "--limit", "6400",
                       "--timeout", "3", "--out", str(tmp_path / "bench"), "--quiet"])
    assert table_exit("a child process of the benchmark outlives `--timeout`", code)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("gluon_gpu.bench: error: the one-process training job ran past --timeout 3 s and was stopped "
                       "(--timeout 0: no limit)")
    assert not [name for name in os.listdir(tmp_path / "bench") if name.startswith("job-")]  # no empty job folder


def test_a_silent_child_is_said_by_how_it_ended():
    """A child killed without a word (the kernel's OOM killer) was 'failed' alone."""
    from gluon_gpu.programs.bench.children import last_words
    assert last_words("x\nthe last line\n", 1) == "the last line"
    assert last_words("", -9) == "killed by SIGKILL (the kernel's out-of-memory killer sends it: see dmesg)"
    assert last_words("  \n", -15) == "killed by SIGTERM"
    assert last_words("", 3) == "exit status 3, nothing on stderr"


def test_a_timeout_where_nothing_runs_as_a_child_is_said(tmp_path, capsys):
    """#62, class 'a flag ignored in a mode': bench --timeout 1 on the scaling table ran to
    its end without a word (its rows train in the benchmark's own process)."""
    assert bench.main(["--devices", "cpu", "--epochs", "1", "--limit", "256", "--baseline", "none", "--timeout", "1",
                       "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "gluon_gpu.bench: warning: --timeout bounds the benchmark's child processes" in capsys.readouterr().err


def test_a_child_dies_with_a_killed_benchmark(tmp_path):
    """#62, class 'a child outliving its owner': a SIGKILLed benchmark's children (a
    training job, PyTorch's loop) ran on. Here a stand-in benchmark streams a child that
    would sleep 10 minutes, and is killed once the child has said it started."""
    probe = ("import sys; from gluon_gpu.programs.bench import children\n"
             "for line in children.lines([sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); "
             "time.sleep(600)'], 'the slow child', 0):\n    print(line.strip(), flush=True)")
    bench_like = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = int(bench_like.stdout.readline())
    bench_like.kill()
    bench_like.wait()
    fd = os.pidfd_open(child)  # waits on the child's state, a minute as the safety net
    try:
        assert select.select([fd], [], [], 60)[0], "the child outlived the benchmark"
    finally:
        os.close(fd)
