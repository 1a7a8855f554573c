#!/usr/bin/env bash
# The demo (README): what the plugin does, on the machine at hand.
#
# Without a GPU: two ranks, in two network namespaces joined by a veth pair shaped
# to RATE (default 2 Gbit/s), stream tensors through the plugin, which each rank
# loads with dlopen the way NCCL does. Each data set runs twice in the same
# session: adaptive (NCCL_ZIP_COMPRESS=auto, the default), always compressing (=on)
# and uncompressed (=off). The demo prints throughput, the speedup over off, and
# the wire bytes per payload byte, read from the veth counters. Data sets:
#   - real MiniLM-L6 tensors, bf16: weights, gradients, activations
#     (scripts/make_tensors.sh builds them; skipped, with the reason, if that fails)
#   - Gaussian bf16 (sigma 0.02)
#   - random bytes (incompressible: must not be slower)
#
# With a GPU (and PyTorch with CUDA) the demo is instead a real NCCL all_reduce
# through the plugin, against NCCL's Socket transport: scripts/e2e.sh, bench part.
#
# Env: RATE (2gbit | 10gbit | none), SIZES (512K,4M), BYTES (bytes per run, 96M),
#      REPS (1), OUT (results file; default a temporary file whose path is
#      printed; set e.g. OUT=bench/results/demo-<rate>-<date>.md to record it),
#      MEM (host | cuda: `--mem` of both ranks; cuda needs a GPU, or
#      NCCL_ZIP_GPU_EMULATE=1 for emulated device memory; MEM=cuda always runs the
#      two-namespace demo, never the PyTorch one).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CMD="$0 $*"
RATE=${RATE:-2gbit}
SIZES=${SIZES:-512K,4M}
BYTES=${BYTES:-$((96 << 20))}
REPS=${REPS:-1}
MEM=${MEM:-host}
case $MEM in host | cuda) ;; *) echo "demo: MEM=$MEM: expected host or cuda" >&2; exit 2 ;; esac

scripts/setup.sh
if [[ $MEM == host ]] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
  && python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "demo: GPU present: a real NCCL all_reduce through the plugin (PyTorch, 2 ranks)"
  PARTS=bench MAX_BYTES=$((64 << 20)) exec scripts/e2e.sh
fi
cargo build --release --quiet --lib --bins
TD=${CARGO_TARGET_DIR:-$ROOT/target}
PERF=$TD/release/nccl-zip-perf
SO=$TD/release/libnccl_net_zip.so
WORK=$(mktemp -d)
cleanup() { "$ROOT/scripts/netns.sh" down >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
source "$ROOT/scripts/lib/pair.sh"
# run_pair starts "$BIN recv|send ...": this wrapper gives both ranks --mem $MEM.
BIN=$WORK/nccl-zip-perf
printf '#!/bin/sh\nrole=$1; shift\nexec "%s" "$role" --mem "%s" "$@"\n' "$PERF" "$MEM" >"$BIN"
chmod +x "$BIN"
# Fails early, with the tool's reason, if this machine or plugin cannot do MEM.
if ! "$BIN" loop --sizes 4K --count 1 --plugin "$SO" >"$WORK/mem.out" 2>&1; then
  echo "demo: MEM=$MEM does not run here:" >&2
  grep -v '^WARNS' "$WORK/mem.out" >&2
  exit 1
fi
MEMDESC=$(sed -n 's/^mem: //p' "$WORK/mem.out" | head -1)

SETS=()
if [ -f bench/data/weights.bf16 ] || scripts/make_tensors.sh >"$WORK/tensors.log" 2>&1; then
  for t in weights gradients activations; do
    [ -f "bench/data/$t.bf16" ] && SETS+=("real $t bf16=file:$ROOT/bench/data/$t.bf16")
  done
else
  echo "demo: real tensors unavailable (scripts/make_tensors.sh failed: $(tail -1 "$WORK/tensors.log")); using synthetic data only" >&2
fi
SETS+=("Gaussian bf16 (sigma 0.02)=bf16" "random bytes=random")

if [[ $RATE == none ]]; then
  "$ROOT/scripts/netns.sh" up none >&2
  LINK="unshaped veth"
else
  "$ROOT/scripts/netns.sh" up "$RATE" >&2
  LINK="veth shaped to $RATE"
fi
# auto as users run it: the plugin is not told the link's speed (tbf is invisible
# to it; the veth says 10 Gbit/s). A NCCL_ZIP_LINK_MBPS from the caller is
# dropped, so that no figure here is a hinted one.
unset NCCL_ZIP_LINK_MBPS

echo
echo "nccl-net-zip demo: 2 ranks, 2 network namespaces, $LINK, messages $SIZES, memory $MEMDESC"
echo
ROWS=()
for set in "${SETS[@]}"; do
  name=${set%%=*}
  DATA=${set#*=}
  for size in ${SIZES//,/ }; do
    zg=() og=() ng=() zw=() ow=() nw=()
    for ((i = 0; i < REPS; i++)); do
      z=$(NCCL_ZIP_COMPRESS=auto run_pair netns zip "$size" "$BYTES")
      n=$(NCCL_ZIP_COMPRESS=on run_pair netns zip "$size" "$BYTES")
      o=$(NCCL_ZIP_COMPRESS=off run_pair netns zip "$size" "$BYTES")
      zg+=("$(field GBps <<<"$z")") og+=("$(field GBps <<<"$o")") ng+=("$(field GBps <<<"$n")")
      zw+=("$(field wire_per_payload <<<"$z")") ow+=("$(field wire_per_payload <<<"$o")") nw+=("$(field wire_per_payload <<<"$n")")
    done
    zm=$(printf '%s\n' "${zg[@]}" | median)
    om=$(printf '%s\n' "${og[@]}" | median)
    nm=$(printf '%s\n' "${ng[@]}" | median)
    zwm=$(printf '%s\n' "${zw[@]}" | median)
    owm=$(printf '%s\n' "${ow[@]}" | median)
    nwm=$(printf '%s\n' "${nw[@]}" | median)
    row=$(awk -v n="$name" -v s="$size" -v z="$zm" -v o="$om" -v c="$nm" -v zw="$zwm" -v ow="$owm" -v cw="$nwm" \
      'BEGIN{printf "| %s | %s | %.3f (%.2f Gbit/s) | **%.2fx** | %.3f | %.3f (%.2fx) | %.3f | %.3f (%.2f Gbit/s) | %.2fx |", n, s, z, z*8, z/o, zw, c, c/o, cw, o, o*8, ow/cw}')
    echo "$row"
    ROWS+=("$row")
  done
done

DATE=$(date -u +%Y-%m-%d)
SUFFIX=; [[ $MEM == cuda ]] && SUFFIX=-cuda
# Results go to bench/results/ only when asked (OUT=bench/results/demo-...md);
# otherwise to a temporary file, so a demo run leaves the git tree clean.
OUT=${OUT:-$(mktemp "${TMPDIR:-/tmp}/nccl-zip-demo-${RATE}$SUFFIX-$DATE-XXXXXX.md")}
mkdir -p "$(dirname "$OUT")"
{
  echo "# Demo: compressed vs uncompressed through the plugin, $LINK, $MEM memory ($DATE)"
  echo
  echo "- Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, kernel $(uname -r); $([[ $MEM == host ]] && echo "no GPU (host-memory path, CPU codec)" || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | grep . || echo "no GPU")"
  echo "- Memory: \`--mem $MEM\` on both ranks: $MEMDESC; buffers registered $([[ $MEM == host ]] && echo NCCL_PTR_HOST || echo NCCL_PTR_CUDA)"
  echo "- Commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src codec || echo ' (modified)')"
  echo "- Command: \`RATE=$RATE SIZES=$SIZES BYTES=$BYTES REPS=$REPS MEM=$MEM $CMD\`"
  echo "- Every column: the same plugin, link and data, in the same run; only NCCL_ZIP_COMPRESS differs: auto (the default: adaptive), on (always run the codec), off (the uncompressed baseline). NCCL_ZIP_LINK_MBPS unset: auto is not told the link's speed."
  echo "- Throughput: receiver side, GB/s = 1e9 B/s (median of $REPS); wire: bytes counted by the receiving veth per payload byte (Ethernet/IP/TCP headers included)."
  echo "- Sender and receiver share this machine's 2 cores, so the encoder, the decoder and both TCP stacks compete for them: where \"on\" falls below \"off\", the CPU codec (not the link) is the limit."
  echo
  echo "| data | message | auto GB/s | auto / off | auto wire/payload | on GB/s (on / off) | on wire/payload | off GB/s | codec wire reduction |"
  echo "|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} >"$OUT"
echo
echo "written to ${OUT#$ROOT/}"
[[ $OUT == "$ROOT"/* ]] || echo "(a temporary file: set OUT=bench/results/demo-$RATE$SUFFIX-$DATE.md to keep it with the project's results)"
