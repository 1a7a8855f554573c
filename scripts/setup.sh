#!/usr/bin/env bash
# Installs what building and testing nccl-net-zip needs on a fresh Debian machine:
# libclang (bindgen), a C compiler (cc crate), iproute2 (network-namespace tests).
# Idempotent and quiet when everything is already there.
set -euo pipefail

need=()
ldconfig -p 2>/dev/null | grep -q 'libclang' || need+=(libclang-dev)
command -v cc >/dev/null || need+=(gcc)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found (need a Rust toolchain)"; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt >/dev/null 2>&1 || true
