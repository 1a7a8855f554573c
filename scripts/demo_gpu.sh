#!/usr/bin/env bash
# The plugin with GPU buffers, on the GPU machine: two ranks of nccl-zip-perf
# (recv and send, `--mem cuda --bench`) send device memory (cuMemAlloc on GPU 0,
# registered NCCL_PTR_CUDA) to each other through the plugin, loaded with dlopen
# the way NCCL loads it. Each data set and message size runs with
# NCCL_ZIP_COMPRESS=auto, on and off in the same session; the table gives GB/s,
# the ratio to off, and the wire bytes per payload byte. Every received message is
# copied back to the host and compared byte for byte (inside the timed loop, as in
# the host-memory demo).
#
# Link: two network namespaces joined by an unshaped veth (scripts/netns.sh) when
# `ip netns add` works here, else loopback (127.0.0.1).
# No GPU (nvidia-smi missing or failing): prints "SKIP: <reason>" and exits 0.
#
# Env: DATASETS (bf16,random), SIZES (128K,512K,4M), BYTES (bytes per run, 512M),
#      REPS (3), SETTING (auto | netns | loopback), NO_BUILD (1: use the binaries
#      already in $CARGO_TARGET_DIR/release), NZC_BUNDLE (prebuilt binaries from
#      scripts/gpu_bundle.sh; the default where cargo is missing), OUT (results directory; default
#      bench/results; the file is demo-gpu-<date>.md), plus any NCCL_ZIP_* variable
#      (NCCL_ZIP_COMPRESS is set per column).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CMD="$0 $*"
DATASETS=${DATASETS:-bf16,random}
SIZES=${SIZES:-128K,512K,4M}
BYTES=${BYTES:-$((512 << 20))}
REPS=${REPS:-3}
SETTING=${SETTING:-auto}
MEM=cuda
# The plugin offers NCCL_PTR_CUDA only with NCCL_ZIP_GPU=on (off by default until
# the device path is validated on a GPU).
export NCCL_ZIP_GPU=${NCCL_ZIP_GPU:-on}

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIP: no GPU (nvidia-smi not found)"
  exit 0
fi
if ! smi_l=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$smi_l"; then
  echo "SKIP: no GPU (nvidia-smi -L: $(head -1 <<<"$smi_l"))"
  exit 0
fi
if [[ -n ${NCCL_ZIP_GPU_EMULATE:-} && ${NCCL_ZIP_GPU_EMULATE} != 0 ]]; then
  echo "demo_gpu: note: NCCL_ZIP_GPU_EMULATE=$NCCL_ZIP_GPU_EMULATE is set: buffers are emulated device memory (host), not the GPU's" >&2
fi

TD=${CARGO_TARGET_DIR:-$ROOT/target}
# The GPU machine has no Rust: use the prebuilt bundle (scripts/gpu_bundle.sh).
source "$ROOT/scripts/lib/gpu.sh"
BUNDLE=$(nzc_bundle) || exit 1
if [[ -n $BUNDLE ]]; then
  PERF=$BUNDLE/nccl-zip-perf
  SO=$BUNDLE/libnccl_net_zip.so
  NO_BUILD=1
  echo "demo_gpu: prebuilt bundle: $(head -1 "$BUNDLE/MANIFEST")" >&2
fi
if [[ ${NO_BUILD:-0} != 1 ]]; then
  # Without nvcc the plugin builds without GPU kernels (build.rs says so).
  nzc_find_nvcc || echo "demo_gpu: no nvcc: the plugin builds without GPU kernels" >&2
  echo "demo_gpu: cargo build --release --lib --bins" >&2
  cargo build --release --quiet --lib --bins
fi
PERF=${PERF:-$TD/release/nccl-zip-perf}
SO=${SO:-$TD/release/libnccl_net_zip.so}
for f in "$PERF" "$SO"; do
  [ -e "$f" ] || { echo "demo_gpu: $f missing (build first, or unset NO_BUILD)" >&2; exit 1; }
done
WORK=$(mktemp -d)
# netns.sh down is safe when nothing is up (and undoes a half-done `up`).
cleanup() { [[ $SETTING == loopback ]] || "$ROOT/scripts/netns.sh" down >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
source "$ROOT/scripts/lib/pair.sh"
# run_pair starts "$BIN recv|send ...": this wrapper gives both ranks --mem cuda.
BIN=$WORK/nccl-zip-perf
printf '#!/bin/sh\nrole=$1; shift\nexec "%s" "$role" --mem "%s" "$@"\n' "$PERF" "$MEM" >"$BIN"
chmod +x "$BIN"

# Fails early, with the tool's reason (no device, plugin without NCCL_PTR_CUDA, ...).
if ! "$BIN" loop --sizes 4K,12345 --count 4 --plugin "$SO" >"$WORK/mem.out" 2>&1; then
  echo "demo_gpu: --mem cuda does not run here:" >&2
  grep -v '^WARNS' "$WORK/mem.out" >&2
  exit 1
fi
MEMDESC=$(sed -n 's/^mem: //p' "$WORK/mem.out" | head -1)

# Namespaces if this machine allows them (and SETTING does not say otherwise).
if [[ $SETTING != loopback ]] && "$ROOT/scripts/netns.sh" up none >"$WORK/netns.log" 2>&1; then
  PAIR=netns LINK="2 network namespaces, unshaped veth"
elif [[ $SETTING == netns ]]; then
  echo "demo_gpu: SETTING=netns but scripts/netns.sh up failed: $(tail -1 "$WORK/netns.log")" >&2
  exit 1
else
  [[ $SETTING == auto ]] && echo "demo_gpu: network namespaces unavailable ($(tail -1 "$WORK/netns.log" 2>/dev/null)); using loopback" >&2
  PAIR=loopback LINK="loopback (127.0.0.1, lo)"
fi

echo
echo "nccl-net-zip GPU demo: 2 ranks, $LINK, memory $MEMDESC, messages $SIZES"
echo "| data | message | auto GB/s | auto / off | on GB/s | on / off | off GB/s | wire/payload auto / on / off |"
echo "|---|---|---|---|---|---|---|---|"
med() { printf '%s\n' $1 | median; } # median of a space-separated list
ROWS=()
for DATA in ${DATASETS//,/ }; do
  for size in ${SIZES//,/ }; do
    declare -A g=() w=()
    for mode in auto on off; do g[$mode]="" w[$mode]=""; done
    for ((i = 0; i < REPS; i++)); do
      for mode in auto on off; do
        r=$(NCCL_ZIP_COMPRESS=$mode run_pair "$PAIR" zip "$size" "$BYTES")
        g[$mode]+="$(field GBps <<<"$r") "
        w[$mode]+="$(field wire_per_payload <<<"$r") "
      done
    done
    a=$(med "${g[auto]}") n=$(med "${g[on]}") o=$(med "${g[off]}")
    aw=$(med "${w[auto]}") nw=$(med "${w[on]}") ow=$(med "${w[off]}")
    row=$(awk -v d="$DATA" -v s="$size" -v a="$a" -v n="$n" -v o="$o" -v aw="$aw" -v nw="$nw" -v ow="$ow" \
      'BEGIN{printf "| %s | %s | %.3f (%.2f Gbit/s) | **%.2fx** | %.3f | %.2fx | %.3f (%.2f Gbit/s) | %.3f / %.3f / %.3f |", d, s, a, a*8, a/o, n, n/o, o, o*8, aw, nw, ow}')
    echo "$row"
    ROWS+=("$row")
    unset g w
  done
done

DATE=$(date -u +%Y-%m-%d)
RESDIR=${OUT:-$ROOT/bench/results}
OUTF=$RESDIR/demo-gpu-$DATE.md
mkdir -p "$RESDIR"
{
  echo "# GPU demo: device buffers (NCCL_PTR_CUDA) through the plugin, $LINK ($DATE)"
  echo
  echo "- Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, kernel $(uname -r)"
  echo "- GPU: $(nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id --format=csv,noheader 2>&1 | paste -sd ';')"
  echo "- Driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1), $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
  echo "- Memory: \`--mem cuda\` on both ranks: $MEMDESC; buffers registered NCCL_PTR_CUDA"
  echo "- Commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD -- src codec kernels 2>/dev/null || echo ' (modified)')"
  echo "- Command: \`DATASETS=$DATASETS SIZES=$SIZES BYTES=$BYTES REPS=$REPS SETTING=$SETTING $CMD\`"
  echo "- Plugin settings: $(env | grep '^NCCL_ZIP_' | grep -v '^NCCL_ZIP_COMPRESS=' | tr '\n' ' ' || true)(unset = defaults); NCCL_ZIP_COMPRESS per column"
  echo "- Each pair: \`nccl-zip-perf recv|send --mem cuda --bench --sizes SIZE --count BYTES/SIZE --warmup 16 --data DATA\` (scripts/lib/pair.sh run_pair)"
  echo "- Every column: the same plugin, link, memory and data, in the same run; only NCCL_ZIP_COMPRESS differs: auto (adaptive, the default), on (always run the codec), off (uncompressed)."
  echo "- Throughput: receiver side, GB/s = 1e9 B/s, median of $REPS runs; each received message is copied to the host and compared inside the timed loop. Wire: bytes counted by the receiver's interface per payload byte (on lo, both directions)."
  echo
  echo "| data | message | auto GB/s | auto / off | on GB/s | on / off | off GB/s | wire/payload auto / on / off |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} >"$OUTF"
echo
echo "written to ${OUTF#$ROOT/}"
