#!/usr/bin/env bash
# Real NCCL end to end (issue 6): PyTorch collectives through the plugin, bit-exact
# against NCCL's own Socket transport, and faster on a bandwidth-bound link.
#
# Needs a GPU and PyTorch with CUDA; without them it prints SKIP and exits 0.
# Two ranks share GPU 0 and look like two nodes to NCCL (distinct NCCL_HOSTID).
# They sit in two network namespaces joined by a veth shaped to RATE; if namespaces
# cannot be made here, both ranks use loopback and the run says so.
#
# Runs, each with NCCL_PROTO = Simple, LL and LL128:
#   socket : NCCL_NET=Socket, no plugin (the baseline)
#   off    : the plugin with NCCL_ZIP_COMPRESS=off
#   zip    : the plugin with NCCL_ZIP_COMPRESS=auto
# then compares every result hash with the Socket run (must be identical), measures
# bus bandwidth for bf16 all_reduce (Gaussian and incompressible) in all three, and
# trains a small GPT with DDP over Socket and over the plugin (losses identical).
#
# Env: RATE (10gbit; "none" for unshaped), OUT (results folder; default
# bench/results/e2e-<date>), STEPS (30), MAX_BYTES (256M for bench),
# MAX_BYTES_CHECK (16M), PARTS (check,bench,train: which parts to run).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RATE=${RATE:-10gbit}
DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-$ROOT/bench/results/e2e-$DATE}
STEPS=${STEPS:-30}
mkdir -p "$OUT"
log() { echo "e2e: $*" | tee -a "$OUT/e2e.log" >&2; }

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: e2e needs an NVIDIA GPU (nvidia-smi found none)"; exit 0
fi
if ! python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP: e2e needs PyTorch with CUDA"; exit 0
fi

cargo build --release --lib --quiet || { log "build failed"; exit 1; }
SO=${CARGO_TARGET_DIR:-$ROOT/target}/release/libnccl_net_zip.so
PLUGIN=$OUT/libnccl-net-zip.so
cp "$SO" "$PLUGIN"

{
  echo "date: $DATE"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
  echo "commit: $(git rev-parse --short HEAD)"
  echo "command: RATE=$RATE $0 $*"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" >&2

# Network: namespaces if we can, loopback otherwise.
NS=1
if "$ROOT/scripts/netns.sh" up "$RATE" >>"$OUT/e2e.log" 2>&1; then
  A_EXEC=(ip netns exec zipa) B_EXEC=(ip netns exec zipb)
  A_IF=zva B_IF=zvb MASTER=10.233.0.1
  [[ $RATE != none ]] && export NCCL_ZIP_LINK_MBPS=$(awk -v r="${RATE,,}" 'BEGIN{ if (r ~ /gbit$/) print r*1000; else print r+0 }')
  log "ranks in namespaces zipa/zipb, veth shaped to $RATE"
else
  NS=0 A_EXEC=() B_EXEC=() A_IF=lo B_IF=lo MASTER=127.0.0.1
  log "network namespaces unavailable here: both ranks on loopback, unshaped (see e2e.log)"
fi
trap '"$ROOT/scripts/netns.sh" down >/dev/null 2>&1 || true' EXIT

# run NAME TRANSPORT PROTO MODE ARGS...: two ranks, results in $OUT/NAME.rank{0,1}.json
run() {
  local name=$1 transport=$2 proto=$3 mode=$4
  shift 4
  local common=(NCCL_PROTO="$proto" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_P2P_DISABLE=1
    NCCL_SHM_DISABLE=1 NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 WORLD_SIZE=2
    MASTER_ADDR=$MASTER MASTER_PORT=$((29500 + RANDOM % 1000)))
  case $transport in
    socket) common+=(NCCL_NET=Socket) ;;
    off) common+=(NCCL_NET=Zip NCCL_NET_PLUGIN="$PLUGIN" NCCL_ZIP_COMPRESS=off) ;;
    zip) common+=(NCCL_NET=Zip NCCL_NET_PLUGIN="$PLUGIN" NCCL_ZIP_COMPRESS=auto) ;;
  esac
  "${A_EXEC[@]}" env "${common[@]}" RANK=0 NCCL_HOSTID=zip-node-a NCCL_SOCKET_IFNAME=$A_IF \
    timeout 1800 python3 scripts/e2e_torch.py --mode "$mode" --out "$OUT/$name.rank0.json" "$@" \
    >"$OUT/$name.rank0.log" 2>&1 &
  local p0=$!
  "${B_EXEC[@]}" env "${common[@]}" RANK=1 NCCL_HOSTID=zip-node-b NCCL_SOCKET_IFNAME=$B_IF \
    timeout 1800 python3 scripts/e2e_torch.py --mode "$mode" --out "$OUT/$name.rank1.json" "$@" \
    >"$OUT/$name.rank1.log" 2>&1
  local r1=$? r0=0
  wait $p0 || r0=$?
  if ((r0 || r1)); then
    log "$name FAILED (rank0 $r0, rank1 $r1): see $name.rank*.log"
    return 1
  fi
  # Which path NCCL took, from its own INFO lines.
  local via
  via=$(grep -ho 'via NET/[A-Za-z]*/[0-9]*\(/GDRDMA\)\?' "$OUT/$name.rank0.log" | sort | uniq -c | tr '\n' ' ')
  # Which buffers the plugin got: GPU (its device path, with or without kernels) or host.
  local dev
  dev=$(grep -ho 'device path: .*' "$OUT/$name.rank0.log" | head -1)
  log "$name ok; NCCL: ${via:-no 'via NET' line found}; plugin: ${dev:-host buffers only}"
}

FAIL=0
PARTS=${PARTS:-check,bench,train}
part() { [[ ,$PARTS, == *,$1,* ]]; }
if part check; then
CHECK_MAX=${MAX_BYTES_CHECK:-$((16 << 20))}
for proto in Simple LL LL128; do
  for t in socket off zip; do
    run "check-$proto-$t" "$t" "$proto" check --max-bytes "$CHECK_MAX" || FAIL=1
  done
done
python3 - "$OUT" <<'EOF' || FAIL=1
import json, sys, glob, os
out = sys.argv[1]
bad = 0
for proto in ["Simple", "LL", "LL128"]:
    for rank in (0, 1):
        ref = json.load(open(f"{out}/check-{proto}-socket.rank{rank}.json"))["result"]
        for t in ("off", "zip"):
            got = json.load(open(f"{out}/check-{proto}-{t}.rank{rank}.json"))["result"]
            diff = [k for k in ref if got.get(k) != ref[k]]
            print(f"check {proto} {t} rank{rank}: {len(ref) - len(diff)}/{len(ref)} results identical to Socket")
            bad += len(diff)
            for k in diff[:5]:
                print("   differs:", k)
sys.exit(1 if bad else 0)
EOF
fi

if part bench; then
BENCH_MAX=${MAX_BYTES:-$((256 << 20))}
for kind in gauss random; do
  for t in socket off zip; do
    run "bench-$kind-$t" "$t" Simple bench --dtypes bf16 --collectives all_reduce --kind "$kind" --max-bytes "$BENCH_MAX" || FAIL=1
  done
done
python3 "$ROOT/scripts/e2e_report.py" "$OUT" || FAIL=1
fi

if part train; then
for t in socket zip; do
  run "train-$t" "$t" Simple train --steps "$STEPS" || FAIL=1
done
python3 - "$OUT" <<'EOF' || FAIL=1
import json, sys
out = sys.argv[1]
a = json.load(open(f"{out}/train-socket.rank0.json"))["result"]["losses_hex"]
b = json.load(open(f"{out}/train-zip.rank0.json"))["result"]["losses_hex"]
print(f"train: {len(a)} steps, losses identical to Socket: {a == b}")
sys.exit(0 if a == b else 1)
EOF
fi
log "done, results in $OUT (FAIL=$FAIL)"
exit $FAIL
