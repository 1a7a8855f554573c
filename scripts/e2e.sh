#!/usr/bin/env bash
# Real NCCL end to end (issue 6): PyTorch collectives through the plugin, bit-exact
# against NCCL's own Socket transport, and faster on a bandwidth-bound link.
#
# Needs a GPU and PyTorch with CUDA; without them it prints SKIP and exits 0.
# Two ranks share GPU 0 and look like two nodes to NCCL (distinct NCCL_HOSTID).
# They sit in two network namespaces joined by a veth shaped to RATE; if namespaces
# cannot be made here (or NETNS=0), both ranks use loopback and the run says so.
#
# Each part runs two ranks of scripts/e2e_torch.py per transport:
#   socket : NCCL_NET=Socket, no plugin (the baseline)
#   off    : the plugin with NCCL_ZIP_COMPRESS=off
#   zip    : the plugin with NCCL_ZIP_COMPRESS=auto
# and scripts/e2e_report.py judges the results:
#   check : every collective x dtype x size, with NCCL_PROTO = Simple, LL and LL128;
#           every result hash of off and zip must equal the Socket run's
#   bench : bus bandwidth of bf16 all_reduce (Gaussian and incompressible data) in all
#           three; report.md and busbw.png
#   train : a small GPT trained with DDP over Socket and over the plugin (zip);
#           losses and final parameters must be identical
# After each run it logs which path NCCL took ("via NET/Zip/0/GDRDMA": the plugin
# got GPU buffers) and the plugin's "device path:" line.
#
# Env: RATE (10gbit; "none" for unshaped), LINK_HINT (1: pass the shaped rate as
# NCCL_ZIP_LINK_MBPS; by default auto is not told it), OUT (results folder; default
# bench/results/e2e-<date>), STEPS (30), MAX_BYTES (256M for bench),
# MAX_BYTES_CHECK (per protocol when unset: Simple 4 MiB, LL and LL128 1 MiB: two
# ranks time-slice one GPU, and LL/LL128 move 2x data at a few GB/s; sizes run
# smallest first and each rank writes NAME.rankN.json.partial as it goes, so a
# stopped run still tells which sizes passed), PARTS (check,bench,train; also graph: which parts to run),
# PROTOS (Simple,LL,LL128: check's protocols), BENCH_ARGS (more e2e_torch.py
# arguments for bench, e.g. "--iters 20"), KINDS (bench data: "gauss random"),
# TRANSPORTS (bench: "socket off zip"), TRAIN_TRANSPORTS ("socket zip"), PYTHON (python3), NETNS (0: loopback,
# never namespaces), RUN_TIMEOUT (480: seconds per run), GRACE (20: seconds a rank
# gets to exit after its peer failed, then it is stopped), NZC_BUNDLE (a prebuilt
# plugin from scripts/gpu_bundle.sh; the default where cargo is missing: .gpu-bundle).
# Each part is judged on its own results: parts can run in separate calls (all three
# at full size may not fit in one 10-minute device call).
# E2E_DRYRUN=1 (scripts/e2e_dryrun.sh): the same runs and judgement with gloo on the
# CPU: no GPU, no plugin build, loopback; tests the scripts, not the plugin.
set -uo pipefail
CALLER_PWD=$PWD
abspath() { [[ $1 == /* ]] && echo "$1" || echo "$CALLER_PWD/$1"; }
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
RATE=${RATE:-10gbit}
DATE=$(date -u +%Y-%m-%d)
OUT=$(abspath "${OUT:-$ROOT/bench/results/e2e-$DATE}")
STEPS=${STEPS:-30}
PY=${PYTHON:-python3}
[[ $PY == */* ]] && PY=$(abspath "$PY") # not realpath: a venv's python is a symlink
DRYRUN=${E2E_DRYRUN:-0}
RUN_TIMEOUT=${RUN_TIMEOUT:-480}
GRACE=${GRACE:-20}
PROTOS=${PROTOS:-Simple,LL,LL128}
PARTS=${PARTS:-check,bench,train}
for p in ${PARTS//,/ }; do
  case $p in check | bench | train | graph) ;; *) echo "e2e: PARTS=$PARTS: unknown part $p (check, bench, train, graph)" >&2; exit 2 ;; esac
done

if [[ $DRYRUN == 1 ]]; then
  if ! TORCH_LINE=$("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null); then
    echo "e2e: E2E_DRYRUN=1 needs torch in $PY (scripts/e2e_dryrun.sh sets one up)" >&2; exit 1
  fi
else
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP: e2e needs an NVIDIA GPU (nvidia-smi found none)"; exit 0
  fi
  if ! "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "SKIP: e2e needs PyTorch with CUDA ($PY)"; exit 0
  fi
fi
mkdir -p "$OUT" || exit 1
log() { echo "e2e: $*" | tee -a "$OUT/e2e.log" >&2; }

TORCH_ARGS=()
if [[ $DRYRUN == 1 ]]; then
  TORCH_ARGS=(--backend gloo --device cpu)
  NETNS=${NETNS:-0}
  PLUGIN_DIR=$OUT PLUGIN_REF=$OUT/libnccl-net-zip.so # no plugin: gloo ignores every NCCL_* variable
else
  # The GPU machine has no Rust: there the plugin comes prebuilt (scripts/gpu_bundle.sh,
  # carried as .gpu-bundle), as for scripts/gpu_validate.sh.
  source "$ROOT/scripts/lib/gpu.sh"
  [[ -n ${NZC_BUNDLE:-} ]] && NZC_BUNDLE=$(abspath "$NZC_BUNDLE")
  # No ip/tc on the GPU machine: the bundle's iproute2 (gpu_bundle.sh), if it has one.
  command -v ip >/dev/null || { nzc_net_tools && log "ip and tc from the bundle's iproute2 ($(ip -V 2>&1))"; }
  BUNDLE=$(nzc_bundle 2>>"$OUT/e2e.log") || { log "$(tail -1 "$OUT/e2e.log")"; exit 1; }
  if [[ -n $BUNDLE ]]; then
    SO=$BUNDLE/libnccl_net_zip.so
  else
    cargo build --release --lib --quiet || { log "build failed"; exit 1; }
    SO=${CARGO_TARGET_DIR:-$ROOT/target}/release/libnccl_net_zip.so
  fi
  # NCCL_NET_PLUGIN is the plugin's absolute path, as a cluster install would set it.
  # NCCL >= 2.21 dlopens that value as given, then tries libnccl-net-<value>.so;
  # 2.20 and older only build libnccl-net-<value>.so (the 2.20.5 library has no other
  # form), so there it is "zip", found through LD_LIBRARY_PATH, which holds the
  # plugin's folder. Either way NCCL_NET=Zip is forced: a plugin that did not load
  # is an error, never a silent fallback to NCCL's own transports.
  PLUGIN_DIR=$OUT
  cp "$SO" "$PLUGIN_DIR/libnccl-net-zip.so" || { log "no plugin at $SO"; exit 1; }
  PLUGIN_REF=$PLUGIN_DIR/libnccl-net-zip.so
  NCCL_VER=$("$PY" -c 'import torch; print("%d.%d.%d" % tuple(torch.cuda.nccl.version())[:3])' 2>/dev/null) || NCCL_VER=
  if [[ -n $NCCL_VER && $(printf '%s\n' "$NCCL_VER" 2.21.0 | sort -V | head -1) != 2.21.0 ]]; then
    PLUGIN_REF=zip
  fi
fi

{
  echo "date: $DATE"
  if [[ $DRYRUN == 1 ]]; then
    echo "DRY RUN: gloo on the CPU ($(nproc --all) cores), no GPU, no plugin: tests the scripts only"
    echo "$TORCH_LINE"
  else
    # compute_mode: two processes share GPU 0, which "Exclusive_Process" forbids.
    nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader
    # GPUDirect RDMA: with a driver >= 11.3 NCCL decides it from the device attribute
    # GPU_DIRECT_RDMA_SUPPORTED alone; 0 means the plugin never gets GPU buffers.
    # Also DMA-BUF support and the compute mode, from the driver API ("unknown (why)"
    # where it cannot be read; never fails).
    timeout 30 "$PY" "$ROOT/scripts/lib/gpu_facts.py" || echo "cuda facts: unknown (scripts/lib/gpu_facts.py failed or timed out)"
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
    # NCCL settings from outside this script apply to every run (NCCL also reads
    # /etc/nccl.conf): recorded, so a baseline skewed by them can be told.
    env | grep -E '^(NCCL_|CUDA_)' | sed 's/^/inherited env: /'
    [[ -f /etc/nccl.conf ]] && sed 's/^/\/etc\/nccl.conf: /' /etc/nccl.conf
  fi
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src codec scripts 2>/dev/null || echo ' (modified)')"
  [[ $DRYRUN == 1 ]] || echo "NCCL_NET_PLUGIN for the plugin runs: $PLUGIN_REF"
  [[ -n ${BUNDLE:-} ]] && sed 's/^/plugin bundle: /' "$BUNDLE/MANIFEST"
  echo "command: RATE=$RATE PARTS=$PARTS $0 $*"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" >&2

# Ranks of the pair now running. Each runs under its own `timeout`, which puts it in
# a process group of its own: a caller that stops this script by signalling its
# process group (scripts/gpu_run.sh at a part's deadline) would leave them holding
# the GPU and the namespaces. So a signal here is passed on to them (timeout hands
# it to its rank), and the EXIT trap then takes the namespaces down.
RANK_PIDS=""
trap 'kill -TERM $RANK_PIDS 2>/dev/null; exit 143' TERM INT HUP

# The adaptive policy is not told the link's speed (issue 21: users whose
# bottleneck is a shared uplink cannot tell it), unless LINK_HINT=1: then the
# shaped rate is passed as NCCL_ZIP_LINK_MBPS (a caller's own value is kept only
# then), and the results say so.
LINK_HINT=${LINK_HINT:-0}
[[ $LINK_HINT == 1 ]] || unset NCCL_ZIP_LINK_MBPS

# Network: namespaces if we can, loopback otherwise.
NETNS=${NETNS:-auto}
if [[ $NETNS != 0 ]] && "$ROOT/scripts/netns.sh" up "$RATE" >>"$OUT/e2e.log" 2>&1; then
  trap '"$ROOT/scripts/netns.sh" down >/dev/null 2>&1 || true' EXIT
  A_EXEC=(ip netns exec zipa) B_EXEC=(ip netns exec zipb)
  A_IF=zva B_IF=zvb MASTER=10.233.0.1
  if [[ $LINK_HINT == 1 && $RATE != none ]]; then
    # tbf is invisible to the plugin (the veth says 10 Gbit/s): LINK_HINT=1 tells
    # its cost model, as a user who knows the bottleneck may.
    NCCL_ZIP_LINK_MBPS=$(awk -v r="${RATE,,}" 'BEGIN{ if (r ~ /gbit$/) print r*1000; else if (r ~ /mbit$/) print r+0; else print 10000 }')
    export NCCL_ZIP_LINK_MBPS
  fi
  log "ranks in namespaces zipa/zipb, veth shaped to $RATE"
else
  A_EXEC=() B_EXEC=()
  A_IF=lo B_IF=lo MASTER=127.0.0.1
  if [[ $NETNS == 0 ]]; then
    log "NETNS=0: both ranks on loopback, unshaped"
  else
    "$ROOT/scripts/netns.sh" down >/dev/null 2>&1 || true # whatever a failed `up` left
    # LO_SHAPE=1 (only on a machine of one's own, e.g. the GPU VM: it shapes every
    # loopback user): shape lo itself, so the link is still the bottleneck.
    rate_bits=$(awk -v r="${RATE,,}" 'BEGIN{ if (r ~ /gbit$/) printf "%.0f", r*1e9; else if (r ~ /mbit$/) printf "%.0f", r*1e6; else print 0 }')
    if [[ ${LO_SHAPE:-0} == 1 && $RATE != none ]] && (( ${rate_bits%.*} > 0 )) &&
      tc qdisc replace dev lo root tbf rate "$RATE" burst $(( rate_bits / 800 > 4194304 ? rate_bits / 800 : 4194304 )) latency 50ms >>"$OUT/e2e.log" 2>&1; then
      trap 'tc qdisc del dev lo root >/dev/null 2>&1 || true' EXIT
      if [[ $LINK_HINT == 1 ]]; then
        NCCL_ZIP_LINK_MBPS=$(awk -v b="$rate_bits" 'BEGIN{ print int(b / 1e6) }')
        export NCCL_ZIP_LINK_MBPS
      fi
      log "network namespaces unavailable here: both ranks on loopback, lo shaped to $RATE (LO_SHAPE=1)"
    else
      log "network namespaces unavailable here: both ranks on loopback, unshaped (see e2e.log; LO_SHAPE=1 shapes lo)"
    fi
  fi
fi

if [[ -n ${NCCL_ZIP_LINK_MBPS:-} ]]; then
  echo "link hint: NCCL_ZIP_LINK_MBPS=$NCCL_ZIP_LINK_MBPS (LINK_HINT=1: auto is told the link's speed)" >>"$OUT/machine.txt"
else
  echo "link hint: none (NCCL_ZIP_LINK_MBPS unset: auto is not told the link's speed)" >>"$OUT/machine.txt"
fi
log "$(tail -n1 "$OUT/machine.txt")"

# wait_pair PID0 PID1: waits for both ranks; exit codes in R0 and R1. A rank whose
# peer failed would wait for it until RUN_TIMEOUT: it gets GRACE seconds, then TERM.
wait_pair() {
  local pids=("$1" "$2") rc=("" "") failed_at=-1 i
  while [[ -z ${rc[0]} || -z ${rc[1]} ]]; do
    for i in 0 1; do
      if [[ -z ${rc[i]} ]] && ! kill -0 "${pids[i]}" 2>/dev/null; then
        wait "${pids[i]}"
        rc[i]=$?
        if ((rc[i] != 0 && failed_at < 0)); then failed_at=$SECONDS; fi
      fi
    done
    if ((failed_at >= 0 && SECONDS - failed_at >= GRACE)); then
      for i in 0 1; do [[ -z ${rc[i]} ]] && kill -TERM "${pids[i]}" 2>/dev/null; done
    fi
    if [[ -z ${rc[0]} || -z ${rc[1]} ]]; then sleep 1; fi
  done
  R0=${rc[0]} R1=${rc[1]}
}

# run NAME TRANSPORT PROTO MODE ARGS...: two ranks, results in $OUT/NAME.rank{0,1}.json
run() {
  local name=$1 transport=$2 proto=$3 mode=$4 net
  shift 4
  # ENV in the debug mask: NCCL then logs the NCCL_HOSTID, NCCL_PROTO and
  # NCCL_NET_PLUGIN it took. The ranks are on different "hosts", so P2P, SHM, NVLS
  # and MNNVL cannot apply; they are disabled anyway so that nothing but the net
  # carries data (e2e_report.py paths fails a run that logs any other path).
  # shellcheck disable=SC2054 # INIT,NET,ENV is one value
  # TUNING: NCCL's algorithm/protocol/channel choice per collective and size (rank
  # 0), summarised by scripts/nccl_tuning.py into NAME.tuning.md. REF_COUNT=1:
  # NCCL 2.28-2.29 cannot reload a plugin once unloaded (DESIGN.md 2a).
  local common=(NCCL_PROTO="$proto" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV,TUNING NCCL_NET_PLUGIN_REF_COUNT=1 NCCL_P2P_DISABLE=1
    NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1
    CUBLAS_WORKSPACE_CONFIG=:4096:8 WORLD_SIZE=2 MASTER_ADDR="$MASTER" MASTER_PORT=$((29500 + RANDOM % 1000)))
  # NCCL_ZIP_GPU=on: GPU buffers through the GPU codec (the plugin's default is off
  # until this very run has validated that path).
  # NCCL_NET_PLUGIN_REF_COUNT=1: NCCL 2.28.x-2.29.x unload the plugin after the
  # last communicator and cannot load it again (NVIDIA/nccl#1978); harmless elsewhere.
  local plugin=(NCCL_NET=Zip NCCL_NET_PLUGIN_REF_COUNT=1 NCCL_ZIP_GPU="${NCCL_ZIP_GPU:-on}" NCCL_NET_PLUGIN="$PLUGIN_REF" LD_LIBRARY_PATH="$PLUGIN_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  case $transport in
    # NCCL_NET_PLUGIN=none: the baseline loads no external plugin at all (NCCL would
    # otherwise dlopen any libnccl-net.so on the library path, then skip it).
    socket) common+=(NCCL_NET=Socket NCCL_NET_PLUGIN=none) net=Socket ;;
    off) common+=("${plugin[@]}" NCCL_ZIP_COMPRESS=off) net=Zip ;;
    zip) common+=("${plugin[@]}" NCCL_ZIP_COMPRESS=auto) net=Zip ;;
    *) log "run: unknown transport $transport"; return 1 ;;
  esac
  # .partial too: one left by an earlier run would pass for this run's progress.
  rm -f "$OUT/$name".rank[01].json "$OUT/$name".rank[01].json.partial "$OUT/$name".rank[01].log
  # ${A[@]+"${A[@]}"}: an empty array under set -u, which bash < 4.4 calls unbound.
  ${A_EXEC[@]+"${A_EXEC[@]}"} env "${common[@]}" RANK=0 NCCL_HOSTID=zip-node-a NCCL_SOCKET_IFNAME="$A_IF" \
    GLOO_SOCKET_IFNAME="$A_IF" timeout "$RUN_TIMEOUT" "$PY" scripts/e2e_torch.py --mode "$mode" \
    --out "$OUT/$name.rank0.json" ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} "$@" >"$OUT/$name.rank0.log" 2>&1 &
  local p0=$!
  ${B_EXEC[@]+"${B_EXEC[@]}"} env "${common[@]}" RANK=1 NCCL_HOSTID=zip-node-b NCCL_SOCKET_IFNAME="$B_IF" \
    GLOO_SOCKET_IFNAME="$B_IF" timeout "$RUN_TIMEOUT" "$PY" scripts/e2e_torch.py --mode "$mode" \
    --out "$OUT/$name.rank1.json" ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} "$@" >"$OUT/$name.rank1.log" 2>&1 &
  local p1=$! t0=$SECONDS
  RANK_PIDS="$p0 $p1"
  wait_pair "$p0" "$p1"
  RANK_PIDS=""
  local took="$((SECONDS - t0)) s"
  if ((R0 || R1)); then
    log "$name FAILED after $took (rank0 exit $R0, rank1 exit $R1$( ((R0 == 124 || R1 == 124)) && echo ", 124: timed out after ${RUN_TIMEOUT}s")): see $name.rank*.log"
    local r
    for r in 0 1; do
      echo "--- $name.rank$r.log (last lines)" >&2
      grep -v '^\s*$' "$OUT/$name.rank$r.log" | tail -n 8 >&2
    done
    return 1
  fi
  if [[ ! -s $OUT/$name.rank0.json || ! -s $OUT/$name.rank1.json ]]; then
    log "$name FAILED: a rank exited 0 without writing its JSON"
    return 1
  fi
  # Which path NCCL took ("via NET/Zip/0/GDRDMA": the plugin got GPU buffers) and
  # which buffers the plugin got (its "device path:" line), from the INFO log.
  local paths
  if ! paths=$("$PY" "$ROOT/scripts/e2e_report.py" paths "$OUT/$name.rank0.log" --net "$net" 2>&1); then
    log "$name FAILED, $took; $paths"
    return 1
  fi
  [[ $DRYRUN == 1 ]] && paths="dry run: gloo, no NCCL, no plugin (says: $paths)"
  log "$name ok, $took; $paths"
  [[ $DRYRUN == 1 ]] || "$PY" "$ROOT/scripts/nccl_tuning.py" "$OUT/$name.rank0.log" >"$OUT/$name.tuning.md" 2>&1 ||
    log "$name: no NCCL tuning lines in rank 0's log (see $name.tuning.md)"
}

FAIL=0
part() { [[ ,$PARTS, == *,$1,* ]]; }
if part check; then
  for proto in ${PROTOS//,/ }; do
    case $proto in Simple) CHECK_MAX=${MAX_BYTES_CHECK:-$((4 << 20))} ;; *) CHECK_MAX=${MAX_BYTES_CHECK:-$((1 << 20))} ;; esac
    for t in socket off zip; do
      run "check-$proto-$t" "$t" "$proto" check --max-bytes "$CHECK_MAX" || FAIL=1
    done
  done
  "$PY" "$ROOT/scripts/e2e_report.py" check "$OUT" --protos "$PROTOS" 2>&1 | tee -a "$OUT/e2e.log" || FAIL=1
  # NCCL's choices over Socket next to the plugin's (what our speed/latency make it do).
  if [[ $DRYRUN != 1 ]]; then
    for proto in ${PROTOS//,/ }; do
      "$PY" "$ROOT/scripts/nccl_tuning.py" "$OUT/check-$proto-socket.rank0.log" "$OUT/check-$proto-zip.rank0.log" \
        >"$OUT/tuning-$proto.md" 2>&1 || true
    done
  fi
fi

if part bench; then
  BENCH_MAX=${MAX_BYTES:-$((256 << 20))}
  for kind in ${KINDS:-gauss random}; do
    for t in ${TRANSPORTS:-socket off zip}; do
      # shellcheck disable=SC2086 # BENCH_ARGS: words
      run "bench-$kind-$t" "$t" Simple bench --dtypes bf16 --collectives all_reduce --kind "$kind" --max-bytes "$BENCH_MAX" ${BENCH_ARGS:-} || FAIL=1
    done
  done
  "$PY" "$ROOT/scripts/e2e_report.py" bench "$OUT" || FAIL=1
fi

if part train; then
  for t in ${TRAIN_TRANSPORTS:-socket zip}; do
    run "train-$t" "$t" Simple train --steps "$STEPS" || FAIL=1
  done
  "$PY" "$ROOT/scripts/e2e_report.py" train "$OUT" 2>&1 | tee -a "$OUT/e2e.log" || FAIL=1
fi
if part graph; then
  # all_reduce captured in a CUDA graph and replayed (issue 23 item 4): every replay
  # equal to the eager result, and the plugin's results equal to Socket's.
  for t in socket zip; do
    run "graph-$t" "$t" Simple graph --min-bytes 65536 --max-bytes "${GRAPH_MAX_BYTES:-$((16 << 20))}" || FAIL=1
  done
  "$PY" "$ROOT/scripts/e2e_report.py" graph "$OUT" --transports zip 2>&1 | tee -a "$OUT/e2e.log" || FAIL=1
fi
log "done, results in $OUT ($( ((FAIL)) && echo FAILED || echo all passed))"
exit $FAIL
