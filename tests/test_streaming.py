"""Data bigger than memory (issue #25): image folders and RecordIO read from disk batch
by batch by DataLoader workers (the loader pipeline), the same batches as in memory,
gluon_gpu.pack, exact resume, bad input mid-run, and a run under a memory cap."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import mxnet as mx
import numpy as np
import pytest

from gluon_gpu.data import load_dataset
from gluon_gpu.data.pipelines import choose_pipeline
from gluon_gpu.programs import pack, predict, train

from conftest import make_image_folder, read_metrics
from failure_table import table_exit
from image_folders import write_colours
from cgroup_caps import can_cap, run_capped
from test_checkpoints import assert_same_run, checkpoint_names, held_after, start, stopped_after, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--devices", "cpu*2", "--batch-size", "64", "--lr", "0.1", "--momentum", "0.9", "--quiet"]


def params(run):
    return {k: v.asnumpy() for k, v in mx.nd.load(os.path.join(run, "net.params")).items()}


def assert_same_params(a, b):
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


def plan_line(run):
    with open(os.path.join(run, "train.log")) as f:
        return f.readline()


@pytest.fixture(scope="module")
def runs(fashion_folder, tmp_path_factory):
    """The same folder trained in memory (device pipeline) and streamed (loader), 2 epochs."""
    root = tmp_path_factory.mktemp("streaming")
    out = {}
    for pipeline in ("device", "loader"):
        out[pipeline] = str(root / pipeline)
        assert train.main(FLAGS + ["--dataset", "folder", "--data-dir", fashion_folder, "--epochs", "2",
                                   "--pipeline", pipeline, "--out", out[pipeline]]) == 0
    return out


def test_a_streamed_run_equals_the_in_memory_run_of_the_same_folder(runs):
    """Same (seed, epoch) order, same images, same in-graph normalization: identical parameters."""
    assert "pipeline loader, 1 data worker" in plan_line(runs["loader"])
    assert "pipeline device" in plan_line(runs["device"])
    assert_same_params(runs["device"], runs["loader"])
    assert read_metrics(runs["loader"])["epochs"][-1]["val_acc"] > 0.6  # learns: chance is 0.1


def test_streamed_images_are_augmented_and_mixed_as_in_memory_ones(image_folder, tmp_path):
    """--augment and --mixup run on the device for streamed batches too, from the same
    (seed, epoch) draws: the same parameters as the in-memory run."""
    flags = ["--dataset", "folder", "--data-dir", image_folder, "--devices", "cpu*2", "--batch-size", "16",
             "--epochs", "2", "--augment", "flip,crop=2,erase", "--mixup", "0.4", "--quiet"]
    for pipeline in ("device", "loader"):
        assert train.main(flags + ["--pipeline", pipeline, "--out", str(tmp_path / pipeline)]) == 0
    assert_same_params(str(tmp_path / "device"), str(tmp_path / "loader"))


def test_a_folder_packed_to_recordio_trains_exactly_as_the_folder(runs, fashion_folder, tmp_path, capsys):
    packed = str(tmp_path / "rec")
    assert pack.main([fashion_folder, packed, "--processes", "2"]) == 0
    said = capsys.readouterr().out
    assert "packed 1536 training and 512 validation images" in said and sys.executable in said
    from gluon_gpu.core.platform.memory import size_text
    written = sum(os.path.getsize(os.path.join(packed, f"{split}.rec")) for split in ("train", "val"))
    assert f"into {packed}: {size_text(written)};" in said and " 0.0 MiB" not in said
    with open(os.path.join(packed, "meta.json")) as f:
        meta = json.load(f)
    assert meta["image_size"] == [28, 28] and meta["channels"] == 1 and "Trouser" in meta["classes"]
    out = str(tmp_path / "run")
    assert train.main(FLAGS + ["--dataset", "rec", "--data-dir", packed, "--epochs", "2", "--pipeline", "loader",
                               "--out", out]) == 0
    assert_same_params(runs["device"], out)
    # the class names travelled with the data: predict names them
    trouser = os.path.join(fashion_folder, "val", "Trouser", sorted(os.listdir(
        os.path.join(fashion_folder, "val", "Trouser")))[0])
    capsys.readouterr()
    assert predict.main(["--params", out, "--devices", "cpu", trouser]) == 0
    assert "Trouser" in capsys.readouterr().out


def test_pack_resizes_and_encodes_jpeg(fashion_folder, tmp_path):
    packed = str(tmp_path / "rec")
    assert pack.main([fashion_folder, packed, "--image-size", "20", "--quality", "90", "--quiet"]) == 0
    data = load_dataset("rec", packed, decoded=False)
    assert data.spec.input_shape == (1, 20, 20) and len(data.train_x) == 1536
    assert data.train_x.payload(0)[:2] == b"\xff\xd8"  # a JPEG
    first = data.train_x.read(0)
    assert first.shape == (1, 20, 20) and first.dtype == np.uint8 and first.std() > 10


@pytest.mark.parametrize("case", ["existing output", "not a folder", "quality", "truncated image", "out in folder"])
def test_pack_refuses_bad_input_in_one_line(case, tmp_path, capsys):
    root = make_image_folder(tmp_path / "f", per_class=(3, 2), size=16)
    argv = {"existing output": [root, str(tmp_path / "rec")], "not a folder": [str(tmp_path / "none"), "x"],
            "quality": [root, str(tmp_path / "rec"), "--quality", "0"],
            "truncated image": [root, str(tmp_path / "rec"), "--image-size", "12"],
            "out in folder": [root, os.path.join(root, "val", "rec")]}[case]
    if case == "truncated image":
        broken = os.path.join(root, "train", "square", "1.png")
        with open(broken, "rb") as f:
            head = f.read(100)
        with open(broken, "wb") as f:
            f.write(head)
    if case == "existing output":
        assert pack.main(argv + ["--quiet"]) == 0
        capsys.readouterr()
    assert pack.main(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert {"existing output": "--overwrite", "not a folder": "not a directory", "quality": "1 to 100",
            "truncated image": "1.png", "out in folder": "is inside FOLDER's val images"}[case] in err
    if case == "out in folder":  # refused before anything was made
        assert not os.path.exists(argv[1])
    if case == "truncated image":  # no half-written files left
        assert sorted(os.listdir(tmp_path / "rec")) == []


def damage(packed, case):
    """One kind of bad RecordIO, and the file the error must name."""
    rec, idx = (os.path.join(packed, f"train.{ext}") for ext in ("rec", "idx"))
    if case == "missing .idx":
        os.remove(idx)
        return idx
    if case == ".idx of another .rec":
        with open(idx) as f:
            lines = f.read().splitlines()
        with open(idx, "w") as f:
            f.write("\n".join(f"{k}\t{int(o) + 4}" for k, o in (line.split("\t") for line in lines)) + "\n")
        return idx
    if case == "corrupt record":
        with open(idx) as f:
            offset = int(f.read().splitlines()[5].split("\t")[1])
        with open(rec, "r+b") as f:
            f.seek(offset + 8 + 24 + 60)  # inside the PNG's pixel data
            f.write(b"\x00" * 40)
        return rec
    raise ValueError(case)


@pytest.mark.parametrize("case", ["missing .idx", ".idx of another .rec", "corrupt record"])
def test_bad_recordio_is_one_line_naming_the_file_and_exit_2(case, tmp_path, capsys):
    root = make_image_folder(tmp_path / "f", per_class=(8, 3), size=16)
    packed = str(tmp_path / "rec")
    assert pack.main([root, packed, "--quiet", "--processes", "0"]) == 0
    named = damage(packed, case)
    capsys.readouterr()
    code = train.main(["--dataset", "rec", "--data-dir", packed, "--devices", "cpu", "--epochs", "1", "--quiet",
                       "--pipeline", "loader", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert table_exit("RecordIO without its", code) and len(err.splitlines()) == 1 and named in err, err


def test_an_image_truncated_mid_run_stops_it_in_one_line_and_keeps_its_checkpoints(tmp_path):
    """The run stops rather than skip the image: skipping would change the batches of
    every later step (and a resumed run's), so a broken dataset is the user's to mend."""
    root = make_image_folder(tmp_path / "f", per_class=(20, 5), size=16)
    out = str(tmp_path / "run")
    proc = start(["--dataset", "folder", "--data-dir", root, "--devices", "cpu", "--epochs", "1000", "--quiet",
                  "--batch-size", "8", "--pipeline", "loader", "--out", out])
    wait_for(lambda: os.path.exists(os.path.join(out, "metrics.json")))  # an epoch is done
    broken = os.path.join(root, "train", "square", "3.png")
    with open(broken, "rb") as f:
        head = f.read(200)
    with open(broken, "wb") as f:
        f.write(head)
    _, err = proc.communicate(timeout=120)
    assert table_exit("an image file or RecordIO record that cannot be decoded", proc.returncode)
    assert err.strip().splitlines() == [
        f"gluon_gpu.train: error: {broken}: image file is truncated"], err
    assert checkpoint_names(out) and read_metrics(out)["epochs"]


def children(pid):
    """The processes ``pid`` started (its DataLoader workers), from /proc."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def test_a_killed_loader_worker_ends_the_run_in_one_line_with_its_partial_epoch_resumable(runs, fashion_folder,
                                                                                          tmp_path):
    """What the out-of-memory killer does: the run stops at its next batch (not after
    Gluon's 120 s stall, with a traceback: communicate's timeout is shorter), checkpoints
    the batches it finished, and resumes to the straight run. The workers are killed
    while the run is held after step 26 (epoch 2, batch 2 of 24), not wherever the
    machine's speed puts a kill."""
    out, marker = str(tmp_path / "run"), str(tmp_path / "held")
    proc = held_after(FLAGS + ["--dataset", "folder", "--data-dir", fashion_folder, "--epochs", "2", "--pipeline",
                               "loader", "--out", out], 26, marker)
    workers = children(proc.pid)  # the training and the validation loaders' (both have run)
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    os.remove(marker)
    _, err = proc.communicate(timeout=60)
    assert table_exit("a DataLoader worker killed", proc.returncode), err
    assert len(workers) >= 2 and len(err.strip().splitlines()) == 1, (workers, err)
    line = err.strip()
    assert line.startswith("gluon_gpu.train: error: a DataLoader worker (pid ") and "killed by SIGKILL" in line
    assert "; continue from its epoch 1, batch 2 with: " in line, line  # 1 epoch finished, 2 batches after it
    assert read_metrics(out)["status"] == "failed"
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(runs["loader"], out)


def test_a_run_killed_with_sigkill_leaves_its_temporary_folder_only_until_the_next_start(fashion_folder, tmp_path):
    """Nothing of a process runs after kill -9, so multiprocessing's pymp-* folder (the
    sockets its loader workers hand shared memory through) stays: the next program that
    starts workers removes it, and its own at exit. TMPDIR short: the sockets' paths
    must fit in 108 characters."""
    temp = tempfile.mkdtemp(prefix="gg-", dir="/tmp")
    try:
        env = {**os.environ, "PYTHONPATH": REPO, "TMPDIR": temp}
        out, marker = str(tmp_path / "run"), str(tmp_path / "held")
        proc = held_after(FLAGS + ["--dataset", "folder", "--data-dir", fashion_folder, "--epochs", "2", "--pipeline",
                                   "loader", "--out", out], 26, marker, {"TMPDIR": temp})  # its workers have run
        proc.kill()
        proc.communicate()
        os.remove(marker)
        left = os.path.join(temp, f"gluon_gpu-{proc.pid}")
        assert os.listdir(temp) == [os.path.basename(left)] and any(n.startswith("pymp-") for n in os.listdir(left))
        done = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--resume", out, "--quiet"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert os.listdir(temp) == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_a_killed_pack_worker_ends_pack_in_one_line_and_leaves_no_files(fashion_folder, tmp_path):
    """Pool.imap waited forever for the images the dead worker held."""
    out = str(tmp_path / "rec")
    proc = subprocess.Popen([sys.executable, "-m", "gluon_gpu.pack", fashion_folder, out, "--image-size", "1024",
                             "--processes", "2", "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    partial = os.path.join(out, f"train.rec.{proc.pid}.partial")  # 1536 images of 1024x1024: the kill lands mid-way
    wait_for(lambda: os.path.exists(partial) and os.path.getsize(partial) > 0)
    os.kill(children(proc.pid)[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert table_exit("a DataLoader worker killed", proc.returncode), err
    assert len(err.strip().splitlines()) == 1, err
    line = err.strip()
    assert line.startswith("gluon_gpu.pack: error: a pack worker (pid ") and "killed by SIGKILL" in line, line
    assert not os.listdir(out), os.listdir(out)  # no .partial left


def test_what_a_killed_pack_left_is_removed_by_the_next(fashion_folder, tmp_path):
    """#62, class 'temporaries outliving their owner': a pack killed mid-write (kill -9:
    no handler runs) left train.rec.partial and train.idx.partial in OUT for good."""
    out = str(tmp_path / "rec")
    proc = subprocess.Popen([sys.executable, "-m", "gluon_gpu.pack", fashion_folder, out, "--image-size", "1024",
                             "--processes", "1", "--quiet"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    partial = os.path.join(out, f"train.rec.{proc.pid}.partial")
    wait_for(lambda: os.path.exists(partial) and os.path.getsize(partial) > 0)
    proc.kill()
    proc.communicate(timeout=60)
    assert os.path.exists(partial)
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.pack", fashion_folder, out, "--processes", "1",
                           "--quiet"], cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO},
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == ["meta.json", "train.idx", "train.rec", "val.idx", "val.rec"]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "kill -9"])
def test_a_streamed_run_stopped_mid_epoch_resumes_to_the_straight_run(how, runs, fashion_folder, tmp_path):
    flags = FLAGS + ["--dataset", "folder", "--data-dir", fashion_folder, "--epochs", "2", "--pipeline", "loader",
                     "--log-interval", "1"]
    out = str(tmp_path / "run")
    proc, _, _ = stopped_after(flags + ["--out", out], 26, how, str(tmp_path / "held"))  # epoch 2, batch 2 of 24
    assert proc.returncode == (130 if how == signal.SIGINT else -signal.SIGKILL)
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(runs["loader"], out)


def test_a_resumed_run_refuses_data_that_changed(tmp_path, capsys):
    root = make_image_folder(tmp_path / "f", per_class=(6, 3), size=16)
    out = str(tmp_path / "run")
    assert train.main(["--dataset", "folder", "--data-dir", root, "--devices", "cpu", "--epochs", "1", "--quiet",
                       "--out", out]) == 0
    shutil.copy(os.path.join(root, "train", "square", "0.png"), os.path.join(root, "train", "square", "new.png"))
    capsys.readouterr()
    assert table_exit("RecordIO without its", train.main(["--resume", out, "--epochs", "2"]))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has 19 training samples; this run trained on 18" in err, err
    os.remove(os.path.join(root, "train", "square", "new.png"))
    os.rename(os.path.join(root, "train", "square"), os.path.join(root, "train", "box"))
    os.rename(os.path.join(root, "val", "square"), os.path.join(root, "val", "box"))
    assert train.main(["--resume", out, "--epochs", "2"]) == 2
    assert "has classes box, hstripes, vstripes; this run's are hstripes, square, vstripes" in capsys.readouterr().err


def test_auto_streams_images_whose_copies_would_not_fit():
    pipeline, why = choose_pipeline("auto", 2 ** 60, [mx.cpu(0), mx.cpu(1)], on_disk=True)
    assert pipeline == "loader" and "would not fit" in why and "read from disk" in why
    assert choose_pipeline("auto", 2 ** 20, [mx.cpu(0)], on_disk=True)[0] == "device"


CAPPED = os.path.join(REPO, "tests", "pooled_model_run.py")


def test_a_folder_larger_than_the_memory_cap_trains_streamed_to_the_in_memory_accuracy(tmp_path):
    """The decoded folder (3 x 256 x 256 x 2900 images: 544 MiB) is larger than the
    process's 480 MiB cgroup cap: --pipeline auto streams it and reaches the accuracy
    the uncapped run reaches with the data in memory. (The streamed run peaks near
    300 MiB here, page cache included: a 400 MiB cap once met the OOM killer in CI.)"""
    if not can_cap():
        pytest.skip("capping memory needs root and a writable cgroup v1 memory controller")
    root = str(tmp_path / "colours")
    rng = np.random.default_rng(0)
    for split, count in (("train", 2600), ("val", 300)):
        write_colours(os.path.join(root, split), count, 256, rng)
    decoded = 2900 * 3 * 256 * 256
    cap = 480 * 2 ** 20
    assert decoded > cap
    results = {}
    for name, limit in (("capped", cap), ("uncapped", None)):
        argv = [sys.executable, CAPPED, root]
        proc = (run_capped(limit, argv, capture_output=True, text=True, cwd=REPO) if limit else
                subprocess.run(argv, capture_output=True, text=True, cwd=REPO))
        assert proc.returncode == 0, proc.stderr
        results[name] = json.loads(proc.stdout.splitlines()[-1])
    assert results["capped"]["pipeline"].startswith("pipeline loader (auto:")
    assert results["uncapped"]["pipeline"].startswith("pipeline device (auto:")
    assert results["capped"]["val_acc"] == results["uncapped"]["val_acc"] > 0.9
