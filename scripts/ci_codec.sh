#!/usr/bin/env bash
# Everything the codec needs in CI (fresh clone, 2 cores, no GPU): format check,
# unit/integration/property tests and frozen vectors (release build: the sweeps
# are heavy), the benchmark builds, and a bounded fuzz run (FUZZ_SECS, default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target-codec}"
FUZZ_SECS="${FUZZ_SECS:-60}"
t0=$(date +%s)
cargo fmt -p nccl-zip-codec -- --check
cargo test -p nccl-zip-codec --release
cargo build -p nccl-zip-codec --release --examples
echo "codec tests: $(( $(date +%s) - t0 ))s"
bash scripts/fuzz_codec.sh "$FUZZ_SECS"
echo "ci_codec: done in $(( $(date +%s) - t0 ))s"
