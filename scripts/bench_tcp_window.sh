#!/usr/bin/env bash
# The window-limited TCP cell of scripts/bench_tcp.sh, focused (issue 20): two
# builds (OLD and NEW) send random bytes (every mode sends raw) across the
# zipa/zipb namespaces at 4 Gbit/s with TCP buffers capped at SOCKBUF bytes,
# interleaved, the order rotating from round to round. BUSY=1 runs one busy
# process (`yes`) beside the two ranks for the whole run, as a training job
# shares a node's CPUs. Prints every run, then per size each build's sorted runs,
# its median and NEW/OLD of the medians; OUT=file also writes that table there.
#   OLD=/tmp/zip-old/target/release/libnccl_net_zip.so BUSY=1 N=6 scripts/bench_tcp_window.sh
# Needs root (scripts/netns.sh) and a built nccl-zip-perf (PERF).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${OLD:?OLD=path/to/old/libnccl_net_zip.so}"
NEW=${NEW:-$ROOT/target/release/libnccl_net_zip.so}
N=${N:-6} SIZES=${SIZES:-512K 4M} SOCKBUF=${SOCKBUF:-16384} BYTES=${BYTES:-268435456}
BIN=${PERF:-$ROOT/target/release/nccl-zip-perf}
[[ -x $BIN && -f $NEW ]] || cargo build --release --quiet --lib --bins
export BIN DATA=random
WORK=$(mktemp -d)
export WORK
busy=
cleanup() {
  [[ -n $busy ]] && kill "$busy" 2>/dev/null
  "$ROOT/scripts/netns.sh" down >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT
source scripts/lib/pair.sh
NETNS_SOCKBUF=$SOCKBUF scripts/netns.sh up 4gbit >/dev/null
if [[ ${BUSY:-0} == 1 ]]; then
  yes >/dev/null &
  busy=$!
fi
builds=(old new)
declare -A so=([old]=$OLD [new]=$NEW)
: >"$WORK/runs"
for ((r = 0; r < N; r++)); do
  for size in $SIZES; do
    for k in 0 1; do
      b=${builds[$(((k + r) % 2))]}
      export SO=${so[$b]}
      line=$(run_pair netns zip "$size" "$BYTES") || continue
      g=$(field GBps <<<"$line")
      echo "round=$r size=$size build=$b GBps=$g"
      echo "$size $b $g" >>"$WORK/runs"
    done
  done
done
TABLE=$(awk '
  function srt(a, n,  i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x } }
  function med(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  { k = $1 " " $2; n[k]++; v[k, n[k]] = $3; sizes[$1] = 1 }
  END {
    for (s in sizes) {
      line = "| " s
      for (b = 1; b <= 2; b++) {
        bn = b == 1 ? "old" : "new"; k = s " " bn; m = n[k]
        for (i = 1; i <= m; i++) a[i] = v[k, i]
        srt(a, m); runs = ""
        for (i = 1; i <= m; i++) runs = runs (i > 1 ? " " : "") a[i]
        md[bn] = m ? med(a, m) : 0
        line = line sprintf(" | %s | %.4f", runs, md[bn])
      }
      printf "%s | %.3f |\n", line, md["old"] ? md["new"] / md["old"] : 0
    }
  }' "$WORK/runs" | sort)
HEAD="| message | old runs (GB/s, sorted) | old median | new runs | new median | new/old |"
echo
echo "$HEAD"
echo "|---|---|---|---|---|---|"
echo "$TABLE"
if [[ -n ${OUT:-} ]]; then
  {
    echo "# Window-limited TCP cell: $NEW against $OLD ($(date -u +%F))"
    echo
    echo "- Command: \`OLD=$OLD NEW=$NEW N=$N SIZES='$SIZES' SOCKBUF=$SOCKBUF BUSY=${BUSY:-0} scripts/bench_tcp_window.sh\`"
    echo "- Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs; 4 Gbit/s, TCP buffers <= $SOCKBUF B, $BYTES B of random bytes per run"
    echo
    echo "$HEAD"
    echo "|---|---|---|---|---|---|"
    echo "$TABLE"
  } >"$OUT"
  echo "written to $OUT"
fi
