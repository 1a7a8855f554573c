#!/usr/bin/env bash
# One call of the device tool (GPU machine): runs one part, then packs its results
# so they come back through the tool's $OUT (which returns at most 8 files).
#
# Here, first:   scripts/gpu_bundle.sh           (the GPU machine has no Rust)
# Device tool:   run(command="scripts/gpu_run.sh validate", carry=[".gpu-bundle"])
# Parts (each fits one 10-minute call; run them in this order of priority):
#   validate     scripts/gpu_validate.sh: kernels vs CPU, memcheck, data path, bench
#   e2e-check    scripts/e2e.sh PARTS=check (collectives bitwise vs Socket, 3 protocols)
#   e2e-bench    scripts/e2e.sh PARTS=bench (bus bandwidth vs Socket and off; PNG)
#   e2e-train    scripts/e2e.sh PARTS=train (DDP GPT losses vs Socket)
#   demo-gpu     scripts/demo_gpu.sh (--mem cuda through the plugin, on/auto/off)
# Results land in $OUT/<part>.tar.gz plus $OUT/<part>.txt (the part's console
# output); unpack them into bench/results/ here and commit.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
part=${1:?usage: gpu_run.sh validate|e2e-check|e2e-bench|e2e-train|demo-gpu}
dest=${OUT:-$PWD/bench/results}
mkdir -p "$dest"
work=$(mktemp -d)
# LO_SHAPE=1: the GPU VM is ours alone, so e2e.sh may shape lo if namespaces fail.
export NZC_BUNDLE=${NZC_BUNDLE:-.gpu-bundle} PYTHONUNBUFFERED=1 LO_SHAPE=${LO_SHAPE:-1}
{
  echo "part: $part"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
  [ -f "$NZC_BUNDLE/MANIFEST" ] && sed 's/^/bundle /' "$NZC_BUNDLE/MANIFEST"
} | tee "$dest/$part.txt"
case $part in
  validate) OUT=$work scripts/gpu_validate.sh ;;
  e2e-check) OUT=$work/e2e PARTS=check scripts/e2e.sh ;;
  e2e-bench) OUT=$work/e2e PARTS=bench scripts/e2e.sh ;;
  e2e-train) OUT=$work/e2e PARTS=train scripts/e2e.sh ;;
  demo-gpu) OUT=$work scripts/demo_gpu.sh ;;
  *) echo "unknown part $part"; exit 2 ;;
esac 2>&1 | tee -a "$dest/$part.txt"
rc=${PIPESTATUS[0]}
echo "part $part: exit $rc" | tee -a "$dest/$part.txt"
tar -C "$work" -czf "$dest/$part.tar.gz" . 2>/dev/null
rm -rf "$work"
exit "$rc"
