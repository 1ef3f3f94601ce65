"""Mixed precision: bfloat16 through contrib.amp on this CPU, the --amp code path (dynamic
loss scaling) run with the bfloat16 target, and the refusals. AMP is process-wide, so
every run that enables it is a process of its own."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, npx

from gluon_gpu import DataParallel
from gluon_gpu.core.step import precision
from gluon_gpu.core.step.precision import BFLOAT16_MEASURED, bfloat16_warning
from gluon_gpu.core.platform.errors import UserError
from gluon_gpu.programs import train
from gluon_gpu.programs.bench import program as bench

from conftest import needs_bf16, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_run(out, *flags):
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.train", "--quiet", "--out", str(out), *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def saved(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


@needs_bf16
def test_bfloat16_lenet_learns_like_float32_and_resumes_exactly(tmp_path):
    common = ["--devices", "cpu*2", "--limit", "4096", "--batch-size", "64", "--epochs", "2"]
    plan = train_run(tmp_path / "bf16", *common, "--dtype", "bfloat16")
    measured = precision.bfloat16_measured()  # this CPU class's figures (docs/bfloat16.md), if measured
    assert "in bfloat16 (contrib.amp) (" + ("not measured on a CPU with" if measured is None else "") in plan
    assert measured is None or precision.measured_words(measured) in plan
    train_run(tmp_path / "fp32", *common)
    bf16, fp32 = read_metrics(tmp_path / "bf16"), read_metrics(tmp_path / "fp32")
    acc = [m["epochs"][-1]["val_acc"] for m in (bf16, fp32)]
    assert acc[0] > 0.65 and abs(acc[0] - acc[1]) < 0.03, acc
    first = saved(tmp_path / "bf16" / "net.params")
    assert all(v.dtype == np.float32 for v in first.values())  # float32 master weights
    assert any(not np.array_equal(v, saved(tmp_path / "fp32" / "net.params")[k]) for k, v in first.items())
    train_run(tmp_path / "half", *common[:-1], "1", "--dtype", "bfloat16")
    train_run(tmp_path / "half", "--resume", str(tmp_path / "half"), "--epochs", "2")
    resumed = saved(tmp_path / "half" / "net.params")
    for k, v in first.items():
        np.testing.assert_array_equal(resumed[k], v, err_msg=k)


def test_the_bfloat16_warning_cites_the_ratio_measured_on_this_cpu_class(tmp_path):
    measured = tmp_path / "measured.json"
    row = {"cpu": "some CPU", "date": "2026-12-05", "version": "0.9.0", "amp": 0.89, "onednn": 2.04}
    measured.write_text(json.dumps({"model": "ResNet-20", "page": "docs/bfloat16.md",
                                    "classes": {"AVX-512 BF16 and AMX": row}}))
    amx = {"avx512_bf16", "amx_bf16", "amx_tile"}
    found = precision.bfloat16_measured(amx, str(measured))
    assert bfloat16_warning(found) == ("warning: slower than float32: ResNet-20 trained at 0.89x float32's "
                                       "samples/s through contrib.amp (measured 2026-12-05 on some CPU (AVX-512 BF16 "
                                       "and AMX), docs/bfloat16.md)")
    assert precision.bfloat16_measured({"avx512_bf16"}, str(measured)) is None  # another class: nothing
    row["amp"] = 1.4
    measured.write_text(json.dumps({"classes": {"AVX-512 BF16 and AMX": row}}))
    assert bfloat16_warning(precision.bfloat16_measured(amx, str(measured))) == ""  # faster: nothing to warn of
    assert precision.bfloat16_measured(amx, str(tmp_path / "none.json")) is None
    # #62: a table read back is checked in every field its readers take (a bad onednn broke the plan line)
    for damaged in ({**row, "onednn": "abc"}, {k: v for k, v in row.items() if k != "date"}, "not a row"):
        measured.write_text(json.dumps({"classes": {"AVX-512 BF16 and AMX": damaged}}))
        assert precision.bfloat16_measured(amx, str(measured)) is None
    measured.write_text('{"classes": {"AVX-512')  # cut short
    assert precision.bfloat16_measured(amx, str(measured)) is None
    with open(BFLOAT16_MEASURED) as f:  # the committed measurement is the page's, a row per class
        committed = json.load(f)
    assert committed["page"] == "docs/bfloat16.md"
    assert set(committed["classes"]) <= {"AVX-512 BF16", "AVX-512 BF16 and AMX"}


@needs_bf16
def test_the_amp_path_scales_the_loss_skips_overflows_and_checkpoints_the_scale():
    done = subprocess.run([sys.executable, os.path.join(REPO, "tests", "amp_probe.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "bfloat16" in found["output_dtype"]  # the network really computes in bfloat16
    assert found["initial_scale"] == 2.0 ** 16
    assert found["loss_last"] < 0.75 * found["loss_first"] and found["replicas_equal"]
    assert found["skipped_equal"] and found["scale_after_overflow"] == 2.0 ** 15
    assert found["restored_scale"] == 2.0 ** 15 and found["restored_unskipped"] == found["saved_unskipped"]
    assert "process-wide" in found["float32_after_amp"]


def test_bfloat16_on_a_cpu_without_the_instructions_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f"})
    for program, flags in ((train, ["--out", str(tmp_path / "r")]), (bench, ["--out", str(tmp_path / "b")])):
        code = program.main(["--devices", "cpu", "--limit", "256", "--quiet", "--dtype", "bfloat16", *flags])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "needs a CPU with AVX-512 BF16" in err, err


def test_amp_on_cpus_is_one_line_for_bench_too(tmp_path, capsys):
    assert bench.main(["--devices", "cpu", "--amp", "--out", str(tmp_path / "b"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--amp (float16 mixed precision) needs GPU devices" in err, err


def test_a_numpy_api_network_is_refused_rather_than_trained_in_float32(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512_bf16"})
    npx.set_np()
    try:
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(10))
        net.initialize()
        with pytest.raises(UserError, match="legacy-API"):
            DataParallel(net, [mx.cpu(0)], dtype="bfloat16")
    finally:
        npx.reset_np()
    assert precision._amp_state["target"] is None  # this process was left in float32
