"""One memory estimate before every large allocation: decoded image folders, the device
pipeline's copies, a network's training state at its batch size, ensembles. A run that
cannot fit is refused in one line with the figure and what is free, before it allocates;
under a cgroup memory cap the free figure is the cap's."""
import os
import sys

import mxnet as mx
import numpy as np
import pytest

from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.core.platform.memory import cgroup_free, check_fits
from gluon_gpu.models import get_model
from gluon_gpu.models.footprint import footprint, training_bytes
from gluon_gpu.programs import train

from conftest import make_image_folder
from failure_table import table_exit
from cgroup_caps import run_capped

MiB = 2 ** 20


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_the_tightest_cgroup_limit_of_the_process_and_its_ancestors_counts(tmp_path):
    """v1: a job's group under a parent with a smaller limit; the page cache the kernel
    can drop is free. v2: "max" is no limit. No limit anywhere: None."""
    root = tmp_path / "cgroup"
    v1 = root / "memory" / "jobs" / "job1"
    _write(str(v1 / "memory.limit_in_bytes"), str(900 * MiB))
    _write(str(v1 / "memory.usage_in_bytes"), str(300 * MiB))
    _write(str(v1 / "memory.stat"), f"cache 1\ntotal_inactive_file {100 * MiB}\n")
    _write(str(root / "memory" / "jobs" / "memory.limit_in_bytes"), str(700 * MiB))
    _write(str(root / "memory" / "jobs" / "memory.usage_in_bytes"), str(300 * MiB))
    _write(str(root / "memory" / "memory.limit_in_bytes"), "9223372036854771712")
    _write(str(root / "memory" / "memory.usage_in_bytes"), str(5000 * MiB))
    proc = tmp_path / "cgroup_of_v1"
    _write(str(proc), "4:memory:/jobs/job1\n3:cpu:/\n0::/\n")
    assert cgroup_free(str(proc), str(root)) == 400 * MiB  # the parent's 700 - 300, not the job's 900 - 200

    v2 = root / "job2"
    _write(str(v2 / "memory.max"), str(512 * MiB))
    _write(str(v2 / "memory.current"), str(112 * MiB))
    _write(str(v2 / "memory.stat"), "inactive_file 0\n")
    _write(str(root / "memory.max"), "max")
    proc2 = tmp_path / "cgroup_of_v2"
    _write(str(proc2), "0::/job2\n")
    assert cgroup_free(str(proc2), str(root)) == 400 * MiB
    _write(str(proc2), "0::/\n")
    assert cgroup_free(str(proc2), str(root)) is None


def test_sizes_read_in_the_unit_that_fits():
    from gluon_gpu.core.platform.memory import size_text
    assert [size_text(n) for n in (512, 40 * 2 ** 10, 53 * 2 ** 20, 3 * 2 ** 30 // 2)] == \
        ["512 bytes", "40 KiB", "53 MiB", "1.5 GiB"]


def test_cpu_contexts_share_the_host_so_their_needs_add_up():
    free_now = 2 ** 40  # check_fits reads the real figure; these needs sit either side of it
    with pytest.raises(UserError) as refused:
        check_fits({mx.cpu(0): free_now, mx.cpu(1): free_now}, "two copies", "use fewer")
    message = str(refused.value)
    assert "\n" not in message and "two copies needs about 2048.0 GiB, and the host has" in message
    assert message.endswith("free; use fewer")
    check_fits({mx.cpu(0): MiB, mx.cpu(1): MiB}, "two small copies", "unused")


@pytest.mark.parametrize("model", ["lenet", "cifar_resnet20_v1"])
def test_the_estimate_counts_the_parameters_and_at_least_every_layer_s_output(model):
    """Shape inference, no allocation: the parameters are exactly those an initialized
    copy holds; the activations at least what the layers return (forward hooks), and they
    grow with the image's area."""
    params, activations = footprint(lambda: get_model(model), (1, 28, 28))
    net = get_model(model)
    net.initialize()
    outputs = []
    from gluon_gpu.core.platform.walk import leaves
    for layer in leaves(net):
        layer.register_forward_hook(  # called on symbols too while shapes are inferred: not counted
            lambda _b, _i, out: isinstance(out, mx.nd.NDArray) and outputs.append(out.size))
    net(mx.nd.zeros((1, 1, 28, 28)))
    assert params == sum(p.data().size for p in net.collect_params().values())
    assert sum(outputs) <= activations < 3 * sum(outputs)
    assert footprint(lambda: get_model(model), (1, 56, 56))[1] > 3 * activations
    # a 20000x20000 input: estimated, not allocated (a forward pass would need over 100 GiB)
    assert footprint(lambda: get_model(model), (1, 20000, 20000))[1] > 400_000 * activations
    assert training_bytes(params, activations, 2, 64) == 4 * (8 * params + 192 * activations)


def test_a_batch_that_cannot_fit_is_refused_before_any_step(tmp_path, capsys):
    """The issue's case: cifar_resnet20_v1 at batch 10,000,000 ran 31 s into "Failed to
    allocate CPU Memory". The estimate counts the largest batch the data makes (all 60,000
    training samples here), and refuses it with the figure and the host's free memory."""
    out = str(tmp_path / "r")
    assert table_exit("a run that cannot fit in memory", train.main(
        ["--model", "cifar_resnet20_v1", "--batch-size", "10000000", "--epochs", "1", "--quiet", "--out", out]))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--model cifar_resnet20_v1 on inputs of 1x28x28 with batches of 60000 samples" in err
    assert "GiB, and the host has" in err and "free; choose a smaller --batch-size" in err
    assert not os.path.exists(out)


def _capped_train(tmp_path, limit, *flags):
    out = str(tmp_path / "run")
    proc = run_capped(limit, [sys.executable, "-m", "gluon_gpu.train", "--epochs", "1", "--quiet", "--out", out,
                              *flags], capture_output=True, text=True, timeout=300)
    return proc, out


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("tiny") / "shapes", per_class=(4, 2), size=16)


@pytest.mark.parametrize("flags, refusal", [
    # the issue's --image-size 20000 (a MemoryError then): one RGB image decoded is 1.1 GiB, and the
    # first one decoded is for the mean and std
    (["--image-size", "20000"], "decoding 1 image of"),
    # decoded (18 MB) they fit; LeNet's training state on 1000x1000 inputs (~2 GiB) does not
    (["--image-size", "1000"], "--model lenet on inputs of 3x1000x1000 with batches of 12 samples"),
])
def test_under_a_memory_cap_a_run_that_cannot_fit_is_refused_before_it_allocates(tmp_path, tiny_folder, flags,
                                                                                 refusal):
    """Each refusal names the cap's free figure, not the host's 20-odd GiB: without the cap
    both runs would start, and the second would fit in the host's memory."""
    proc, out = _capped_train(tmp_path, 400 * MiB, "--dataset", "folder", "--data-dir", tiny_folder,
                              "--devices", "cpu", "--batch-size", "12", *flags)
    assert table_exit("a run that cannot fit in memory", proc.returncode), proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and refusal in line, line
    free = float(line.split("the host has ")[1].split()[0])
    assert "MiB free" in line and free < 400, line
    assert not os.path.exists(out)


def test_the_device_pipeline_s_copies_are_checked_against_the_cap(tmp_path):
    """An npz of 173 MB of float32 images on cpu*8: the device pipeline would copy it to
    each of the eight contexts (1.4 GB more) under a cap that leaves about half that; the
    refusal says to use the loader pipeline, which --pipeline auto (the default) then
    chooses, saying why, and trains under the same cap; so does a sweep of eight
    members, one per context, each batch read once for all of them (under a cap that
    leaves room for their training state)."""
    rng = np.random.default_rng(0)
    path = str(tmp_path / "big.npz")
    np.savez(path, x_train=rng.random((3000, 1, 120, 120), dtype=np.float32), y_train=rng.integers(0, 2, 3000),
             x_val=rng.random((64, 1, 120, 120), dtype=np.float32), y_val=rng.integers(0, 2, 64))
    common = ["--dataset", "npz", "--data-dir", path, "--devices", "cpu*8", "--model", "mlp"]
    proc, out = _capped_train(tmp_path, 1200 * MiB, *common, "--pipeline", "device")
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "--pipeline device: a copy of 3000 samples on each of 8 devices" in line
    assert "use --pipeline loader" in line
    proc, out = _capped_train(tmp_path, 1200 * MiB, *common)  # --pipeline auto: the loader, said why
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.exists(os.path.join(out, "net.params"))
    plan = proc.stdout.splitlines()[0]
    assert ", pipeline loader (auto: 8 copies of 168 MiB would not fit in the " in plan, plan
    assert plan.split(" would not fit in the ")[1].startswith(tuple("0123456789")) and "the host has free)" in plan
    # eight members' training state is about 300 MB more (1.25 GiB in all, measured): a cap of 1600 MiB,
    # which the eight copies still do not fit in
    proc, out = _capped_train(tmp_path / "sweep", 1600 * MiB, *common, "--sweep", "lr=0.01,0.02,0.05,0.1 wd=0,1e-4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = proc.stdout.splitlines()[0]
    assert plan.startswith("gluon_gpu ") and "sweep of 8 x mlp (devices layout)" in plan, plan
    assert ", pipeline loader (auto: 8 copies of 168 MiB would not fit in the " in plan, plan
    with open(os.path.join(out, "sweep.csv")) as f:
        assert len(f.read().strip().splitlines()) == 9  # a header and every member


def test_auto_keeps_the_data_on_the_devices_when_it_fits(tmp_path, capsys):
    """The default --pipeline auto: FashionMNIST's copies fit, so the data stays on the
    devices, and the plan line says so with the figures; an ensemble needs the device
    pipeline whatever the memory."""
    for flags, said in (([], "pipeline device (auto: 2 copies of "),
                        (["--ensemble", "2"], "pipeline device (auto: members that draw their own samples need it)")):
        assert train.main(["--devices", "cpu*2", "--limit", "512", "--dry-run", "--out", str(tmp_path / "r")]
                          + flags) == 0
        plan = capsys.readouterr().out.splitlines()[0]
        assert said in plan, plan
    assert "MiB fit in the " in train_plan(tmp_path, capsys)


def train_plan(tmp_path, capsys):
    assert train.main(["--devices", "cpu", "--limit", "512", "--dry-run", "--out", str(tmp_path / "r")]) == 0
    return capsys.readouterr().out.splitlines()[0]


def test_a_label_that_makes_a_million_classes_is_one_line_before_any_allocation(tmp_path):
    """The issue's npz with one label of 10**6: 1000001 classes from 64 samples (LeNet's
    last layer would be 84 M parameters, 1.3 GiB to train). It died in "Failed to
    allocate CPU Memory"; the dataset check (data/checks.py) refuses it as it is read,
    before the estimate, under a cap; the same data labelled 0..9 fits."""
    x = np.random.RandomState(0).randint(0, 256, (64, 1, 28, 28)).astype(np.uint8)
    y = np.arange(64) % 10
    paths = {}
    for name, top in (("ten", 9), ("million", 10 ** 6)):
        paths[name] = str(tmp_path / f"{name}.npz")
        np.savez(paths[name], x_train=x, y_train=np.where(y == 9, top, y), x_val=x[:16], y_val=y[:16])
    proc, _ = _capped_train(tmp_path, 700 * MiB, "--dataset", "npz", "--data-dir", paths["million"], "--devices",
                            "cpu", "--batch-size", "16")
    assert table_exit("a dataset that makes no sense", proc.returncode), proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "1000001 classes from 64 training samples" in line, line
    proc, _ = _capped_train(tmp_path, 700 * MiB, "--dataset", "npz", "--data-dir", paths["ten"], "--devices", "cpu",
                            "--batch-size", "16")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_pack_refuses_an_image_size_its_workers_cannot_hold_under_a_cap(tmp_path, tiny_folder):
    """The issue's `pack --image-size 20000` ran until killed: each worker holds an image
    decoded, resized and encoded (3 x 1.1 GiB in colour), refused here before any is."""
    out = str(tmp_path / "rec")
    proc = run_capped(400 * MiB, [sys.executable, "-m", "gluon_gpu.pack", tiny_folder, out, "--image-size", "20000",
                                  "--processes", "2", "--quiet"], capture_output=True, text=True, timeout=300)
    assert table_exit("a run that cannot fit in memory", proc.returncode), proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "packing images of 3x20000x20000 with 2 processes needs about" in line, line
    assert "MiB free; pass a smaller --image-size, or fewer --processes" in line, line
    assert not os.path.exists(out)
