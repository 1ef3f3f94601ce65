"""The launcher across real hosts: network namespaces running openssh-server (hosts.py).
CI runs as root and makes them; elsewhere the tests are skipped and say why."""
import os
import signal
import uuid

import numpy as np
import pytest

from hosts import Hosts, why_not_possible
from test_distributed import TRAIN, checkpoint_exists, job_processes, params, run_launch, wait_until, wait_until_gone

from conftest import read_metrics, with_flags
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.core.platform.optional import require_horovod

REASON = why_not_possible()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no namespace hosts here: {REASON}")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    made = Hosts(tmp_path_factory.mktemp("hosts"))
    yield made
    made.close()


def horovod_missing():
    try:
        require_horovod("this test")
    except UserError as e:
        return str(e)
    return None


def launch_on(hosts, tmp_path, worker_args, job, launcher_args=()):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(a + "\n" for a in hosts.addresses))
    return run_launch(["-n", "2", "-s", "2", "--hostfile", str(hostfile), "--ssh-config", hosts.ssh_config,
                       "--scheduler-host", hosts.local, *launcher_args, "--"] + worker_args, job)


def all_gone(job, hosts):
    """Remote roles end when their ssh session does: the job's processes here and on the
    hosts, once none is left (or the hang guard passed)."""
    return wait_until_gone(job, lambda: any(hosts.pids().values())), hosts.pids()


def test_a_dist_sync_job_across_two_hosts(hosts, tmp_path):
    out, replicas, job = str(tmp_path / "run"), str(tmp_path / "replicas"), uuid.uuid4().hex
    proc = launch_on(hosts, tmp_path, ["env", f"GLUON_GPU_REPLICA_DIR={replicas}"] + TRAIN +
                     ["--epochs", "1", "--out", out], job)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    r0, r1 = params(os.path.join(replicas, "rank-0.params")), params(os.path.join(replicas, "rank-1.params"))
    for k in r0:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    assert printed.count("epoch   1/1") == 1 and "(2 workers)" in printed  # rank 0 alone prints and writes
    m = read_metrics(out)
    assert m["workers"] == 2 and m["status"] == "finished" and m["epochs"][0]["val_acc"] > 0.5
    assert all_gone(job, hosts) == ([], {ns: [] for ns in hosts.namespaces})


def test_sigterm_reaches_remote_workers_through_ssh(hosts, tmp_path):
    """ssh passes no signal on: the remote wrapper does, and rank 0 checkpoints."""
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = launch_on(hosts, tmp_path, TRAIN + ["--epochs", "100", "--out", out, "--log-interval", "10"], job,
                     ["--grace", "120"])
    wait_until(lambda: os.path.isdir(os.path.join(out, "checkpoints", "epoch-00001-batch-0000000")), proc,
               "checkpoint of epoch 1")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "gluon_gpu.train: SIGTERM: stopped in epoch 2" in err
    assert read_metrics(out)["status"] == "interrupted"
    assert all_gone(job, hosts) == ([], {ns: [] for ns in hosts.namespaces})


def test_no_remote_role_outlives_a_killed_launcher(hosts, tmp_path):
    """kill -9 of the launcher ends its ssh sessions; each remote wrapper then kills its role."""
    job = uuid.uuid4().hex
    proc = launch_on(hosts, tmp_path, TRAIN + ["--epochs", "100", "--out", str(tmp_path / "run")], job)
    wait_until(lambda: len([r for _, r in job_processes(job) if r == "worker"]) >= 2, proc, "both workers")
    proc.kill()
    proc.wait()
    assert all_gone(job, hosts) == ([], {ns: [] for ns in hosts.namespaces})


def test_a_horovod_job_across_two_hosts(hosts, tmp_path):
    """--engine horovod over a hostfile in Horovod's format: Horovod's launcher reaches
    each host through ssh with the launcher's --ssh-config (horovodrun has no flag for
    one), the workers' ring runs over the hosts' network, and both end equal."""
    why = horovod_missing()
    if why:
        pytest.skip(why)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{a} slots=1\n" for a in hosts.addresses))
    out, replicas, job = str(tmp_path / "run"), str(tmp_path / "replicas"), uuid.uuid4().hex
    command = ["env", f"GLUON_GPU_REPLICA_DIR={replicas}"] + with_flags(TRAIN, "--kvstore", "horovod", "--epochs", "1",
                                                                         "--out", out)
    proc = run_launch(["--engine", "horovod", "-n", "2", "--hostfile", str(hostfile), "--ssh-config",
                       hosts.ssh_config, "--"] + command, job)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    r0, r1 = params(os.path.join(replicas, "rank-0.params")), params(os.path.join(replicas, "rank-1.params"))
    for k in r0:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    m = read_metrics(out)
    assert m["workers"] == 2 and m["status"] == "finished" and m["epochs"][0]["val_acc"] > 0.5
    assert all_gone(job, hosts) == ([], {ns: [] for ns in hosts.namespaces})


def test_an_elastic_horovod_job_over_two_hosts_goes_on_without_the_one_lost(hosts, tmp_path):
    """--elastic over the two hosts, which the discovery script lists (and
    --network-interface names their interface, as on a cluster): the second host's
    worker killed mid-epoch, the first trains on alone from the newest commit, and the
    run ends with that commit's parameters resumed by one worker."""
    why = horovod_missing()
    if why:
        pytest.skip(why)
    from test_horovod import ELASTIC, assert_equals_a_resume_from, discovery, horovod_workers, resumed_from
    script, _ = discovery(tmp_path, *(f"{a}:1" for a in hosts.addresses))
    out, job = str(tmp_path / "run"), uuid.uuid4().hex
    proc = run_launch(["--engine", "horovod", "--elastic", "-n", "2", "--host-discovery-script", script,
                       "--ssh-config", hosts.ssh_config, "--network-interface", "eth0", "--grace", "30", "--"] +
                      ELASTIC + ["--out", out], job)
    wait_until(lambda: checkpoint_exists(out, 1, 20), proc, "a commit inside epoch 2")
    second = [pid for pid in horovod_workers(job) if pid in hosts.pids_in(hosts.namespaces[1])]
    assert len(second) == 1
    os.kill(second[0], signal.SIGKILL)
    printed, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    epochs = read_metrics(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and epochs[0]["workers"] == 2 and epochs[-1].get("workers", 1) == 1
    assert_equals_a_resume_from(out, resumed_from(printed), 1, tmp_path)
    assert all_gone(job, hosts) == ([], {ns: [] for ns in hosts.namespaces})
