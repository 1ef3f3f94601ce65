"""scripts/install_mxnet.sh picks the MXNet wheel from nvidia-smi's CUDA version."""
import os
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "install_mxnet.sh")


@pytest.mark.parametrize("cuda,wheel", [("12.2", "mxnet-cu117==1.9.1"), ("11.7", "mxnet-cu117==1.9.1"),
                                        ("11.4", "mxnet-cu112==1.9.1"), ("10.2", "mxnet==1.9.1"),
                                        (None, "mxnet==1.9.1")])
def test_wheel_choice(tmp_path, cuda, wheel):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if cuda:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho '| NVIDIA-SMI 535.1   Driver Version: 535.1   CUDA Version: {cuda}     |'\n")
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PIP": "echo pip"}
    proc = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"pip install {wheel} numpy==1.23.5"
