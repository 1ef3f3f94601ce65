"""Bad input, tried for real: each case is one clear stderr line and exit status 2,
never a traceback, and never a change to an existing run directory."""
import gzip
import hashlib
import os
import struct

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from gluon_gpu.programs import evaluate, predict, train
from gluon_gpu.data.fashion_mnist import DEBIAN_DIR, FILES
from gluon_gpu.models import get_model

from conftest import trained_run
from failure_table import table_exit

TEST_IMAGES = os.path.join(DEBIAN_DIR, "t10k-images-idx3-ubyte.gz")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return trained_run(tmp_path_factory, ["--devices", "cpu", "--epochs", "2", "--limit", "2560", "--quiet"])


def snapshot(directory):
    digests = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return digests


def make_case(kind, tmp, good_params):
    """Return (command module, argv) for one kind of bad input."""
    p = str(tmp / kind)
    raw = open(good_params, "rb").read()
    if kind == "params-truncated":
        open(p, "wb").write(raw[: len(raw) * 2 // 3])
        return predict, ["--params", p, "--idx", TEST_IMAGES]
    if kind == "params-random-bytes":
        open(p, "wb").write(np.random.default_rng(1).bytes(len(raw)))
        return evaluate, ["--params", p]
    if kind == "params-missing":
        return evaluate, ["--params", p]
    if kind == "params-of-another-model":
        net = get_model("cifar_resnet20_v1")
        net.initialize()
        net(mx.nd.zeros((1, 1, 28, 28)))
        net.save_parameters(p)
        return predict, ["--params", p, "--model", "lenet", "--idx", TEST_IMAGES]
    if kind == "params-as-another-model":
        return evaluate, ["--params", good_params, "--model", "cifar_resnet20_v1"]
    if kind == "image-not-an-image":
        open(p, "w").write("just text\n")
        return predict, ["--params", good_params, p]
    if kind == "image-empty-file":
        open(p, "wb").close()
        return predict, ["--params", good_params, p]
    if kind == "image-1x1":
        Image.new("L", (1, 1)).save(p + ".png")
        return predict, ["--params", good_params, p + ".png"]
    if kind == "image-truncated-png":
        Image.fromarray(np.zeros((64, 64), np.uint8) + 200).save(p + ".png")
        data = open(p + ".png", "rb").read()
        open(p + ".png", "wb").write(data[: len(data) // 2])
        return predict, ["--params", good_params, p + ".png"]
    if kind == "image-missing":
        return predict, ["--params", good_params, p + ".png"]
    if kind in ("idx-wrong-magic", "idx-wrong-count"):
        images = np.zeros((3, 28, 28), np.uint8)
        magic, count = (0x0801, 3) if kind == "idx-wrong-magic" else (0x0803, 4)
        with gzip.open(p + ".gz", "wb") as f:
            f.write(struct.pack(">IIII", magic, count, 28, 28) + images.tobytes())
        return predict, ["--params", good_params, "--idx", p + ".gz"]
    if kind == "idx-index-out-of-range":
        return predict, ["--params", good_params, "--idx", TEST_IMAGES, "--index", "10000:10005"]
    if kind == "data-dir-corrupt-idx":
        os.makedirs(p)
        for name in FILES["train"]:
            with gzip.open(os.path.join(p, name + ".gz"), "wb") as f:
                f.write(b"\x00\x00\x08\x03garbage")
        return train, ["--data-dir", p, "--devices", "cpu", "--out", str(tmp / "out-corrupt")]
    if kind == "out-unwritable":
        open(p, "w").write("a file, not a directory")
        return train, ["--out", os.path.join(p, "run"), "--devices", "cpu", "--limit", "64"]
    raise AssertionError(kind)


CASES = {
    "params-truncated": "Invalid NDArray file format",
    "params-random-bytes": "Invalid NDArray file format",
    "params-missing": "does not exist",
    "params-of-another-model": "it lacks 0.bias",
    "params-as-another-model": "cannot load",
    "image-not-an-image": "not an image Pillow can read",
    "image-empty-file": "not an image Pillow can read",
    "image-1x1": "image is 1x1",
    "image-truncated-png": "image-truncated-png.png:",
    "image-missing": "no such file",
    "idx-wrong-magic": "magic",
    "idx-wrong-count": "truncated or corrupt",
    "idx-index-out-of-range": "selects nothing",
    "data-dir-corrupt-idx": "not an IDX file",
    "out-unwritable": "cannot write to run directory",
}


@pytest.fixture(autouse=True)
def _gluoncv_imported():
    """gluoncv flips Pillow's LOAD_TRUNCATED_IMAGES on import; the cases must hold anyway."""
    import gluoncv.data  # noqa: F401


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(kind, run_dir, tmp_path, capsys):
    before = snapshot(run_dir)
    module, argv = make_case(kind, tmp_path, os.path.join(run_dir, "net.params"))
    assert module.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert CASES[kind] in err and "Traceback" not in err, err
    assert err.startswith(module.__name__.replace(".programs", "") + ": error: ")
    assert snapshot(run_dir) == before


def test_commands_aimed_at_an_existing_run_leave_it_intact(run_dir, capsys):
    before = snapshot(run_dir)
    for argv in (["--out", run_dir, "--devices", "cpu"],
                 ["--resume", run_dir, "--model", "cifar_resnet20_v1"],
                 ["--resume", run_dir, "--devices", "gpu"],
                 ["--resume", run_dir, "--batch-size", "7"],
                 ["--out", run_dir, "--dry-run"]):
        assert train.main(argv) == 2, argv
    assert snapshot(run_dir) == before
    capsys.readouterr()


def test_prediction_works_and_json_is_machine_readable(run_dir, tmp_path, capsys):
    import json
    img = tmp_path / "bag.png"
    Image.fromarray(np.full((40, 30), 128, np.uint8)).convert("RGB").save(img)
    assert predict.main(["--params", os.path.join(run_dir, "net.params"), "--json", str(img),
                         str(img)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["input"] for r in out] == [str(img)] * 2
    assert abs(sum(out[0]["probabilities"]) - 1) < 1e-4
    assert out[0]["probabilities"] == out[1]["probabilities"]


def test_idx_prediction_matches_validation_accuracy(run_dir, capsys):
    """Predicting the whole test set gives the accuracy training measured: the CLI's
    preprocessing is exactly training's."""
    from gluon_gpu.data.fashion_mnist import CLASSES, load_split
    from conftest import read_metrics
    assert predict.main(["--params", os.path.join(run_dir, "net.params"), "--idx", TEST_IMAGES,
                         "--index", ":", "--devices", "cpu*2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 10000
    _, labels = load_split("test", DEBIAN_DIR)
    predicted = [CLASSES.index(l.split(": ", 1)[1].rsplit(" (", 1)[0]) for l in lines]
    accuracy = np.mean(np.array(predicted) == labels)
    assert accuracy == pytest.approx(read_metrics(run_dir)["epochs"][-1]["val_acc"], abs=1e-4)
    assert accuracy > 0.3  # chance is 0.1


def test_dry_run_checks_everything_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    assert train.main(["--dry-run", "--devices", "cpu*2", "--out", str(out)]) == 0
    plan, memory = capsys.readouterr().out.strip().splitlines()
    assert "lenet (fused conv+relu+pool) on cpu(0), cpu(1)" in plan
    assert memory.startswith("memory: about ") and "of the host's" in memory, memory  # what the checks added up
    assert "--pipeline device: a copy of 60000 samples on each of 2 devices" in memory, memory
    assert not out.exists()


# -- fuzzed flags ----------------------------------------------------------------------
values = st.one_of(st.integers(-3, 5).map(str), st.floats(allow_nan=True, allow_infinity=True).map(str),
                   st.sampled_from(["", "abc", "cpu", "gpu", "cpu*2", "gpu:0", "cpu*0", "1e9", "-0",
                                    "nan", "0x10", "1,2", "3:", "cpu*99999"]),
                   st.text(max_size=6))
flags = st.sampled_from(["--epochs", "--lr", "--batch-size", "--devices", "--momentum", "--wd",
                         "--limit", "--optimizer", "--lr-mode", "--lr-decay-epoch", "--log-interval",
                         "--kvstore", "--dtype", "--seed", "--model", "--keep", "--save-period"])


# Derandomized, so CI runs the same examples every time; FUZZ_EXAMPLES=2000 digs deeper.
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(flags, values), min_size=1, max_size=3))
def test_fuzzed_train_flags_never_crash(tmp_path, capsys, pairs):
    argv = ["--dry-run", "--out", str(tmp_path / "fuzz"), "--devices", "cpu"]
    for flag, value in pairs:
        argv += [flag, value]
    code = train.main(argv)
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), (argv, err)
    assert "Traceback" not in err
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("gluon_gpu.train: error: "), err


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=8), st.from_regex(r"-?\d{0,6}:-?\d{0,6}", fullmatch=True)))
def test_fuzzed_predict_index_never_crashes(run_dir, capsys, index):
    code = predict.main(["--params", os.path.join(run_dir, "net.params"), "--idx", TEST_IMAGES,
                         "--index", index, "--json"])
    captured = capsys.readouterr()
    assert code in (0, 2)
    assert "Traceback" not in captured.err
    if code == 2:
        assert len(captured.err.strip().splitlines()) == 1


def png_header(width, height):
    """A PNG that declares ``width`` x ``height`` (8-bit grayscale) and holds one empty
    row: what a decompression bomb looks like to a reader of headers."""
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1)))
            + chunk(b"IEND", b""))


def test_predict_refuses_a_decompression_bomb_from_its_header(run_dir, tmp_path, capsys):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_header(20000, 20000))  # 400M pixels, 0.1 KB on disk
    assert table_exit("an image over 40M", predict.main(["--params", os.path.join(run_dir, "net.params"), str(bomb)]))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "400000000 pixels" in err and "over the 40M pixels" in err, err


# -- environment variables MXNet reads at start-up -----------------------------------------
@pytest.mark.parametrize("variable, value", [
    ("OMP_NUM_THREADS", "abc"),  # MXNet 1.9: abort (uncaught dmlc::ParamError)
    ("OMP_NUM_THREADS", "100000"),  # a segfault when libgomp cannot make the threads
    ("OMP_NUM_THREADS", "2,1"),  # an OpenMP list: MXNet aborts
    ("MXNET_CPU_WORKER_NTHREADS", "0"),  # hangs forever
    ("MXNET_CPU_WORKER_NTHREADS", "-2"),
    ("MXNET_ENGINE_TYPE", "Bogus"),  # a traceback from the engine
    ("MXNET_CPU_TEMP_COPY", "0"),  # SIGFPE at the first operator, nothing printed
    ("MXNET_CPU_TEMP_COPY", "abc"),  # MXNetError "Invalid Parameter format"
    ("MXNET_CPU_PARALLEL_RAND_COPY", "0"),  # SIGFPE
])
@pytest.mark.parametrize("program", ["train", "evaluate", "predict", "bench", "launch"])
def test_bad_environment_variables_are_one_line_before_mxnet_starts(variable, value, program):
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", f"gluon_gpu.{program}", "--help"], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": repo, variable: value})
    assert table_exit("a bad variable", done.returncode) and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gluon_gpu: error: {variable}={value!r}: must be"), lines


def test_every_whole_number_variable_is_checked_at_its_bounds():
    from gluon_gpu.core.platform import environment
    for name, (low, high, _) in environment.whole_numbers().items():
        for good in (low, high):
            assert environment.problem({name: str(good)}) is None, name
        for bad in ([str(low - 1)] if low > 0 else []) + [str(high + 1), "abc", "", "2,1", "1.5", "²", "٣", "1_0"]:
            found = environment.problem({name: bad})
            assert found.startswith(f"{name}={bad!r}: must be a whole number from {low} to {high}"), (name, bad)


def test_a_library_user_gets_the_same_reason_as_an_exception():
    from gluon_gpu.core.platform import environment
    assert environment.problem({"OMP_NUM_THREADS": "abc"}).startswith("OMP_NUM_THREADS='abc': must be a whole")
    assert environment.problem({"OMP_NUM_THREADS": "2", "MXNET_ENGINE_TYPE": "NaiveEngine"}) is None


IMPORT_PROBE = """
import os, sys
before = dict(os.environ)
import gluon_gpu
print("mxnet" in sys.modules, dict(os.environ) == before)
try:
    gluon_gpu.DataParallel
except gluon_gpu.core.platform.errors.UserError as e:
    print("UserError:", e)
"""


def test_importing_gluon_gpu_writes_no_variable_starts_no_mxnet_and_never_exits():
    """The API is imported on first use: a bad variable is then a UserError (never an
    exit); only choosing devices sets the CPU pools' sizes (test_devices)."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MXNET_CPU_TEMP", "MXNET_CPU_PARALLEL"))}
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE], cwd=repo, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": repo, "OMP_NUM_THREADS": "abc"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False True", "UserError: OMP_NUM_THREADS='abc': must be a whole number "
                                        f"from 1 to {16 * len(os.sched_getaffinity(0))} (16 per core)"]



# -- numeric flags at the bounds their consumers accept ------------------------------------
def _float_flags():
    from dataclasses import fields
    from gluon_gpu.programs import cli
    from gluon_gpu.programs.config import RunConfig, flag_name
    kinds = (cli.positive_float, cli.non_negative_float, cli.below_one)
    return [(flag_name(f.name), f.metadata["type"]) for f in fields(RunConfig) if f.metadata.get("type") in kinds]


def test_every_float_flag_stops_where_mxnet_s_float32_parameters_stop(capsys):
    """MXNet parses operator parameters (the optimizer's lr, wd, momentum, the clip norm)
    as float32: the largest float32 updates, 1e39 is an MXNetError; so the flags take the
    one and refuse the other (a momentum stops below 1)."""
    from gluon_gpu.programs import cli
    from gluon_gpu.programs.train import build_parser
    flags = _float_flags()
    assert {"--lr", "--wd", "--momentum", "--warmup-lr", "--clip-grad", "--lr-decay"} <= {f for f, _ in flags}
    opt = mx.optimizer.SGD(learning_rate=cli.FLOAT32_MAX, wd=cli.FLOAT32_MAX, momentum=0.99)
    weight = mx.nd.ones(3)
    opt.update(0, weight, mx.nd.ones(3), opt.create_state(0, weight))
    weight.wait_to_read()  # the consumer takes the largest float32
    with pytest.raises(mx.base.MXNetError):
        mx.optimizer.SGD(learning_rate=1e39).update(0, weight, mx.nd.ones(3), None)
    for flag, kind in flags:
        top = "0.999" if kind is cli.below_one else repr(cli.FLOAT32_MAX)
        assert getattr(build_parser().parse_args([flag, top]), flag[2:].replace("-", "_")) == float(top)
        for bad in ("1e39", "inf", "nan", "-1") + (("1", "5") if kind is cli.below_one else ()):
            with pytest.raises(SystemExit) as e:
                build_parser().parse_args([flag, bad])
            assert table_exit("an optimizer setting", e.value.code)
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith(f"gluon_gpu.train: error: argument {flag}: must be"), err


@pytest.mark.parametrize("command,message", [
    # a wait past 24.8 days was an OverflowError in the wait
    (["gluon_gpu.bench", "--workers", "1", "--timeout", "9999999"], "--timeout: must be from 0 to 604800 seconds"),
    (["gluon_gpu.launch", "--timeout", "9999999", "--", "true"], "--timeout: must be from 0 to 604800 seconds"),
    (["gluon_gpu.launch", "--grace", "9999999", "--", "true"], "--grace: must be from 0 to 604800 seconds"),
    # pack --processes 1000000 hung without a line, leaving its .partial files
    (["gluon_gpu.pack", "in", "out", "--processes", "1000000"], "--processes/--num-workers: must be from 0 to"),
    # beyond what the restarted children take back from GLUON_GPU_RESTART / GLUON_GPU_ELASTIC_TRAINING
    (["gluon_gpu.launch", "--max-restarts", "1000001", "--", "true"], "--max-restarts: must be from 0 to 1000000"),
    (["gluon_gpu.train", "--max-resets", "1000001"], "--max-resets: must be from 0 to 1000000")])
def test_a_count_or_a_deadline_has_the_ceiling_its_consumer_takes(command, message):
    """#62, class 'a count or value without a ceiling, or beyond what its consumer takes'."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_a_limit_beyond_the_data_is_said(capsys):
    """#62, class 'input silently dropped': --limit 100000 on 90 images trained on 90 without a word."""
    from gluon_gpu.programs import train
    assert train.main(["--limit", "100000", "--val-limit", "20000", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "gluon_gpu.train: warning: --limit 100000 is more than the 60000 training samples the data has: it uses " \
           "them all" in err
    assert "--val-limit 20000 is more than the 10000 validation samples" in err
