#!/usr/bin/env bash
# The one command to validate the GPU codec on a GPU machine (issue 4):
#   scripts/gpu_validate.sh            # results into $OUT (device tool) or bench/results/
# Steps, each logged, none stopping the others (exit status = number of failed steps):
#   0. facts: nvidia-smi, driver, nvcc, git commit, command line
#   1. build (release) with NCCL_ZIP_REQUIRE_KERNELS=1
#   2. host proof (tests/kernels_host.rs) and load tests (tests/gpu_load.rs)
#   3. GPU tests (tests/gpu_codec.rs): vectors byte identity, decode, sweep, corrupt frames
#   3b. the TCP data path with CUDA buffers through the GPU lanes (tests/gpu_path.rs)
#   3c. no data-path CUDA step waits for another stream's spinning kernel (tests/gpu_hazards.rs),
#       also with CUDA_DEVICE_MAX_CONNECTIONS=1
#   4. the same GPU tests with NCCL_ZIP_GPU_FORCE_NVRTC=1 (the old-driver fallback)
#   5. compute-sanitizer --tool memcheck (and racecheck on the vectors) over the GPU tests
#   6. throughput benchmark (tests/gpu_bench.rs): 256 MiB (all SMs and capped), 128 KiB/512 KiB/1 MiB x 8 in flight
#      in one launch, and the data-path lanes (one launch per chunk, 1/4/8 threads)
# Knobs: NCCL_ZIP_GPU_SMS (default 16), NCCL_ZIP_HBM_GBPS (roofline, default 3350).
# The GPU machine has no Rust toolchain: build the binaries here with
# scripts/gpu_bundle.sh, carry .gpu-bundle, and run with NZC_BUNDLE=.gpu-bundle (the
# default when cargo is missing). Then step 1 prints the bundle's MANIFEST and step 2
# runs only the load test (the host proof needs g++ and ran in CI).
set -uo pipefail
cd "$(dirname "$0")/.."
# NZC_VALIDATE: all (default) | core (steps 1-4 and 6) | sanitize (step 5)
what=${NZC_VALIDATE:-all}
case $what in core | sanitize | all) ;; *) echo "NZC_VALIDATE=$what: want core, sanitize or all" >&2; exit 2 ;; esac
res=${OUT:-bench/results}/gpu_validate_$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$res"
log=$res/summary.txt
export CARGO_TERM_COLOR=never NCCL_ZIP_REQUIRE_KERNELS=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
fails=0
say() { echo "$*" | tee -a "$log"; }
step() { # step NAME CMD...: runs, logs to $res/NAME.log, records PASS/FAIL
  local name=$1; shift
  say "== $name: $*"
  local t0=$SECONDS
  "$@" >"$res/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$res/$name.log"
  if [ $rc -eq 0 ]; then say "== $name: PASS ($((SECONDS - t0)) s)"; else say "== $name: FAIL rc=$rc ($((SECONDS - t0)) s)"; fails=$((fails + 1)); fi
}

say "command: $0 $* (NZC_VALIDATE=$what)"
say "date: $(date -u)"
say "git: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) dirty files"
say "host: $(hostname) $(nproc) cores"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || echo "nvidia-smi failed"; } | tee -a "$log"
nvidia-smi >"$res/nvidia-smi.txt" 2>&1 || true

source scripts/lib/gpu.sh
BUNDLE=$(nzc_bundle 2>>"$log") || { say "!! $(tail -1 "$log")"; exit 1; }
if [ -n "$BUNDLE" ]; then
  say "prebuilt bundle $BUNDLE:"; tee -a "$log" <"$BUNDLE/MANIFEST"
else
  nzc_find_nvcc
  say "nvcc: ${NVCC:-${CUDA_HOME:+$CUDA_HOME/bin/nvcc}} $( (${NVCC:-${CUDA_HOME:+$CUDA_HOME/bin/}nvcc} --version 2>&1 || true) | grep release)"
  cargo --version | tee -a "$log"
fi
# tbin NAME: the test binary NAME (cargo's harness), built by cargo or from the bundle.
tbin() {
  if [ -n "$BUNDLE" ]; then echo "$BUNDLE/$1"; else
    # cargo prints "Executable tests/X.rs (PATH)", PATH relative to here or absolute.
    local p
    p=$(cargo test --release --test "$1" --no-run 2>&1 | grep -o "([^ )]*/deps/$1-[0-9a-f]*)" | head -1 | tr -d '()')
    case $p in /*) echo "$p" ;; ?*) echo "$PWD/$p" ;; esac
  fi
}

case $what in
  core | all)
    if [ -z "$BUNDLE" ]; then
      step build cargo build --release --lib --tests
      step host_proof cargo test --release --test kernels_host --test gpu_load -- --nocapture
    else
      step load_test "$(tbin gpu_load)" --nocapture
    fi
    step gpu_tests "$(tbin gpu_codec)" --nocapture --test-threads=1
    if grep -q "SKIP:" "$res/gpu_tests.log"; then say "!! GPU tests SKIPPED: $(grep -m1 SKIP: "$res/gpu_tests.log")"; fails=$((fails + 1)); fi
    step gpu_path "$(tbin gpu_path)" --nocapture
    if grep -q "SKIP:" "$res/gpu_path.log"; then say "!! data-path GPU test SKIPPED: $(grep -m1 SKIP: "$res/gpu_path.log")"; fails=$((fails + 1)); fi
    # Every data-path CUDA step while another stream's kernel spins (NCCL's case); then
    # with one hardware queue (Megatron's CUDA_DEVICE_MAX_CONNECTIONS=1).
    step hazards "$(tbin gpu_hazards)" --nocapture
    if grep -q "SKIP:" "$res/hazards.log"; then say "!! hazards test SKIPPED: $(grep -m1 SKIP: "$res/hazards.log")"; fails=$((fails + 1)); fi
    step hazards_1conn env CUDA_DEVICE_MAX_CONNECTIONS=1 "$(tbin gpu_hazards)" --nocapture
    # libnvrtc: the toolkit's, or the one PyTorch's wheels bring (nvidia-cuda-nvrtc).
    nvrtc_dirs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/**/libnvrtc.so*", recursive=True)})))' 2>/dev/null || true)
    say "extra libnvrtc dirs: ${nvrtc_dirs:-none}"
    step gpu_tests_nvrtc env NCCL_ZIP_GPU_FORCE_NVRTC=1 LD_LIBRARY_PATH="${nvrtc_dirs:+$nvrtc_dirs:}${LD_LIBRARY_PATH:-}" "$(tbin gpu_codec)" --nocapture --test-threads=1
    grep -q "kernels Nvrtc" "$res/gpu_tests_nvrtc.log" || say "!! NVRTC run did not report 'kernels Nvrtc' (libnvrtc missing?)"

    step bench "$(tbin gpu_bench)" --ignored --nocapture --test-threads=1
    grep -E "device:|lanes:|^ +[0-9]+ +[0-9]+ " "$res/bench.log" | tee "$res/bench_table.txt" | tee -a "$log"
    ;;
esac
case $what in
  sanitize | all)
    # compute-sanitizer on the test binary (encode, decode, corrupt frames)
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    bin=$(tbin gpu_codec)
    if [ -n "$cs" ] && [ -n "$bin" ]; then
      export NZC_TEST_TIMEOUT_S=900
      step memcheck "$cs" --tool memcheck --error-exitcode 99 --leak-check no "$bin" --nocapture --test-threads=1
      step racecheck "$cs" --tool racecheck --error-exitcode 99 "$bin" --nocapture --test-threads=1 gpu_encode_frozen gpu_decode_frozen
    else
      say "!! compute-sanitizer (${cs:-not found}) or test binary (${bin:-not found}) missing: memcheck NOT run"; fails=$((fails + 1))
    fi
    ;;
esac
say "results: $res ($fails failed steps)"
exit $fails
