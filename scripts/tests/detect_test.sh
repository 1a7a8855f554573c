#!/usr/bin/env bash
# Checks scripts/lib/detect.sh against fake inputs: the stock image's `ldconfig -p`
# (libclang-cpp only) must read as "no libclang", which the old check
# (`ldconfig -p | grep -q libclang`) got wrong; real libclang layouts must read as
# present. Exits non-zero on the first wrong answer.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/detect.sh
fail=0
expect() { # expect yes|no DESCRIPTION COMMAND...
  local want=$1 what=$2; shift 2
  local got=no
  if "$@"; then got=yes; fi
  if [[ $got == "$want" ]]; then echo "ok   $what"; else echo "FAIL $what: got $got, want $want"; fail=1; fi
}
stock='1234 libs found in cache `/etc/ld.so.cache'"'"'
	libclang-cpp.so.14 (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-cpp.so.14
	libc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6'
devpkg="$stock
	libclang-14.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-14.so.1"
cppdev="$stock
	libclang-cpp.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libclang-cpp.so"
plain="	libclang.so.1 (libc6,x86-64) => /usr/lib/llvm-16/lib/libclang.so.1"
old_check() { grep -q 'libclang' <<<"$1"; }
expect no "stock image listing (libclang-cpp.so.14 only)" libclang_in_ldconfig <<<"$stock"
expect no "libclang-cpp.so (C++ dev symlink) is not libclang" libclang_in_ldconfig <<<"$cppdev"
expect yes "libclang-14.so.1 (libclang1-14)" libclang_in_ldconfig <<<"$devpkg"
expect yes "libclang.so.1" libclang_in_ldconfig <<<"$plain"
# The old check is the bug this test guards against: it said yes to the stock image.
expect yes "old check was fooled by the stock listing (documents the bug)" old_check "$stock"
for n in libclang.so libclang-14.so libclang.so.1 libclang-14.so.1 libclang-17.0.6.so; do
  expect yes "name $n" libclang_name_ok "$n"
done
for n in libclang-cpp.so.14 libclang-cpp.so libclangBasic.a libclang_rt.asan.so clang.so; do
  expect no "name $n" libclang_name_ok "$n"
done
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
touch "$d/libclang-cpp.so.14"
expect no "dir holding only libclang-cpp" libclang_in_dirs "$d"
touch "$d/libclang-14.so.1"
expect yes "dir holding libclang-14.so.1" libclang_in_dirs "$d"
printf '#!/bin/sh\nexit 0\n' >"$d/nvcc" && chmod +x "$d/nvcc"
expect no "an nvcc that writes no PTX does not count" nvcc_works "$d/nvcc"
expect no "a missing nvcc" nvcc_works "$d/none"
expect no "python module that does not exist" python_has nzc_no_such_module_xyz
expect yes "python module json" python_has json
# Under the same shell options setup.sh runs with (pipefail), on this machine.
if command -v tc >/dev/null && command -v ip >/dev/null; then
  expect yes "iproute2 with netns and tc, under pipefail" tc_has_tbf
fi
exit $fail
