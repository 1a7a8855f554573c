#!/usr/bin/env bash
# Frame format 1 against format 2 through the plugin (issue 19, item 4: what v2's
# slower encoder costs a user, and what its ratio gains): one sender and one
# receiver in two network namespaces (scripts/netns.sh), each pinned to its own
# core (one "node" each), one direction, NCCL_ZIP_LINK_MBPS unset. Per round, in a
# shuffled order: off, NCCL_ZIP_FORMAT=1 and =2 with NCCL_ZIP_COMPRESS=on (the
# codec always) and =auto (the default policy). Per cell it prints the medians of
# v2/v1 (same round), each against off, and the wire bytes per payload byte.
#   N=3 RATES='2gbit 10gbit none' DATAS='weights.bf16 embed92' scripts/bench_format.sh
# DATAS: files of bench/data (scripts/make_tensors.sh) by name, and the sparse
# classes of codec_bench (written with --dump): embed92 (embedding gradient, 92%
# zero rows), moe30 (MoE dispatch, 30% unfilled), f32bf16 (fp32 holding bf16 real
# weights), relu (ReLU of real activations, bf16), relu16 (the same, fp16).
# Needs root (network namespaces).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CMD="$0 $*"
N=${N:-3} BYTES=${BYTES:-$((256 << 20))} SIZE=${SIZE:-1M}
RATES=${RATES:-2gbit 10gbit none}
DATAS=${DATAS:-weights.bf16 activations.bf16 gradients.bf16 gradients.fp16 embed92 moe30 f32bf16 relu relu16}
read -r CA CB <<<"${CORES:-0 1}"
TD=${CARGO_TARGET_DIR:-$ROOT/target}
PERF=${PERF:-$TD/release/nccl-zip-perf}
SO=${SO:-$TD/release/libnccl_net_zip.so}
[[ -f $PERF && -f $SO ]] || cargo build --release --quiet --lib --bins
unset NCCL_ZIP_LINK_MBPS NCCL_ZIP_FORMAT NCCL_ZIP_COMPRESS
source scripts/lib/pair.sh
source scripts/lib/results.sh
netns_bench_setup bench_format
# the sparse classes, as codec_bench builds them (same seeds)
CARGO_TARGET_DIR=${CODEC_TARGET_DIR:-$ROOT/target-codec} cargo run --release -q -p nccl-zip-codec \
  --example codec_bench -- --only sparse --msg 262144 --secs 0.01 --no-zstd --dump "$WORK/dump" >/dev/null \
  || { echo "bench_format: codec_bench --dump failed" >&2; exit 1; }
path_of() { # data name → file
  local pat
  case $1 in
    embed92) pat='*embedding_grad__92_*' ;;
    moe30) pat='*MoE_dispatch__30_*' ;;
    f32bf16) pat='*fp32_holding_bf16__real*' ;;
    relu) pat='*ReLU*.bf16' ;;
    relu16) pat='*ReLU*.fp16' ;;
    *) echo "$ROOT/bench/data/$1"; return ;;
  esac
  # shellcheck disable=SC2086
  ls "$WORK"/dump/$pat | head -1
}
for d in $DATAS; do
  [[ -f $(path_of "$d") ]] || { echo "bench_format: no data $d" >&2; exit 1; }
done
export PIN_A=$CA PIN_B=$CB
MODES="off 1:on 2:on 1:auto 2:auto"
echo "N=$N BYTES=$BYTES SIZE=$SIZE RATES='$RATES' DATAS='$DATAS' cores $CA,$CB SEED=${SEED:-1} plugin=$SO"
: >"$WORK/runs"
for rate in $RATES; do
  scripts/netns.sh up "$rate" >/dev/null
  for ((i = 0; i < N; i++)); do
    for d in $DATAS; do
      DATA=file:$(path_of "$d")
      read -ra ms <<<"$(printf '%s\n' $MODES | awk -v s="$(cksum <<<"${SEED:-1} $i $rate $d" | cut -d' ' -f1)" 'BEGIN { srand(s) } { print rand(), $0 }' | sort -n | cut -d' ' -f2 | tr '\n' ' ')"
      for m in "${ms[@]}"; do
        if [[ $m == off ]]; then
          r=$(NCCL_ZIP_COMPRESS=off run_pair netns zip "$SIZE" "$BYTES") || continue
        else
          r=$(NCCL_ZIP_FORMAT=${m%%:*} NCCL_ZIP_COMPRESS=${m#*:} run_pair netns zip "$SIZE" "$BYTES") || continue
        fi
        results_record "$WORK/runs" "$rate $d $i $m" "$r"
      done
    done
  done
done
SUMMARY=$(awk 'function srt(a, n,  i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x } }
  function md(a, n) { srt(a, n); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  { k=$1" "$2; r=k" "$3; g[r" "$4]=$5; w[r" "$4]=$6; rounds[k]=rounds[k]" "$3; keys[k]=1 }
  END {
    for (k in keys) {
      n=split(rounds[k], rs, " "); m=0; split("", seen)
      for (j=1; j<=n; j++) { r=k" "rs[j]; if (seen[r]++) continue
        o=g[r" off"]; a1=g[r" 1:on"]; a2=g[r" 2:on"]; u1=g[r" 1:auto"]; u2=g[r" 2:auto"]
        if (o=="" || a1=="" || a2=="" || u1=="" || u2=="") continue
        m++; on21[m]=a2/a1; au21[m]=u2/u1; on1[m]=a1/o; on2[m]=a2/o; au1[m]=u1/o; au2[m]=u2/o
        w1[m]=w[r" 1:on"]; w2[m]=w[r" 2:on"]; x1[m]=w[r" 1:auto"]; x2[m]=w[r" 2:auto"] }
      if (!m) continue
      kk=k; gsub(/ /, " | ", kk)
      printf "| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.4f | %.4f | %.4f | %.4f | %d |\n", kk, md(on21, m), md(au21, m), md(on1, m), md(on2, m), md(au1, m), md(au2, m), md(w1, m), md(w2, m), md(x1, m), md(x2, m), m
    }
  }' "$WORK/runs" | sort -k2,2 -k4,4)
HEAD="| link | data | on: v2/v1 | auto: v2/v1 | on v1/off | on v2/off | auto v1/off | auto v2/off | wire on v1 | wire on v2 | wire auto v1 | wire auto v2 | rounds |"
echo
results_table "$HEAD" "$SUMMARY"
OUT=$(results_path format-e2e)
{
  results_head "Frame format 1 against 2 through the plugin, one direction, pinned nodes" \
    "; ranks pinned to cores $CA and $CB (taskset), NCCL_ZIP_LINK_MBPS unset" "$CMD" \
    "N=$N BYTES=$BYTES SIZE=$SIZE RATES='$RATES' DATAS='$DATAS' SEED=${SEED:-1}"
  echo "- Per round, in a shuffled order: off, then NCCL_ZIP_FORMAT=1 and 2, each with NCCL_ZIP_COMPRESS=on and auto. Each ratio is the median over rounds of the same round's pair. wire: receiver-side veth bytes per payload byte."
  echo
  results_table "$HEAD" "$SUMMARY"
  echo
  results_runs "link data round mode GB/s wire/payload" "$WORK/runs"
} >"$OUT"
echo
echo "written to ${OUT#$ROOT/}"
