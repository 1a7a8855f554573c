#!/usr/bin/env bash
# Prints the codec benchmark table (ours vs zstd-1/3 vs order-0 bound, single-thread
# GB/s) for synthetic classes and, if present, real tensors in bench/data
# (run scripts/make_tensors.sh first), and the sparse and fp8 classes of issue 19
# (`--only sparse`, `--only fp8`). Extra arguments go to the benchmark
# (e.g. --only bf16, --msg 262144 for the plugin's chunks, --secs 1, --dump DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-codec}"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
cargo run --release -q -p nccl-zip-codec --example codec_bench -- "$@"
