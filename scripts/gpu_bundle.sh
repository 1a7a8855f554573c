#!/usr/bin/env bash
# Builds, here, everything the GPU machine runs, into .gpu-bundle/ (gitignored):
# the GPU machine has CUDA, PyTorch and NCCL but no Rust toolchain, so the plugin,
# the perf tool and the GPU test binaries travel prebuilt (device tool: carry
# [".gpu-bundle"]). glibc here (Debian 12, 2.36) is older than there, so they run.
#
#   scripts/gpu_bundle.sh        # then, on the GPU machine:
#   NZC_BUNDLE=.gpu-bundle scripts/gpu_validate.sh   (e2e.sh, demo_gpu.sh likewise)
#
# Contents: libnccl_net_zip.so, nccl-zip-perf, nccl-zip, the test binaries
# gpu_codec, gpu_path, gpu_hazards, gpu_bench, gpu_load (cargo's test harness: pass
# --nocapture etc. directly), MANIFEST (commit, nvcc, sizes). Debug info is
# stripped to keep it small (the device tool carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
B=.gpu-bundle
export NCCL_ZIP_REQUIRE_KERNELS=1 CARGO_TERM_COLOR=never
source scripts/lib/gpu.sh
nzc_find_nvcc || { echo "gpu_bundle: no nvcc (scripts/setup_cuda.sh failed)" >&2; exit 1; }
TD=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --lib --bins
TESTS=(gpu_codec gpu_path gpu_hazards gpu_bench gpu_load)
json=$(mktemp)
cargo test --release --no-run --message-format=json $(printf -- '--test %s ' "${TESTS[@]}") >"$json"
rm -rf "$B" && mkdir -p "$B"
python3 - "$json" "$B" "${TESTS[@]}" <<'PY'
import json, shutil, sys
src, dst, want = sys.argv[1], sys.argv[2], set(sys.argv[3:])
found = {}
for line in open(src):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    t = m.get("target") or {}
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") in want and "test" in t.get("kind", []):
        found[t["name"]] = m["executable"]
missing = want - set(found)
if missing:
    sys.exit(f"test binaries not built: {sorted(missing)}")
for name, exe in found.items():
    shutil.copy2(exe, f"{dst}/{name}")
PY
rm -f "$json"
cp "$TD/release/libnccl_net_zip.so" "$TD/release/nccl-zip-perf" "$TD/release/nccl-zip" "$B/"
strip --strip-debug "$B"/*
{
  echo "commit: $(git rev-parse HEAD) ($(git status --porcelain | wc -l) dirty files)"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m), $(ldd --version | head -1)"
  echo "nvcc: $(${NVCC:-nvcc} --version 2>/dev/null | grep release || echo '?')"
  ls -l "$B" | awk 'NR > 1 {print "file: " $NF " " $5}'
} >"$B/MANIFEST"
cat "$B/MANIFEST"
du -sh "$B"
