#!/usr/bin/env bash
# The release tarball as a user gets it (scripts/package.sh, NO_BUILD=1: uses
# dist/release/<arch> from scripts/release.sh):
#  1. its SHA256SUMS verify, and the unpacked tree's nccl-zip-perf runs against the
#     tree's own plugin (bin/ -> ../lib) without --plugin;
#  2. install.sh --prefix P --destdir D puts the files under D/P, and the installed
#     nccl-zip-perf runs against the installed plugin; no libnccl-net.so by default;
#  3. install.sh --uninstall leaves no file behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
tgz=$(NO_BUILD=1 scripts/package.sh 2>/dev/null | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -C "$tmp" -xzf "$tgz"
tree=$(echo "$tmp"/nccl-net-zip-*)
(cd "$tree" && sha256sum --quiet -c SHA256SUMS)
echo "ok   $(basename "$tgz"): SHA256SUMS verify"

perf_loop() { # perf_loop BIN: 100 compressed bf16 messages through the plugin BIN finds itself
  NCCL_SOCKET_IFNAME=lo NCCL_ZIP_COMPRESS=on timeout 60 "$1" loop --data bf16 --sizes 64K,1M \
    --count 100 --check-leaks --timeout 50 >"$tmp/out" 2>&1 || { cat "$tmp/out"; return 1; }
  grep -q "OK recv 100 messages" "$tmp/out" && grep -q "LEAKS none" "$tmp/out" || { cat "$tmp/out"; return 1; }
  grep "^loaded " "$tmp/out"
}
perf_loop "$tree/bin/nccl-zip-perf"
echo "ok   unpacked tree: bin/nccl-zip-perf loop through ../lib/libnccl-net-zip.so"

dest=$tmp/root prefix=/opt/nccl-net-zip
"$tree/install.sh" --prefix "$prefix" --destdir "$dest" >/dev/null
for f in lib/libnccl-net-zip.so bin/nccl-zip bin/nccl-zip-perf share/doc/nccl-net-zip/USERS.md share/nccl-net-zip/MANIFEST; do
  [ -f "$dest$prefix/$f" ] || { echo "FAIL: $prefix/$f not installed"; exit 1; }
done
[ ! -e "$dest$prefix/lib/libnccl-net.so" ] || { echo "FAIL: libnccl-net.so installed by default"; exit 1; }
# The installed tool must use the installed plugin, not the unpacked tree's.
rm -rf "$tree"
perf_loop "$dest$prefix/bin/nccl-zip-perf"
"$dest$prefix/bin/nccl-zip" --version
echo "ok   installed under DESTDIR: bin/nccl-zip-perf loop through the installed plugin"

tar -C "$tmp" -xzf "$tgz"
tree=$(echo "$tmp"/nccl-net-zip-*)
"$tree/install.sh" --uninstall --prefix "$prefix" --destdir "$dest" >/dev/null
left=$(find "$dest" -mindepth 1 ! -type d; [ ! -d "$dest$prefix" ] || echo "$prefix/")
[ -z "$left" ] || { echo "FAIL: uninstall left: $left"; exit 1; }
echo "ok   --uninstall left nothing under $prefix"
echo "package_test: passed"
