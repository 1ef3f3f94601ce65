"""The benchmark end to end on a tiny slice (figures are not judged here: that is the
benchmark's job, on a quiet machine), and the helpers behind its report."""
import json
import os
import sys

import mxnet as mx
import pytest

from gluon_gpu.core.platform.devices import cpu_contexts, thread_settings
from gluon_gpu.core.platform.environment import usable_cpus
from gluon_gpu.core.step import precision
from gluon_gpu.core.step.precision import BF16_CPU_FLAGS, cpu_flags
from gluon_gpu.data import augment
from gluon_gpu.models.zoo import get_model
from gluon_gpu.programs.bench import accuracy as bench_accuracy
from gluon_gpu.programs.bench import program as bench
from gluon_gpu.programs.bench import torch_train
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.recipes import RECIPES, apply_recipe
from gluon_gpu.programs.run import lr_scheduler

from conftest import needs_bf16, trained_run


@pytest.fixture(autouse=True)
def judge_no_row_busy(monkeypatch):
    """These tests check the tables' ratios, which a row marked busy has none of: beside
    the suite's other tests every row would be. test_race_table.py tests the marking."""
    monkeypatch.setenv("GLUON_GPU_CPU_STAT", os.devnull)


def test_bench_runs_end_to_end_and_writes_json_and_png(tmp_path, capsys):
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "cpu*2", "--epochs", "2", "--limit", "1024",
                       "--loader-workers", "0", "--out", out, "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "vs tutorial" in printed and "compute floor" in printed and "peak RSS" in printed
    with open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    names = [r["name"] for r in report["results"]]
    assert names == ["cpu", "cpu*2"]
    for r in report["results"]:
        assert len(r["runs"][0]["seconds"]) == 2 and r["median_epoch_s"] > 0
        assert r["samples_per_s"] == pytest.approx(1024 / r["median_epoch_s"])
        assert r["vs_tutorial"] == pytest.approx(report["tutorial"]["median_epoch_s"] / r["median_epoch_s"])
    assert report["results"][0]["speedup"] == 1.0
    assert report["results"][1]["devices"] == 2
    # several devices: the paired no-exchange epochs, and the exchange's share of the epoch
    single, multi = report["results"]
    assert "exchange_share" not in single and single["runs"][0]["no_exchange_seconds"] == []
    pairs = list(zip(multi["runs"][0]["seconds"][1:], multi["runs"][0]["no_exchange_seconds"][1:]))
    assert len(pairs) == 1 and multi["exchange_share"] == pytest.approx(1 - pairs[0][1] / pairs[0][0])
    assert multi["no_exchange_epoch_s"] == pairs[0][1] > 0
    assert "exchange: the share of the epoch" in printed
    assert report["machine"]["mxnet"] == mx.__version__ and report["machine"]["cores"] >= 1
    assert report["peak_rss_mib"] > 0
    assert all(r["cores_busy"] > 0 and 0 < r["of_floor"] for r in report["results"])
    assert report["machine"]["threads"]["cpu_temp_copy"] >= 64
    assert report["machine"]["threads"]["cpu_parallel_rand_copy"] >= 8
    assert all(r["fused_conv"] for r in report["results"])  # auto, on CPUs: the fused operator
    with open(os.path.join(out, "scaling.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bench_compares_fused_conv_modes_side_by_side(tmp_path, capsys):
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "cpu*2", "--fused-conv", "on", "off", "--epochs", "2",
                       "--limit", "512", "--baseline", "none", "--out", out, "--quiet"]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        rows = json.load(f)["results"]
    assert [r["name"] for r in rows] == ["cpu fused", "cpu*2 fused", "cpu unfused", "cpu*2 unfused"]
    assert [r["fused_conv"] for r in rows] == [True, True, False, False]
    assert rows[0]["speedup"] == 1.0 and rows[2]["speedup"] == 1.0  # each mode against its own cpu row
    assert rows[3]["speedup"] == pytest.approx(rows[2]["median_epoch_s"] / rows[3]["median_epoch_s"])
    assert "cpu*2 unfused" in printed


def test_bench_rejects_a_bad_spec_before_any_work(tmp_path, capsys):
    assert bench.main(["--devices", "cpu", "gpu*8", "--out", str(tmp_path / "b")]) == 2
    assert "asks for GPUs" in capsys.readouterr().err
    assert not (tmp_path / "b" / "bench.json").exists()


def test_lenet_training_flops_match_the_hand_count():
    conv1 = 6 * 24 * 24 * 25
    macs = conv1 + 16 * 10 * 10 * 6 * 9 + 400 * 120 + 120 * 84 + 84 * 10
    assert bench.training_flops("lenet", 10, (1, 28, 28), 10) == 2 * (3 * macs - conv1) * 10  # no gradient for the images


def test_default_specs_scale_over_gpus(monkeypatch):
    monkeypatch.setattr(bench, "gpu_count", lambda: 0)
    assert bench.default_specs() == ["cpu", "cpu*2"]
    monkeypatch.setattr(bench, "gpu_count", lambda: 6)
    assert bench.default_specs() == ["gpu*1", "gpu*2", "gpu*4", "gpu*6", "cpu"]


@pytest.mark.skipif(cpu_contexts() < 2, reason="one core: an ensemble on one context keeps one engine worker")
def test_ensemble_bench_times_every_spec_and_layout_against_k_times_one(tmp_path, capsys, monkeypatch):
    """Each row as the trainer runs it: auto on one CPU context side by side on two engine
    workers (a child bench), against K=1 on one; every other row in this process, on one."""
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "cpu*2", "--ensemble", "2", "3", "--ensemble-layout", "auto", "fused",
                       "--epochs", "2", "--limit", "512", "--val-limit", "500", "--out", out, "--quiet"]) == 0
    assert "cpu K=3 separate (auto) [2 workers]" in capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        rows = json.load(f)["ensembles"]
    assert [(r["spec"], r["layout"], r["members"], r["engine_threads"]) for r in rows] == [
        ("cpu", "-", 1, 1), ("cpu", "separate", 2, 2), ("cpu", "separate", 3, 2), ("cpu", "fused", 2, 1),
        ("cpu", "fused", 3, 1), ("cpu*2", "devices", 2, 1), ("cpu*2", "devices", 3, 1), ("cpu*2", "fused", 2, 1),
        ("cpu*2", "fused", 3, 1)]
    assert [r["auto"] for r in rows[1:]] == [True, True, False, False, True, True, False, False]
    assert rows[0]["speedup_vs_one_by_one"] == 1.0
    for r in rows:
        assert r["member_samples_per_s"] == pytest.approx(512 * r["members"] / r["median_epoch_s"])
        assert r["speedup_vs_one_by_one"] == pytest.approx(r["one_by_one_epoch_s"] / r["median_epoch_s"])
        assert r["one_epoch_s"] > 0 and r["one_by_one_epoch_s"] == pytest.approx(r["members"] * r["one_epoch_s"])
    with open(os.path.join(out, "ensemble.png"), "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_sweep_bench_times_each_configuration_alone_then_the_sweep_in_one_invocation(tmp_path, capsys):
    """bench --sweep: each of the K configurations alone on the first context, then the
    sweep as one job on each spec, against the sum of the K epochs."""
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu*2", "--sweep", "lr=0.05,0.2 wd=0,1e-4", "--epochs", "2", "--limit", "512",
                       "--val-limit", "500", "--out", out, "--quiet"]) == 0
    assert "cpu*2 sweep of 4 (devices)" in capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    rows = report["sweep"]
    assert [r["name"] for r in rows] == ["cpu lr=0.05 wd=0", "cpu lr=0.05 wd=0.0001", "cpu lr=0.2 wd=0",
                                         "cpu lr=0.2 wd=0.0001", "cpu*2 sweep of 4 (devices)"]
    alone = sum(r["median_epoch_s"] for r in rows[:4])
    assert report["one_after_another_epoch_s"] == pytest.approx(alone)
    assert rows[4]["vs_one_after_another"] == pytest.approx(alone / rows[4]["median_epoch_s"])
    assert rows[4]["member_samples_per_s"] == pytest.approx(4 * 512 / rows[4]["median_epoch_s"])
    with open(os.path.join(out, "sweep.png"), "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_an_ensemble_bench_of_two_engine_worker_counts_times_k1_on_one_worker(tmp_path, capsys):
    """--engine-threads 1 2: each count in a child ensemble bench. With two workers, auto
    runs the members side by side on one context, and its K=1 is timed by a grandchild
    bench on one worker, as the trainer runs a single network."""
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "--ensemble", "2", "--engine-threads", "1", "2", "--epochs", "2",
                       "--limit", "512", "--val-limit", "500", "--out", out, "--quiet"]) == 0
    table = capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        rows = json.load(f)["ensembles"]
    assert [(r["name"], r["layout"]) for r in rows] == [
        ("cpu K=1 w1", "-"), ("cpu K=2 sequential (auto) w1", "sequential"),
        ("cpu K=1 (1 engine worker) w2", "-"), ("cpu K=2 separate (auto) w2", "separate")]
    assert "cpu K=2 separate (auto) w2" in table
    for r in rows:
        assert r["speedup_vs_one_by_one"] == pytest.approx(r["one_by_one_epoch_s"] / r["median_epoch_s"])
    for workers in (1, 2):  # each child's own report, with its own engine
        with open(os.path.join(out, f"float32-ompdefault-w{workers}", "bench.json")) as f:
            assert json.load(f)["machine"]["threads"]["engine_threads"] == workers
    with open(os.path.join(out, "ensemble.png"), "rb") as f:
        assert f.read(4) == b"\x89PNG"


@pytest.mark.parametrize("flags,message", [
    (["--ensemble", "2", "--ensemble-layout", "fused", "--model", "resnet50_v1b_gn"], "its layer bn1 (GroupNorm)"),
    (["--workers", "2", "--omp-threads", "1", "2"], "time --workers once per value"),
    (["--workers", "2", "--engine-threads", "1", "2"], "time --workers once per value"),
])
def test_bench_modes_refuse_what_they_cannot_time(tmp_path, capsys, flags, message):
    assert bench.main(["--devices", "cpu", "--out", str(tmp_path / "b"), "--quiet"] + flags) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_workers_bench_times_real_jobs(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "bench")
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert bench.main(["--devices", "cpu", "--workers", "2", "--epochs", "2", "--limit", "1024", "--val-limit", "500",
                       "--batch-size", "128", "--out", out, "--quiet"]) == 0
    assert "time vs 1 process" in capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        rows = json.load(f)["workers"]
    assert [r["workers"] for r in rows] == [0, 2]
    assert rows[0]["overhead_ratio"] == 1.0
    assert rows[1]["overhead_ratio"] == pytest.approx(rows[1]["median_epoch_s"] / rows[0]["median_epoch_s"])
    assert rows[1]["val_acc"] > 0.1
    assert bench.main(["--devices", "cpu", "--workers", "1", "--epochs", "1", "--limit", "256",
                       "--batch-size", "128", "--out", out, "--quiet"]) == 0  # the same --out again


@needs_bf16
def test_bench_runs_each_dtype_and_thread_count_in_its_own_process(tmp_path, capsys):
    """contrib.amp and OMP_NUM_THREADS hold for a whole process: every combination is a
    child bench, the rows come back tagged and compared across the children."""
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "--dtype", "float32", "bfloat16", "--omp-threads", "1", "2",
                       "--epochs", "2", "--limit", "512", "--val-limit", "500", "--loader-workers", "0", "--out", out,
                       "--quiet"]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    rows = report["results"]
    assert [(r["dtype"], r["omp_threads"]) for r in rows] == [("float32", 1), ("float32", 2),
                                                              ("bfloat16", 1), ("bfloat16", 2)]
    for r in rows:
        assert r["vs_first"] == pytest.approx(rows[0]["median_epoch_s"] / r["median_epoch_s"])
        assert r["vs_tutorial"] == pytest.approx(report["tutorial"]["median_epoch_s"] / r["median_epoch_s"])
        assert len(r["runs"][0]["loss"]) == 2 and r["runs"][0]["loss"][1] < r["runs"][0]["loss"][0]
    for dtype in ("float32", "bfloat16"):  # each child's own report, with its own thread setting
        with open(os.path.join(out, f"{dtype}-omp2", "bench.json")) as f:
            child = json.load(f)
        assert child["machine"]["threads"]["omp_threads"] == 2 and child["config"]["dtype"] == [dtype]
    assert "cpu bfloat16 t2" in printed and "baseline loop" in printed
    with open(os.path.join(out, "variants.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bench_of_a_zoo_model_times_gluoncv_s_loop_as_the_baseline(tmp_path, monkeypatch):
    from gluon_gpu.programs import tutorial_loop
    built = []
    real = tutorial_loop.run
    monkeypatch.setattr(tutorial_loop, "run", lambda *a, **k: built.append(k["model"]) or real(*a, **k))
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "--model", "cifar_resnet20_v1", "--epochs", "2", "--limit", "256",
                       "--val-limit", "500", "--batch-size", "128", "--loader-workers", "0", "--out", out, "--quiet"]) == 0
    with open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    assert built == ["cifar_resnet20_v1"] and report["tutorial"]["samples_per_s"] > 0
    assert report["results"][0]["vs_tutorial"] == pytest.approx(
        report["tutorial"]["median_epoch_s"] / report["results"][0]["median_epoch_s"])


def test_bench_compares_augmentation_settings_on_the_same_spec(tmp_path, capsys):
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu*2", "--augment", "none", "basic", "--epochs", "2", "--limit", "1024",
                       "--baseline", "none", "--out", out, "--quiet"]) == 0
    printed = capsys.readouterr().out
    report = json.load(open(os.path.join(out, "bench.json")))
    plain, augmented = report["results"]
    assert (plain["name"], augmented["name"]) == ("cpu*2 none", "cpu*2 basic")
    assert augmented["augment_cost"] == pytest.approx(augmented["median_epoch_s"] / plain["median_epoch_s"] - 1)
    assert f"cpu*2 basic {augmented['augment_cost']:+.1%}" in printed


def test_time_to_accuracy_against_the_baseline_loop_with_the_same_recipe(tmp_path, capsys):
    out = str(tmp_path / "bench")
    assert bench.main(["--to-accuracy", "0.6", "--recipe", "lenet", "--devices", "cpu*2", "--limit", "2560",
                       "--val-limit", "500", "--loader-workers", "0", "--out", out, "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "time to val-acc 0.6 on cpu*2: lenet, recipe lenet" in printed
    report = json.load(open(os.path.join(out, "accuracy.json")))
    ours, theirs = report["results"]
    assert report["config"]["lr"] == 0.2 and report["config"]["lr_mode"] == "cosine"  # the recipe, for both
    for r in (ours, theirs):
        seconds, accuracy = zip(*r["curve"])
        assert list(seconds) == sorted(seconds) and accuracy[-1] >= 0.6 and all(a < 0.6 for a in accuracy[:-1])
        assert r["seconds_to_target"] == seconds[-1] and r["epochs_to_target"] == len(seconds)
    assert ours["speedup"] == pytest.approx(theirs["seconds_to_target"] / ours["seconds_to_target"])
    assert os.path.getsize(os.path.join(out, "accuracy.png")) > 0


def test_time_to_accuracy_takes_the_flags_typed_beside_the_recipe():
    """`--epochs 4` beside `--recipe resnet20` ran "at most 60 epochs": the recipe filled
    every flag. Now the typed ones stay, as in train; the rest are the recipe's."""
    parser = bench.build_parser()
    flags = parser.parse(["--to-accuracy", "0.85", "--recipe", "resnet20", "--epochs", "4", "--lr", "0.05",
                          "--devices", "cpu*2"])
    config = bench_accuracy.bench_config(flags.values, flags.typed)
    assert (config.epochs, config.lr, config.model, config.ema) == (4, 0.05, "cifar_resnet20_v1", 0.999)
    config = bench_accuracy.bench_config(parser.parse(["--to-accuracy", "0.94", "--recipe", "fast94", "--devices",
                                                       "cpu"]).values)
    assert config.epochs == RECIPES["fast94"].flags["epochs"] and config.tta == "flip"
    assert config.dtype == ("bfloat16" if cpu_flags() & BF16_CPU_FLAGS else "float32")  # the CPU's fastest


def test_the_baseline_loop_refuses_test_time_augmentation_in_one_line(capsys, tmp_path):
    assert bench.main(["--to-accuracy", "0.94", "--recipe", "fast94", "--limit", "256", "--val-limit", "100",
                       "--dtype", "float32", "--devices", "cpu", "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gluon_gpu.bench: error: the baseline loop trains without --mixup, --cutmix, --ema and --tta; leave them out "
        "of the recipe to compare time to accuracy, or leave the baseline out (--baseline none)")


def test_the_baseline_loop_augments_as_gluoncv_and_refuses_what_it_cannot():
    from mxnet import nd
    from gluon_gpu.core.platform.errors import UserError
    from gluon_gpu.data.augment import parse_augment
    from gluon_gpu.programs.tutorial_loop import host_transforms
    image = nd.array(mx.nd.arange(28 * 28).reshape(28, 28, 1), dtype="uint8")
    before, after = host_transforms(parse_augment("flip,crop=4,rotate=10"), (28, 28))
    for transform in before:
        assert transform(image).shape == (28, 28, 1)
    assert after[0](nd.zeros((1, 28, 28))).shape == (1, 28, 28) and len(before) == 2
    with pytest.raises(UserError, match="no host transform for `augment` erase"):
        host_transforms(parse_augment("erase"), (28, 28))


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory, small_fashion):
    return trained_run(tmp_path_factory, ["--data-dir", small_fashion, "--devices", "cpu", "--epochs", "1",
                                          "--batch-size", "64", "--val-limit", "256", "--quiet"], "lenet")


def test_inference_bench_times_every_engine_in_one_invocation(lenet_run, small_fashion, tmp_path, capsys):
    out = str(tmp_path / "b")
    assert bench.main(["--inference", lenet_run, "--data-dir", small_fashion, "--val-limit", "512", "--repeats", "2",
                       "--out", out]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "bench.json")) as f:
        rows = json.load(f)["inference"]
    keys = [r["key"] for r in rows]
    assert keys == ["graph", "fused", "int8"] + ["bfloat16"] * bool(cpu_flags() & BF16_CPU_FLAGS) + ["onnxruntime"]
    for r in rows:
        assert r["samples"] == 512 and len(r["seconds"]) == 2 and r["name"] in printed
        assert r["vs_graph"] == pytest.approx(r["samples_per_s"] / rows[0]["samples_per_s"]) and r["cpu_share"] > 0
        assert r["omp_threads"] == (usable_cpus() if r["key"] != "graph" else thread_settings()["omp_threads"])
    acc = {r["key"]: r["acc"] for r in rows}
    assert acc["graph"] == acc["fused"] == acc["onnxruntime"] > 0.5 and abs(acc["int8"] - acc["graph"]) < 0.02
    with open(os.path.join(out, "inference.png"), "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_inference_bench_refuses_what_it_cannot_time(lenet_run, tmp_path, capsys):
    out = str(tmp_path / "b")
    assert bench.main(["--inference", lenet_run, "--ensemble", "2", "--out", out]) == 2
    assert capsys.readouterr().err.strip() == ("gluon_gpu.bench: error: --inference times a trained network's "
                                               "inference; --ensemble times training: one at a time")
    assert bench.main(["--inference", lenet_run, "--torch-python", "/no/such/python", "--engines", "pytorch",
                       "--out", out]) == 2
    assert capsys.readouterr().err.strip() == ("gluon_gpu.bench: error: --torch-python /no/such/python: "
                                               "No such file or directory")


@pytest.mark.skipif(not os.environ.get("GLUON_GPU_TORCH_PYTHON"),
                    reason="GLUON_GPU_TORCH_PYTHON names no interpreter with PyTorch (gluoncv refuses PyTorch 2 "
                           "beside it, so it cannot be this one)")
def test_pytorch_runs_the_same_lenet_with_the_same_weights(lenet_run, small_fashion, tmp_path, capsys):
    out = str(tmp_path / "b")
    assert bench.main(["--inference", lenet_run, "--data-dir", small_fashion, "--val-limit", "512", "--engines",
                       "graph,pytorch", "--torch-python", os.environ["GLUON_GPU_TORCH_PYTHON"], "--out", out]) == 0
    with open(os.path.join(out, "rows.json")) as f:
        rows = {r["key"]: r for r in json.load(f)}
    assert rows["pytorch"]["acc"] == rows["graph"]["acc"] and rows["pytorch"]["samples"] == 512


@pytest.mark.parametrize("flags", [{"lr_mode": "cosine", "warmup_epochs": 2}, {"lr_mode": "cosine"},
                                   {"lr_mode": "step", "lr_decay_epoch": "3,5", "warmup_epochs": 1, "warmup_lr": 0.01},
                                   {}])
def test_the_pytorch_rows_follow_the_runs_schedule_update_by_update(flags):
    """torch_train.py runs in PyTorch's interpreter, without gluoncv: its rate equals
    gluoncv's LRSequential as run.lr_scheduler builds it, at every update."""
    config = RunConfig(epochs=6, lr=0.1, **flags)
    theirs = lr_scheduler(config, 10)
    for update in range(1, 70):
        expected = theirs(update) if theirs else config.lr
        assert torch_train.learning_rate(config.to_dict(), update, 10) == pytest.approx(expected, abs=1e-12), update


def test_the_pytorch_rows_train_what_the_run_trains_or_say_what_they_cannot():
    assert (torch_train.ERASE_AREA, torch_train.ERASE_ASPECT) == (augment.ERASE_AREA, augment.ERASE_ASPECT)
    for preset, spelled in augment.PRESETS.items():  # the same defaults and presets as gluon_gpu's augment.py
        assert torch_train.parse_augment(preset) == augment.parse_augment(spelled)
    config = apply_recipe(RunConfig(recipe="fast94"), given=set()).to_dict()
    assert torch_train.refused(config) == ""
    assert torch_train.refused(apply_recipe(RunConfig(recipe="resnet20"), given=set()).to_dict()).startswith("ema")
    assert torch_train.refused({**config, "ema": 0, "tta": "flip,shift=1"}) == ""  # no average; views it takes
    assert torch_train.refused({**config, "model": "lenet"}) == ""
    for change, why in (({"model": "mlp"}, "model mlp"), ({"mixup": 0.2}, "mixup 0.2"), ({"ema": 0.99}, "ema"),
                        ({"augment": "flip,jitter"}, "augment jitter"), ({"lr_mode": "poly"}, "lr_mode poly")):
        assert torch_train.refused({**config, **change}).startswith(why)


@pytest.mark.skipif(not os.environ.get("GLUON_GPU_TORCH_PYTHON"),
                    reason="GLUON_GPU_TORCH_PYTHON names no interpreter with PyTorch")
def test_the_scaling_table_times_pytorch_eager_training_the_same_lenet(small_fashion, tmp_path, capsys):
    out = str(tmp_path / "bench")
    assert bench.main(["--devices", "cpu", "--epochs", "3", "--data-dir", small_fashion, "--limit", "4096",
                       "--baseline", "none", "--torch-python", os.environ["GLUON_GPU_TORCH_PYTHON"], "--out", out,
                       "--quiet"]) == 0
    printed = capsys.readouterr().out
    report = json.load(open(os.path.join(out, "bench.json")))
    pytorch, ours = report["pytorch"], report["results"][0]
    assert len(pytorch["runs"][0]["seconds"]) == 3 and pytorch["threads"] >= 1 and "PyTorch (cpu)" in printed
    assert ours["vs_pytorch"] == pytest.approx(pytorch["median_epoch_s"] / ours["median_epoch_s"])
    net = get_model("lenet")
    net.initialize()
    net(mx.nd.zeros((1, 1, 28, 28)))
    assert pytorch["parameters"] == sum(p.data().size for p in net.collect_params().values())  # the same network
    assert pytorch["val_acc"] > 0.3 and ours["val_acc"] > 0.3  # both learned (chance: 0.1)


@pytest.mark.skipif(not os.environ.get("GLUON_GPU_TORCH_PYTHON"),
                    reason="GLUON_GPU_TORCH_PYTHON names no interpreter with PyTorch")
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (1, 20, 24)])
def test_pytorchs_lenet_is_ours_for_any_image_size(shape):
    """Its first dense layer's inputs follow the image, as Gluon infers ours."""
    import subprocess
    probe = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import torch_train; "
             "net = torch_train.build(torch, torch.nn, 'lenet', tuple(map(int, sys.argv[2:])), 10); "
             "print(tuple(net(torch.zeros(2, *map(int, sys.argv[2:]))).shape), sum(p.numel() for p in net.parameters()))")
    done = subprocess.run([os.environ["GLUON_GPU_TORCH_PYTHON"], "-c", probe, os.path.dirname(torch_train.__file__),
                           *map(str, shape)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    net = get_model("lenet", 10, shape[0])
    net.initialize()
    net(mx.nd.zeros((1,) + shape))
    assert done.stdout.split() == ["(2,", "10)", str(sum(p.data().size for p in net.collect_params().values()))]


def test_pytorch_rows_only_where_pytorch_has_rows(tmp_path, capsys):
    for flags, where in ((["--ensemble", "2"], "--ensemble"), (["--workers", "2"], "--workers"),
                         (["--dtype", "float32", "bfloat16"], "several --dtype")):
        assert bench.main(["--devices", "cpu", "--torch-python", sys.executable, "--out", str(tmp_path / "b"),
                           *flags]) == 2
        assert capsys.readouterr().err.strip().startswith("gluon_gpu.bench: error: --torch-python: PyTorch has rows "
                                                           f"in the scaling table, --inference and --to-accuracy, "
                                                           f"not with {where}")
    assert bench.main(["--devices", "cpu", "--torch-python", sys.executable, "--model", "mlp", "--limit", "256",
                       "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == ("gluon_gpu.bench: error: --torch-python: the PyTorch row cannot train "
                                               "this: model mlp: the PyTorch rows train lenet, cifar_resnet20_v1, "
                                               "cifar_resnet56_v1, cifar_resnet110_v1")


@pytest.mark.skipif(not os.environ.get("GLUON_GPU_TORCH_PYTHON"),
                    reason="GLUON_GPU_TORCH_PYTHON names no interpreter with PyTorch")
def test_time_to_accuracy_against_pytorch_float32_and_bfloat16_autocast(tmp_path):
    out = str(tmp_path / "bench")
    assert bench.main(["--to-accuracy", "0.5", "--model", "cifar_resnet20_v1", "--epochs", "4", "--lr", "0.1",
                       "--batch-size", "128", "--devices", "cpu*2", "--limit", "2048", "--val-limit", "500",
                       "--baseline", "none", "--torch-python", os.environ["GLUON_GPU_TORCH_PYTHON"], "--out", out,
                       "--quiet"]) == 0
    report = json.load(open(os.path.join(out, "accuracy.json")))
    best = "bfloat16 autocast" if precision.cpu_flags() & precision.BF16_CPU_FLAGS else "float32"
    assert [r["name"] for r in report["results"]] == ["gluon_gpu float32", "PyTorch float32"] + [
        "PyTorch bfloat16 autocast"] * (best != "float32") + [f"PyTorch standard recipe, {best}"]
    assert report["results"][-1]["epochs"] <= bench_accuracy.STANDARD["epochs"]
    for r in report["results"]:
        seconds, accuracy = zip(*r["curve"])
        assert list(seconds) == sorted(seconds) and max(accuracy) > 0.2  # each learned
        if r["seconds_to_target"] and report["results"][0]["seconds_to_target"] and r is not report["results"][0]:
            assert r["ours_sooner"] == pytest.approx(r["seconds_to_target"] / report["results"][0]["seconds_to_target"])
