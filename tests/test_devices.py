import importlib
import os
import shutil
import subprocess
import sys

import mxnet as mx
import pytest

import gluon_gpu
from gluon_gpu.core.platform.cgroups import cpu_quota
from gluon_gpu.core.platform.errors import DeviceError, UserError

from cgroup_caps import run_with_cpu_quota

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The package exports the context manager as gluon_gpu.devices, shadowing the module name.
dev = importlib.import_module("gluon_gpu.core.platform.devices")


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n):
        monkeypatch.setattr(dev, "gpu_count", lambda: n)
    return set_count


def test_cpu_specs():
    assert dev.parse_devices("cpu") == [mx.cpu(0)]
    assert dev.parse_devices("cpu*3") == [mx.cpu(0), mx.cpu(1), mx.cpu(2)]
    assert dev.parse_devices(" CPU*2 ") == [mx.cpu(0), mx.cpu(1)]


def test_all_without_gpus_is_a_cpu_context_per_thread_group_filling_the_cores(gpus, monkeypatch):
    gpus(0)
    monkeypatch.setattr(dev, "usable_cpus", lambda: 8)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert dev.parse_devices("all") == [mx.cpu(i) for i in range(4)]
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert dev.parse_devices("all") == [mx.cpu(0)]
    monkeypatch.delenv("OMP_NUM_THREADS")  # MXNet's default: half the logical CPUs per operator
    assert dev.parse_devices("all") == [mx.cpu(0), mx.cpu(1)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not shutil.which("taskset"),
                    reason="needs two CPUs and taskset")
def test_all_fills_the_cpus_the_process_may_use_not_the_machine_s():
    """A container's cpuset or taskset limits the CPUs: os.cpu_count() still counts the
    machine's, so `all` (and the OpenMP default) go by the affinity mask."""
    probe = ("from gluon_gpu.core.platform.devices import parse_devices, thread_settings; "
             "print(parse_devices('all'), thread_settings()['omp_threads'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[cpu(0)]", "1"]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_tightest_cpu_quota_of_the_process_and_its_ancestors_counts(tmp_path):
    """v1: a job's quota of 4 CPUs under a parent's of 2.5 (rounded down: 2); -1 is no
    quota. v2: cpu.max "max" is none, "300000 100000" 3 CPUs. None without any."""
    root = tmp_path / "cgroup"
    for group, quota in (("jobs/job1", 400_000), ("jobs", 250_000), ("", -1)):
        _write(root / "cpu" / group / "cpu.cfs_quota_us", str(quota))
        _write(root / "cpu" / group / "cpu.cfs_period_us", "100000")
    proc = tmp_path / "cgroup_of_v1"
    _write(proc, "4:memory:/\n1:cpu,cpuacct:/jobs/job1\n0::/\n")
    assert cpu_quota(str(proc), str(root)) == 2
    _write(proc, "1:cpu,cpuacct:/\n")
    assert cpu_quota(str(proc), str(root)) is None
    _write(root / "job2" / "cpu.max", "300000 100000\n")
    _write(root / "cpu.max", "max 100000\n")
    _write(proc, "0::/job2\n")
    assert cpu_quota(str(proc), str(root)) == 3
    _write(proc, "0::/\n")
    assert cpu_quota(str(proc), str(root)) is None


def test_a_cpu_quota_sets_the_cpu_contexts_and_openmp_threads(tmp_path):
    """A cgroup CPU quota of one CPU on this machine of two: `all` is one context, and
    OpenMP gets the quota's threads, set before MXNet starts, in a script through
    gluon_gpu's API and in the programs (the plan line); without the quota, both CPUs."""
    probe = ("import os, gluon_gpu; from gluon_gpu.core.platform.environment import usable_cpus; "
             "print(gluon_gpu.parse_devices('all'), os.environ.get('OMP_NUM_THREADS'), usable_cpus())")
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, "PYTHONPATH": REPO}
    if len(os.sched_getaffinity(0)) != 2:
        pytest.skip("written for a machine of two CPUs")
    free = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert free.stdout.split() == ["[cpu(0),", "cpu(1)]", "None", "2"], free.stderr
    capped = run_with_cpu_quota(1, [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert capped.stdout.split() == ["[cpu(0)]", "1", "1"], capped.stderr
    train = run_with_cpu_quota(1, [sys.executable, "-m", "gluon_gpu.train", "--epochs", "1", "--limit", "256",
                                   "--val-limit", "100", "--out", str(tmp_path / "run"), "--quiet"],
                               capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert train.returncode == 0, train.stderr
    assert "on cpu(0) (1 OpenMP thread per op, 1 engine worker per context)" in train.stdout


def test_gpu_specs_with_four_gpus(gpus):
    gpus(4)
    assert dev.parse_devices("all") == [mx.gpu(i) for i in range(4)]
    assert dev.parse_devices("gpu") == [mx.gpu(i) for i in range(4)]
    assert dev.parse_devices("gpu*2") == [mx.gpu(0), mx.gpu(1)]
    assert dev.parse_devices("gpu:0,2") == [mx.gpu(0), mx.gpu(2)]
    assert dev.parse_devices("gpu:3") == [mx.gpu(3)]


@pytest.mark.parametrize("spec,gpu_count,message", [
    ("gpu", 0, "has none"),
    ("gpu*1", 0, "has none"),
    ("gpu*3", 2, "asks for 3 GPUs: this machine has 2 GPUs"),
    ("gpu:2", 2, "GPU 2 does not exist"),
    ("gpu:0", 0, "GPU 0 does not exist: this machine has no GPU"),
    ("gpu:1,1", 4, "repeated"),
    ("cpu*0", 0, "at least 1"),
    ("gpu*0", 4, "at least 1"),
    ("cpu:1", 0, "chosen by count"),
    ("tpu", 0, "bad device spec"),
    ("gpu:", 4, "bad device spec"),
    ("cpu*x", 0, "bad device spec"),
    ("", 0, "bad device spec"),
])
def test_bad_specs(gpus, spec, gpu_count, message):
    gpus(gpu_count)
    with pytest.raises(DeviceError, match=message):
        dev.parse_devices(spec)


def test_context_manager_yields_list_and_syncs():
    with gluon_gpu.devices("cpu*2") as ctx:
        assert ctx == [mx.cpu(0), mx.cpu(1)]
        x = mx.nd.ones((4,), ctx=ctx[1]) * 3
    assert x.asnumpy().tolist() == [3, 3, 3, 3]


def test_thread_settings_read_the_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "2")
    assert dev.thread_settings()["omp_threads"] == 3 and dev.thread_settings()["engine_threads"] == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS")
    defaults = dev.thread_settings()
    assert defaults["omp_threads"] == max(1, dev.usable_cpus() // 2) and defaults["engine_threads"] == 1


def test_thread_flags_in_process_are_refused_unless_already_in_effect(monkeypatch):
    """A library caller cannot change MXNet's threads after it started: a clear error
    naming the variable, and nothing when the environment already says so."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dev.require_thread_settings(omp_threads=1)
    dev.require_thread_settings()
    with pytest.raises(UserError, match="OMP_NUM_THREADS=5 before starting Python"):
        dev.require_thread_settings(omp_threads=5)
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_train_in_process_with_other_threads_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from gluon_gpu.programs import train
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    assert train.main(["--engine-threads", "3", "--dry-run", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gluon_gpu.train: error: thread settings take effect only when MXNet starts: "
        "set MXNET_CPU_WORKER_NTHREADS=3 before starting Python"]


def test_cli_restarts_itself_with_the_thread_flags_in_effect(tmp_path, data_dir):
    """MXNet reads its thread counts only at start, so the program re-executes itself with
    them set: the plan is printed once, by a process that has them."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS")}
    proc = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--devices", "cpu*2", "--dry-run",
                           "--omp-threads", "3", "--engine-threads", "2", "--limit", "512",
                           "--data-dir", data_dir, "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**env, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    plan, memory = proc.stdout.strip().splitlines()  # the plan line once, then the dry run's memory line
    assert "(3 OpenMP threads per op, 2 engine workers per context)" in plan and memory.startswith("memory: about ")


@pytest.mark.parametrize("preset, expected", [(None, "64"), ("8", "8")])
def test_choosing_devices_widens_the_shared_cpu_scratch_pool(preset, expected):
    """MXNet's default of 4 CPU scratch buffers, shared by all CPU contexts, serializes
    cpu(0) and cpu(1); choosing devices raises it unless the user chose a value (importing
    gluon_gpu does not: test_bad_input)."""
    env = {k: v for k, v in os.environ.items() if k != "MXNET_CPU_TEMP_COPY"}
    if preset:
        env["MXNET_CPU_TEMP_COPY"] = preset
    proc = subprocess.run([sys.executable, "-c", "import os, gluon_gpu; gluon_gpu.parse_devices('cpu*2'); "
                           "print(os.environ['MXNET_CPU_TEMP_COPY'])"],
                          capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": REPO})
    assert proc.stdout.strip() == expected, proc.stderr
