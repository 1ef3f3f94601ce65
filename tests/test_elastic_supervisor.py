"""An elastic Horovod worker's supervisor (programs/elastic.supervise): the process
Horovod's driver started runs the training as a child, and a new child after each
reset (its exit RESET_STATUS) or a crash as a collective failed, at most --max-resets
times. Its child here is a stand-in script that ends as each test says."""
import os
import signal
import sys

import pytest

from gluon_gpu.programs import elastic


def supervised(monkeypatch, body, max_resets=3):
    """supervise() over a child running ``body`` (Python; ``n``: how many resets came
    before it, from elastic.TRAINING_ENV), its exit status."""
    source = f"import os, signal, sys\nn = int(os.environ[{elastic.TRAINING_ENV!r}])\n{body}"
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", source])
    monkeypatch.delenv(elastic.TRAINING_ENV, raising=False)
    handlers = {s: signal.getsignal(s) for s in elastic.STOP_SIGNALS}
    try:
        return elastic.supervise(max_resets)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def test_a_crash_and_a_reset_each_start_a_new_child_that_goes_on(monkeypatch, capfd):
    code = supervised(monkeypatch, f"if n == 0: os.kill(os.getpid(), signal.SIGSEGV)\n"
                                   f"sys.exit({elastic.RESET_STATUS} if n == 1 else 0)")
    said = capfd.readouterr().err.strip().splitlines()
    assert code == 0
    assert said == ["gluon_gpu.train: its training died of SIGSEGV as a collective failed: this worker trains on "
                    "from the newest commit (reset 1 of at most 3, --max-resets)",
                    "gluon_gpu.train: the job's membership changed: this worker trains on from the newest commit "
                    "(reset 2 of at most 3, --max-resets)"]


def test_a_segfault_mxnet_turns_into_exit_255_is_a_crash_too(monkeypatch, capfd):
    """MXNet's SIGSEGV handler prints its line and exits 255: the supervisor did not see a
    crash there, and a worker whose new child segfaulted ended the elastic job (seen in a
    fresh-clone suite beside other work)."""
    code = supervised(monkeypatch, "if n == 0:\n    import ctypes, mxnet\n    ctypes.string_at(0)\nsys.exit(0)")
    said = capfd.readouterr().err.strip().splitlines()
    assert code == 0 and "Segmentation fault: 11" in said
    assert said[-1] == ("gluon_gpu.train: its training died of SIGSEGV as a collective failed: this worker trains on "
                        "from the newest commit (reset 1 of at most 3, --max-resets)")


def test_resets_have_a_ceiling(monkeypatch, capfd):
    code = supervised(monkeypatch, f"sys.exit({elastic.RESET_STATUS})", max_resets=2)
    said = capfd.readouterr().err.strip().splitlines()
    assert code == 1 and len(said) == 3
    assert said[-1] == ("gluon_gpu.train: error: the job's membership changed after 2 resets (--max-resets): "
                        "this worker stops")


@pytest.mark.parametrize("body,expected", [("sys.exit(3)", 3), ("os.kill(os.getpid(), signal.SIGKILL)", 137),
                                           ("sys.exit(0)", 0)])
def test_any_other_end_is_the_worker_s_own(monkeypatch, capfd, body, expected):
    assert supervised(monkeypatch, body) == expected
    assert capfd.readouterr().err == ""


def test_a_stop_signal_goes_on_to_the_child(monkeypatch, tmp_path):
    """SIGTERM to the supervisor reaches the training child, which ends as it decides."""
    ready = tmp_path / "ready"
    body = (f"signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
            f"open({str(ready)!r}, 'w').close()\nos.kill(os.getppid(), signal.SIGTERM)\nsignal.pause()")
    assert supervised(monkeypatch, body) == 143
    assert ready.exists()


@pytest.fixture
def rendezvous(monkeypatch):
    """A stand-in for the driver's rendezvous server answering ``answer[0]`` to every
    GET, and the variables Horovod's driver gives a worker pointing at it."""
    import http.server
    import threading
    answer, asked = ["1,2,0,1,1,2"], []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # pylint: disable=invalid-name
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answer[0].encode("ascii"))

        def log_message(self, *_):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name, value in (("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1"), ("HOROVOD_GLOO_RENDEZVOUS_PORT",
                        str(server.server_port)), ("HOROVOD_HOSTNAME", "node1"), ("HOROVOD_GLOO_TIMEOUT_SECONDS", "5"),
                        *((v, "1" if v.endswith("SIZE") else "0") for v in elastic.RANK_VARIABLES)):
        monkeypatch.setenv(name, value)  # all restored after, those the worker sets too
    yield answer, asked, server
    server.shutdown()


def test_a_new_child_takes_its_rank_in_the_new_membership(rendezvous):
    answer, asked, _ = rendezvous
    assert elastic._take_new_rank() is None  # pylint: disable=protected-access
    assert asked == ["/rank_and_size/node1:0"]
    assert [os.environ[v] for v in elastic.RANK_VARIABLES] == answer[0].split(",")


def test_a_host_taken_out_of_the_job_ends_its_worker_quietly(rendezvous, capfd):
    rendezvous[0][0] = "-1,-1,-1,-1,-1,-1"
    assert elastic._take_new_rank() == 0  # pylint: disable=protected-access
    assert capfd.readouterr().err == "gluon_gpu.train: Horovod's driver took node1:0 out of the job: this worker ends\n"


@pytest.mark.parametrize("answer", ["garbage", "1,2"])
def test_no_rank_from_the_server_is_one_line(rendezvous, capfd, answer):
    rendezvous[0][0] = answer
    assert elastic._take_new_rank() == 1  # pylint: disable=protected-access
    said = capfd.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("gluon_gpu.train: error: Horovod's rendezvous server at 127.0.0.1:")


def test_a_server_gone_is_one_line(rendezvous, capfd):
    rendezvous[2].shutdown()
    rendezvous[2].server_close()
    assert elastic._take_new_rank() == 1  # pylint: disable=protected-access
    said = capfd.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "gave this worker no rank within 5 s (HOROVOD_GLOO_TIMEOUT_SECONDS)" in said[0]


def test_an_epoch_end_checks_the_hosts_only_when_another_step_follows():
    """After the last epoch (or an early stop) no check: a reset there ended the worker
    before it wrote the run's final files, seen in a job over two hosts."""
    class Commits:
        checks = 0

        def check_host_updates(self):
            self.checks += 1
    commits = Commits()
    commit = elastic.ElasticCommit(commits, checkpointer=None, history=[], every=0, batches=100)
    commit.on_epoch_end({"epoch": 3}, [])
    assert commits.checks == 0
    commit.on_step(4, 1)
    commit.on_step(4, 2)
    assert commits.checks == 1
