#!/usr/bin/env bash
# The test command (README): builds everything and runs every test that this
# machine can run. GPU tests skip with a printed reason when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

export CARGO_TERM_COLOR=never
echo "== build (debug, all targets)"
cargo build --workspace --all-targets

echo "== cargo test (plugin; the codec's suite runs below, in release)"
cargo test --workspace --exclude nccl-zip-codec --no-fail-fast

if [ -x scripts/ci_codec.sh ]; then
  echo "== codec CI (fuzz smoke)"
  scripts/ci_codec.sh
fi
echo "== all tests passed"
