#!/usr/bin/env bash
# Separates the causes of the stall the first GPU run found (bench/results/
# gpu-2026-11-27-h100): with GPU buffers and the GPU kernels, back-to-back
# all_reduces stopped with "GPU decode: the GPU lane's stream has not drained".
# (scripts/gpu_run.sh hang; GPU machine only.)
#
# Each variant is a short real-NCCL run through scripts/e2e.sh (bf16 all_reduce,
# Gaussian data, 1 to 4 MiB, 50 back to back per size: where the first run stalled),
# with NCCL_ZIP_GPU=on and a 5 s lane deadline (NCCL_ZIP_GPU_TIMEOUT_MS), so a stall
# costs seconds and its WARN says whether the work queued before the kernel had run:
#   default       as the first run
#   conn32        CUDA_DEVICE_MAX_CONNECTIONS=32: no hardware queue shared by two
#                 streams (if this passes and default stalls: a false dependency on
#                 NCCL's queued kernel)
#   eager         CUDA_MODULE_LOADING=EAGER: no lazy module load in the application
#   nokernels     NCCL_ZIP_GPU_KERNELS=off: copies + CPU codec, no kernel from the plugin
#   train-nokernels, train-conn32   the DDP run (10 steps) of the first run, bitwise
#                 against Socket, under the two settings most likely to hold
# Results in $OUT/<variant>/ and one summary line per variant on stdout.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-bench/results/gpu-hang-$(date -u +%Y%m%dT%H%MZ)}
mkdir -p "$OUT"
VARIANTS=${VARIANTS:-default conn32 eager nokernels train-nokernels train-conn32}
fails=0
for v in $VARIANTS; do
  env=(NCCL_ZIP_GPU=on NCCL_ZIP_GPU_TIMEOUT_MS=5000 NETNS=0 RATE=none RUN_TIMEOUT=${HANG_RUN_TIMEOUT:-45} GRACE=5)
  case $v in
    default | train-default) ;;
    conn32 | train-conn32) env+=(CUDA_DEVICE_MAX_CONNECTIONS=32) ;;
    eager | train-eager) env+=(CUDA_MODULE_LOADING=EAGER) ;;
    nokernels | train-nokernels) env+=(NCCL_ZIP_GPU_KERNELS=off) ;;
    *) echo "hang: unknown variant $v"; fails=$((fails + 1)); continue ;;
  esac
  if [[ $v == train-* ]]; then
    env+=(PARTS=train STEPS=10)
  else
    env+=(PARTS=bench KINDS=gauss TRANSPORTS=zip MAX_BYTES=4194304 "BENCH_ARGS=--min-bytes 1048576")
  fi
  t0=$SECONDS
  env "${env[@]}" OUT="$OUT/$v" scripts/e2e.sh >"$OUT/$v.log" 2>&1
  rc=$?
  # Bench with TRANSPORTS=zip alone has no baseline to report against: judge it by
  # whether both ranks finished (their JSON results) instead of e2e's exit status.
  if [[ $v != train-* ]]; then
    if [[ -f $OUT/$v/bench-gauss-zip.rank0.json && -f $OUT/$v/bench-gauss-zip.rank1.json ]]; then rc=0; else rc=1; fi
  fi
  warn=$(grep -h "has not drained" "$OUT/$v"/*.rank*.log 2>/dev/null | head -2 | sed 's/.*NCCL WARN NET\/Zip : //')
  bw=$(grep -h "^BENCH" "$OUT/$v"/*.rank0.log 2>/dev/null | awk '{printf "%s %s; ", $5, $6}')
  echo "hang: $v: $([ $rc = 0 ] && echo ok || echo FAILED) in $((SECONDS - t0)) s${bw:+; $bw}${warn:+; WARN: $warn}"
  [ $rc = 0 ] || fails=$((fails + 1))
done
exit $fails
