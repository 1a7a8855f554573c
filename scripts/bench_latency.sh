#!/usr/bin/env bash
# Small-message latency: one message in flight, from isend to the receive being
# done (`nccl-zip-perf loop --latency`), for the plugin and for NCCL's Socket
# transport as it runs by default (one non-blocking socket polled by the progress
# thread, no helper threads: `--baseline tcp`), in the same run, over loopback.
#
# Variants, interleaved round by round so that the machine's noise hits all alike:
#   tcp        the single-socket baseline as NCCL's Socket transport moves a
#              request: the 4-byte size, then the payload, each its own socket
#              operation on both sides
#   tcp1w      the same with size and payload in one write and one read: a floor
#              for any transport over one TCP socket
#   auto       the plugin, defaults (small raw messages on the inline stream)
#   off        the plugin, NCCL_ZIP_COMPRESS=off
#   threads    the plugin with NCCL_ZIP_INLINE_MAX=0: every message through the
#              I/O threads (the path all messages took before the inline stream)
# OLD=path/to/old/libnccl_net_zip.so adds "old" (that build, defaults) to every
# round and an auto/old column: the no-regression check of a redesign.
# Each cell: median (the lower middle for an even REPS) over REPS rounds of each round's p50 (and of its p99), in us.
# Prints a markdown table and writes it to bench/results/latency-<date>.md (or $OUT).
#
# Env: REPS (5), COUNT (2000 timed messages per size and round), SIZES
#      (8,1K,4K,16K,64K,256K), plus any NCCL_ZIP_* variable for every plugin variant.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CMD="$0 $*"
REPS=${REPS:-5}
COUNT=${COUNT:-2000}
SIZES=${SIZES:-8,1K,4K,16K,64K,256K}

cargo build --release --quiet
TD=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TD/release/nccl-zip-perf
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$ROOT/scripts/lib/pair.sh" # bytes_of, median
source "$ROOT/scripts/lib/results.sh"

VARIANTS=(tcp tcp1w auto off threads)
[[ -z ${OLD:-} ]] || VARIANTS+=(old)
run() { # VARIANT → LAT lines
  local args=(loop --latency --sizes "$SIZES" --count "$COUNT" --warmup 200 --timeout 300)
  case $1 in
    tcp) env NCCL_SOCKET_IFNAME=lo "$BIN" "${args[@]}" --baseline tcp ;;
    tcp1w) env NCCL_SOCKET_IFNAME=lo "$BIN" "${args[@]}" --baseline tcp-onewrite ;;
    auto) env NCCL_SOCKET_IFNAME=lo "$BIN" "${args[@]}" ;;
    off) env NCCL_SOCKET_IFNAME=lo NCCL_ZIP_COMPRESS=off "$BIN" "${args[@]}" ;;
    threads) env NCCL_SOCKET_IFNAME=lo NCCL_ZIP_INLINE_MAX=0 "$BIN" "${args[@]}" ;;
    old) env NCCL_SOCKET_IFNAME=lo "$BIN" "${args[@]}" --plugin "$OLD" ;;
  esac | grep '^LAT '
}

for ((i = 0; i < REPS; i++)); do
  for v in "${VARIANTS[@]}"; do
    run "$v" | sed "s/^LAT [a-z0-9]* /LAT $v /" >>"$WORK/all"
  done
  echo "round $((i + 1))/$REPS done" >&2
done

# cell VARIANT SIZE FIELD → median over rounds
cell() {
  awk -v v="$1" -v s="$2" -v f="$3" '$2 == v && $4 == s { for (i = 5; i < NF; i += 2) if ($i == f) print $(i + 1) }' "$WORK/all" |
    median | grep . || echo -
}

OUTF=$(results_path latency)
{
  results_head "Small-message latency: plugin vs NCCL Socket-style single socket" "; loopback" \
    "$CMD" "REPS=$REPS COUNT=$COUNT SIZES=$SIZES"
  echo "- One message in flight, isend to receive done, one polling thread (nccl-zip-perf loop --latency);"
  echo "  each cell is the median over $REPS interleaved rounds of the round's p50 (p99 in brackets), microseconds."
  echo "- tcp: one non-blocking socket polled by the same thread, as NCCL's Socket transport does by default (no helper"
  echo "  threads): the 4-byte size, then the payload, each its own socket operation. tcp1w: both in one write and one read."
  echo "  threads: NCCL_ZIP_INLINE_MAX=0, every message through the I/O threads."
  echo
  if [[ -n ${OLD:-} ]]; then
    echo "- old: $OLD (defaults), in the same rounds; auto/old < 1 means the new build is faster."
    echo
    echo "| size | tcp | tcp1w | auto | off | threads | old | auto/tcp | auto/tcp1w | threads/tcp | auto/old |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
  else
    echo "| size | tcp | tcp1w | auto | off | threads | auto/tcp | auto/tcp1w | threads/tcp |"
    echo "|---|---|---|---|---|---|---|---|---|"
  fi
  for s in ${SIZES//,/ }; do
    b=$(bytes_of "$s")
    row="| $s"
    for v in "${VARIANTS[@]}"; do
      row+=" | $(cell "$v" "$b" p50_us) ($(cell "$v" "$b" p99_us))"
    done
    t=$(cell tcp "$b" p50_us) t1=$(cell tcp1w "$b" p50_us) a=$(cell auto "$b" p50_us) th=$(cell threads "$b" p50_us)
    row+=$(awk -v t="$t" -v t1="$t1" -v a="$a" -v th="$th" 'BEGIN{printf " | %.2f | %.2f | %.2f |", a/t, a/t1, th/t}')
    if [[ -n ${OLD:-} ]]; then
      row+=$(awk -v a="$a" -v o="$(cell old "$b" p50_us)" 'BEGIN{printf " %.2f |", a/o}')
    fi
    echo "$row"
  done
} >"$OUTF"
cat "$OUTF"
echo "written to ${OUTF#$ROOT/}" >&2
