#!/usr/bin/env bash
# Install the MXNet 1.9.1 wheel that matches this machine: a CUDA build when nvidia-smi
# reports a driver for CUDA >= 11.7 (mxnet-cu117) or >= 11.2 (mxnet-cu112), else the CPU wheel.
# numpy is pinned in the same install: mxnet 1.9.1 fails to import with numpy >= 1.24.
# The CUDA wheels bundle neither cuDNN nor NCCL, and carry GPU code for compute
# capability <= 8.6 only (no Hopper): install cuDNN 8 / NCCL 2 from NVIDIA separately.
set -euo pipefail
PIP=${PIP:-python -m pip}
wheel=mxnet
if command -v nvidia-smi >/dev/null 2>&1; then
  cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n1)
  if [ -n "$cuda" ]; then
    read -r major minor <<<"$cuda"
    if [ "$major" -gt 11 ] || { [ "$major" -eq 11 ] && [ "$minor" -ge 7 ]; }; then wheel=mxnet-cu117
    elif [ "$major" -eq 11 ] && [ "$minor" -ge 2 ]; then wheel=mxnet-cu112
    else echo "CUDA $major.$minor is older than 11.2: installing the CPU wheel" >&2
    fi
  fi
fi
echo "installing $wheel==1.9.1 with numpy==1.23.5" >&2
$PIP uninstall -y mxnet mxnet-cu117 mxnet-cu112 >/dev/null 2>&1 || true
$PIP install "$wheel==1.9.1" "numpy==1.23.5"
