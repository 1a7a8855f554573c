# shellcheck shell=bash
# Sourced by the scripts that build or run GPU code (gpu_bundle, gpu_validate,
# demo_gpu, e2e). Callers are in the repository root.

# nzc_find_nvcc: makes nvcc findable for build.rs: one already on PATH, NVCC or
# CUDA_HOME as set, a toolkit in /usr/local/cuda*, else the PyPI wheels
# (scripts/setup_cuda.sh). Fails when there is none.
nzc_find_nvcc() {
  # Each candidate must compile a kernel (scripts/lib/detect.sh), not merely exist.
  source scripts/lib/detect.sh
  if [ -n "${NVCC:-}" ] && nvcc_works "$NVCC"; then return 0; fi
  if [ -n "${CUDA_HOME:-}" ] && nvcc_works "$CUDA_HOME/bin/nvcc"; then return 0; fi
  if command -v nvcc >/dev/null && nvcc_works "$(command -v nvcc)"; then return 0; fi
  local d
  for d in /usr/local/cuda /usr/local/cuda-13.0; do
    if nvcc_works "$d/bin/nvcc"; then export CUDA_HOME=$d; return 0; fi
  done
  unset NVCC
  NVCC=$(scripts/setup_cuda.sh 2>/dev/null) && export NVCC
}

# nzc_bundle: prints the absolute path of the prebuilt binaries to use (NZC_BUNDLE,
# else .gpu-bundle where cargo is missing: the GPU machine has no Rust), or nothing
# when cargo builds here. Fails, saying why, when a bundle is needed but absent.
nzc_bundle() {
  local b=${NZC_BUNDLE:-}
  if [ -z "$b" ] && ! command -v cargo >/dev/null; then b=.gpu-bundle; fi
  [ -z "$b" ] && return 0
  if [ ! -f "$b/MANIFEST" ]; then
    echo "no cargo here and no bundle at $b: run scripts/gpu_bundle.sh where Rust is, and carry .gpu-bundle" >&2
    return 1
  fi
  (cd "$b" && pwd)
}

# nzc_net_tools: where `ip` is missing and the bundle brings iproute2 (gpu_bundle.sh,
# tools/*.deb), unpacks it under /tmp/nzc-tools and puts wrappers for ip and tc first
# on PATH. Each wrapper runs its binary through the system's dynamic loader with
# --library-path, which applies to that binary alone: `ip netns exec NS python ...`
# starts the ranks with the environment untouched. Returns 0 when ip is usable.
nzc_net_tools() {
  command -v ip >/dev/null && command -v tc >/dev/null && return 0
  local b=${NZC_BUNDLE:-.gpu-bundle} root=/tmp/nzc-tools/root bin=/tmp/nzc-tools/bin f ldso libs
  compgen -G "$b/tools/*.deb" >/dev/null || return 1
  ldso=$(ls /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 2>/dev/null | head -1)
  [ -n "$ldso" ] || return 1
  mkdir -p "$root" "$bin"
  for f in "$b"/tools/*.deb; do dpkg -x "$f" "$root" || return 1; done
  libs=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu
  for f in ip tc; do
    printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' "$ldso" "$libs" "$root/sbin/$f" >"$bin/$f"
    chmod +x "$bin/$f"
  done
  export PATH=$bin:$PATH
  ip -V >/dev/null 2>&1
}
