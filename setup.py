"""gluon_gpu: multi-device data-parallel training on Apache MXNet Gluon."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "gluon_gpu" / "core" / "version.py").read_text()).group(1)

setup(
    name="gluon_gpu",
    version=VERSION,
    description="Multi-GPU data-parallel training on Apache MXNet Gluon, with honest timings",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["gluon_gpu", "gluon_gpu.*"]),
    # the fused conv operator's C++ source, compiled on first use (gluon_gpu/fused_conv.py);
    # what scripts/bfloat16_page.py measured, which a bfloat16 run's plan line cites
    package_data={"gluon_gpu.models": ["kernels/*.cc"], "gluon_gpu.core": ["bfloat16_measured.json"]},
    # numpy 1.23.5 (required by mxnet 1.9.1, see requirements.txt) has no wheels past 3.11.
    python_requires=">=3.8,<3.12",
    # Ranges here, exact pins in requirements.txt. mxnet is not listed: the CPU wheel
    # (mxnet) and the GPU wheels (mxnet-cu117, mxnet-cu112) are different distributions
    # of the same package, and listing one would make pip install it over the other.
    install_requires=["numpy<1.24", "gluoncv==0.10.5.post0", "opencv-python<4.12",
                      "tqdm", "matplotlib", "Pillow", "tensorboardX", "onnx==1.15.*", "onnxruntime==1.18.*"],
    extras_require={"test": ["pytest", "hypothesis"]},
    entry_points={"console_scripts": [
        "gluon-gpu-train=gluon_gpu.train:main",
        "gluon-gpu-evaluate=gluon_gpu.evaluate:main",
        "gluon-gpu-predict=gluon_gpu.predict:main",
        "gluon-gpu-bench=gluon_gpu.bench:main",
        "gluon-gpu-launch=gluon_gpu.launch:main",
        "gluon-gpu-pack=gluon_gpu.pack:main",
        "gluon-gpu-export=gluon_gpu.export:main",
    ]},
)
