#!/usr/bin/env bash
# Installs what building and testing nccl-net-zip needs on a fresh Debian machine:
# libclang (bindgen), a C compiler (cc crate), iproute2 (network-namespace tests),
# binutils (readelf checks) and libibverbs-dev (verbs.h, for the layout test only:
# the plugin itself loads libibverbs at run time, if at all).
# Idempotent and quiet when everything is already there.
set -euo pipefail

need=()
ldconfig -p 2>/dev/null | grep -q 'libclang' || need+=(libclang-dev)
command -v cc >/dev/null || need+=(gcc)
command -v g++ >/dev/null || need+=(g++)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v readelf >/dev/null || need+=(binutils)
# verbs.h: tests/ib_verbs.rs checks our runtime-loaded verbs layouts against it.
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found (need a Rust toolchain)"; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt >/dev/null 2>&1 || true
