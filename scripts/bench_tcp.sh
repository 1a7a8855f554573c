#!/usr/bin/env bash
# Plugin (TCP transport, uncompressed data path) vs. a single-socket TCP baseline
# (NCCL Socket-style: 4-byte size + payload, TCP_NODELAY), measured in the same
# run, at 128 KiB, 512 KiB and 4 MiB messages, in three settings:
#   (i)   loopback;
#   (ii)  two network namespaces joined by veth, tbf at 2 Gbit/s on both ends;
#   (iii) the same at 4 Gbit/s with every socket's TCP buffers capped
#         (NETNS_SOCKBUF, default 16 KiB) so that one stream's window is below the
#         path's bandwidth-delay product: a case one stream cannot fill. (The usual
#         recipe, netem delay, needs sch_netem, which this kernel lacks; a smaller
#         window instead of a longer RTT gives the same window/RTT limit.)
# Each figure is the receiver's throughput, the median of REPS runs (plugin and
# baseline alternate). Prints a markdown table and writes it to
# bench/results/tcp-<date>.md with the machine and the command. Needs root.
#
# OLD=path/to/old/libnccl_net_zip.so adds that build's runs (same rounds) and a
# new/old column: the no-regression check of a redesign.
# Env: REPS (3), BYTES_LO / BYTES_NS (bytes per size per run: 512 MiB / 256 MiB),
#      NETNS_SOCKBUF (16384), SIZES (128K,512K,4M), DATA (random),
#      plus any NCCL_ZIP_* variable for the plugin side.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CMD="$0 $*"
REPS=${REPS:-3}
BYTES_LO=${BYTES_LO:-$((512 << 20))}
BYTES_NS=${BYTES_NS:-$((256 << 20))}
SOCKBUF=${NETNS_SOCKBUF:-16384}
SIZES=${SIZES:-128K,512K,4M}
DATA=${DATA:-random}

cargo build --release --quiet
TD=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TD/release/nccl-zip-perf
SO=$TD/release/libnccl_net_zip.so
WORK=$(mktemp -d)
cleanup() { "$ROOT/scripts/netns.sh" down >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT

source "$ROOT/scripts/lib/pair.sh"
source "$ROOT/scripts/lib/results.sh"

ROWS=()
measure() { # SETTING BYTES
  local setting=$1 total=$2
  for size in ${SIZES//,/ }; do
    local zg=() tg=() zw=() tw=() og=()
    for ((i = 0; i < REPS; i++)); do
      local z t o
      z=$(run_pair "$setting" zip "$size" "$total")
      t=$(run_pair "$setting" tcp "$size" "$total")
      if [[ -n ${OLD:-} ]]; then
        o=$(SO=$OLD run_pair "$setting" zip "$size" "$total")
        og+=("$(field GBps <<<"$o")")
      fi
      zg+=("$(field GBps <<<"$z")") tg+=("$(field GBps <<<"$t")")
      zw+=("$(field wire_per_payload <<<"$z")") tw+=("$(field wire_per_payload <<<"$t")")
    done
    local zm tm ratio zwm twm
    zm=$(printf '%s\n' "${zg[@]}" | median)
    tm=$(printf '%s\n' "${tg[@]}" | median)
    zwm=$(printf '%s\n' "${zw[@]}" | median)
    twm=$(printf '%s\n' "${tw[@]}" | median)
    ratio=$(awk -v a="$zm" -v b="$tm" 'BEGIN{printf "%.2f", a/b}')
    local old="" om
    if [[ -n ${OLD:-} ]]; then
      om=$(printf '%s\n' "${og[@]}" | median)
      old=$(awk -v a="$zm" -v o="$om" -v r="${og[*]}" 'BEGIN{printf " %.3f | %.2f | %s |", o, a/o, r}')
    fi
    local row
    row=$(awk -v s="$setting" -v z="$size" -v zm="$zm" -v tm="$tm" -v r="$ratio" \
      -v zr="${zg[*]}" -v tr="${tg[*]}" -v zw="$zwm" -v tw="$twm" \
      'BEGIN{printf "| %s | %s | %.3f (%.2f Gbit/s) | %.3f (%.2f Gbit/s) | %s | %s / %s | %s / %s |", s, z, zm, zm*8, tm, tm*8, r, zr, tr, zw, tw}')
    row+=$old
    echo "$row" >&2
    ROWS+=("$row")
  done
}

echo "== (i) loopback" >&2
measure loopback "$BYTES_LO"
echo "== (ii) netns, tbf 2 Gbit/s" >&2
"$ROOT/scripts/netns.sh" up 2gbit >&2
measure "netns 2 Gbit/s" "$BYTES_NS"
echo "== (iii) netns, tbf 4 Gbit/s, socket buffers capped at $SOCKBUF B" >&2
NETNS_SOCKBUF=$SOCKBUF "$ROOT/scripts/netns.sh" up 4gbit >&2
measure "netns 4 Gbit/s, TCP buffers <= $SOCKBUF B" "$BYTES_NS"
"$ROOT/scripts/netns.sh" down >&2

OUTF=$(results_path tcp)
{
  results_head "TCP transport: plugin vs single-socket TCP" "" \
    "$CMD" "REPS=$REPS BYTES_LO=$BYTES_LO BYTES_NS=$BYTES_NS NETNS_SOCKBUF=$SOCKBUF DATA=$DATA"
  echo "- Throughput: receiver side, GB/s = 1e9 B/s, median of $REPS runs; 16 untimed warm-up messages per run."
  echo "- Wire/payload: bytes counted by the receiver's interface over the whole run (rx; on lo, both directions) per payload byte, warm-up included; Ethernet/IP/TCP headers included."
  if [[ -n ${OLD:-} ]]; then
    echo "- old: $OLD, run in the same rounds; new/old: plugin / old medians."
    echo
    echo "| setting | message | plugin GB/s | TCP baseline GB/s | plugin/baseline | runs plugin / baseline (GB/s) | wire/payload plugin / baseline | old GB/s | new/old | runs old |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
  else
    echo
    echo "| setting | message | plugin GB/s | TCP baseline GB/s | plugin/baseline | runs plugin / baseline (GB/s) | wire/payload plugin / baseline |"
    echo "|---|---|---|---|---|---|---|"
  fi
  printf '%s\n' "${ROWS[@]}"
} >"$OUTF"
cat "$OUTF"
echo "written to ${OUTF#$ROOT/}" >&2
