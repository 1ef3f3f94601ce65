"""An installed copy is the product: the sdist is built from the project's files, the
wheel from the sdist (as pip builds it from PyPI), and the wheel installed, not editable,
into a fresh virtualenv that sees the pinned dependencies but not the checkout. From a
folder of its own, with a PATH that holds only that virtualenv and the system's, every
console script answers --help and a short train -> evaluate -> predict -> export runs."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest
from conftest import needs_bf16
from pasted import SYSTEM_PATH

from gluon_gpu.models import amx_features

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tracked_files():
    """The project's files as git sees them (tracked, and new files not ignored)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if os.path.isfile(os.path.join(REPO, f))]


def console_scripts():
    """The console scripts pyproject.toml declares: ``{name: "module:function"}``."""
    import tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def run(command, cwd, env, timeout=600):
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, command))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(sdist, wheel)`` built from a copy of the project's files (the checkout gets no
    ``build/`` or ``*.egg-info``)."""
    work = tmp_path_factory.mktemp("built")
    source = work / "source"
    for name in tracked_files():
        os.makedirs(source / os.path.dirname(name), exist_ok=True)
        shutil.copy2(os.path.join(REPO, name), source / name)
    run([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(source)], cwd=work,
        env={**os.environ, "PYTHONPATH": ""})
    sdist, = (work / "dist").glob("*.tar.gz")
    wheel, = (work / "dist").glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory, built):
    """``(bin folder, environment, working folder)`` of a fresh virtualenv holding the
    wheel, whose only view of the pinned dependencies is a folder of links to them."""
    work = tmp_path_factory.mktemp("installed")
    deps = work / "deps"
    deps.mkdir()
    ours = ("gluon_gpu", "__editable__", "_gluon_gpu")
    for name in os.listdir(sysconfig.get_paths()["purelib"]):
        if not name.startswith(ours) and not name.endswith(".pth"):
            os.symlink(os.path.join(sysconfig.get_paths()["purelib"], name), deps / name)
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
    site = subprocess.run([str(work / "venv" / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "pinned_dependencies.pth"), "w") as f:
        f.write(str(deps) + "\n")
    env = {"PATH": f"{work / 'venv' / 'bin'}:{SYSTEM_PATH}", "HOME": os.environ.get("HOME", str(work)),
           "LANG": "C.UTF-8"}
    # --no-index: every dependency the wheel declares must be among the pinned ones already there
    run(["pip", "install", "--no-index", "--disable-pip-version-check", "--quiet", str(built[1])], cwd=work, env=env)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return work / "venv" / "bin", env, elsewhere


def test_the_wheel_and_the_sdist_hold_every_file_of_the_package(built):
    package = {f for f in tracked_files() if f.startswith("gluon_gpu/") and "__pycache__" not in f}
    sdist, wheel = built
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
    assert sorted(package - in_sdist) == [] and sorted(package - in_wheel) == []
    assert {"README.md", "requirements.txt", "pyproject.toml"} <= in_sdist


def test_every_program_of_the_installed_wheel_answers_help(installed):
    bin_dir, env, elsewhere = installed
    where = run(["python", "-c", "import gluon_gpu; print(gluon_gpu.__file__)"], cwd=elsewhere, env=env)
    assert where.stdout.startswith(str(bin_dir.parent)), where.stdout
    scripts = console_scripts()
    assert len(scripts) == 7, scripts
    for name, target in scripts.items():
        assert (bin_dir / name).exists(), name
        shown = run([name, "--help"], cwd=elsewhere, env=env)
        assert shown.stdout.startswith(f"usage: {name}"), (name, shown.stdout[:200])
        module = target.split(":")[0]
        run(["python", "-m", module, "--help"], cwd=elsewhere, env=env)


def test_the_installed_wheel_trains_evaluates_predicts_and_exports(installed, small_fashion):
    bin_dir, env, elsewhere = installed
    trained = run(["gluon-gpu-train", "--data-dir", small_fashion, "--devices", "cpu*2", "--batch-size", "64",
                   "--momentum", "0.9", "--epochs", "2", "--out", "runs/quick"], cwd=elsewhere, env=env)
    assert "fused conv+relu+pool" in trained.stdout, trained.stdout  # kernels/*.cc came with the wheel
    assert (elsewhere / "runs" / "quick" / "best.params").exists()
    evaluated = run(["gluon-gpu-evaluate", "--params", "runs/quick", "--data-dir", small_fashion], cwd=elsewhere,
                    env=env)
    accuracy = float(evaluated.stdout.split(" acc ")[1].split()[0])
    assert accuracy > 0.6, evaluated.stdout
    predicted = run(["gluon-gpu-predict", "--params", "runs/quick", "--idx",
                     os.path.join(small_fashion, "t10k-images-idx3-ubyte.gz"), "--index", "0:3"],
                    cwd=elsewhere, env=env)
    assert len(predicted.stdout.strip().splitlines()) == 3, predicted.stdout
    run(["gluon-gpu-export", "runs/quick", "--out", "served"], cwd=elsewhere, env=env)
    assert sorted(os.listdir(elsewhere / "served"))


@needs_bf16
def test_the_installed_wheel_plans_bfloat16_on_its_kernels(installed):
    bin_dir, env, elsewhere = installed
    planned = run(["gluon-gpu-train", "--dtype", "bfloat16", "--dry-run"], cwd=elsewhere, env=env)
    assert "bfloat16" in planned.stdout, planned.stdout  # core/bfloat16_measured.json came with it
    planned = run(["gluon-gpu-train", "--model", "cifar_resnet20_v1", "--dtype", "bfloat16", "--limit", "256",
                   "--dry-run"], cwd=elsewhere, env=env)  # the oneDNN 3 kernels compile from the installed source
    path = "oneDNN 3: " if amx_features.auto_kernels() == "onednn" else "contrib.amp"  # as the table of this class says
    assert f"in bfloat16 ({path}" in planned.stdout, planned.stdout + planned.stderr
