#!/usr/bin/env bash
# Usage: scripts/package.sh [x86_64|aarch64]     (default: this machine's)
#
# A relocatable release tarball from scripts/release.sh's glibc-2.28 build (which
# it runs first; NO_BUILD=1 takes dist/release/<arch> as it is):
#   dist/nccl-net-zip-<version>-<arch>-linux-glibc2.28.tar.gz (+ .sha256), holding
#   nccl-net-zip-<version>-<arch>-linux-glibc2.28/
#     lib/libnccl-net-zip.so  bin/nccl-zip  bin/nccl-zip-perf  install.sh
#     README.md  LICENSE  docs/USERS.md  docs/TROUBLESHOOTING.md  BUILDINFO  SHA256SUMS
# The tree works where it is unpacked (bin/nccl-zip-perf finds ../lib) or installs
# with its install.sh (PREFIX, DESTDIR, --uninstall). Prints the tarball's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-$(uname -m)}
[ "${NO_BUILD:-0}" = 1 ] || scripts/release.sh "$arch" >&2
rel=dist/release/$arch
for f in libnccl-net-zip.so nccl-zip nccl-zip-perf BUILDINFO; do
  [ -f "$rel/$f" ] || { echo "package: $rel/$f missing (run scripts/release.sh $arch)" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name=nccl-net-zip-$version-$arch-linux-glibc2.28
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
t=$stage/$name
install -D -m 0755 "$rel/libnccl-net-zip.so" "$t/lib/libnccl-net-zip.so"
install -D -m 0755 "$rel/nccl-zip" "$t/bin/nccl-zip"
install -D -m 0755 "$rel/nccl-zip-perf" "$t/bin/nccl-zip-perf"
install -m 0755 scripts/install.sh "$t/install.sh"
install -m 0644 README.md LICENSE "$rel/BUILDINFO" "$t/"
install -D -m 0644 docs/USERS.md "$t/docs/USERS.md"
install -D -m 0644 docs/TROUBLESHOOTING.md "$t/docs/TROUBLESHOOTING.md"
(cd "$t" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | sort | xargs sha256sum >SHA256SUMS)
mkdir -p dist
# Reproducible order and owners; mtimes as built.
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -czf "dist/$name.tar.gz" "$name"
(cd dist && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "package: $(cat "dist/$name.tar.gz.sha256")" >&2
echo "$PWD/dist/$name.tar.gz"
