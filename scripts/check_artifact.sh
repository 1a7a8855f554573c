#!/usr/bin/env bash
# Usage: scripts/check_artifact.sh [--static] DIR
#
# Checks the shipped files themselves (what scripts/release.sh or a package
# holds), not a fresh build: DIR has libnccl-net-zip.so, nccl-zip and
# nccl-zip-perf (either flat, or in lib/ and bin/ as in a package).
#  - the plugin exports exactly one symbol, ncclNetPlugin_v8;
#  - it is linked -z nodelete (DF_1_NODELETE), so NCCL >= 2.28 may dlclose it;
#  - no DT_NEEDED on libcuda, libnvrtc, libcudart, libibverbs or mlx5: those are
#    loaded at run time, so hosts without them still load the plugin;
#  - every file needs glibc symbol versions <= 2.28 (MAX_GLIBC to change);
#  - the GPU kernels' fatbin is embedded (fatbin magic 0xBA55ED50);
#  - unless --static: the shipped nccl-zip-perf dlopens the shipped plugin as
#    NCCL does and moves compressed and random data through it over loopback
#    (verified bytes, no leaked threads or fds), and nccl-zip round-trips a file.
# Prints one line per check; exits 1 at the end if any failed.
set -euo pipefail
static=0
[ "${1:-}" = --static ] && { static=1; shift; }
[ $# -eq 1 ] || { echo "usage: $0 [--static] DIR" >&2; exit 2; }
D=$1
MAX_GLIBC=${MAX_GLIBC:-2.28}
find1() { # find1 NAME: the file NAME in D or D/lib or D/bin
  for p in "$D/$1" "$D/lib/$1" "$D/bin/$1"; do [ -f "$p" ] && { echo "$p"; return; }; done
  echo "check_artifact: $1 not found in $D" >&2
  exit 1
}
SO=$(find1 libnccl-net-zip.so)
ZIP=$(find1 nccl-zip)
PERF=$(find1 nccl-zip-perf)
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# Defined dynamic symbols that are GLOBAL or WEAK (readelf columns: Num Value Size Type Bind Vis Ndx Name).
exports=$(readelf -W --dyn-syms "$SO" | awk '$5 ~ /GLOBAL|WEAK/ && $7 != "UND" && $8 != "" {print $8}' | sort -u)
if [ "$exports" = ncclNetPlugin_v8 ]; then ok "exports: ncclNetPlugin_v8 only"
else bad "exports: expected only ncclNetPlugin_v8, got: $(echo $exports)"; fi

if readelf -d "$SO" | grep -E 'FLAGS_1' | grep -q NODELETE; then ok "DF_1_NODELETE set (-z nodelete)"
else bad "DF_1_NODELETE missing (link with -z nodelete)"; fi

for f in "$SO" "$ZIP" "$PERF"; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  if echo "$needed" | grep -qiE 'libcuda|libnvrtc|libcudart|libibverbs|mlx5'; then
    bad "$(basename "$f"): DT_NEEDED on a run-time-loaded library: $needed"
  else ok "$(basename "$f"): DT_NEEDED $needed"; fi
  maxv=$(readelf -W --dyn-syms -V "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  if [ -z "$maxv" ]; then bad "$(basename "$f"): no GLIBC_ symbol versions found (not a glibc binary?)"
  elif [ "$(printf '%s\n%s\n' "$maxv" "$MAX_GLIBC" | sort -V | tail -1)" = "$MAX_GLIBC" ]; then
    ok "$(basename "$f"): needs GLIBC_$maxv (<= $MAX_GLIBC)"
  else bad "$(basename "$f"): needs GLIBC_$maxv (> $MAX_GLIBC): will not load on glibc $MAX_GLIBC hosts"; fi
done

if python3 - "$SO" <<'PY'
import sys
sys.exit(0 if b"\x50\xed\x55\xba" in open(sys.argv[1], "rb").read() else 1)
PY
then ok "GPU kernels embedded (fatbin)"
else bad "no fatbin in $SO: the GPU kernels were not embedded (release builds need NCCL_ZIP_REQUIRE_KERNELS=1)"; fi

if [ $static = 0 ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if "$ZIP" --version >"$tmp/v" 2>&1 && "$PERF" --version >>"$tmp/v" 2>&1; then ok "--version: $(tr '\n' ';' <"$tmp/v")"
  else bad "--version failed: $(cat "$tmp/v")"; fi
  for run in "bf16 on" "random auto"; do
    set -- $run
    if NCCL_SOCKET_IFNAME=lo NCCL_ZIP_COMPRESS=$2 timeout 120 "$PERF" loop --plugin "$SO" --data "$1" \
      --sizes 4K,100K,256K,1M,3M --count 200 --check-leaks --timeout 100 >"$tmp/loop" 2>&1 \
      && grep -q "OK recv 200 messages" "$tmp/loop" && grep -q "LEAKS none" "$tmp/loop"; then
      ok "nccl-zip-perf loop through the shipped plugin: $1 data, NCCL_ZIP_COMPRESS=$2, 200 messages verified, no leaks"
    else bad "nccl-zip-perf loop ($1, $2) failed:"; tail -20 "$tmp/loop"; fi
  done
  head -c 3000000 /dev/urandom >"$tmp/in"
  if "$ZIP" compress "$tmp/in" "$tmp/z" && "$ZIP" decompress "$tmp/z" "$tmp/out" && cmp -s "$tmp/in" "$tmp/out"; then
    ok "nccl-zip compress/decompress round trip"
  else bad "nccl-zip round trip failed"; fi
fi
if [ $fails -gt 0 ]; then echo "check_artifact: $fails check(s) failed for $D"; exit 1; fi
echo "check_artifact: all checks passed for $D"
