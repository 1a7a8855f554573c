# Shared by the benchmark and demo scripts: runs one receiver/sender pair of
# nccl-zip-perf on loopback or across the zipa/zipb namespaces (scripts/netns.sh).
# Callers set BIN, SO, WORK and DATA; NCCL_ZIP_* variables in the environment
# reach both ranks. PIN_A / PIN_B (optional): CPU lists the sender's (zipa) and
# the receiver's (zipb) process is pinned to with taskset, one "node" each.

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
  # A fresh name per run, removed after it: a handle file left by an earlier run
  # under the same name would send the sender to a port nobody listens on.
  local h
  h=$(mktemp -u "$WORK/handle.XXXXXXXX")
  local args=(--handle-file "$h" --sizes "$size" --count "$n" --warmup 16 --bench
    --data "$DATA" --timeout 120 --plugin "$SO")
  [[ $transport == tcp ]] && args+=(--baseline tcp)
  local rpre=() spre=() renv=(NCCL_SOCKET_IFNAME=lo) senv=(NCCL_SOCKET_IFNAME=lo)
  if [[ $setting != loopback ]]; then
    rpre=(ip netns exec zipb) spre=(ip netns exec zipa)
    renv=(NCCL_SOCKET_IFNAME=zvb) senv=(NCCL_SOCKET_IFNAME=zva)
  fi
  [[ -n ${PIN_B:-} ]] && rpre+=(taskset -c "$PIN_B")
  [[ -n ${PIN_A:-} ]] && spre+=(taskset -c "$PIN_A")
  "${rpre[@]}" env "${renv[@]}" timeout 150 "$BIN" recv "${args[@]}" >"$WORK/r.out" 2>"$WORK/r.err" &
  local rpid=$!
  if ! "${spre[@]}" env "${senv[@]}" timeout 150 "$BIN" send "${args[@]}" >"$WORK/s.out" 2>"$WORK/s.err"; then
    echo "sender failed ($setting $transport $size):" >&2; cat "$WORK/s.err" >&2
  fi
  if ! wait "$rpid"; then
    rm -f "$h"
    echo "receiver failed ($setting $transport $size):" >&2; cat "$WORK/r.err" >&2; return 1
  fi
  rm -f "$h"
  echo "$(grep '^BENCH' "$WORK/r.out" | head -1) $(grep '^WIRE' "$WORK/r.out" | head -1)"
}

# run_bidir SIZE BYTES → both directions at once across the zipa/zipb namespaces:
# each rank (`nccl-zip-perf bidir`) sends BYTES to the other while receiving as
# much. Prints "GBps=<sum of both receivers' rates> GBps_a=.. GBps_b=..
# wire_per_payload=<mean of both receivers'>". PIN_A / PIN_B as for run_pair.
run_bidir() {
  local size=$1 total=$2
  local n=$(($(bytes_of "$size") > 0 ? total / $(bytes_of "$size") : 100))
  ((n < 64)) && n=64
  local ha hb
  ha=$(mktemp -u "$WORK/handle.XXXXXXXX") hb=$(mktemp -u "$WORK/handle.XXXXXXXX")
  local args=(--sizes "$size" --count "$n" --warmup 16 --bench --data "$DATA" --timeout 300 --plugin "$SO")
  local apre=(ip netns exec zipa) bpre=(ip netns exec zipb)
  [[ -n ${PIN_A:-} ]] && apre+=(taskset -c "$PIN_A")
  [[ -n ${PIN_B:-} ]] && bpre+=(taskset -c "$PIN_B")
  "${bpre[@]}" env NCCL_SOCKET_IFNAME=zvb timeout 330 "$BIN" bidir --handle-file "$hb" --peer-handle-file "$ha" \
    "${args[@]}" >"$WORK/b.out" 2>"$WORK/b.err" &
  local bpid=$! ok=1
  if ! "${apre[@]}" env NCCL_SOCKET_IFNAME=zva timeout 330 "$BIN" bidir --handle-file "$ha" --peer-handle-file "$hb" \
    "${args[@]}" >"$WORK/a.out" 2>"$WORK/a.err"; then
    echo "rank a failed ($size):" >&2; cat "$WORK/a.err" >&2; ok=0
  fi
  if ! wait "$bpid"; then
    echo "rank b failed ($size):" >&2; cat "$WORK/b.err" >&2; ok=0
  fi
  rm -f "$ha" "$hb"
  ((ok)) || return 1
  local ga gb wa wb
  ga=$(grep '^BENCH.* role=recv' "$WORK/a.out" | head -1 | field GBps)
  gb=$(grep '^BENCH.* role=recv' "$WORK/b.out" | head -1 | field GBps)
  wa=$(grep '^WIRE' "$WORK/a.out" | head -1 | field wire_per_payload)
  wb=$(grep '^WIRE' "$WORK/b.out" | head -1 | field wire_per_payload)
  awk -v a="$ga" -v b="$gb" -v wa="$wa" -v wb="$wb" \
    'BEGIN{printf "BIDIR GBps=%.3f GBps_a=%s GBps_b=%s wire_per_payload=%.4f\n", a+b, a, b, (wa+wb)/2}'
}

# netns_bench_setup NAME: what the scripts that run pairs across the namespaces
# share: a work folder removed at exit (the namespaces taken down with it), BIN the
# host-memory wrapper of $PERF, and bench/data's real tensors (made once; NAME
# names the caller in the error).
netns_bench_setup() {
  WORK=$(mktemp -d)
  trap '"$ROOT/scripts/netns.sh" down >/dev/null 2>&1; rm -rf "$WORK"' EXIT
  BIN=$WORK/perf
  printf '#!/bin/sh\nrole=$1; shift\nexec "%s" "$role" --mem host "$@"\n' "$PERF" >"$BIN"
  chmod +x "$BIN"
  [[ -f bench/data/weights.bf16 ]] || scripts/make_tensors.sh >"$WORK/tensors.log" 2>&1 \
    || { echo "$1: scripts/make_tensors.sh failed" >&2; exit 1; }
}

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

