#!/usr/bin/env bash
# The adaptive policy's matrix (issue 21): {one direction, both directions} x
# {2gbit, 10gbit, none} x {real bf16 weights, random bytes}, two ranks in two
# network namespaces (scripts/netns.sh), each pinned to its own core with taskset
# (one "node" each), NCCL_ZIP_LINK_MBPS unset (as users run it). auto, on and off
# (and off2, a second off run: the noise floor) run interleaved, N rounds, the
# order rotating from round to round; per cell it prints the median and minimum of
# auto/off and auto/max(on, off) (per round), and writes bench/results/.
#   N=5 BYTES=$((1<<30)) CELLS='both:2gbit:bf16 one:none:*' SIZE=1M scripts/bench_adapt.sh
#   A=old.so B=new.so scripts/bench_adapt.sh     compares two builds (same rounds)
# CELLS: space-separated DIR:RATE:DATA globs (default all). CORES: two CPUs
# (default "0 1"). Both directions: each rank sends BYTES and receives as much;
# the figure is the sum of both receivers' rates. Needs root.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CMD="$0 $*"
N=${N:-5} BYTES=${BYTES:-$((1 << 30))} SIZE=${SIZE:-1M} CELLS=${CELLS:-*:*:*}
read -r CA CB <<<"${CORES:-0 1}"
TD=${CARGO_TARGET_DIR:-$ROOT/target}
PERF=${PERF:-$TD/release/nccl-zip-perf}
if [[ -n ${A:-} || -n ${B:-} ]]; then
  : "${A:?A=old .so}" "${B:?B=new .so}"
  BUILDS="A B"
else
  A=$TD/release/libnccl_net_zip.so
  BUILDS=A
  [[ -f $PERF && -f $A ]] || cargo build --release --quiet --lib --bins
fi
unset NCCL_ZIP_LINK_MBPS
source scripts/lib/pair.sh
source scripts/lib/results.sh
netns_bench_setup bench_adapt
export PIN_A=$CA PIN_B=$CB
# off2: a second `off` run in each round, first: off2/off is the noise floor
# of the cell (what two identical runs differ by on this machine). CONTROL=0 drops it.
MODES="auto on off"
[[ ${CONTROL:-1} == 0 ]] || MODES="off2 $MODES"

wanted() { # dir rate data
  local c
  for c in $CELLS; do
    # shellcheck disable=SC2053
    [[ $1 == ${c%%:*} && $2 == $(cut -d: -f2 <<<"$c") && $3 == ${c##*:} ]] && return 0
  done
  return 1
}

echo "N=$N BYTES=$BYTES SIZE=$SIZE CELLS=$CELLS ORDER=${ORDER:-rotate} cores $CA,$CB builds: $(for v in $BUILDS; do echo -n "$v=${!v} "; done)"
: >"$WORK/runs"
for rate in 2gbit 10gbit none; do
  cells=()
  for dir in one both; do
    for data in bf16 random; do
      wanted "$dir" "$rate" "$data" && cells+=("$dir:$data")
    done
  done
  ((${#cells[@]})) || continue
  scripts/netns.sh up "$rate" >/dev/null
  for ((i = 0; i < N; i++)); do
    for cell in "${cells[@]}"; do
      dir=${cell%%:*} data=${cell##*:}
      case $data in bf16) DATA=file:$ROOT/bench/data/weights.bf16 ;; *) DATA=random ;; esac
      for v in $BUILDS; do
        SO=${!v}
        # The modes' order changes from round to round: a run's position in
        # the round (the machine's state after the runs before it) must not
        # favour one mode (a fixed order showed off2/off up to 1.2 unshaped).
        # ORDER=rotate: rotated by one each round (then `off` always follows
        # `on`, the slowest run, in 3 rounds of 4); ORDER=shuffle: a random
        # order per round (SEED, default 1, so a run can be repeated).
        read -ra ms <<<"$MODES"
        [[ ${ORDER:-rotate} == shuffle ]] && read -ra ms <<<"$(printf '%s\n' "${ms[@]}" | awk -v s="$(cksum <<<"${SEED:-1} $i $cell $v" | cut -d' ' -f1)" 'BEGIN { srand(s) } { print rand(), $0 }' | sort -n | cut -d' ' -f2 | tr '\n' ' ')"
        for ((j = 0; j < ${#ms[@]}; j++)); do
          if [[ ${ORDER:-rotate} == shuffle ]]; then m=${ms[j]}; else m=${ms[(i + j) % ${#ms[@]}]}; fi
          if [[ $dir == both ]]; then
            r=$(NCCL_ZIP_COMPRESS=${m%2} run_bidir "$SIZE" "$BYTES") || continue
          else
            r=$(NCCL_ZIP_COMPRESS=${m%2} run_pair netns zip "$SIZE" "$BYTES") || continue
          fi
          results_record "$WORK/runs" "$v $dir $rate $data $i $m" "$r"
        done
      done
    done
  done
done
# Per build and cell: per round auto/off and auto/max(on,off); median and minimum.
SUMMARY=$(awk 'function srt(a, n,  i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x } }
  function med(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  {k=$1" "$2" "$3" "$4; r=k" "$5; g[r" "$6]=$7; w[r" "$6]=$8; rounds[k]=rounds[k]" "$5; keys[k]=1}
  END {
    for (k in keys) {
      n=split(rounds[k], rs, " "); m=0; q=0; p=0; split("", seen)
      for (j=1; j<=n; j++) { r=k" "rs[j]; if (seen[r]++) continue
        a=g[r" auto"]; o=g[r" off"]; c=g[r" on"]; if (a=="" || o=="" || c=="") continue
        m++; vo[m]=a/o; vb[m]=a/(c>o?c:o); vc[m]=c/o; ww[m]=w[r" auto"]
        ra[m]=a; p++; po[p]=o
        x=g[r" off2"]; if (x!="") { q++; vn[q]=x/o; p++; po[p]=x } }
      if (!m) continue
      srt(vo, m); srt(vb, m); srt(vc, m); srt(ww, m); srt(vn, q); srt(ra, m); srt(po, p)
      kk=k; gsub(/ /, " | ", kk)
      noise = q ? sprintf("%.3f (%.3f-%.3f)", vn[int((q+1)/2)], vn[1], vn[q]) : "-"
      printf "| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.4f | %s | %.3f | %d |\n", kk, vo[int((m+1)/2)], vo[1], vb[int((m+1)/2)], vb[1], vc[int((m+1)/2)], ww[int((m+1)/2)], noise, med(ra, m) / med(po, p), m
    }
  }' "$WORK/runs" | sort)
HEAD="| build | direction | link | data | auto/off median | auto/off min | auto/best median | auto/best min | on/off median | auto wire/payload | off2/off median (min-max) | auto/off pooled | rounds |"
echo
results_table "$HEAD" "$SUMMARY"
OUT=$(results_path adapt-matrix)
{
  results_head "Adaptive policy matrix: one and both directions, pinned nodes" \
    "; ranks pinned to cores $CA and $CB (taskset), NCCL_ZIP_LINK_MBPS unset" "$CMD" \
    "N=$N BYTES=$BYTES SIZE=$SIZE CELLS='$CELLS' ORDER=${ORDER:-rotate}"
  for v in $BUILDS; do echo "- Build $v: ${!v}"; done
  echo "- Per round (off2, auto, on, off of one build back to back, the order rotating from round to round, or shuffled per round with ORDER=shuffle): auto/off and auto/max(on, off); median and minimum over the rounds. Both directions: the sum of both receivers' rates; wire: receiver-side veth bytes per payload byte (mean of both ranks). off2/off: a second \`off\` run of the same round against the first, the cell's noise floor. auto/off pooled: the median of auto's runs over the median of all \`off\` and \`off2\` runs (2N runs: less noise where runs, not rounds, vary)."
  echo
  results_table "$HEAD" "$SUMMARY"
  echo
  results_runs "build direction link data round mode GB/s wire/payload" "$WORK/runs"
} >"$OUT"
echo
echo "written to ${OUT#$ROOT/}"
