#!/usr/bin/env bash
# A/B of two builds of the plugin on the same link, runs interleaved so that the
# machine's noise falls on both alike: for each round, A and B each run
# NCCL_ZIP_COMPRESS=auto and =off, and the script prints one line per run and the
# means. Used to compare adaptive-policy changes (bench/results/adapt-*.md).
# MODES (default "auto off") picks the NCCL_ZIP_COMPRESS settings, e.g. MODES=on
# to compare codec speed.
#   A=path/to/old/libnccl_net_zip.so B=path/to/new/libnccl_net_zip.so \
#   RATE=none|2gbit|... SIZE=4M BYTES=$((512<<20)) DATA=bf16 N=6 scripts/ab_plugin.sh
# Needs root (network namespaces, scripts/netns.sh) and a built nccl-zip-perf
# (PERF, default target/release/nccl-zip-perf).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${A:?A=old plugin .so}" "${B:?B=new plugin .so}"
PERF=${PERF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/nccl-zip-perf}
MODES=${MODES:-auto off}
RATE=${RATE:-none} SIZE=${SIZE:-4M} BYTES=${BYTES:-$((512 << 20))} DATA=${DATA:-bf16} N=${N:-6}
WORK=$(mktemp -d)
trap '"$ROOT/scripts/netns.sh" down >/dev/null 2>&1; rm -rf "$WORK"' EXIT
source scripts/lib/pair.sh
BIN=$WORK/perf
printf '#!/bin/sh\nrole=$1; shift\nexec "%s" "$role" --mem host "$@"\n' "$PERF" >"$BIN"
chmod +x "$BIN"
scripts/netns.sh up "$RATE" >&2
# The link's speed is not passed (users do not); HINT=1 passes it as
# NCCL_ZIP_LINK_MBPS, as this script did before issue 21.
if [[ ${HINT:-0} == 1 && $RATE != none ]]; then
  export NCCL_ZIP_LINK_MBPS=$(awk -v r="${RATE,,}" 'BEGIN{ if (r ~ /gbit$/) print r*1000; else if (r ~ /mbit$/) print r+0; else print 10000 }')
fi
echo "A=$A"
echo "B=$B"
echo "RATE=$RATE SIZE=$SIZE BYTES=$BYTES DATA=$DATA N=$N"
for ((i = 0; i < N; i++)); do
  for v in A B; do
    SO=${!v}
    for m in $MODES; do
      r=$(NCCL_ZIP_COMPRESS=$m run_pair netns zip "$SIZE" "$BYTES") || continue
      echo "$v $m $(field GBps <<<"$r") $(field wire_per_payload <<<"$r")"
    done
  done
done | tee "$WORK/runs"
awk '{k=$1" "$2; s[k]+=$3; n[k]++; w[k]+=$4}
  END {for (k in s) printf "mean %s: %.3f GB/s, wire/payload %.4f (%d runs)\n", k, s[k]/n[k], w[k]/n[k], n[k]}' "$WORK/runs" | sort
