#!/usr/bin/env bash
# Prints the codec benchmark table (ours vs zstd-1/3 vs order-0 bound, single-thread
# GB/s) for synthetic classes and, if present, real tensors in bench/data
# (run scripts/make_tensors.sh first). Extra arguments go to the benchmark
# (e.g. --only bf16, --msg 65536, --secs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-codec}"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
cargo run --release -q -p nccl-zip-codec --example codec_bench -- "$@"
