"""The environment a program reads is checked before use (issue #53): a distributed
job's DMLC_* (ps-lite hung without a word, or aborted in C++, on bad ones), Slurm's as
the launcher reads them, gluon_gpu's own; and a worker whose scheduler never comes
gives up after GLUON_GPU_CONNECT_TIMEOUT seconds with one line naming the address."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from gluon_gpu.core.platform import environment

from failure_table import table_exit
from test_checkpoints import REPO

JOB = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091", "DMLC_NUM_WORKER": "1",
       "DMLC_NUM_SERVER": "1"}
TRAIN = [sys.executable, "-m", "gluon_gpu.train", "--devices", "cpu", "--kvstore", "dist_sync", "--epochs", "1",
         "--limit", "256", "--val-limit", "64", "--quiet"]


def clean_env(**changes):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "SLURM_", "GLUON_GPU_"))}
    env.update({k: v for k, v in changes.items() if v is not None})
    for k in [k for k, v in changes.items() if v is None]:
        env.pop(k, None)
    return env


@pytest.mark.parametrize("changes,message", [
    ({"DMLC_ROLE": "bogus"}, "DMLC_ROLE='bogus': must be one of worker, server, scheduler"),
    ({"DMLC_NUM_WORKER": "0"}, "DMLC_NUM_WORKER='0': must be a whole number from 1 to 4096"),
    ({"DMLC_NUM_WORKER": "-1"}, "DMLC_NUM_WORKER='-1': must be a whole number"),
    ({"DMLC_NUM_WORKER": "abc"}, "DMLC_NUM_WORKER='abc': must be a whole number"),
    ({"DMLC_NUM_SERVER": "99999"}, "DMLC_NUM_SERVER='99999': must be a whole number from 1 to 4096"),
    ({"DMLC_PS_ROOT_PORT": "70000"}, "DMLC_PS_ROOT_PORT='70000': must be a whole number from 1 to 65535"),
    ({"DMLC_PS_ROOT_URI": None}, "DMLC_ROLE='worker' but DMLC_PS_ROOT_URI is not set"),
    ({"GLUON_GPU_CONNECT_TIMEOUT": "0"}, "GLUON_GPU_CONNECT_TIMEOUT='0': must be a whole number from 1"),
    ({"GLUON_GPU_STALL_TIMEOUT": "1h"}, "GLUON_GPU_STALL_TIMEOUT='1h': must be a whole number from 1"),
    ({"HOROVOD_RANK": "abc"}, "HOROVOD_RANK='abc': must be a whole number from 0 to 4095 (Horovod's launcher"),
    ({"HOROVOD_SIZE": "0"}, "HOROVOD_SIZE='0': must be a whole number from 1 to 4096 (Horovod's launcher"),
    ({"HOROVOD_GLOO_TIMEOUT_SECONDS": "30s"}, "HOROVOD_GLOO_TIMEOUT_SECONDS='30s': must be a whole number from 1"),
    ({"HOROVOD_CYCLE_TIME": "nan"}, "HOROVOD_CYCLE_TIME='nan': must be milliseconds above 0, at most 1000"),
    # what a check took and its consumer (int(), C's atoi) refused: digits that are not ASCII's (#62)
    ({"OMP_NUM_THREADS": "²"}, "OMP_NUM_THREADS='²': must be a whole number from 1 to"),
    ({"OMP_NUM_THREADS": "٣"}, "OMP_NUM_THREADS='٣': must be a whole number from 1 to"),
    ({"DMLC_NUM_WORKER": "1_0"}, "DMLC_NUM_WORKER='1_0': must be a whole number from 1 to 4096"),
    ({"HOROVOD_CYCLE_TIME": "١٠"}, "HOROVOD_CYCLE_TIME='١٠': must be milliseconds above 0, at most 1000"),
    ({"GLUON_GPU_GPU_SHARE": "٠/2"}, "GLUON_GPU_GPU_SHARE='٠/2': must be J/W"),
])
def test_a_bad_job_variable_is_one_line_before_mxnet_starts(changes, message):
    done = subprocess.run(TRAIN + ["--out", "/nonexistent/never"], cwd=REPO, env=clean_env(**{**JOB, **changes}),
                          capture_output=True, text=True, timeout=120)
    assert table_exit("a distributed job's variable that is wrong", done.returncode)
    assert done.stderr.strip() == f"gluon_gpu: error: {message}" + \
        done.stderr.strip().split(message, 1)[1], done.stderr
    assert done.stderr.count("\n") == 1


def test_a_restart_number_outside_a_launched_job_is_refused_not_a_silent_resume(tmp_path):
    for value, message in (("abc", "GLUON_GPU_RESTART='abc': must be a whole number"),
                           ("1", "GLUON_GPU_RESTART='1' is set outside a distributed job")):
        done = subprocess.run(TRAIN[:3] + ["--devices", "cpu", "--out", str(tmp_path)], cwd=REPO,
                              env=clean_env(GLUON_GPU_RESTART=value), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_worker_whose_scheduler_has_no_address_gives_up_in_one_line(tmp_path):
    env = clean_env(**{**JOB, "DMLC_PS_ROOT_URI": "no-such-host.invalid", "GLUON_GPU_CONNECT_TIMEOUT": "3"})
    done = subprocess.run(TRAIN + ["--out", str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert table_exit("a worker whose scheduler never admits it", done.returncode)
    assert done.stderr.count("\n") == 1, done.stderr
    assert "waited 3 s for the scheduler at no-such-host.invalid:9091, a name with no address" in done.stderr


def test_a_worker_whose_scheduler_never_comes_gives_up_in_one_line(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = clean_env(**{**JOB, "DMLC_PS_ROOT_PORT": str(port), "GLUON_GPU_CONNECT_TIMEOUT": "3"})
    done = subprocess.run(TRAIN + ["--out", str(tmp_path / "run")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert (f"gluon_gpu: error: this worker waited 3 s for the scheduler at 127.0.0.1:{port} (DMLC_PS_ROOT_URI, "
            "DMLC_PS_ROOT_PORT) to start the job of 1 worker(s) and 1 server(s)") in done.stderr


@pytest.mark.parametrize("changes,message", [
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS='0': must be a whole number from 1 to"),
    ({"SLURM_NTASKS": "-3"}, "SLURM_NTASKS='-3'"),
    ({"SLURM_NTASKS": "abc"}, "SLURM_NTASKS='abc'"),
    ({"SLURM_NTASKS": "1000000"}, "SLURM_NTASKS='1000000': must be a whole number from 1 to 32 (8 a CPU of the "
                                  "allocation's 1 node(s) of 4)"),
    ({"SLURM_RESTART_COUNT": "abc"}, "SLURM_RESTART_COUNT='abc'"),
    ({"SLURM_NTASKS": "²"}, "SLURM_NTASKS='²': must be a whole number from 1 to"),  # a ValueError traceback before
    ({"SLURM_NTASKS": "٢"}, "SLURM_NTASKS='٢': must be a whole number from 1 to"),
    # a GPU count Slurm did not write ran as if the node had none, and said nothing (#62)
    ({"SLURM_GPUS_ON_NODE": "abc"}, "SLURM_GPUS_ON_NODE='abc': must be a whole number from 0 to 4096 (the GPUs"),
    ({"SLURM_GPUS_ON_NODE": "-1"}, "SLURM_GPUS_ON_NODE='-1'"),
    ({"SLURM_GPUS_ON_NODE": "4(IDX:0-3)"}, "SLURM_GPUS_ON_NODE='4(IDX:0-3)'"),
    ({"SLURM_JOB_ID": "12x"}, "SLURM_JOB_ID='12x': must be Slurm's job number")])
def test_slurm_variables_the_launcher_reads_are_checked(changes, message):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_ON_NODE": "4", "SLURM_NTASKS": "2",
           **changes}
    assert message in environment.slurm_problem(env)
    launched = subprocess.run([sys.executable, "-m", "gluon_gpu.launch", "--", "true"], cwd=REPO, timeout=120,
                              env=clean_env(**env, SLURM_JOB_NODELIST="node0"), capture_output=True, text=True)
    assert table_exit("a Slurm variable the launcher reads", launched.returncode)
    assert launched.stderr.strip() == f"gluon_gpu.launch: error: --slurm: {environment.slurm_problem(env)}"
    assert environment.slurm_problem({k: v for k, v in env.items() if k not in changes} | {
        "SLURM_NTASKS": "2"}) is None


@pytest.mark.parametrize("command,message", [
    (["gluon_gpu.train", "--loader-workers", "1000000"], "--loader-workers/--num-workers: must be from 0 to"),
    (["gluon_gpu.launch", "-n", "100000", "--", "true"], "-n 100000 workers and -s 1 server(s) over 1 host(s): at "
                                                       "most")])
def test_a_count_past_the_machine_is_refused_before_any_process_starts(command, message):
    done = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert table_exit("a count past what the machine runs", done.returncode)
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_waiting_for_its_scheduler_hears_a_stop_signal(tmp_path, signum):
    """#62, class 'a stop signal not heard during a blocking wait': ps-lite's connect waits
    in C++, where no Python handler runs, and the worker ignored SIGTERM and Ctrl-C until
    the connect deadline ended (600 s by default). It is waited on by ps-lite's own line
    (PS_VERBOSE: its bind, inside the wait) before the signal is sent."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = clean_env(**{**JOB, "DMLC_PS_ROOT_PORT": str(port), "GLUON_GPU_CONNECT_TIMEOUT": "600", "PS_VERBOSE": "1"})
    worker = subprocess.Popen(TRAIN + ["--out", str(tmp_path / "run")], cwd=REPO, env=env, stderr=subprocess.PIPE,
                              text=True)
    for line in worker.stderr:
        if "Bind to role=worker" in line:
            break
    worker.send_signal(signum)
    rest = worker.stderr.read()
    assert table_exit("a stop signal (Ctrl-C, SIGTERM, SIGHUP) while a worker waits", worker.wait(timeout=120))
    assert worker.returncode == 128 + signum
    assert rest.strip() == (f"gluon_gpu: stopped by {signal.Signals(signum).name} while this worker waited for "
                            f"the scheduler at 127.0.0.1:{port}"), rest
