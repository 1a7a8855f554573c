#!/usr/bin/env bash
# Fills .toolchain/cuda with a working nvcc from the PyPI CUDA compiler wheels, on
# any x86-64 Linux machine, with or without a GPU (see shared/DESIGN.md §4).
# build.rs looks there after NVCC, CUDA_HOME and PATH. Idempotent; prints nvcc's path.
#
# CUDA 13.0 matches the GPU machine's toolkit (PyTorch cu130); its SASS needs a
# driver >= 580, and the embedded PTX lets newer GPUs JIT.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.toolchain/cuda
nvcc=$dest/nvidia/cu13/bin/nvcc
ver=${NCCL_ZIP_CUDA_WHEELS:-13.0.*}
source scripts/lib/detect.sh
# nvcc_works compiles a kernel: a half-installed folder (nvcc without cicc or the
# CRT headers) is reinstalled, not trusted.
if ! nvcc_works "$nvcc"; then
  echo "setup_cuda: installing CUDA $ver compiler wheels into $dest" >&2
  rm -rf "$dest"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dest" \
    "nvidia-cuda-nvcc==$ver" "nvidia-nvvm==$ver" "nvidia-cuda-crt==$ver" \
    "nvidia-cuda-runtime==$ver" "nvidia-cuda-cccl==$ver" 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
fi
nvcc_works "$nvcc" || { echo "setup_cuda: $nvcc cannot compile a kernel after installing the wheels" >&2; exit 1; }
echo "$PWD/$nvcc"
