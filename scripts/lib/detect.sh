# shellcheck shell=bash
# "Is it installed?" checks, each asking what the consuming tool really loads or
# runs, not whether some similarly named file exists. Sourced by scripts/setup.sh
# and tested by scripts/tests/detect_test.sh against fake listings.

# libclang_name_ok NAME: whether clang-sys (bindgen's loader, runtime mode) would
# take a file of this name: libclang.so, libclang-*.so, libclang.so.*,
# libclang-*.so.*, but never libclang-cpp (the C++ library, a different ABI that
# Debian's stock image ships without libclang itself).
libclang_name_ok() {
  case $1 in
    *-cpp.*) return 1 ;;
    libclang.so | libclang-*.so | libclang.so.* | libclang-*.so.*) return 0 ;;
    *) return 1 ;;
  esac
}

# libclang_in_ldconfig: reads an `ldconfig -p` listing on stdin; succeeds when one
# of its libraries is a libclang that clang-sys would load.
libclang_in_ldconfig() {
  local name rest
  while read -r name rest; do
    [[ $rest == *"=>"* ]] || continue
    libclang_name_ok "$name" && return 0
  done
  return 1
}

# libclang_in_dirs DIR...: succeeds when a directory holds such a file (clang-sys
# also globs /usr/lib*/*, /usr/local/lib*/* and LIBCLANG_PATH, not only ld.so's
# cache; llvm-N/lib is where Debian's libclang1-N puts libclang.so.1).
libclang_in_dirs() {
  local d f
  for d in "$@"; do
    [ -d "$d" ] || continue
    for f in "$d"/libclang*.so*; do
      [ -e "$f" ] || continue
      libclang_name_ok "${f##*/}" && return 0
    done
  done
  return 1
}

# have_libclang: the check setup.sh uses.
have_libclang() {
  if [ -n "${LIBCLANG_PATH:-}" ]; then
    if [ -f "$LIBCLANG_PATH" ]; then libclang_name_ok "${LIBCLANG_PATH##*/}" && return 0; fi
    libclang_in_dirs "$LIBCLANG_PATH" && return 0
  fi
  ldconfig -p 2>/dev/null | libclang_in_ldconfig && return 0
  # shellcheck disable=SC2206
  local dirs=(/usr/lib/llvm-*/lib /usr/local/llvm*/lib* /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib)
  libclang_in_dirs "${dirs[@]}"
}

# python_has MODULE...: succeeds when python3 can import every module (what the
# demo's tensor maker and the codec benchmark import), not when pip lists it.
python_has() {
  local m
  for m in "$@"; do
    python3 -c "import $m" >/dev/null 2>&1 || return 1
  done
}

# nvcc_works NVCC: succeeds when NVCC compiles a kernel to PTX (cicc, the CRT
# headers and cuda_runtime.h all found), which is what build.rs asks of it; a
# bare `nvcc --version` passes with half a toolkit.
nvcc_works() {
  local nvcc=$1 tmp rc
  [ -x "$nvcc" ] || return 1
  tmp=$(mktemp -d)
  printf '__global__ void k(float *p) { p[threadIdx.x] += 1.0f; }\n' >"$tmp/k.cu"
  "$nvcc" -ptx -arch=compute_80 -o "$tmp/k.ptx" "$tmp/k.cu" >/dev/null 2>&1 && [ -s "$tmp/k.ptx" ]
  rc=$?
  rm -rf "$tmp"
  return $rc
}

# tc_has_tbf: succeeds when `tc` can parse a tbf qdisc (iproute2 present and the
# right one); whether the kernel accepts it is checked by scripts/netns.sh itself.
# (Output is captured, not piped into grep -q: under pipefail an early grep exit
# would fail the pipeline through SIGPIPE.)
tc_has_tbf() {
  command -v tc >/dev/null && command -v ip >/dev/null || return 1
  local tcu ipu
  tcu=$(tc qdisc help 2>&1 || true)
  ipu=$(ip netns help 2>&1 || true)
  [[ $tcu == *"tc qdisc"* && $ipu == *"ip netns add"* ]]
}
