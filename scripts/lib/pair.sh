# Shared by the benchmark and demo scripts: runs one receiver/sender pair of
# nccl-zip-perf on loopback or across the zipa/zipb namespaces (scripts/netns.sh).
# Callers set BIN, SO, WORK and DATA; NCCL_ZIP_* variables in the environment
# reach both ranks.

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

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

