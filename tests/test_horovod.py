"""Horovod's allreduce as the second engine (issue #55): `gluon-gpu-launch --engine
horovod` runs Horovod's own launcher over Gloo on this host, the workers train with
`--kvstore horovod`, and a job equals one process with the global batch, stops on
SIGTERM with a checkpoint and resumes exactly, on as many workers or on one."""
import json
import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

from gluon_gpu.core.platform.optional import require_horovod
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.programs import train
from gluon_gpu.programs.elastic import TRAINING_ENV

from conftest import read_metrics, with_flags
from failure_table import table_exit
from test_distributed import (REPO, assert_same_params, checkpoint_exists, job_processes, params, run_launch,
                              wait_until)

try:
    require_horovod("these tests")
    HOROVOD = None
except UserError as e:
    HOROVOD = str(e)
pytestmark = pytest.mark.skipif(HOROVOD is not None, reason=HOROVOD or "")

TRAIN = [sys.executable, "-m", "gluon_gpu.train", "--kvstore", "horovod", "--devices", "cpu", "--quiet",
         "--limit", "6400", "--batch-size", "64"]
LONG = TRAIN[:-4] + ["--limit", "12800", "--batch-size", "64", "--epochs", "3"]  # 100 steps an epoch


def horovod_job(workers, command, job=None, **kw):
    return run_launch(["--engine", "horovod", "-n", str(workers), "--grace", "120", "--"] + command,
                      job or uuid.uuid4().hex, **kw)


def test_two_horovod_workers_equal_one_process_with_the_global_batch(tmp_path):
    """Worker r trains the r-th slice of each global batch, its gradients summed with the
    other's by allreduce: 2 workers x 64 end where one process on 2 devices with 128 ends."""
    job = str(tmp_path / "job")
    proc = horovod_job(2, TRAIN + ["--epochs", "1", "--out", job])
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "kvstore horovod" in printed and "(2 workers)" in printed
    single = str(tmp_path / "single")
    assert train.main(["--devices", "cpu*2", "--quiet", "--limit", "6400", "--batch-size", "128",
                       "--epochs", "1", "--out", single]) == 0
    assert_same_params(params(os.path.join(job, "net.params")), params(os.path.join(single, "net.params")))
    assert read_metrics(job)["workers"] == 2 and read_metrics(job)["epochs"][0]["val_acc"] > 0.5


@pytest.fixture(scope="module")
def straight_horovod_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("straight") / "run")
    proc = horovod_job(2, LONG + ["--out", out])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return params(os.path.join(out, "net.params"))


@pytest.fixture(scope="module")
def stopped_horovod_run(tmp_path_factory):
    """A 2-worker job stopped by SIGTERM to the launcher in epoch 2: (run folder, stderr,
    exit status, the job's leftover processes)."""
    out, job = str(tmp_path_factory.mktemp("stopped") / "run"), uuid.uuid4().hex
    proc = horovod_job(2, LONG + ["--out", out, "--log-interval", "10"], job)
    wait_until(lambda: checkpoint_exists(out, 1), proc, "the epoch-1 checkpoint")  # epoch 2 is under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)  # bounded by the grace
    return out, err, proc.returncode, job_processes(job)


def copied(run, tmp_path):
    """A copy of the stopped run, to resume without changing it for the other tests."""
    out = str(tmp_path / "run")
    subprocess.run(["cp", "-r", run, out], check=True)
    return out


def test_sigterm_checkpoints_the_partial_epoch_and_the_resume_equals_a_straight_run(stopped_horovod_run,
                                                                                     straight_horovod_run, tmp_path):
    stopped, err, code, left = stopped_horovod_run
    out = copied(stopped, tmp_path)
    assert table_exit("SIGTERM / SIGINT to", code), err
    assert "Traceback" not in err and left == []
    assert len([l for l in err.splitlines() if "gluon_gpu.train: SIGTERM: stopped in epoch 2" in l]) == 1, err
    newest = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    assert newest.startswith("epoch-00001-batch-") and not newest.endswith("-0000000"), newest
    resumed = horovod_job(2, LONG + ["--resume", out])
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert_same_params(params(os.path.join(out, "net.params")), straight_horovod_run)


def test_a_horovod_run_resumes_on_one_worker(stopped_horovod_run, tmp_path):
    """The checkpoint of 2 workers, mid-epoch, continued by one process (Horovod of size 1,
    no launcher) at the same samples done: the run ends at epoch 3, every epoch once."""
    out = copied(stopped_horovod_run[0], tmp_path)
    newest = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    batch = int(newest.rsplit("-", 1)[1])
    done = subprocess.run(LONG + ["--resume", out], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert table_exit("`--resume` with another worker count", done.returncode), done.stderr
    assert f"checkpoints/{newest} (epoch 2, batch {batch * 2 + 1})" in done.stdout, done.stdout
    epochs = read_metrics(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and [e.get("workers", 1) for e in epochs] == [2, 1, 1]
    assert epochs[-1]["val_acc"] > 0.6


def test_a_killed_worker_restarts_the_job_which_resumes_and_ends_as_a_straight_run(straight_horovod_run, tmp_path):
    """--max-restarts with --engine horovod: a worker killed in epoch 2 fails Horovod's
    launcher, the launcher starts the job again, and its workers resume from the newest
    complete checkpoint (epoch 1's), ending exactly where the uninterrupted job ends."""
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = run_launch(["--engine", "horovod", "-n", "2", "--grace", "30", "--max-restarts", "1", "--"] + LONG +
                      ["--out", out], job)
    wait_until(lambda: checkpoint_exists(out, 1), proc, "the epoch-1 checkpoint")  # epoch 2 is under way
    os.kill(horovod_workers(job)[-1], signal.SIGKILL)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert re.search(r"gluon_gpu\.launch: worker 0 exited with status \d+; restart 1 of 1: the workers resume", err), err
    assert f"resuming from {out}/checkpoints/epoch-00001-batch-0000000" in printed, printed
    assert read_metrics(out)["status"] == "finished" and job_processes(job) == []
    assert_same_params(params(os.path.join(out, "net.params")), straight_horovod_run)


def test_without_horovod_the_engine_and_the_kvstore_are_one_line_each(tmp_path):
    hidden = tmp_path / "horovod"  # a package of that name that is not Horovod for MXNet
    hidden.mkdir()
    (hidden / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    for command, elastic in (([sys.executable, "-m", "gluon_gpu.launch", "--engine", "horovod", "-n", "2", "--",
                               "true"], "0"), (TRAIN + ["--epochs", "1", "--out", str(tmp_path / "run")], "0"),
                             # an elastic worker imported Horovod first: a 19-line traceback (#62)
                             (TRAIN + ["--epochs", "1", "--out", str(tmp_path / "elastic")], "1")):
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**env, "HOROVOD_ELASTIC": elastic})
        assert table_exit("Horovod missing", done.returncode)
        last = done.stderr.strip().splitlines()
        assert len(last) == 1 and "needs Horovod built for MXNet, which this Python lacks: make horovod" in last[0]


# -- elastic: Horovod's elastic driver, hosts as a discovery script lists them ----------
ELASTIC = LONG + ["--commit-steps", "10", "--log-interval", "10", "--keep", "1000"]


def discovery(tmp_path, *hosts):
    """A host-discovery script printing ``hosts`` (HOST:SLOTS), from a file a test may
    change: Horovod blacklists a host whose worker failed, so each local worker of these
    jobs has a name of its own (localhost, 127.0.0.1)."""
    listed, script = tmp_path / "hosts", tmp_path / "discover.sh"
    listed.write_text("".join(f"{h}\n" for h in hosts))
    script.write_text(f"#!/bin/sh\ncat {listed}\n")
    script.chmod(0o755)
    return str(script), listed


def elastic_job(workers, script, command, job, most=2):
    return run_launch(["--engine", "horovod", "--elastic", "-n", str(workers), "--max-workers", str(most),
                       "--host-discovery-script", script, "--grace", "30", "--"] + command, job)


def horovod_workers(job):
    """The worker processes of ``job`` Horovod's driver started (not the launchers, the
    shells that start them, or the children that train: elastic.supervise)."""
    def read(pid, what):
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read().split(b"\0")
    return [pid for pid, _ in job_processes(job) if read(pid, "cmdline")[1:3] == [b"-m", b"gluon_gpu.train"]
            and not any(v.startswith(f"{TRAINING_ENV}=".encode()) for v in read(pid, "environ"))]


def resumed_from(printed):
    """The commit an elastic job went on from after its last reset (its line), as a
    folder name: a child that died with the failed collective adds a reset (elastic.py)."""
    line = [l for l in printed.splitlines() if "resuming from" in l][-1]
    return os.path.basename(line.split("resuming from ", 1)[1].split(" (")[0])


def assert_equals_a_resume_from(out, commit, workers, tmp_path):
    """The elastic run's parameters are those of its commit ``commit`` resumed by
    ``workers`` workers: the updates after the commit undone, every later sample of the
    epoch trained once by the new membership."""
    reference = str(tmp_path / "reference")
    os.makedirs(os.path.join(reference, "checkpoints"))
    subprocess.run(["cp", "-r", os.path.join(out, "checkpoints", commit), os.path.join(reference, "checkpoints")],
                   check=True)
    command = LONG + ["--resume", reference]
    if workers == 1:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": REPO})
    else:
        proc = horovod_job(workers, command)
        done = subprocess.CompletedProcess(command, proc.wait(timeout=300), *proc.communicate())
    assert done.returncode == 0, done.stderr
    assert_same_params(params(os.path.join(out, "net.params")), params(os.path.join(reference, "net.params")))


def test_elastic_a_worker_killed_mid_epoch_and_the_job_goes_on_with_the_rest(tmp_path):
    """The worker left trains on from the newest commit in a new child process (its
    first one may die with the failed collective: elastic.py says why), at most
    --max-resets times; the job ends with one worker, every sample of the interrupted
    epoch trained once in the parameters that survive."""
    script, _ = discovery(tmp_path, "localhost:1", "127.0.0.1:1")
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = elastic_job(2, script, ELASTIC + ["--out", out], job)
    wait_until(lambda: checkpoint_exists(out, 1, 20), proc, "a commit inside epoch 2")
    workers = horovod_workers(job)
    assert len(workers) == 2
    os.kill(workers[-1], signal.SIGKILL)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    epochs = read_metrics(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and epochs[0]["workers"] == 2 and epochs[-1].get("workers", 1) == 1
    commit = resumed_from(printed)
    assert commit.startswith(("epoch-00001-", "epoch-00002-")) and commit != "epoch-00001-batch-0000000"
    assert_equals_a_resume_from(out, commit, 1, tmp_path)


def test_elastic_a_host_added_joins_at_the_next_commit(tmp_path):
    script, listed = discovery(tmp_path, "localhost:1")
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = elastic_job(1, script, ELASTIC + ["--out", out], job)
    wait_until(lambda: checkpoint_exists(out, 1), proc, "epoch 1")
    listed.write_text("localhost:1\n127.0.0.1:1\n")
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    epochs = read_metrics(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and epochs[0].get("workers", 1) == 1
    assert epochs[-1]["workers"] == 2 and "(2 workers)" in printed
    assert_equals_a_resume_from(out, resumed_from(printed), 2, tmp_path)


def test_bench_times_both_engines_side_by_side(tmp_path, capsys, monkeypatch):
    from gluon_gpu.programs.bench import program as bench
    monkeypatch.setenv("PYTHONPATH", REPO)
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "--workers", "2", "--kvstore", "dist_sync", "horovod", "--epochs", "1",
                       "--limit", "1024", "--val-limit", "500", "--batch-size", "128", "--model", "mlp",
                       "--out", out, "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "2 workers dist_sync" in table and "2 workers horovod" in table
    with open(os.path.join(out, "bench.json")) as f:
        rows = json.load(f)["workers"]
    assert [(r["workers"], r["kvstore"]) for r in rows] == [(0, "local"), (2, "dist_sync"), (2, "horovod")]
    assert all(r["samples_per_s"] > 0 for r in rows)
    jobs = sorted(os.listdir(out))  # each job trained the --model given (bench --workers ignored it)
    assert all(read_metrics(os.path.join(out, j))["config"]["model"] == "mlp" for j in jobs if j.startswith("job-"))


@pytest.mark.parametrize("flags,message", [
    (["--kvstore", "horovod"], "--kvstore: only with --workers"),
    (["--workers", "2", "--kvstore", "local"], "--kvstore with --workers: dist_sync .ps-lite. or horovod")])
def test_bench_engines_are_checked_before_any_work(flags, message, tmp_path, capsys):
    from gluon_gpu.programs.bench import program as bench
    assert bench.main(flags + ["--out", str(tmp_path / "b")]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from slurm_cluster import Cluster, why_not_possible
    why = why_not_possible()
    if why:
        pytest.skip(f"no Slurm cluster here: {why}")
    made = Cluster(tmp_path_factory.mktemp("slurm"))
    yield made
    made.stop()


def test_the_docs_horovod_job_script_runs_in_slurm_and_equals_one_process(slurm, tmp_path):
    """docs/horovod.md's job script, submitted as written: two tasks, two
    Horovod workers, the same parameters as one process with the global batch."""
    import re as regex
    from test_slurm import Submitted
    with open(os.path.join(REPO, "docs", "horovod.md")) as f:
        script = next(body for body in regex.findall(r"```sh\n(.*?)```", f.read(), regex.S)
                      if "#SBATCH" in body and "--engine horovod" in body)
    job = Submitted(slurm, tmp_path, script.splitlines()[1:], wait=True)
    assert job.code == 0, job.text()
    assert regex.search(r"gluon_gpu\.launch: Slurm job \d+: 2 Horovod worker\(s\) over \S+ through horovodrun",
                        job.text()), job.text()
    out, single = str(tmp_path / "runs" / "slurm-horovod"), str(tmp_path / "single")
    flags = [f for f in regex.search(r"gluon-gpu-train (.*)", script).group(1).split() if f not in ("--kvstore",
                                                                                                 "horovod")]
    assert train.main(with_flags(flags, "--devices", "cpu*2", "--batch-size", "256", "--out", single)) == 0
    assert_same_params(params(os.path.join(out, "net.params")), params(os.path.join(single, "net.params")))
    assert read_metrics(out)["workers"] == 2 and job_processes(job.marker) == []


@pytest.fixture(scope="module")
def two_hosts_slurm(tmp_path_factory):
    """A Slurm cluster of two nodes, each a namespace host running sshd too
    (hosts.Hosts), as Horovod's launcher reaches the other nodes of an allocation."""
    from hosts import Hosts, why_not_possible as why_no_hosts
    from slurm_cluster import cluster_over, why_not_possible
    why = why_not_possible() or why_no_hosts()
    if why:
        pytest.skip(f"no two-node Slurm cluster with ssh here: {why}")
    yield from cluster_over(Hosts(tmp_path_factory.mktemp("nodes"), 2), tmp_path_factory.mktemp("slurm2"))


def test_a_horovod_job_over_two_slurm_nodes_equals_one_process(two_hosts_slurm, tmp_path):
    """Two nodes, a task each: Horovod's launcher, in the batch script on the first node,
    starts a worker on each (the other through ssh, with --ssh-config), and the job ends
    as one process with the global batch."""
    from test_slurm import Submitted, job_line
    out, single = str(tmp_path / "run"), str(tmp_path / "single")
    flags = TRAIN[1:] + ["--epochs", "1", "--out", out]
    job = Submitted(two_hosts_slurm, tmp_path, [job_line(*flags, launch_flags=(
        "--engine", "horovod", "--ssh-config", two_hosts_slurm.nodes.ssh_config))], "--nodes=2", "--ntasks=2",
        wait=True)
    assert job.code == 0, job.text()
    assert "2 Horovod worker(s) over node0, node1 through horovodrun and ssh" in job.text(), job.text()
    assert train.main(["--devices", "cpu*2", "--quiet", "--limit", "6400", "--batch-size", "128",
                       "--epochs", "1", "--out", single]) == 0
    assert_same_params(params(os.path.join(out, "net.params")), params(os.path.join(single, "net.params")))
    assert read_metrics(out)["workers"] == 2 and job_processes(job.marker) == []


@pytest.mark.parametrize("flags,message", [
    (["--engine", "horovod", "-n", "2", "-s", "2"], "-s/--num-servers: not with --engine horovod"),
    (["--engine", "horovod", "-n", "2", "--elastic", "--host-discovery-script", "/bin/true", "--hostfile", "h"],
     "--hostfile: not with --engine horovod"),
    (["-n", "2", "--elastic"], "--elastic: only with --engine horovod"),
    (["--engine", "horovod", "-n", "2", "--elastic"], "--elastic needs --host-discovery-script"),
    (["--engine", "horovod", "-n", "2", "--max-workers", "3"], "--max-workers: only with --elastic"),
    # a ps-lite job ran with it, unsaid (#62, class 'a flag ignored in a mode')
    (["-n", "2", "--min-workers", "3"], "--min-workers: only with --engine horovod"),
    (["--engine", "horovod", "-n", "2", "--min-workers", "2"], "--min-workers: only with --elastic"),
    (["--engine", "horovod", "-n", "2", "--elastic", "--host-discovery-script", "/nonexistent"],
     "--host-discovery-script /nonexistent: not an executable file"),
    (["--engine", "horovod", "-n", "4", "--elastic", "--host-discovery-script", "/bin/true", "--max-workers", "3"],
     "-n 4: --elastic starts between --min-workers 1 and --max-workers 3")])
def test_the_engine_s_flags_are_one_line_each(flags, message, capsys):
    from gluon_gpu.programs import launch
    assert table_exit("`launch` flags of the other engine", launch.main(flags + ["--", "true"]))
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"gluon_gpu.launch: error: {message}"), said


def test_a_job_over_a_hostfile_in_horovod_s_format(tmp_path):
    """`--hostfile` in Horovod's and MPI's format (what Kubeflow's MPIJob writes for its
    launcher pod) goes to Horovod's launcher as it is."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    out = str(tmp_path / "run")
    proc = run_launch(["--engine", "horovod", "-n", "2", "--hostfile", str(hostfile), "--"] + TRAIN +
                      ["--epochs", "1", "--out", out], uuid.uuid4().hex)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert read_metrics(out)["workers"] == 2 and "(2 workers)" in printed
