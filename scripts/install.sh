#!/usr/bin/env bash
# Usage: scripts/install.sh PREFIX
# Builds the release plugin and installs PREFIX/lib/libnccl-net-zip.so (the name
# NCCL looks for with NCCL_NET_PLUGIN=zip) and PREFIX/bin/nccl-zip.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$1
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --lib --bins
target=${CARGO_TARGET_DIR:-target}
install -D -m 0755 "$target/release/libnccl_net_zip.so" "$prefix/lib/libnccl-net-zip.so"
for b in nccl-zip nccl-zip-perf; do
  [ -f "$target/release/$b" ] && install -D -m 0755 "$target/release/$b" "$prefix/bin/$b"
done
echo "installed $prefix/lib/libnccl-net-zip.so"
echo "use: LD_LIBRARY_PATH=$prefix/lib:\$LD_LIBRARY_PATH NCCL_NET_PLUGIN=zip NCCL_NET=Zip <your job>"
