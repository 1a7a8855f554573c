#!/usr/bin/env bash
# A real, shaped TCP link between two network namespaces on this machine
# (shared/DESIGN.md §4):
#
#   scripts/netns.sh up RATE [DELAY]   RATE: tc rate (2gbit, 10gbit, ...) or "none"
#                                      DELAY: netem one-way delay per end (e.g. 5ms)
#   scripts/netns.sh down
#
#   NETNS_SOCKBUF=BYTES scripts/netns.sh up ...   also caps every socket's TCP
#     buffers (net.ipv4.tcp_rmem/tcp_wmem max, per namespace) at BYTES, so one
#     stream's window can be made smaller than the path's bandwidth-delay product.
#
# netem needs the sch_netem module; kernels without it (this workplace's) reject
# a DELAY with a clear error. NETNS_SOCKBUF is the way to get a window-limited
# stream there: throughput per stream is then about window / RTT.
#
# Namespaces zipa (10.233.0.1, veth zva) and zipb (10.233.0.2, veth zvb). With a
# RATE, a tbf qdisc shapes each end; with a DELAY, netem delays each end, so the
# round trip is 2 x DELAY. `up` first removes whatever an earlier run left, so it
# is idempotent; `down` is safe to call when nothing is up. Needs root.
set -euo pipefail

NSA=zipa NSB=zipb VA=zva VB=zvb
IPA=10.233.0.1 IPB=10.233.0.2

down() {
  ip netns del "$NSA" 2>/dev/null || true
  ip netns del "$NSB" 2>/dev/null || true
  # Deleting a namespace deletes its veth end and so the pair; this catches a
  # pair left in the root namespace by an interrupted `up`.
  ip link del "$VA" 2>/dev/null || true
}

# tc rate like 2gbit/500mbit → bits per second (for the tbf burst size).
rate_bps() {
  local r=${1,,}
  local n=${r%%[a-z]*} u=${r##*[0-9.]}
  case $u in
    gbit) echo $((n * 1000000000)) ;;
    mbit) echo $((n * 1000000)) ;;
    kbit) echo $((n * 1000)) ;;
    bit | "") echo "$n" ;;
    *) echo "unsupported rate unit in $1 (use gbit/mbit/kbit)" >&2; exit 2 ;;
  esac
}

shape() { # ns dev rate delay
  local ns=$1 dev=$2 rate=$3 delay=$4
  if [[ $rate != none ]]; then
    # Burst: 10 ms at the rate (at least 4 MiB), or tbf cannot reach its rate
    # with 64 KiB GSO packets and the kernel's timer granularity.
    local bps burst
    bps=$(rate_bps "$rate")
    burst=$((bps / 8 / 100))
    ((burst < 4194304)) && burst=4194304
    tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 50ms
    if [[ -n $delay ]]; then
      tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay" limit 1000000
    fi
  elif [[ -n $delay ]]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 1000000
  fi
}

up() {
  local rate=${1:?usage: netns.sh up RATE [DELAY]} delay=${2:-}
  down
  ip netns add "$NSA"
  ip netns add "$NSB"
  ip link add "$VA" type veth peer name "$VB"
  ip link set "$VA" netns "$NSA"
  ip link set "$VB" netns "$NSB"
  ip -n "$NSA" addr add "$IPA/24" dev "$VA"
  ip -n "$NSB" addr add "$IPB/24" dev "$VB"
  for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
  ip -n "$NSA" link set "$VA" up
  ip -n "$NSB" link set "$VB" up
  if ! shape "$NSA" "$VA" "$rate" "$delay" || ! shape "$NSB" "$VB" "$rate" "$delay"; then
    down
    echo "netns.sh: tc failed (a DELAY needs sch_netem, which this kernel may lack)" >&2
    exit 1
  fi
  local buf=${NETNS_SOCKBUF:-}
  if [[ -n $buf ]]; then
    for ns in "$NSA" "$NSB"; do
      ip netns exec "$ns" sysctl -q -w "net.ipv4.tcp_rmem=4096 $((buf < 131072 ? buf : 131072)) $buf" \
        "net.ipv4.tcp_wmem=4096 $((buf < 16384 ? buf : 16384)) $buf"
    done
  fi
  echo "netns up: $NSA/$VA $IPA <-> $NSB/$VB $IPB rate=$rate delay=${delay:-0} sockbuf=${buf:-default}"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down; echo "netns down" ;;
  *) echo "usage: $0 up RATE [DELAY] | down" >&2; exit 2 ;;
esac
