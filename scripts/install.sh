#!/usr/bin/env bash
# Installs nccl-net-zip, or removes it.
#
#   install.sh [--prefix PREFIX | PREFIX] [--destdir DESTDIR] [--with-libnccl-net-link]
#   install.sh --uninstall [--prefix PREFIX | PREFIX] [--destdir DESTDIR]
#
# PREFIX (default /usr/local; also read from $PREFIX) and DESTDIR (staging root for
# packagers; also $DESTDIR) as in GNU make. Gives:
#   PREFIX/lib/libnccl-net-zip.so     the plugin (NCCL_NET_PLUGIN=zip loads this name)
#   PREFIX/bin/nccl-zip, nccl-zip-perf
#   PREFIX/share/doc/nccl-net-zip/    README.md, LICENSE, USERS.md, TROUBLESHOOTING.md
#   PREFIX/share/nccl-net-zip/MANIFEST  what was installed; --uninstall removes exactly that
#
# Run from an unpacked release tarball (scripts/package.sh) it installs the shipped
# files; run as scripts/install.sh in a source checkout it builds them first
# (cargo build --release; for glibc-2.28 binaries use scripts/package.sh).
#
# No libnccl-net.so is created unless --with-libnccl-net-link: NCCL loads that name
# whenever NCCL_NET_PLUGIN is unset, so such a link routes every job that uses this
# library directory through the plugin (docs/USERS.md, "Making it the default").
set -euo pipefail
prefix=${PREFIX:-/usr/local} destdir=${DESTDIR:-} uninstall=0 link=0
usage() { sed -n '4,5p' "$0" | sed 's/^#  *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift ;;
    --prefix=*) prefix=${1#*=} ;;
    --destdir) [ $# -ge 2 ] || usage; destdir=$2; shift ;;
    --destdir=*) destdir=${1#*=} ;;
    --uninstall) uninstall=1 ;;
    --with-libnccl-net-link) link=1 ;;
    -h|--help) usage ;;
    -*) echo "install.sh: unknown option $1" >&2; usage ;;
    *) prefix=$1 ;;
  esac
  shift
done
case $prefix in /*) ;; *) prefix=$(cd "$(dirname "$prefix")" 2>/dev/null && pwd)/$(basename "$prefix") ;; esac
root=$destdir$prefix
manifest=share/nccl-net-zip/MANIFEST

if [ $uninstall = 1 ]; then
  [ -f "$root/$manifest" ] || { echo "install.sh: no nccl-net-zip installation at $root ($manifest missing)" >&2; exit 1; }
  while IFS= read -r f; do
    [ -n "$f" ] && rm -f "$root/$f"
  done <"$root/$manifest"
  rm -f "$root/$manifest"
  # Directories this layout uses, deepest first, if now empty; never above PREFIX.
  for d in share/nccl-net-zip share/doc/nccl-net-zip share/doc share lib bin ""; do
    rmdir "$root/$d" 2>/dev/null || true
  done
  echo "uninstalled nccl-net-zip from $root"
  exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$here/lib/libnccl-net-zip.so" ]; then
  src=$here # an unpacked release tarball
  so=$src/lib/libnccl-net-zip.so bins=$src/bin docs=("$src/README.md" "$src/LICENSE" "$src/docs/USERS.md" "$src/docs/TROUBLESHOOTING.md")
elif [ -f "$here/../Cargo.toml" ]; then
  cd "$here/.."
  scripts/setup.sh
  cargo build --release -p nccl-net-zip --lib --bins
  td=${CARGO_TARGET_DIR:-$PWD/target}/release
  so=$td/libnccl_net_zip.so bins=$td docs=("$PWD/README.md" "$PWD/LICENSE" "$PWD/docs/USERS.md" "$PWD/docs/TROUBLESHOOTING.md")
else
  echo "install.sh: run it from an unpacked nccl-net-zip tarball or as scripts/install.sh in a checkout" >&2
  exit 1
fi

installed=()
put() { # put MODE SRC REL
  install -D -m "$1" "$2" "$root/$3"
  installed+=("$3")
}
put 0755 "$so" lib/libnccl-net-zip.so
for b in nccl-zip nccl-zip-perf; do put 0755 "$bins/$b" "bin/$b"; done
for f in "${docs[@]}"; do
  [ -f "$f" ] && put 0644 "$f" "share/doc/nccl-net-zip/$(basename "$f")"
done
if [ $link = 1 ]; then
  ln -sf libnccl-net-zip.so "$root/lib/libnccl-net.so"
  installed+=(lib/libnccl-net.so)
fi
mkdir -p "$root/share/nccl-net-zip"
printf '%s\n' "${installed[@]}" >"$root/$manifest"
echo "installed nccl-net-zip into $root:"
printf '  %s\n' "${installed[@]}"
echo "use: NCCL_NET_PLUGIN=$prefix/lib/libnccl-net-zip.so NCCL_NET=Zip NCCL_NET_PLUGIN_REF_COUNT=1 <your job>"
echo "     (or LD_LIBRARY_PATH=$prefix/lib:\$LD_LIBRARY_PATH NCCL_NET_PLUGIN=zip ...; docs: $prefix/share/doc/nccl-net-zip/USERS.md)"
echo "remove: $0 --uninstall --prefix $prefix${destdir:+ --destdir $destdir}"
