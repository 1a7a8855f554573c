#!/usr/bin/env bash
# The test command (README): builds everything and runs every test that this
# machine can run. GPU tests skip with a printed reason when no GPU is present.
# Each step prints its wall time; the total comes last.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
STEP= STEP_T0=$SECONDS
step() { # step NAME: ends the running step (printing its time), starts NAME
  [ -n "$STEP" ] && echo "== [$((SECONDS - STEP_T0)) s] $STEP"
  STEP=$1 STEP_T0=$SECONDS
  [ -n "$STEP" ] && echo "== $STEP"
  return 0
}

step "setup checks (scripts/tests/detect_test.sh)"
scripts/tests/detect_test.sh >/dev/null || scripts/tests/detect_test.sh
step "setup (installs what is missing)"
scripts/setup.sh

export CARGO_TERM_COLOR=never
# CUDA kernels are compiled on every run, GPU or not: nvcc 13.0 from the PyPI
# wheels, and build.rs fails the build if any kernel does not compile.
step "nvcc"
echo "nvcc: $(scripts/setup_cuda.sh)"
export NCCL_ZIP_REQUIRE_KERNELS=1
# The kernels' SASS facts (registers, local memory, 64-bit divisions, load
# widths): printed, not yet enforced (the v1 kernels fail --strict; issue 19).
step "kernel SASS facts (scripts/sass_check.sh)"
scripts/sass_check.sh
step "build (debug, all targets)"
cargo build --workspace --all-targets

step "cargo test (plugin; the codec's suite runs below, in release)"
cargo test --workspace --exclude nccl-zip-codec --no-fail-fast

step "GPU tests (print SKIP and the reason when there is no usable GPU)"
cargo test --test gpu_codec --test gpu_bench --test gpu_path -- --nocapture 2>&1 | grep -E "^SKIP|^test result|^test .*(FAILED|ok)$|panicked"

# The files a user gets: built for glibc 2.28 with cargo-zigbuild (zig and
# cargo-zigbuild are installed on first use; the step fails naming what could not be
# installed), checked as shipped (one export, -z nodelete, no DT_NEEDED on CUDA or
# verbs, GLIBC_ <= 2.28, kernels embedded, the perf driver run against the shipped
# .so), then packaged, installed under a DESTDIR, run, and uninstalled.
step "release artifacts (glibc 2.28) and shipped-file checks (scripts/release.sh)"
scripts/release.sh x86_64
step "package, install, run, uninstall (scripts/tests/package_test.sh)"
scripts/tests/package_test.sh

if [ -x scripts/ci_codec.sh ]; then
  step "codec CI (fuzz smoke)"
  scripts/ci_codec.sh
fi
step "end-to-end NCCL"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "GPU present: run scripts/e2e.sh for the real-NCCL check (long; not part of this suite)"
else
  scripts/e2e.sh
fi
step ""
echo "== all tests passed in $((SECONDS - T0)) s"
