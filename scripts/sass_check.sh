#!/usr/bin/env bash
# The GPU kernels' machine code, read without a GPU (issue 19, item 5): compiles
# kernels/nzc_kernels.cu to a cubin (nvcc from scripts/setup_cuda.sh), reads its
# SASS with cuobjdump/nvdisasm, and prints per kernel: registers, stack frame and
# spills (ptxas), local loads/stores (LDL/STL), 64-bit division subroutines
# (`__cuda_sm20_div_u64` and friends), global/generic loads and stores by width
# (1-2 byte accesses against 4-16 byte ones: a coalescing proxy; static counts,
# not executed ones), fences, barriers, and
# resident CTAs per SM at 256 threads with the launch's shared memory.
#   scripts/sass_check.sh                 sm_90, prints the table
#   ARCH=sm_100 scripts/sass_check.sh
#   scripts/sass_check.sh --strict        exit 1 on local memory, spills or calls
#                                         (64-bit division subroutines) in the v2
#                                         kernels (STRICT_KERNELS=. : in all)
#   OUT=bench/results/x.md scripts/sass_check.sh   also writes the table there
# cuobjdump and nvdisasm come from PyPI wheels into .toolchain/cuobjdump; 13.0
# (our nvcc's version) is not published there, so the oldest 13.x is used (13.2.51,
# which reads 13.0 cubins).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARCH=${ARCH:-sm_90}
STRICT=0
[[ ${1:-} == --strict ]] && STRICT=1
NVCC=$(scripts/setup_cuda.sh)
TOOLS=.toolchain/cuobjdump
TV=13.2.51
if [[ ! -x $TOOLS/nvidia/cu13/bin/cuobjdump || ! -x $TOOLS/nvidia/cu13/bin/nvdisasm ]]; then
  echo "sass_check: installing cuobjdump and nvdisasm $TV into $TOOLS" >&2
  rm -rf "$TOOLS"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$TOOLS" \
    "nvidia-cuda-cuobjdump==$TV" "nvidia-cuda-nvdisasm==$TV" 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
fi
export PATH=$ROOT/$TOOLS/nvidia/cu13/bin:$PATH
command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null \
  || { echo "sass_check: cuobjdump/nvdisasm missing after install" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$NVCC" -std=c++17 -O3 -arch="$ARCH" -cubin -Xptxas -v kernels/nzc_kernels.cu -o "$W/k.cubin" 2>"$W/ptxas.txt"
cuobjdump -sass "$W/k.cubin" >"$W/k.sass"
cuobjdump -elf "$W/k.cubin" >"$W/k.elf"
# The launch's dynamic shared memory (smem_bytes(16), the default 64 KiB blocks),
# from the same formula the kernels use, via the host harness.
g++ -std=c++17 -O1 -pthread kernels/host/harness.cpp -o "$W/h"
printf 'smem 16\nsmem2 16\n' >"$W/s.txt"
SMEM=$("$W/h" "$W/s.txt" | awk 'NR == 1 {print $2}')
SMEM2=$("$W/h" "$W/s.txt" | awk 'NR == 2 {print $2}')  # nzc_decode_v2's carve
NVCC_V=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
DIS_V=$(cuobjdump --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')

# Per function: ptxas figures, then SASS counts. Subroutines are attributed to the
# kernel whose listing contains them (cuobjdump prints them inside it).
awk -v smem="$SMEM" -v smem2="$SMEM2" -v arch="$ARCH" '
  FNR == 1 { file++ }
  file == 1 && /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); f = substr($0, RSTART + 1, RLENGTH - 2); order[++nf] = f }
  file == 1 && /bytes stack frame/ { split($0, a, " "); stack[f] = a[1]; spill[f] = a[5] + a[9] }
  file == 1 && /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); regs[f] = substr($0, RSTART + 5, RLENGTH - 15) + 0 }
  file == 2 && /Function :/ { g = $3 }
  file == 2 && g != "" && /\/\*[0-9a-f]+\*\/ / {
    ins[g]++
    if ($0 ~ / (LDL|STL)(\.| )/) local[g]++
    # global or generic loads and stores (LDG/LD, STG/ST; not shared, local, constant)
    if ($0 ~ / (LDG|LD)\.E/) { if ($0 ~ / (LDG|LD)\.E\.(U8|S8|U16|S16)[ .]/) narrow[g]++; else wide[g]++ }
    if ($0 ~ / (STG|ST)\.E/) { if ($0 ~ / (STG|ST)\.E\.(U8|S8|U16|S16)[ .]/) snarrow[g]++; else swide[g]++ }
    if ($0 ~ / (MEMBAR|FENCE)/) fence[g]++
    if ($0 ~ / BAR\.(SYNC|RED)/) bar[g]++
    if ($0 ~ / CALL\.REL/) calls[g]++
  }
  file == 3 && /\$__internal_[0-9]+_\$__cuda_sm[0-9]+_[a-z0-9_]+/ && !/Value:/ {
    match($0, /__cuda_sm[0-9]+_[a-z0-9_]+/); sub_name = substr($0, RSTART, RLENGTH); subs[sub_name]++
  }
  END {
    printf "| kernel (%s) | registers | stack B | spill B | LDL/STL | CALL | 1-2 B loads | 4-16 B loads | 1-2 B stores | 4-16 B stores | fences | barriers | SASS instr | CTAs/SM (256 thr, %d B smem; _v2: %d B) |\n", arch, smem, smem2
    print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= nf; i++) {
      f = order[i]; r = regs[f]
      # 65536 registers per SM, allocated per warp in units of 256; 8 warps per CTA;
      # 2048 threads; 228 KiB of shared memory (sm_90/sm_100), 1 KiB reserved per CTA.
      rw = int((r * 32 + 255) / 256) * 256; byreg = rw ? int(65536 / (rw * 8)) : 8
      sm = f ~ /_v2$/ ? smem2 : smem; bysm = int(233472 / (sm + 1024)); occ = byreg < 8 ? byreg : 8; if (f != "nzc_smem_bytes" && bysm < occ) occ = bysm
      printf "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", f, r, stack[f], spill[f], local[f], calls[f], narrow[f], wide[f], snarrow[f], swide[f], fence[f], bar[f], ins[f], occ
    }
    n = 0; for (s in subs) { printf "subroutine: %s\n", s; n++ }
    if (!n) print "subroutines: none"
  }' "$W/ptxas.txt" "$W/k.sass" "$W/k.elf" >"$W/table.md"

{
  echo "# SASS facts of kernels/nzc_kernels.cu ($(date -u +%Y-%m-%d))"
  echo
  echo "nvcc $NVCC_V, cuobjdump/nvdisasm $DIS_V, $ARCH, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); command: \`ARCH=$ARCH scripts/sass_check.sh\`"
  echo
  cat "$W/table.md"
} | tee "$W/out.md"
if [[ -n ${OUT:-} ]]; then cp "$W/out.md" "$OUT"; echo "written to $OUT"; fi

if ((STRICT)); then
  # The kernels --strict holds to (STRICT_KERNELS, an awk regex; default: the v2
  # kernels; '.' for all): no stack frame, spill or LDL/STL, and no CALL at all
  # (the 64-bit division subroutines are the calls the v1 kernels make).
  SK=${STRICT_KERNELS:-_v2$}
  bad=$(awk -F'|' -v re="$SK" 'NR > 2 && NF > 10 { k = $2; gsub(/ /, "", k) }
    NR > 2 && NF > 10 && k ~ re && ($4 + 0 > 0 || $5 + 0 > 0 || $6 + 0 > 0 || $7 + 0 > 0) { print k }' "$W/table.md")
  if [[ -n $bad ]]; then
    echo "sass_check: strict ($SK): local memory or calls in: $bad" >&2
    exit 1
  fi
  echo "sass_check: strict ($SK): no local memory, spills or calls"
fi
