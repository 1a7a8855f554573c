#!/usr/bin/env bash
# One call of the device tool (GPU machine): runs one or more parts, then packs each
# part's results so they come back through the tool's $OUT (at most 8 files: two
# per part, so at most 4 parts per call).
#
# Here, first:   scripts/gpu_bundle.sh           (the GPU machine has no Rust)
# Device tool:   run(command="scripts/gpu_run.sh validate", carry=[".gpu-bundle"])
#                run(command="scripts/gpu_run.sh e2e-check,demo-gpu", ...)
# Parts (in order of priority; each NAME or NAME:SECONDS, the number overriding
# that part's own cap below):
#   probe        scripts/gpu_probe.sh: the machine (iproute2, netns, veth, tbf, MPS,
#                GPUDirect attributes, which libcuda a process opens, NCCL and driver
#                versions, nvidia-peermem), then a 2-rank NCCL smoke run (Simple, 4 KiB
#                to 64 KiB, plugin vs Socket) with NCCL's tuning choices logged
#   validate     scripts/gpu_validate.sh core: kernels vs CPU, data path, hazards, NVRTC, bench
#   sanitize     scripts/gpu_validate.sh sanitize: compute-sanitizer memcheck + racecheck
#   e2e-check    scripts/e2e.sh PARTS=check (collectives bitwise vs Socket, 3 protocols)
#   e2e-bench    scripts/e2e.sh PARTS=bench (bus bandwidth vs Socket and off; PNG)
#   e2e-train    scripts/e2e.sh PARTS=train (DDP GPT losses vs Socket)
#   demo-gpu     scripts/demo_gpu.sh (--mem cuda through the plugin, on/auto/off)
#   e2e-graph    scripts/e2e.sh PARTS=graph (all_reduce in a CUDA graph, replayed; vs Socket)
#   hang         scripts/gpu_hang.sh: which setting ends the GPU-kernel path's stall
#                under back-to-back collectives (first GPU run), and DDP under it
#   bench-O      the kernel throughput benchmark built with -DNZC_UNORDERED_ROUNDS
#                (variant O of docs/GPU.md; prebuilt by scripts/gpu_bundle.sh into
#                .gpu-bundle/variant-O/), next to the default build's, same call
# Results land in $OUT/<part>.tar.gz plus $OUT/<part>.txt (the part's console
# output, written as it runs, so it comes back even if the call is killed); unpack
# them into bench/results/ here and commit.
#
# Deadline: every part has its own cap (part_cap below, or NAME:SECONDS), cut to
# what is left of NZC_CALL_LIMIT_S (default 560 s, under the tool's 600 s per call),
# so that a slow first part cannot eat the time of the parts after it; a part still
# running at its cap is stopped (exit 124) and what it wrote so far is packed all
# the same. Each part runs with
# NZC_PART_DEADLINE (epoch seconds) set to its stop time: gpu_validate.sh fits its
# per-step limits inside it and logs steps it has no time left for.
# Each part's header also records the device facts NCCL's GPU path depends on
# (scripts/lib/gpu_facts.py: GPUDirect RDMA and DMA-BUF support, compute mode).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
parts=${1:?usage: gpu_run.sh PART[:SECONDS][,PART...] (probe|validate|sanitize|e2e-check|e2e-bench|e2e-train|demo-gpu|bench-O|hang|e2e-graph)}
dest=${OUT:-$PWD/bench/results}
mkdir -p "$dest"
# LO_SHAPE=1: the GPU VM is ours alone, so e2e.sh may shape lo if namespaces fail.
export NZC_BUNDLE=${NZC_BUNDLE:-.gpu-bundle} PYTHONUNBUFFERED=1 LO_SHAPE=${LO_SHAPE:-1}
deadline=$(($(date +%s) + ${NZC_CALL_LIMIT_S:-560}))
worst=0

# Each part's own cap, in seconds (measured dry runs and expected GPU times:
# docs/GPU.md, "Runbook").
part_cap() {
  case $1 in
    probe) echo 150 ;;
    validate) echo 330 ;;
    sanitize) echo 540 ;;
    e2e-check) echo 300 ;;
    e2e-bench) echo 360 ;;
    e2e-train) echo 240 ;;
    demo-gpu) echo 200 ;;
    bench-O) echo 200 ;;
    hang) echo 180 ;;
    e2e-graph) echo 120 ;;
    *) echo 0 ;;
  esac
}

run_part() { # part work
  case $1 in
    probe) OUT=$2 scripts/gpu_probe.sh ;;
    bench-O)
      local b=$NZC_BUNDLE/variant-O
      if [ ! -x "$b/gpu_bench" ]; then echo "bench-O: $b/gpu_bench missing (scripts/gpu_bundle.sh builds it unless VARIANTS=)"; return 2; fi
      sed 's/^/variant-O /' "$b/MANIFEST" 2>/dev/null
      echo "== default build (ordered rounds)"
      timeout -k 5 90 "$NZC_BUNDLE/gpu_bench" --ignored --nocapture --test-threads=1 --exact gpu_bench 2>&1 | tee "$2/bench-default.log"
      echo "== variant O (-DNZC_UNORDERED_ROUNDS)"
      timeout -k 5 90 "$b/gpu_bench" --ignored --nocapture --test-threads=1 --exact gpu_bench 2>&1 | tee "$2/bench-O.log" ;;
    validate) OUT=$2 NZC_VALIDATE=core scripts/gpu_validate.sh ;;
    sanitize) OUT=$2 NZC_VALIDATE=sanitize scripts/gpu_validate.sh ;;
    e2e-check) OUT=$2/e2e PARTS=check scripts/e2e.sh ;;
    e2e-bench) OUT=$2/e2e PARTS=bench scripts/e2e.sh ;;
    e2e-train) OUT=$2/e2e PARTS=train scripts/e2e.sh ;;
    demo-gpu) OUT=$2 scripts/demo_gpu.sh ;;
    hang) OUT=$2 scripts/gpu_hang.sh ;;
    e2e-graph) OUT=$2/e2e PARTS=graph scripts/e2e.sh ;;
    *) echo "unknown part $1"; return 2 ;;
  esac
}

IFS=, read -ra list <<<"$parts"
for item in "${list[@]}"; do
  part=${item%%:*}
  cap=$(part_cap "$part")
  # An unknown part is refused before anything runs, with or without NAME:SECONDS.
  if [ "$cap" = 0 ]; then echo "unknown part $part" | tee -a "$dest/$part.txt"; worst=2; continue; fi
  if [[ $item == *:* ]]; then
    cap=${item#*:}
    [[ $cap =~ ^[0-9]+$ ]] || { echo "part $part: cap '$cap' is not a number of seconds" | tee -a "$dest/$part.txt"; worst=2; continue; }
  fi
  work=$(mktemp -d)
  {
    echo "part: $part"
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1
    timeout 30 python3 scripts/lib/gpu_facts.py 2>&1 || echo "cuda facts: unknown (scripts/lib/gpu_facts.py failed or timed out)"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
    [ -f "$NZC_BUNDLE/MANIFEST" ] && sed 's/^/bundle /' "$NZC_BUNDLE/MANIFEST"
  } | tee "$dest/$part.txt"
  left=$((deadline - $(date +%s) - 15)) # 15 s kept for packing
  [ "$left" -gt "$cap" ] && left=$cap
  if [ "$left" -lt 30 ]; then
    echo "part $part: not started, only ${left}s left of this call" | tee -a "$dest/$part.txt"
    rc=125
  else
    echo "part $part: up to ${left}s (its cap: ${cap}s)" | tee -a "$dest/$part.txt"
    # timeout runs the part in its own process group and stops the whole group
    # (netns children, ranks) at the deadline.
    export -f run_part
    export NZC_PART_DEADLINE=$(($(date +%s) + left))
    timeout -k 5 "$left" bash -c 'run_part "$0" "$1"' "$part" "$work" 2>&1 | tee -a "$dest/$part.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && echo "part $part: STOPPED at its deadline (partial results)" | tee -a "$dest/$part.txt"
  fi
  echo "part $part: exit $rc" | tee -a "$dest/$part.txt"
  tar -C "$work" -czf "$dest/$part.tar.gz" . 2>/dev/null
  rm -rf "$work"
  [ "$rc" != 0 ] && worst=$rc
done
exit "$worst"
