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
#
# Also, so that no variant needs a rebuild on the GPU machine:
#   variant-O/gpu_bench   the benchmark with -DNZC_UNORDERED_ROUNDS (docs/GPU.md,
#                         variant O; `scripts/gpu_run.sh bench-O`), built in
#                         target-variant-O/ (VARIANTS= skips it)
#   data/*.bf16           the first DATA_MB (4) MiB of each real tensor file of
#                         bench/data (scripts/make_tensors.sh; not in git), when present
# The bundle must stay under BUNDLE_MAX_MB (56), and with the tree (which travels
# with it) under CARRY_MAX_MB (62; the device tool's limit is 64 MiB).
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
for v in ${VARIANTS-O}; do
  case $v in
    O) flags=-DNZC_UNORDERED_ROUNDS ;;
    *) echo "gpu_bundle: unknown variant $v" >&2; exit 1 ;;
  esac
  vjson=$(mktemp)
  NCCL_ZIP_NVCC_FLAGS=$flags CARGO_TARGET_DIR=$PWD/target-variant-$v \
    cargo test --release --no-run --message-format=json --test gpu_bench >"$vjson"
  mkdir -p "$B/variant-$v"
  exe=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and (m.get("target") or {}).get("name") == "gpu_bench": print(m["executable"])' "$vjson")
  rm -f "$vjson"
  cp "$exe" "$B/variant-$v/gpu_bench"
  strip --strip-debug "$B/variant-$v/gpu_bench"
  echo "variant $v: NCCL_ZIP_NVCC_FLAGS=$flags, commit $(git rev-parse HEAD) ($(git status --porcelain | wc -l) dirty files)" >"$B/variant-$v/MANIFEST"
done
if compgen -G "bench/data/*.bf16" >/dev/null; then
  mkdir -p "$B/data"
  for f in bench/data/*.bf16; do
    head -c $((${DATA_MB:-4} << 20)) "$f" >"$B/data/$(basename "$f")"
  done
else
  echo "gpu_bundle: no bench/data/*.bf16 (scripts/make_tensors.sh): the bundle carries no real tensors" >&2
fi
# iproute2 (ip, tc) and its libraries as .deb files: the GPU machine has neither,
# so scripts/e2e.sh could not make the shaped link there (first GPU run). On that
# machine nzc_net_tools (scripts/lib/gpu.sh) unpacks them under /tmp and runs them
# through the dynamic loader with their own library path. TOOLS=0 skips them.
if [ "${TOOLS:-1}" = 1 ]; then
  mkdir -p "$B/tools"
  if ! (cd "$B/tools" && apt-get download iproute2 libbpf1 libbsd0 libcap2 libelf1 libmd0 libmnl0 libxtables12 zlib1g >/dev/null 2>&1); then
    echo "gpu_bundle: apt-get download of iproute2 failed: no shaped link on the GPU machine" >&2
    rm -rf "$B/tools"
  fi
fi
{
  echo "commit: $(git rev-parse HEAD) ($(git status --porcelain | wc -l) dirty files)"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -m), $(ldd --version | head -1)"
  echo "nvcc: $(${NVCC:-nvcc} --version 2>/dev/null | grep release || echo '?')"
  find "$B" -type f ! -path "$B/MANIFEST" -printf 'file: %P %s\n' | sort
} >"$B/MANIFEST"
cat "$B/MANIFEST"
du -sh "$B"
mb=$(du -sm "$B" | cut -f1)
if [ "$mb" -gt "${BUNDLE_MAX_MB:-56}" ]; then
  echo "gpu_bundle: $B is $mb MiB, over BUNDLE_MAX_MB=${BUNDLE_MAX_MB:-56} (the device tool carries 64 MiB with the tree): lower DATA_MB" >&2
  exit 1
fi
# What a device call carries: the tree (tracked files and untracked ones git does
# not ignore) plus the bundle, 64 MiB at most; CARRY_MAX_MB (62) leaves a margin.
tree=$({ git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
bundle=$(du -sb "$B" | cut -f1)
carry=$(((tree + bundle) >> 20))
echo "gpu_bundle: a device call carries $carry MiB: tree $((tree >> 10)) KiB + $B $((bundle >> 10)) KiB (limit 64 MiB)"
if [ "$carry" -ge "${CARRY_MAX_MB:-62}" ]; then
  echo "gpu_bundle: tree + bundle is $carry MiB, over CARRY_MAX_MB=${CARRY_MAX_MB:-62}: lower DATA_MB or remove large untracked files" >&2
  exit 1
fi
