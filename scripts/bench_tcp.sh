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

bytes_of() { # 128K → 131072
  local s=$1
  case $s in
    *K) echo $((${s%K} << 10)) ;;
    *M) echo $((${s%M} << 20)) ;;
    *) echo "$s" ;;
  esac
}

# run_pair SETTING TRANSPORT SIZE BYTES → prints the receiver's BENCH line
run_pair() {
  local setting=$1 transport=$2 size=$3 total=$4
  local n=$(($(bytes_of "$size") > 0 ? total / $(bytes_of "$size") : 100))
  ((n < 64)) && n=64
  local h=$WORK/handle.$RANDOM
  local args=(--handle-file "$h" --sizes "$size" --count "$n" --warmup 16 --bench
    --data "$DATA" --timeout 120 --plugin "$SO")
  [[ $transport == tcp ]] && args+=(--baseline tcp)
  local rpre=() spre=() renv=(NCCL_SOCKET_IFNAME=lo) senv=(NCCL_SOCKET_IFNAME=lo)
  if [[ $setting != loopback ]]; then
    rpre=(ip netns exec zipb) spre=(ip netns exec zipa)
    renv=(NCCL_SOCKET_IFNAME=zvb) senv=(NCCL_SOCKET_IFNAME=zva)
  fi
  "${rpre[@]}" env "${renv[@]}" timeout 150 "$BIN" recv "${args[@]}" >"$WORK/r.out" 2>"$WORK/r.err" &
  local rpid=$!
  if ! "${spre[@]}" env "${senv[@]}" timeout 150 "$BIN" send "${args[@]}" >"$WORK/s.out" 2>"$WORK/s.err"; then
    echo "sender failed ($setting $transport $size):" >&2; cat "$WORK/s.err" >&2
  fi
  if ! wait "$rpid"; then
    echo "receiver failed ($setting $transport $size):" >&2; cat "$WORK/r.err" >&2; return 1
  fi
  echo "$(grep '^BENCH' "$WORK/r.out" | head -1) $(grep '^WIRE' "$WORK/r.out" | head -1)"
}

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

ROWS=()
measure() { # SETTING BYTES
  local setting=$1 total=$2
  for size in ${SIZES//,/ }; do
    local zg=() tg=() zw=() tw=()
    for ((i = 0; i < REPS; i++)); do
      local z t
      z=$(run_pair "$setting" zip "$size" "$total")
      t=$(run_pair "$setting" tcp "$size" "$total")
      zg+=("$(field GBps <<<"$z")") tg+=("$(field GBps <<<"$t")")
      zw+=("$(field wire_per_payload <<<"$z")") tw+=("$(field wire_per_payload <<<"$t")")
    done
    local zm tm ratio zwm twm
    zm=$(printf '%s\n' "${zg[@]}" | median)
    tm=$(printf '%s\n' "${tg[@]}" | median)
    zwm=$(printf '%s\n' "${zw[@]}" | median)
    twm=$(printf '%s\n' "${tw[@]}" | median)
    ratio=$(awk -v a="$zm" -v b="$tm" 'BEGIN{printf "%.2f", a/b}')
    local row
    row=$(awk -v s="$setting" -v z="$size" -v zm="$zm" -v tm="$tm" -v r="$ratio" \
      -v zr="${zg[*]}" -v tr="${tg[*]}" -v zw="$zwm" -v tw="$twm" \
      'BEGIN{printf "| %s | %s | %.3f (%.2f Gbit/s) | %.3f (%.2f Gbit/s) | %s | %s / %s | %s / %s |", s, z, zm, zm*8, tm, tm*8, r, zr, tr, zw, tw}')
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

DATE=$(date -u +%Y-%m-%d)
OUTF=$ROOT/bench/results/tcp-$DATE.md
mkdir -p "$ROOT/bench/results"
{
  echo "# TCP transport: plugin vs single-socket TCP ($DATE)"
  echo
  echo "- Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, kernel $(uname -r)"
  echo "- Commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src || echo ' (src/ modified)')"
  echo "- Command: \`$CMD\` (REPS=$REPS BYTES_LO=$BYTES_LO BYTES_NS=$BYTES_NS NETNS_SOCKBUF=$SOCKBUF DATA=$DATA)"
  echo "- Plugin settings: $(env | grep '^NCCL_ZIP_' | tr '\n' ' ' || true)(unset = defaults)"
  echo "- Throughput: receiver side, GB/s = 1e9 B/s, median of $REPS runs; 16 untimed warm-up messages per run."
  echo "- Wire/payload: bytes counted by the receiver's interface over the whole run (rx; on lo, both directions) per payload byte, warm-up included; Ethernet/IP/TCP headers included."
  echo
  echo "| setting | message | plugin GB/s | TCP baseline GB/s | plugin/baseline | runs plugin / baseline (GB/s) | wire/payload plugin / baseline |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} >"$OUTF"
cat "$OUTF"
echo "written to ${OUTF#$ROOT/}" >&2
