#!/usr/bin/env bash
# Installs what building and testing nccl-net-zip needs on a fresh Debian machine:
# libclang (bindgen), C and C++ compilers (cc crate, zstd-sys, which builds its own
# libzstd, so no zstd package is needed), iproute2 (network-namespace tests),
# binutils (readelf checks) and libibverbs-dev (verbs.h, for the layout test only:
# the plugin itself loads libibverbs at run time, if at all).
#
# Every check asks what the consuming tool really loads (scripts/lib/detect.sh):
# bindgen's clang-sys loads libclang.so / libclang-N.so.M, never libclang-cpp,
# which the stock image has without libclang. After installing, each check is
# repeated, and setup fails naming whatever is still missing.
# Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/detect.sh

missing() {
  need=()
  have_libclang || need+=(libclang-dev)
  command -v cc >/dev/null || need+=(gcc)
  command -v g++ >/dev/null || need+=(g++)
  tc_has_tbf || need+=(iproute2)
  command -v readelf >/dev/null || need+=(binutils)
  # verbs.h: tests/ib_verbs.rs checks our runtime-loaded verbs layouts against it.
  [ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
}
missing
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  missing
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: still missing after apt-get install: ${need[*]}" >&2
    exit 1
  fi
fi
command -v cargo >/dev/null || { echo "setup: cargo not found (need a Rust toolchain)"; exit 1; }
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt >/dev/null 2>&1 || true
