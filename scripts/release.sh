#!/usr/bin/env bash
# Usage: scripts/release.sh [x86_64|aarch64|all]     (default: x86_64)
#
# Builds the release artifacts for glibc 2.28 (RHEL/Rocky 8, Ubuntu 20.04 and
# later: the hosts PyTorch's manylinux_2_28 wheels run on) with cargo-zigbuild,
# which links against zig's glibc 2.28 stubs. The GPU kernels are compiled by
# nvcc in build.rs exactly as for a normal build (NCCL_ZIP_REQUIRE_KERNELS=1: a
# kernel that does not compile fails the release) and embedded as a fatbin; the
# fatbin is device code, so it is the same for every host architecture.
#
# Output, per architecture: dist/release/<arch>/{libnccl-net-zip.so,nccl-zip,nccl-zip-perf,BUILDINFO}
# then scripts/check_artifact.sh runs on them (for aarch64 on an x86-64 machine,
# only the static checks: the binaries cannot run here).
# zig and cargo-zigbuild are installed on first use (scripts/lib/zig.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/lib/zig.sh

archs=${1:-x86_64}
[ "$archs" = all ] && archs="x86_64 aarch64"
for a in $archs; do
  case $a in x86_64|aarch64) ;; *) echo "usage: $0 [x86_64|aarch64|all]" >&2; exit 2 ;; esac
done

scripts/setup.sh
NVCC=$(scripts/setup_cuda.sh)
export NVCC NCCL_ZIP_REQUIRE_KERNELS=1
setup_zig
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then commit=$commit-dirty; fi
export NCCL_ZIP_GIT_COMMIT=$commit
TD=${CARGO_TARGET_DIR:-$ROOT/target}

for a in $archs; do
  triple=$a-unknown-linux-gnu
  if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
    rustup target add "$triple" >/dev/null || { echo "release: rustup target add $triple failed" >&2; exit 1; }
  fi
  echo "release: cargo zigbuild --release --target $triple.2.28 (commit $commit)"
  cargo zigbuild -q --release --target "$triple.2.28" -p nccl-net-zip --lib --bins
  src=$TD/$triple/release
  out=$ROOT/dist/release/$a
  rm -rf "$out"
  mkdir -p "$out"
  cp "$src/libnccl_net_zip.so" "$out/libnccl-net-zip.so"
  cp "$src/nccl-zip" "$src/nccl-zip-perf" "$out/"
  {
    echo "version $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
    echo "commit $commit"
    echo "target $triple, glibc 2.28 (cargo-zigbuild $ZIGBUILD_VERSION, zig $ZIG_VERSION)"
    echo "rustc $(rustc --version | cut -d' ' -f2-)"
    echo "nvcc $("$NVCC" --version | grep -o 'release [0-9.]*' | head -1)"
  } >"$out/BUILDINFO"
  if [ "$a" = "$(uname -m)" ]; then
    scripts/check_artifact.sh "$out"
  else
    scripts/check_artifact.sh --static "$out"
  fi
done
