"""Distributed training on MXNet's parameter-server kvstore, on loopback, and the launcher."""
import json
import os
import re
import random
import shlex
import signal
import subprocess
import sys
import time
import uuid

import mxnet as mx
import numpy as np
import pytest

from gluon_gpu.core.platform import owned
from gluon_gpu.programs import launch, resume, train

from conftest import read_metrics, with_flags
from test_checkpoints import CHAOS_KILLS, CHAOS_SEED, cpu_seconds
from failure_table import table_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = [sys.executable, "-m", "gluon_gpu.train", "--kvstore", "dist_sync", "--devices", "cpu",
         "--quiet", "--limit", "6400", "--batch-size", "64"]


def run_launch(args, job, timeout=240, **kw):
    env = {**os.environ, "PYTHONPATH": REPO, launch.JOB_ENV: job, **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "gluon_gpu.launch"] + args, cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def job_processes(job):
    """(pid, DMLC_ROLE) of every live process carrying the job's marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    continue  # a zombie is already dead
        except OSError:
            continue
        if env.get(launch.JOB_ENV.encode()) == job.encode():
            found.append((int(pid), env.get(b"DMLC_ROLE", b"").decode()))
    return found


HANG_GUARD = 120  # seconds; see wait_until_gone


def wait_until_gone(job, others=lambda: False):
    """Until no process of ``job`` lives (nor ``others()`` says one does): the state waited
    on; HANG_GUARD only keeps a hang from stalling the suite. What is left, for the assert."""
    deadline = time.time() + HANG_GUARD
    while (job_processes(job) or others()) and time.time() < deadline:
        time.sleep(0.05)
    return job_processes(job)


def params(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--timeout", "200", "--"] + TRAIN +
                      ["--epochs", "1", "--out", str(root / "run")], job,
                      env={"GLUON_GPU_REPLICA_DIR": str(root / "replicas")})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert job_processes(job) == []
    return root, out


def test_two_workers_hold_identical_replicas_and_learn(two_worker_run):
    root, printed = two_worker_run
    r0, r1 = params(root / "replicas" / "rank-0.params"), params(root / "replicas" / "rank-1.params")
    for k in r0:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    m = read_metrics(str(root / "run"))
    assert m["workers"] == 2 and m["status"] == "finished"
    assert m["epochs"][0]["val_acc"] > 0.5  # chance is 0.1
    assert "(2 workers)" in printed and printed.count("epoch   1/1") == 1  # rank 0 prints alone


def test_two_workers_equal_one_process_with_the_same_global_batch(two_worker_run, tmp_path):
    """Worker r takes the r-th slice of each global batch, so 2 workers x 64 train exactly
    what one process on 2 devices with a batch of 128 trains (up to float error)."""
    root, _ = two_worker_run
    single = str(tmp_path / "single")
    assert train.main(["--devices", "cpu*2", "--quiet", "--limit", "6400", "--batch-size", "128",
                       "--epochs", "1", "--out", single]) == 0
    want, got = params(os.path.join(single, "net.params")), params(root / "run" / "net.params")
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    a, b = read_metrics(single)["epochs"][0], read_metrics(str(root / "run"))["epochs"][0]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert a["val_acc"] == pytest.approx(b["val_acc"], abs=2e-3)


def test_an_augmented_mixed_job_equals_one_process(tmp_path):
    """--augment and --mixup draw per sample from (seed, epoch): each worker augments and
    mixes its slice of the global batch as one process with all the devices does."""
    flags = ["--augment", "flip,crop=2,erase", "--mixup", "0.4", "--limit", "2560", "--val-limit", "500",
             "--epochs", "1"]
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--timeout", "200", "--"] + with_flags(TRAIN, *flags)
                      + ["--out", str(tmp_path / "job")], job)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    single = str(tmp_path / "single")
    assert train.main(["--devices", "cpu*2", "--quiet", "--batch-size", "128", "--out", single] + flags) == 0
    want, got = params(os.path.join(single, "net.params")), params(tmp_path / "job" / "net.params")
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_a_streamed_job_reads_each_worker_s_share_and_equals_one_process(tmp_path, fashion_folder):
    """Over an image folder read from disk per batch, each worker's DataLoader decodes
    only its slice of every global batch: the two workers' reads are disjoint halves of
    the epoch, and the job ends where one process with both devices ends."""
    flags = ["--dataset", "folder", "--data-dir", fashion_folder, "--pipeline", "loader", "--epochs", "1"]
    logs = tmp_path / "reads"
    logs.mkdir()
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--timeout", "200", "--", sys.executable,
                       os.path.join(REPO, "tests", "counted_reads.py"), str(logs)] + TRAIN[3:-4] + flags
                      + ["--batch-size", "64", "--out", str(tmp_path / "job")], job)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    reads = []
    for name in sorted(os.listdir(logs)):
        with open(logs / name) as f:
            reads.append([line for line in f.read().splitlines() if "/train/" in line])
    assert len(reads) == 2 and len(reads[0]) == len(reads[1]) == 768  # 1536 images, 12 global batches of 128
    assert not set(reads[0]) & set(reads[1])
    single = str(tmp_path / "single")
    assert train.main(["--devices", "cpu*2", "--quiet", "--batch-size", "128", "--out", single] + flags) == 0
    want, got = params(os.path.join(single, "net.params")), params(tmp_path / "job" / "net.params")
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_a_dead_worker_stops_the_whole_job_and_leaves_no_process(tmp_path):
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--grace", "3", "--"] + TRAIN +
                      ["--epochs", "100", "--out", str(tmp_path / "run")], job)
    wait_until(lambda: os.path.exists(tmp_path / "run" / "metrics.json"), proc, "training under way")
    workers = [pid for pid, role in job_processes(job) if role == "worker"]
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)  # bounded: the poll, then SIGTERM, grace, SIGKILL
    assert len(read_metrics(tmp_path / "run")["epochs"]) < 100  # stopped, not run out
    assert table_exit("a process of a distributed job dies", proc.returncode)
    lines = err.strip().splitlines()
    assert lines[-1].startswith("gluon_gpu.launch: worker ") and "killed by SIGKILL" in lines[-1]
    assert wait_until_gone(job) == []  # the launcher has reaped them; the kernel may lag a moment


def test_a_stopped_server_ends_its_workers_waits_after_the_stall_deadline(tmp_path):
    """A role that stops (SIGSTOP: alive, so no launcher notices) leaves its workers waiting
    in ps-lite: each gives up after GLUON_GPU_STALL_TIMEOUT seconds with one line."""
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--grace", "3", "--"] + TRAIN +
                      ["--epochs", "100", "--out", str(tmp_path / "run")], job,
                      env={"GLUON_GPU_STALL_TIMEOUT": "5"})
    wait_until(lambda: os.path.exists(tmp_path / "run" / "metrics.json"), proc, "training under way")
    servers = [pid for pid, role in job_processes(job) if role == "server"]
    assert len(servers) == 1
    os.kill(servers[0], signal.SIGSTOP)
    _, err = proc.communicate(timeout=120)  # bounded: the stall deadline, then the launcher's stop
    assert len(read_metrics(tmp_path / "run")["epochs"]) < 100  # stopped, not run out
    assert table_exit("a role of a distributed job stops", proc.returncode)
    assert re.search(r"gluon_gpu: error: worker \d of 2 made no progress for 5 s: it waits on a role of the job "
                     r"\(scheduler at 127\.0\.0\.1:\d+, 1 server\(s\)", err), err
    assert wait_until_gone(job) == []


def test_timeout_stops_a_job(tmp_path):
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "1", "--timeout", "4", "--grace", "2", "--", sys.executable, "-c",
                       "import time; time.sleep(600)"], job)
    _, err = proc.communicate(timeout=60)
    assert table_exit("a job outlives", proc.returncode) and "timed out after 4 s" in err
    assert job_processes(job) == []


def test_hostfile_plan_runs_over_ssh_round_robin(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1\nalice@node2:2222\n")
    args = launch.build_parser().parse_args(["-n", "3", "-s", "2", "--hostfile", str(hostfile),
                                             "--scheduler-host", "10.0.0.5", "python", "train.py"])
    procs = launch.plan(args, "job1", 9000, launch.read_hostfile(str(hostfile)), cwd="/work dir")
    roles = [(role, i, host) for role, i, host, _, _ in procs]
    assert roles == [("scheduler", 0, None), ("server", 0, "node1"), ("server", 1, "alice@node2:2222"),
                     ("worker", 0, "node1"), ("worker", 1, "alice@node2:2222"), ("worker", 2, "node1")]
    _, _, _, argv, env = procs[4]
    deadlines = len(launch.SSH_DEADLINES)  # every ssh connection has deadlines (ConnectTimeout, ServerAlive)
    assert argv[:5 + deadlines] == ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                                    *launch.SSH_DEADLINES]
    assert "ConnectTimeout=30" in argv and "ServerAliveInterval=15" in argv
    argv = argv[:5] + argv[5 + deadlines:]
    assert argv[5:8] == ["-p", "2222", "alice@node2"]
    words = shlex.split(argv[8])
    assert words[:5] == ["cd", "/work dir", "&&", "exec", "env"]
    for assignment in ("DMLC_ROLE=worker", "DMLC_PS_ROOT_URI=10.0.0.5", "DMLC_PS_ROOT_PORT=9000",
                       "DMLC_NUM_SERVER=2", "DMLC_NUM_WORKER=3", "GLUON_GPU_JOB=job1"):
        assert assignment in words
    # the role runs under the wrapper that ends it with the ssh session
    assert words[-5:] == [sys.executable, "-c", owned.SOURCE, "python", "train.py"]
    scheduler = procs[0]
    assert scheduler[3][1:] == ["-c", "import mxnet"] and scheduler[4]["DMLC_ROLE"] == "scheduler"


def test_local_plan_uses_loopback():
    args = launch.build_parser().parse_args(["-n", "2", "--", "echo"])
    procs = launch.plan(args, "j", 1234)
    assert {env["DMLC_PS_ROOT_URI"] for *_, env in procs} == {"127.0.0.1"}
    assert {env["DMLC_NODE_HOST"] for *_, env in procs} == {"127.0.0.1"}  # what each listens on
    assert [p[0] for p in procs] == ["scheduler", "server", "worker", "worker"]


def test_launcher_usage_errors(tmp_path, capsys):
    assert launch.main(["-n", "2"]) == 2
    assert "no worker command" in capsys.readouterr().err
    assert table_exit("`launch --port P`", launch.main(["-n", "2", "--hostfile", str(tmp_path / "none"), "--", "true"]))
    assert capsys.readouterr().err.splitlines() == [f"gluon_gpu.launch: error: cannot read --hostfile {tmp_path}/none: "
                                                    "No such file or directory"]
    (tmp_path / "empty").write_text("# nobody\n")
    assert launch.main(["-n", "2", "--hostfile", str(tmp_path / "empty"), "--", "true"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"gluon_gpu.launch: error: --hostfile {tmp_path}/empty lists no host"]
    assert launch.main(["-n", "2", "--port", "70000", "--", "true"]) == 2
    assert "--port: must be a TCP port" in capsys.readouterr().err


def test_slurm_mistakes_are_one_line_each(tmp_path, capsys, monkeypatch):
    """--slurm outside an allocation, with --hostfile, or -n missing outside Slurm."""
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    assert launch.main(["--slurm", "--", "true"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gluon_gpu.launch: error: --slurm: not inside a Slurm allocation (no SLURM_JOB_ID and SLURM_JOB_NODELIST): "
        "run it from sbatch or salloc"]
    (tmp_path / "hosts").write_text("localhost\n")
    assert launch.main(["--slurm", "--hostfile", str(tmp_path / "hosts"), "--", "true"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gluon_gpu.launch: error: --slurm and --hostfile both name the hosts: give one"]
    assert launch.main(["--", "true"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gluon_gpu.launch: error: -n/--num-workers: how many workers (outside a Slurm allocation it has no default)"]


def role_sees(share, visible):
    """(status, stdout, stderr) of a role under the wrapper given GPU share ``share`` on a
    node whose step lists ``visible``; the role prints its CUDA_VISIBLE_DEVICES. The
    control line stays open until the role is done, as the launcher's does."""
    proc = subprocess.Popen([sys.executable, "-c", owned.SOURCE, sys.executable, "-c",
                             "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, owned.GPU_SHARE_ENV: share, "CUDA_VISIBLE_DEVICES": visible})
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    return proc.wait(), out, err


def test_slurm_gpus_are_split_among_each_node_s_workers(monkeypatch, capsys):
    """Every step of an --overlap job is given all of its node's GPUs: each worker's wrapper
    narrows CUDA_VISIBLE_DEVICES to its share (Slurm's list, renumbered or not), and a
    split that cannot be even is one line, from the launcher or from a node that differs."""
    for name, value in (("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "n[1-2]"), ("SLURM_GPUS_ON_NODE", "4")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "slurm_nodes", lambda: ["n1", "n2"])
    monkeypatch.setattr(launch, "slurm_node_address", lambda: "10.1.2.3")
    args = launch.build_parser().parse_args(["-n", "4", "--", "train"])
    placed = launch.placement(args)
    assert "the scheduler here, at 10.1.2.3; 4 GPUs a node, 2 to each worker (its CUDA_VISIBLE_DEVICES)" in \
        capsys.readouterr().err
    workers = [(host, env[owned.GPU_SHARE_ENV]) for role, _, host, _, env in
               launch.plan(args, "j", 9000, placed.hosts, cwd="/w", gpu_sharers=placed.gpu_sharers) if role == "worker"]
    assert workers == [("n1", "0/2"), ("n2", "0/2"), ("n1", "1/2"), ("n2", "1/2")]
    for share, visible in (("0/2", "4,5"), ("1/2", "6,7")):  # what Slurm gave the step: the node's 4 GPUs
        assert role_sees(share, "4,5,6,7") == (0, visible + "\n", "")
    status, *said = role_sees("0/2", "0,1,2")
    assert table_exit("`launch` in a Slurm allocation whose GPUs", status) and said == [
        "", "gluon_gpu.launch: error: this node's 3 GPUs (CUDA_VISIBLE_DEVICES 0,1,2) do not split evenly among its 2 "
            "workers\n"]
    assert table_exit("`launch` in a Slurm allocation whose GPUs", launch.main(["-n", "3", "--", "train"]))
    assert capsys.readouterr().err.splitlines() == [
        "gluon_gpu.launch: error: --slurm: the 4 GPUs of each node (SLURM_GPUS_ON_NODE) do not split evenly among "
        "-n 3 workers over 2 nodes (2/1 a node): give every node the same number of workers, one that divides 4"]
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert launch.placement(launch.build_parser().parse_args(["-n", "3", "--", "train"])) == \
        launch.Placement(["n1", "n2"], 0, 0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # Slurm requeued the job twice: its workers resume
    assert launch.placement(launch.build_parser().parse_args(["-n", "3", "--", "train"])).requeued == 2
    assert "; requeued by Slurm (2 time(s)): the workers resume from the newest complete checkpoint" in \
        capsys.readouterr().err


def test_under_slurm_the_scheduler_listens_at_this_node_s_nodeaddr(tmp_path, monkeypatch):
    """Not at what the hostname resolves to (Debian maps it to 127.0.1.1): at the address
    Slurm reaches the node at; one line when scontrol cannot say."""
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n[ \"$3\" = node7 ] && echo 'NodeName=node7 Arch=x86_64\n   NodeAddr=10.9.8.7 "
                    "NodeHostName=node7' && exit 0\necho \"Node $3 not found\" >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    assert launch.slurm_node_address() == "10.9.8.7"
    monkeypatch.setenv("SLURMD_NODENAME", "node8")
    with pytest.raises(launch.UserError, match=r"^--slurm: cannot find the address of this node \(node8\) with "
                                               r"scontrol: Node node8 not found; pass --scheduler-host$"):
        launch.slurm_node_address()


def test_a_port_in_use_is_one_line_naming_it(capsys):
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert table_exit("`launch --port P`", launch.main(["-n", "1", "--port", str(port), "--", "true"]))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gluon_gpu.launch: error: --port {port} is in use here"), err


def test_dist_kvstore_outside_a_job_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DMLC_ROLE", raising=False)
    assert train.main(["--kvstore", "dist_sync", "--devices", "cpu", "--out", str(tmp_path / "r")]) == 2
    assert "gluon_gpu.launch" in capsys.readouterr().err


def test_a_worker_command_that_cannot_start_is_one_line_and_leaves_nothing():
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "--grace", "3", "--", "/nonexistent/cmd"], job)
    _, err = proc.communicate(timeout=60)
    assert table_exit("a worker command that cannot start", proc.returncode) and "Traceback" not in err
    assert err.strip().splitlines() == ["gluon_gpu.launch: error: cannot start worker 0 (/nonexistent/cmd): "
                                        "No such file or directory"]
    assert job_processes(job) == []  # the scheduler and server it had started are gone


def test_no_role_outlives_a_killed_launcher(tmp_path):
    """kill -9 of the launcher: the kernel kills every local role (PR_SET_PDEATHSIG)."""
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--"] + TRAIN + ["--epochs", "100", "--out", str(tmp_path / "run")], job)
    wait_until(lambda: len([r for _, r in job_processes(job) if r == "worker"]) >= 2, proc, "the whole job up")
    proc.kill()
    assert table_exit("the launcher is killed", proc.wait())
    assert wait_until_gone(job) == []  # killed by the kernel as their parent died


# -- the job on a signal, and restarts: both must end where an uninterrupted job ends ----
LONG = TRAIN[:-4] + ["--limit", "12800", "--batch-size", "64", "--epochs", "3"]  # 100 steps an epoch


def wait_until(condition, proc, what, timeout=180):
    """Poll ``condition`` (progress: a file, a process) while the job runs; ``timeout``
    only keeps a hang from stalling the suite."""
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"the job ended before {what}: {proc.communicate()}"
        assert time.time() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


def listening(pids):
    """The TCP addresses ``pids`` listen on (``ss``, iproute2)."""
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line.split()[3] for line in lines
            if any(f"pid={pid}," in line for pid in pids)]


def checkpoint_exists(out, epoch, batch=0):
    return os.path.isdir(os.path.join(out, "checkpoints", f"epoch-{epoch:05d}-batch-{batch:07d}"))


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """An uninterrupted 2-worker dist_sync job of 3 epochs: what the others must end at."""
    out = str(tmp_path_factory.mktemp("straight") / "run")
    proc = run_launch(["-n", "2", "--"] + LONG + ["--out", out], uuid.uuid4().hex)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return params(os.path.join(out, "net.params"))


def assert_same_params(got, want):
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_sigterm_to_the_launcher_checkpoints_the_partial_epoch_and_exits_143(tmp_path, straight_run):
    """A preemption: the workers agree on a step, rank 0 checkpoints it, all exit, and the
    launcher exits 143 at once, not after --grace (120 s here); the run then resumes to
    exactly the parameters of the uninterrupted job."""
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = run_launch(["-n", "2", "--grace", "120", "--"] + LONG + ["--out", out, "--log-interval", "10"], job)
    wait_until(lambda: checkpoint_exists(out, 1), proc, "the epoch-1 checkpoint")  # epoch 2 is under way
    addresses = listening({pid for pid, _ in job_processes(job)})
    assert len(addresses) == 4 and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # far less than the grace
    assert table_exit("SIGTERM / SIGINT to", proc.returncode), err
    assert "Traceback" not in err
    stopped = [l for l in err.splitlines() if l.startswith("gluon_gpu.train: SIGTERM: stopped in epoch 2")]
    assert len(stopped) == 1, err  # rank 0 alone reports (and writes)
    assert err.strip().splitlines()[-1] == "gluon_gpu.launch: stopped by SIGTERM; stopped all 4 processes of the job"
    newest = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    assert newest.startswith("epoch-00001-batch-") and not newest.endswith("-0000000"), newest
    assert read_metrics(out)["status"] == "interrupted"
    assert job_processes(job) == []
    resumed = run_launch(["-n", "2", "--"] + LONG + ["--resume", out], uuid.uuid4().hex)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert_same_params(params(os.path.join(out, "net.params")), straight_run)


def mxjob_replicas(cmd, job, port):
    """The replicas of an MXJob (1 scheduler, 1 server, 2 workers) started as the Kubeflow
    training operator starts them: the same command in each, with the variables its
    SetPodEnv gives (pkg/controller.v1/mxnet), plus GLUON_GPU_RESTART from the pod spec
    (docs/distributed.md): no launcher."""
    address = [{"url": "127.0.0.1", "port": port}]
    cluster = {"scheduler": address, "server": address, "worker": address * 2}
    replicas = []
    for role, index in (("scheduler", 0), ("server", 0), ("worker", 0), ("worker", 1)):
        env = {"MX_CONFIG": json.dumps({"cluster": cluster, "labels": {}, "task": {"type": role, "index": index}}),
               "DMLC_PS_ROOT_PORT": str(port), "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NUM_SERVER": "1",
               "DMLC_NUM_WORKER": "2", "DMLC_ROLE": role, "DMLC_USE_KUBERNETES": "1",
               **({"DMLC_WORKER_ID": str(index)} if role == "worker" else {}), launch.RESTART_ENV: "1"}
        env = {**os.environ, "PYTHONPATH": REPO, launch.JOB_ENV: job, **env}
        replicas.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    return replicas


def test_mxjob_replicas_run_the_job_stop_on_sigterm_and_resume_when_restarted(tmp_path, straight_run):
    """The Kubernetes contract: each role from the operator's variables alone (scheduler
    and server: the same train command becomes that role and exits with the job); SIGTERM
    to every pod (a deletion, an eviction) checkpoints the partial epoch; the same pods
    started again resume from it and end exactly where the uninterrupted job ends."""
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    cmd = LONG + ["--out", out, "--log-interval", "10"]
    replicas = mxjob_replicas(cmd, job, launch.free_port())
    wait_until(lambda: checkpoint_exists(out, 1), replicas[2], "the epoch-1 checkpoint")  # epoch 2 is under way
    for replica in replicas:
        replica.send_signal(signal.SIGTERM)
    ended = [replica.communicate(timeout=120) for replica in replicas]
    assert [r.returncode for r in replicas] == [143] * 4, ended
    assert sum(err.count("gluon_gpu.train: SIGTERM: stopped in epoch 2") for _, err in ended) == 1, ended
    newest = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    assert newest.startswith("epoch-00001-batch-") and not newest.endswith("-0000000"), newest
    assert job_processes(job) == []
    restarted = mxjob_replicas(cmd, job, launch.free_port())
    ended = [replica.communicate(timeout=300) for replica in restarted]
    assert [r.returncode for r in restarted] == [0] * 4, ended
    assert f"resuming from {out}/checkpoints/{newest}" in ended[2][0] + ended[3][0]
    assert read_metrics(out)["status"] == "finished"
    assert_same_params(params(os.path.join(out, "net.params")), straight_run)


CHAOS_EPOCHS = max(10, 2 * CHAOS_KILLS)  # enough work that no kill comes after the end (3 were not)


@pytest.fixture(scope="module")
def straight_chaos_job(request, tmp_path_factory):
    """The straight job of the chaos test's length: the 3 epochs of straight_run in CI."""
    if CHAOS_EPOCHS == 3:
        return request.getfixturevalue("straight_run")
    out = str(tmp_path_factory.mktemp("straight") / "run")
    proc = run_launch(["-n", "2", "--"] + LONG[:-2] + ["--epochs", str(CHAOS_EPOCHS), "--out", out], uuid.uuid4().hex)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err  # (once, beside other work, it ended 1 and said nothing here)
    return params(os.path.join(out, "net.params"))


def test_chaos_worker_kills_with_max_restarts_end_where_the_straight_job_ends(tmp_path, straight_chaos_job):
    """CHAOS_KILLS kill -9s in a row, each of a random worker after a random amount of its
    CPU work (start-up, training, a checkpoint write): each time the launcher stops the
    job and starts it again (--max-restarts), the workers resume from the newest complete
    checkpoint, and the job ends where the uninterrupted one does, leaving no process and
    no temporary."""
    rng = random.Random(CHAOS_SEED)
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = run_launch(["-n", "2", "--grace", "3", "--max-restarts", str(CHAOS_KILLS), "--"] + LONG[:-2] +
                      ["--epochs", str(CHAOS_EPOCHS), "--out", out], job)
    retired, killed = [], []  # retired: every worker of a hit incarnation, which the launcher stops

    def workers():
        return [pid for pid, role in job_processes(job) if role == "worker" and pid not in retired]
    for _ in range(CHAOS_KILLS):
        wait_until(lambda: len(workers()) == 2, proc, "the job's two workers")
        incarnation = workers()
        victim = rng.choice(incarnation)
        target = cpu_seconds(victim) + rng.uniform(0.3, 4.0)  # start-up takes about 2.5 CPU s
        wait_until(lambda: (cpu_seconds(victim) or target) >= target, proc, "the victim's work")
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:  # (once, beside other work, a worker was gone before its kill)
            proc.kill()
            pytest.fail(f"worker {victim} ended before it was killed:\n{proc.communicate()[1]}")
        killed.append(victim)
        retired.extend(incarnation)
    printed, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    restarts = [l for l in err.splitlines() if f" of {CHAOS_KILLS}: " in l]
    assert len(restarts) == CHAOS_KILLS and all("killed by SIGKILL" in l for l in restarts), err
    assert_same_params(params(os.path.join(out, "net.params")), straight_chaos_job)
    assert read_metrics(out)["status"] == "finished" and len(read_metrics(out)["epochs"]) == CHAOS_EPOCHS
    assert [n for n in os.listdir(os.path.join(out, "checkpoints")) if n.startswith(".")] == []
    assert job_processes(job) == []
    print(f"chaos (seed {CHAOS_SEED}): {len(killed)} workers killed, {len(restarts)} restarts; resumed from:",
          *[l for l in printed.splitlines() if "resuming from" in l], sep="\n  ")


def test_restarts_are_bounded(tmp_path):
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "1", "--grace", "2", "--max-restarts", "2", "--", sys.executable, "-c",
                       "import sys; sys.exit(3)"], job)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert [l.split("; ")[1].split(":")[0] for l in lines[:2]] == ["restart 1 of 2", "restart 2 of 2"]
    assert lines[-1] == "gluon_gpu.launch: worker 0 exited with status 3; stopped all 3 processes of the job"
    assert job_processes(job) == []


def test_a_worker_s_usage_error_is_not_restarted_and_exits_2():
    """Status 2 is a mistake in the worker's command (gluon_gpu's user errors, argparse,
    a missing script): every restart would repeat it."""
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "1", "--grace", "2", "--max-restarts", "2", "--", sys.executable, "-m",
                       "gluon_gpu.train", "--epochs", "0"], job)
    _, err = proc.communicate(timeout=120)
    assert table_exit("a worker that exits with status 2", proc.returncode), err
    assert "restart" not in err and "--epochs: must be a positive integer" in err
    assert err.strip().splitlines()[-1] == ("gluon_gpu.launch: worker 0 exited with status 2; stopped all 3 "
                                            "processes of the job")
    assert job_processes(job) == []


def test_a_restarted_job_needs_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(launch.RESTART_ENV, "1")
    assert train.main(["--devices", "cpu", "--dry-run"]) == 2
    assert "a restarted job (the launcher's --max-restarts, or a Slurm job requeued) needs --out" in \
        capsys.readouterr().err


def test_a_run_continues_mid_epoch_with_another_worker_count(tmp_path):
    """Checkpoints name their place by (epoch, global batch) and record the worker count:
    1 worker stopped after global batch B of epoch 2 continues on 2 workers at global
    batch B/2 (the same samples done), and the run then ends at epoch 3, not redoing any."""
    out = str(tmp_path / "run")
    proc = run_launch(["-n", "1", "--grace", "120", "--"] + LONG + ["--out", out, "--log-interval", "10"],
                      uuid.uuid4().hex)
    wait_until(lambda: checkpoint_exists(out, 1), proc, "the epoch-1 checkpoint")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    newest = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    batch = int(newest.rsplit("-", 1)[1])
    assert newest.startswith("epoch-00001-") and batch > 0 and batch % 10 == 0, newest
    resumed = run_launch(["-n", "2", "--"] + LONG + ["--resume", out], uuid.uuid4().hex)
    printed, err = resumed.communicate(timeout=300)
    assert table_exit("`--resume` with another worker count", resumed.returncode), err
    assert f"checkpoints/{newest} (epoch 2, batch {batch // 2 + 1})" in printed, printed
    epochs = read_metrics(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and [e.get("workers", 1) for e in epochs] == [1, 2, 2]
    assert sorted(os.listdir(os.path.join(out, "checkpoints")))[-1] == "epoch-00003-batch-0000000"


@pytest.mark.parametrize("batch, workers, now, expected", [(60, 1, 2, 30), (61, 1, 2, None), (30, 2, 1, 60),
                                                           (0, 4, 3, 0), (9, 3, 2, None), (8, 3, 4, 6)])
def test_a_mid_epoch_position_converts_between_worker_counts(batch, workers, now, expected):
    assert resume.same_position(batch, workers, now) == expected


def test_a_worker_stuck_on_a_stopped_server_hears_sigterm(tmp_path):
    """#62, class 'a stop signal not heard during a blocking wait': a worker waiting in
    ps-lite for a server that stopped (SIGSTOP: alive, so nothing else notices) ran no
    Python handler, and SIGTERM waited for the stall deadline (1800 s by default). It ends
    once it has computed nothing for IDLE_SECONDS after the signal, in one line."""
    job = uuid.uuid4().hex
    proc = run_launch(["-n", "2", "-s", "1", "--grace", "60", "--"] + TRAIN +
                      ["--epochs", "100", "--out", str(tmp_path / "run")], job)
    wait_until(lambda: os.path.exists(tmp_path / "run" / "metrics.json"), proc, "training under way")
    roles = job_processes(job)
    server, worker = (next(pid for pid, role in roles if role == kind) for kind in ("server", "worker"))
    os.kill(server, signal.SIGSTOP)
    os.kill(worker, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)  # bounded well below the stall deadline; the launcher ends the server
    assert re.search(r"gluon_gpu: stopped by SIGTERM while worker \d of 2 waited for the job's other processes "
                     r"\(10 s without computing\)", err), err
    assert len(read_metrics(tmp_path / "run")["epochs"]) < 100
    assert wait_until_gone(job) == []
