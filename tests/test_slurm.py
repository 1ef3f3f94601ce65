"""gluon-gpu-launch inside Slurm allocations, against a real Slurm (tests/slurm_cluster.py:
slurmctld, slurmd and munged started here as root; one node, or two in network
namespaces): the roles start with srun, a job equals one process with the global batch,
scancel checkpoints and leaves nothing, a lost worker step or a failed node is
restarted inside the allocation, and the job script of docs/distributed.md runs as
written."""
import os
import re
import shlex
import signal
import sys
import uuid

import numpy as np
import pytest

from gluon_gpu.programs import launch, train
from conftest import read_metrics, with_flags
from hosts import Namespaces, why_no_namespaces
from slurm_cluster import Cluster, cluster_over, why_not_possible
from test_distributed import LONG, REPO, TRAIN, assert_same_params, checkpoint_exists, job_processes, params

WHY = why_not_possible()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no Slurm cluster here: {WHY}")
PYTHON = sys.executable
LAUNCH = [PYTHON, "-m", "gluon_gpu.launch"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    made = Cluster(tmp_path_factory.mktemp("slurm"))
    yield made
    made.stop()


class Submitted:
    """A job script submitted with sbatch from ``folder``: its id, output and job marker."""

    def __init__(self, cluster, folder, lines, *sbatch, wait=False):
        self.cluster, self.folder, self.marker = cluster, str(folder), uuid.uuid4().hex
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"job-{self.marker}.sbatch")
        with open(path, "w") as f:
            f.write("#!/bin/bash\n" + "\n".join(lines) + "\n")
        self.output = os.path.join(self.folder, f"job-{self.marker}.out")
        env = {**cluster.env, "PYTHONPATH": REPO, launch.JOB_ENV: self.marker,
               "PATH": os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"]}
        done = cluster.run("sbatch", "--parsable", f"--output={self.output}", *sbatch, *(["--wait"] if wait else []),
                           path, cwd=self.folder, env=env, timeout=600)
        self.code, self.id = done.returncode, done.stdout.strip().split(";")[0]
        assert self.id, done.stderr

    def text(self):
        with open(self.output) as f:
            return f.read()

    def wait_for_checkpoint(self, out, epoch):
        """Until the run in ``out`` has its epoch-``epoch`` checkpoint (the next epoch under way)."""
        while not checkpoint_exists(out, epoch):
            assert self.cluster.queued(self.id), f"the job ended before its epoch-{epoch} checkpoint: {self.text()}"

    def wait_gone(self):
        """Until Slurm has no more of the job (its processes reaped after KillWait)."""
        while self.cluster.queued(self.id):
            pass


LONG_FLAGS = LONG[1:]  # train's flags of test_distributed's 3-epoch job


def job_line(*train_flags, launch_flags=()):
    """The job script's line: the launcher, as the batch shell itself, and train's flags."""
    return "exec " + " ".join(LAUNCH + list(launch_flags) + ["--", PYTHON] + list(train_flags))


def interrupted(job, out, *scancel, epoch=2):
    """``job`` stopped in ``epoch`` by ``scancel *scancel``: checkpointed mid-epoch, one
    line from rank 0 and one from the launcher, no process left."""
    job.wait_for_checkpoint(out, epoch - 1)  # the epoch is under way
    assert job.cluster.run("scancel", *scancel, job.id).returncode == 0
    job.wait_gone()
    text = job.text()
    assert text.count(f"gluon_gpu.train: SIGTERM: stopped in epoch {epoch}") == 1, text
    assert "gluon_gpu.launch: stopped by SIGTERM; stopped all 4 processes of the job" in text, text
    assert "Traceback" not in text
    assert read_metrics(out)["status"] == "interrupted"
    newest = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    assert newest.startswith(f"epoch-{epoch - 1:05d}-batch-") and not newest.endswith("-0000000"), newest
    assert job_processes(job.marker) == []
    return text


def long_job(cluster, folder, out, *launch_flags, sbatch=("--ntasks=2",)):
    """test_distributed's 3-epoch job on 2 tasks, syncing every 10 steps; ``--grace 2``:
    a worker that has not ended 2 s after the others is killed (Slurm's KillWait is 30 s)."""
    line = job_line(*LONG_FLAGS, "--log-interval", "10", "--out", out, launch_flags=["--grace", "2", *launch_flags])
    return Submitted(cluster, folder, [line], *sbatch)


@pytest.fixture(scope="module")
def straight(cluster, tmp_path_factory):
    """An uninterrupted 2-worker job of 3 epochs under Slurm: what the others must end at."""
    folder = tmp_path_factory.mktemp("straight")
    job = Submitted(cluster, folder, [job_line(*LONG_FLAGS, "--out", str(folder / "run"))], "--ntasks=2", wait=True)
    assert job.code == 0, job.text()
    return params(folder / "run" / "net.params")


def test_scancel_checkpoints_and_leaves_no_process(cluster, tmp_path):
    """scancel signals every process of the job: the workers still agree on a step and rank
    0 checkpoints it (the scheduler and servers outlast them); nothing is left."""
    out = str(tmp_path / "run")
    interrupted(long_job(cluster, tmp_path, out), out)


def worker_trainers(marker):
    """The pids of the job's workers' train processes (not their wrappers)."""
    found = []
    for pid, role in job_processes(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if role == "worker" and b"gluon_gpu.train" in f.read().split(b"\0")[:3]:
                    found.append(pid)
        except OSError:
            pass
    return found


def test_a_dead_worker_restarts_the_time_limit_signal_checkpoints_and_the_run_resumes_exactly(
        cluster, tmp_path, straight):
    """kill -9 of a worker in epoch 2 (what the out-of-memory killer does): its srun step
    fails, the launcher stops the job and, with --max-restarts, starts it again in the
    same allocation from the epoch-1 checkpoint. In epoch 3 the time limit's signal
    (``sbatch --signal=B:TERM``, here ``scancel --batch --signal=TERM``: the batch shell
    alone, the launcher that exec'd it) checkpoints it mid-epoch; --resume then ends
    exactly where the uninterrupted job ends."""
    out = str(tmp_path / "run")
    job = long_job(cluster, tmp_path, out, "--max-restarts", "1")
    job.wait_for_checkpoint(out, 1)
    os.kill(worker_trainers(job.marker)[-1], signal.SIGKILL)
    text = interrupted(job, out, "--batch", "--signal=TERM", epoch=3)
    assert "restart 1 of 1: the workers resume from the newest complete checkpoint" in text, text
    resumed = Submitted(cluster, tmp_path, [job_line(*LONG_FLAGS, "--resume", out)], "--ntasks=2", wait=True)
    assert resumed.code == 0, resumed.text()
    assert read_metrics(out)["status"] == "finished"
    assert_same_params(params(os.path.join(out, "net.params")), straight)


def test_the_job_script_of_the_docs_runs_as_written_and_equals_one_process(cluster, tmp_path):
    """docs/distributed.md's script: two tasks, two workers (SLURM_NTASKS), each started by
    srun; the job trains what one process with the global batch trains, as the ssh
    launcher's does."""
    with open(os.path.join(REPO, "docs", "distributed.md")) as f:
        script = next(body for body in re.findall(r"```sh\n(.*?)```", f.read(), re.S) if "#SBATCH" in body)
    job = Submitted(cluster, tmp_path, script.splitlines()[1:], wait=True)  # after its #!/bin/bash
    assert job.code == 0, job.text()
    assert re.search(r"gluon_gpu\.launch: Slurm job \d+: 1 server\(s\) and 2 worker\(s\) over \S+ through srun",
                     job.text()), job.text()
    out, single = str(tmp_path / "runs" / "slurm-fashion"), str(tmp_path / "single")
    flags = re.search(r"gluon-gpu-train (.*)", script).group(1).split()
    flags = [f for f in flags if f not in ("--kvstore", "dist_sync")]
    assert train.main(with_flags(flags, "--devices", "cpu*2", "--batch-size", "256", "--out", single)) == 0
    want, got = params(os.path.join(single, "net.params")), params(os.path.join(out, "net.params"))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert read_metrics(out)["workers"] == 2 and read_metrics(out)["status"] == "finished"
    assert job_processes(job.marker) == []


def test_the_workers_on_a_node_split_its_gpus(cluster, tmp_path):
    """A job given the node's 4 GPUs (fake ones: slurm_cluster.fake_gpus): every --overlap
    step is given all 4, and each of the 2 workers on the node gets its 2, as the
    launcher's first line says. The workers only write down what they see."""
    if not cluster.gpus:
        pytest.skip("no fake GPU device could be made here (mknod), so Slurm has no GPUs to hand out")
    seen = tmp_path / "seen"
    os.makedirs(seen)
    worker = f"import os; open(os.path.join({str(seen)!r}, str(os.getpid())), 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"
    line = "exec " + " ".join(LAUNCH + ["--grace", "1", "--", PYTHON, "-c", shlex.quote(worker)])
    job = Submitted(cluster, tmp_path, [line], "--ntasks=2", f"--gpus-per-node={cluster.gpus}", wait=True)
    assert job.code == 0, job.text()
    assert "the scheduler here, at 127.0.0.1; 4 GPUs a node, 2 to each worker (its CUDA_VISIBLE_DEVICES)" in \
        job.text(), job.text()  # 127.0.0.1: the test node's NodeAddr
    assert sorted((seen / name).read_text() for name in os.listdir(seen)) == ["0,1", "2,3"]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A Slurm cluster of two nodes, each a network namespace of its own (hosts.Namespaces)."""
    why = why_no_namespaces()
    if why:
        pytest.skip(f"no network namespaces for a second node: {why}")
    yield from cluster_over(Namespaces(tmp_path_factory.mktemp("nodes"), 2), tmp_path_factory.mktemp("slurm2"))


def test_a_two_node_job_outlives_a_failed_node_and_ends_as_one_process(two_nodes, tmp_path, straight):
    """A 2-node allocation (``--no-kill``: Slurm keeps the job when a node fails): one
    worker a node, the scheduler at the first node's NodeAddr. The second node fails in
    epoch 2 (every process in it killed, its slurmd included); once Slurm has marked it
    down its worker's step fails, and the launcher (--max-restarts) starts the job again
    on the node left, both workers there, from the epoch-1 checkpoint: the run ends where
    the uninterrupted job ends."""
    two_nodes.restore()
    out = str(tmp_path / "run")
    job = long_job(two_nodes, tmp_path, out, "--max-restarts", "1", sbatch=("--nodes=2", "--ntasks=2", "--no-kill"))
    job.wait_for_checkpoint(out, 1)
    two_nodes.kill_node(1)
    job.wait_gone()
    text = job.text()
    assert f"over node0, node1 through srun; the scheduler here, at {two_nodes.nodes.addresses[0]}" in text, text
    assert re.search(r"gluon_gpu\.launch: (server|worker) \d on node1 lost its node, which Slurm took out of the "
                     r"allocation \(a failed node\); restart 1 of 1: the workers resume from the newest complete "
                     r"checkpoint\ngluon_gpu\.launch: node1 left the allocation \(a failed node\): the job goes over "
                     r"node0\n", text), text
    assert "Traceback" not in text
    assert read_metrics(out)["status"] == "finished", text
    assert_same_params(params(os.path.join(out, "net.params")), straight)
    assert job_processes(job.marker) == []


def test_a_job_slurm_requeues_after_a_node_failure_resumes_its_run(two_nodes, tmp_path, straight):
    """Without --no-kill a node failure ends the job, and Slurm requeues it (JobRequeue's
    default): the job script runs again once the node is back, with SLURM_RESTART_COUNT
    set, and its workers continue the run from the newest complete checkpoint instead of
    refusing a run folder that holds one; the run ends where the uninterrupted job ends."""
    two_nodes.restore()
    out = str(tmp_path / "run")
    job = long_job(two_nodes, tmp_path, out, sbatch=("--nodes=2", "--ntasks=2", "--open-mode=append"))
    job.wait_for_checkpoint(out, 1)
    two_nodes.kill_node(1)
    while two_nodes.job_state(job.id) != "PD":  # requeued, waiting for its nodes
        pass
    two_nodes.restore()  # the node back and idle; Slurm holds a requeued job back a few minutes: not here
    assert two_nodes.run("scontrol", "update", f"JobId={job.id}", "StartTime=now").returncode == 0
    job.wait_gone()
    text = job.text()
    assert "; requeued by Slurm (1 time(s)): the workers resume from the newest complete checkpoint" in text, text
    assert f"resuming from {out}/checkpoints/epoch-00001-batch-0000000" in text, text
    assert read_metrics(out)["status"] == "finished", text
    assert_same_params(params(os.path.join(out, "net.params")), straight)
    assert job_processes(job.marker) == []
