# Sourced by scripts/release.sh: puts zig (the `ziglang` wheel from PyPI) and
# cargo-zigbuild on PATH, installing them on first use into $NCCL_ZIP_TOOLS
# (default ~/.cache/nccl-net-zip/tools). Pinned versions, so a release is
# reproducible; fails with a clear message when either cannot be installed.
ZIG_VERSION=${ZIG_VERSION:-0.13.0}
ZIGBUILD_VERSION=${ZIGBUILD_VERSION:-0.24.1}
NCCL_ZIP_TOOLS=${NCCL_ZIP_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/nccl-net-zip/tools}

zig_fail() {
  echo "release: $*" >&2
  echo "release: the glibc-2.28 release build needs zig $ZIG_VERSION (PyPI wheel 'ziglang') and cargo-zigbuild $ZIGBUILD_VERSION (crates.io); install them, or point NCCL_ZIP_TOOLS at a directory that has them" >&2
  exit 1
}

setup_zig() {
  local zdir=$NCCL_ZIP_TOOLS/ziglang-$ZIG_VERSION
  if [ ! -x "$zdir/ziglang/zig" ]; then
    echo "release: installing zig $ZIG_VERSION (PyPI ziglang) into $zdir"
    local py
    py=$(command -v python3 || true)
    [ -n "$py" ] || zig_fail "python3 not found (needed to install the ziglang wheel)"
    mkdir -p "$zdir"
    "$py" -m pip install -q --disable-pip-version-check --target "$zdir" "ziglang==$ZIG_VERSION" \
      || zig_fail "pip install ziglang==$ZIG_VERSION failed"
    [ -x "$zdir/ziglang/zig" ] || zig_fail "the ziglang wheel has no zig binary for this machine ($(uname -m))"
  fi
  export PATH=$zdir/ziglang:$PATH
  zig version >/dev/null 2>&1 || zig_fail "$zdir/ziglang/zig does not run"

  local cdir=$NCCL_ZIP_TOOLS/cargo-zigbuild-$ZIGBUILD_VERSION
  if [ ! -x "$cdir/bin/cargo-zigbuild" ]; then
    echo "release: installing cargo-zigbuild $ZIGBUILD_VERSION into $cdir (a few minutes, once)"
    cargo install -q --locked --version "$ZIGBUILD_VERSION" --root "$cdir" cargo-zigbuild \
      || zig_fail "cargo install cargo-zigbuild $ZIGBUILD_VERSION failed"
  fi
  export PATH=$cdir/bin:$PATH
}
