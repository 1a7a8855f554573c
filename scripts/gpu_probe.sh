#!/usr/bin/env bash
# First part of a GPU session (scripts/gpu_run.sh probe): what the machine can do,
# then the cheapest real-NCCL check, so that even a call cut short says something.
#   1. facts (each line "probe: NAME: VALUE", never fails): kernel, iproute2, network
#      namespaces, veth, tbf, MPS, nvidia-peermem, the GPU and its GPUDirect/DMA-BUF
#      attributes (scripts/lib/gpu_facts.py), which libcuda.so.1 a process opens,
#      driver, PyTorch, CUDA, NCCL and the libnccl file PyTorch loads,
#      CUDA_MODULE_LOADING
#   2. NCCL smoke: scripts/e2e.sh PARTS=check PROTOS=Simple, 4 KiB to 64 KiB,
#      Socket vs the plugin (off and compressed), NCCL's tuning choices logged
#      (tuning-Simple.md); SMOKE=0 skips it, SMOKE_MAX_BYTES sets the top size
# Results in $OUT (default bench/results/probe-<date>): probe.txt, smoke/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-bench/results/probe-$(date -u +%Y%m%dT%H%MZ)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
f() { echo "probe: $1: $2" | tee -a "$OUT/probe.txt"; }
try() { # try NAME CMD...: "ok" or the first line of its error
  local out
  if out=$(timeout 20 "${@:2}" 2>&1); then f "$1" "ok"; else f "$1" "FAILED ($(echo "$out" | head -1))"; fi
}
t0=$SECONDS
source scripts/lib/gpu.sh
command -v ip >/dev/null || { nzc_net_tools && f iproute2_source "the bundle's tools/*.deb (scripts/gpu_bundle.sh)"; }
f date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
f kernel "$(uname -r) $(uname -m), $(nproc) cores"
f iproute2 "$(ip -V 2>&1 | head -1 || echo missing); tc: $(command -v tc || echo missing)"
try netns bash -c 'ip netns add nzcprobe && ip netns del nzcprobe'
try veth bash -c 'ip link add nzcpa type veth peer name nzcpb && ip link del nzcpa'
try tbf bash -c 'ip link add nzcpa type veth peer name nzcpb && tc qdisc add dev nzcpa root tbf rate 1gbit burst 1mb latency 50ms; r=$?; ip link del nzcpa; exit $r'
f mps "control: $(command -v nvidia-cuda-mps-control || echo none); pipe dir: $(ls -d "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}" 2>/dev/null || echo none)"
f nvidia_peermem "$( [ -d /sys/module/nvidia_peermem ] && echo loaded || echo 'not loaded')"
f CUDA_MODULE_LOADING "${CUDA_MODULE_LOADING:-unset (driver default: LAZY since 12.2)}"
f gpu "$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
f nvidia_smi_mps "$(nvidia-smi -q 2>/dev/null | grep -i -m1 'mps' || echo 'no MPS line')"
timeout 30 "$PY" scripts/lib/gpu_facts.py 2>&1 | sed 's/^/probe: cuda facts: /' | tee -a "$OUT/probe.txt"
f libcuda "$(timeout 20 "$PY" -c '
import ctypes, os
ctypes.CDLL("libcuda.so.1")
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libcuda" in l]
p = sorted(set(maps))[0] if maps else "?"
print(p, "->", os.path.realpath(p))' 2>&1 | tail -1)"
f ldconfig_libcuda "$(ldconfig -p 2>/dev/null | grep -m3 'libcuda\.so' | tr -s ' \n' ' ')"
f torch "$(timeout 60 "$PY" -c '
import torch, torch.distributed
torch.cuda.init()
v = ".".join(map(str, torch.cuda.nccl.version()))
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", v, "lib", libs[0] if libs else "(not mapped yet)")' 2>&1 | tail -1)"
f bundle "$(head -1 "${NZC_BUNDLE:-.gpu-bundle}/MANIFEST" 2>/dev/null || echo 'none')"
f facts_seconds "$((SECONDS - t0))"

if [ "${SMOKE:-1}" = 1 ]; then
  t1=$SECONDS
  OUT=$OUT/smoke PARTS=check PROTOS=Simple MAX_BYTES_CHECK=${SMOKE_MAX_BYTES:-65536} RUN_TIMEOUT=${SMOKE_RUN_TIMEOUT:-90} \
    scripts/e2e.sh
  rc=$?
  f smoke "exit $rc in $((SECONDS - t1)) s (results: smoke/, NCCL's choices: smoke/tuning-Simple.md)"
  [ -f "$OUT/smoke/tuning-Simple.md" ] && cat "$OUT/smoke/tuning-Simple.md"
  exit $rc
fi
