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
#   5. compute-sanitizer: memcheck on the frozen vectors (encode, decode), racecheck on
#      them, then memcheck on the rest (random sweep, corrupt frames)
#   6. throughput benchmark (tests/gpu_bench.rs): 256 MiB (all SMs and capped), 128 KiB/512 KiB/1 MiB x 8 in flight
#      in one launch, the data-path lanes (one launch per chunk, 1/4/8 threads), and
#      the plugin's own lanes (gpu_bench_data_path): device scratch, then zero-copy
# Knobs: NCCL_ZIP_GPU_SMS (default 16), NCCL_ZIP_HBM_GBPS (roofline, default 3350).
# The GPU machine has no Rust toolchain: build the binaries here with
# scripts/gpu_bundle.sh, carry .gpu-bundle, and run with NZC_BUNDLE=.gpu-bundle (the
# default when cargo is missing). Then step 1 prints the bundle's MANIFEST and step 2
# runs only the load test (the host proof needs g++ and ran in CI).
# Time limits: every step runs under `timeout` (its own limit, below, and never past
# NZC_PART_DEADLINE, the epoch second at which scripts/gpu_run.sh stops this part);
# a step that times out is logged (rc 124, or 137 if it ignored SIGTERM) and the
# next step runs. A step with too little time left is logged as NOT RUN.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
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
step_pid='' step_name=''
# Stopped from outside (gpu_run.sh's deadline for the part): stop the running step
# too. `timeout` puts its command in a process group of its own, which a signal to
# ours would miss; a TERM to that `timeout` reaches its whole group (and KILLs it 5 s
# later). The step runs in the background so that this trap runs at once.
# shellcheck disable=SC2317 # called by the trap below
on_stop() {
  [ -n "$step_pid" ] && kill -TERM "$step_pid" 2>/dev/null
  say "!! stopped from outside during step ${step_name:-(none)}; $fails failed steps before it"
  exit 124
}
trap on_stop TERM INT HUP
step() { # step NAME LIMIT_S CMD...: runs under timeout, logs to $res/NAME.log, records PASS/FAIL
  local name=$1 lim=$2; shift 2
  if [ -n "${NZC_PART_DEADLINE:-}" ]; then
    local room=$((NZC_PART_DEADLINE - $(date +%s) - 10)) # 10 s: the kill grace and the summary
    [ "$room" -lt "$lim" ] && lim=$room
  fi
  if [ "$lim" -lt 10 ]; then
    say "== $name: NOT RUN (${lim}s left before this part's deadline): $*"
    fails=$((fails + 1))
    return
  fi
  say "== $name (limit ${lim}s): $*"
  local t0=$SECONDS rc
  timeout -k 5 "$lim" "$@" >"$res/$name.log" 2>&1 &
  step_pid=$! step_name=$name
  wait "$step_pid"
  rc=$?
  step_pid='' step_name=''
  tail -n 25 "$res/$name.log"
  local took="$((SECONDS - t0)) s"
  case $rc in
    0) say "== $name: PASS ($took)" ;;
    124) say "== $name: TIMED OUT after ${lim}s (rc 124; its log is partial), going on" ;;
    137) say "== $name: TIMED OUT after ${lim}s and KILLED 5 s later (rc 137: it ignored SIGTERM), going on" ;;
    3) say "== $name: FAIL rc=3 ($took): the test stopped itself, a kernel or transfer never finished (see its log)" ;;
    *) say "== $name: FAIL rc=$rc ($took)" ;;
  esac
  [ $rc -eq 0 ] || fails=$((fails + 1))
}

say "command: $0 $* (NZC_VALIDATE=$what)"
say "date: $(date -u)"
say "git: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) dirty files"
say "host: $(hostname) $(nproc) cores"
[ -n "${NZC_PART_DEADLINE:-}" ] && say "deadline: $((NZC_PART_DEADLINE - $(date +%s))) s from now (NZC_PART_DEADLINE)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_mode --format=csv 2>&1 || echo "nvidia-smi failed"; } | tee -a "$log"
{ timeout 30 python3 scripts/lib/gpu_facts.py 2>&1 || echo "cuda facts: unknown (scripts/lib/gpu_facts.py failed or timed out)"; } | tee -a "$log"
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
      step build 3000 cargo build --release --lib --tests
      step host_proof 900 cargo test --release --test kernels_host --test gpu_load -- --nocapture
    else
      step load_test 60 "$(tbin gpu_load)" --nocapture
    fi
    # Limits: a run takes seconds; a hung kernel ends a test binary with exit 3 after
    # its own wait (20-60 s); the limit catches what is left, and hangs in CUDA calls.
    step gpu_tests 150 "$(tbin gpu_codec)" --nocapture --test-threads=1
    if grep -qs "SKIP:" "$res/gpu_tests.log"; then say "!! GPU tests SKIPPED: $(grep -m1 SKIP: "$res/gpu_tests.log")"; fails=$((fails + 1)); fi
    step gpu_path 150 "$(tbin gpu_path)" --nocapture
    if grep -qs "SKIP:" "$res/gpu_path.log"; then say "!! data-path GPU test SKIPPED: $(grep -m1 SKIP: "$res/gpu_path.log")"; fails=$((fails + 1)); fi
    # Every data-path CUDA step while another stream's kernel spins (NCCL's case); then
    # with one hardware queue (Megatron's CUDA_DEVICE_MAX_CONNECTIONS=1).
    step hazards 150 "$(tbin gpu_hazards)" --nocapture
    if grep -qs "SKIP:" "$res/hazards.log"; then say "!! hazards test SKIPPED: $(grep -m1 SKIP: "$res/hazards.log")"; fails=$((fails + 1)); fi
    step hazards_1conn 150 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$(tbin gpu_hazards)" --nocapture
    step bench 150 "$(tbin gpu_bench)" --ignored --nocapture --test-threads=1
    grep -sE "device:|lanes:|data path:|^ +[0-9]+ +[0-9]+ " "$res/bench.log" | tee "$res/bench_table.txt" | tee -a "$log"
    # The plugin's lanes with the kernels on the mapped staging itself, against the
    # default (device scratch + copies) in the bench step above.
    step bench_zerocopy 90 env NCCL_ZIP_GPU_ZEROCOPY=1 "$(tbin gpu_bench)" --ignored --nocapture --test-threads=1 gpu_bench_data_path
    grep -sE "data path:|^ +[0-9]+ +[0-9]+ " "$res/bench_zerocopy.log" | tee -a "$res/bench_table.txt" | tee -a "$log"
    # Last: the old-driver fallback matters less than the figures above, and a short
    # part (a 15-minute device session) must reach the benchmark first.
    # libnvrtc: the toolkit's, or the one PyTorch's wheels bring (nvidia-cuda-nvrtc).
    nvrtc_dirs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/**/libnvrtc.so*", recursive=True)})))' 2>/dev/null || true)
    say "extra libnvrtc dirs: ${nvrtc_dirs:-none}"
    # Longer: every test compiles the kernels with NVRTC at run time.
    step gpu_tests_nvrtc 240 env NCCL_ZIP_GPU_FORCE_NVRTC=1 LD_LIBRARY_PATH="${nvrtc_dirs:+$nvrtc_dirs:}${LD_LIBRARY_PATH:-}" "$(tbin gpu_codec)" --nocapture --test-threads=1
    [ ! -f "$res/gpu_tests_nvrtc.log" ] || grep -q "kernels Nvrtc" "$res/gpu_tests_nvrtc.log" || say "!! NVRTC run did not report 'kernels Nvrtc' (libnvrtc missing?)"

    ;;
esac
case $what in
  sanitize | all)
    # compute-sanitizer on the test binary, most important first, one run each, so
    # that a run stopped by its limit or the part's deadline leaves the earlier ones
    # whole: memcheck on the frozen vectors (encode and decode), racecheck on them,
    # then memcheck on the rest (random sweep, corrupt frames).
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    bin=$(tbin gpu_codec)
    if [ -n "$cs" ] && [ -n "$bin" ]; then
      # Per-batch wait under the sanitizer (slow): below the step limits, so that a
      # hung kernel is named by the test (exit 3) before the step is stopped.
      export NZC_TEST_TIMEOUT_S=200
      step memcheck 240 "$cs" --tool memcheck --error-exitcode 99 --leak-check no "$bin" --nocapture --test-threads=1 gpu_encode_frozen gpu_decode_frozen
      step racecheck 240 "$cs" --tool racecheck --error-exitcode 99 "$bin" --nocapture --test-threads=1 gpu_encode_frozen gpu_decode_frozen
      step memcheck_rest 240 "$cs" --tool memcheck --error-exitcode 99 --leak-check no "$bin" --nocapture --test-threads=1 --skip _frozen_
      for s in memcheck racecheck memcheck_rest; do
        if [ -f "$res/$s.log" ] && grep -q "SKIP:" "$res/$s.log"; then say "!! $s SKIPPED the GPU tests: $(grep -m1 SKIP: "$res/$s.log")"; fails=$((fails + 1)); fi
      done
    else
      say "!! compute-sanitizer (${cs:-not found}) or test binary (${bin:-not found}) missing: memcheck NOT run"; fails=$((fails + 1))
    fi
    ;;
esac
say "results: $res ($fails failed steps)"
exit $fails
