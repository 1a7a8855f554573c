#!/usr/bin/env bash
# Fuzzes the codec's decoder (1/2 of the time), encode->decode round trip (1/6), the
# format-2 decoder on bit-flipped v2 frames (decode_v2, 1/6) and the GPU kernels'
# decoder built for the host against the CPU decoder (kernel_decode, differential, 1/6)
# with cargo-fuzz (libFuzzer + AddressSanitizer for the Rust side) for SECONDS in total
# (default 60).
# Seeds: the committed frozen frames. Prints exec counts and crashes; exits 1 on a crash.
# Only a stable toolchain exists here, so nightly-only flags are enabled with RUSTC_BOOTSTRAP=1.
set -euo pipefail
SECS="${1:-60}"
cd "$(dirname "$0")/../codec/fuzz"
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz || cargo install cargo-fuzz
unset CARGO_TARGET_DIR  # the fuzz crate is its own workspace: codec/fuzz/target (gitignored)

mkdir -p corpus/decode corpus/decode_v2 corpus/roundtrip corpus/kernel_decode artifacts
for f in ../tests/vectors/*.nzf; do
    # 2 leading bytes choose the destination size (0xFFFF * 32 bytes: big enough)
    { printf '\xff\xff'; cat "$f"; } > "corpus/decode/seed-$(basename "$f")"
    # kernel_decode: a first byte below 0x80 means "a frame follows" (0x7FFF * 32: 1 MiB)
    { printf '\x7f\xff'; cat "$f"; } > "corpus/kernel_decode/seed-$(basename "$f")"
done
for f in ../tests/vectors/v2/*.nzf; do
    { printf '\xff\xff'; cat "$f"; } > "corpus/decode/seed-v2-$(basename "$f")"
    { printf '\x7f\xff'; cat "$f"; } > "corpus/kernel_decode/seed-v2-$(basename "$f")"
done
for f in ../tests/vectors/v2/*.in; do
    # kernel_decode, first byte >= 0x80: compress as v2 (low bits: hint, checksum,
    # block size), then flip bits (next 8 bytes), as decode_v2
    head -c 30000 "$f" | { printf '\x84\x12\x34\x00\x00\x00\x00\x00\x00'; cat; } > "corpus/kernel_decode/seed-in-$(basename "$f")"
done
for f in ../tests/vectors/v2/*.in; do
    # byte 0: dtype hint and block size; bytes 1..8: bit positions to flip
    head -c 30000 "$f" | { printf '\x00\x12\x34\x00\x00\x00\x00\x00\x00'; cat; } > "corpus/decode_v2/seed-$(basename "$f")"
done
for f in ../tests/vectors/*.in; do
    head -c 20000 "$f" | { printf '\x00'; cat; } > "corpus/roundtrip/seed-$(basename "$f")"
done

cargo fuzz build -O decode >/dev/null 2>&1 || cargo fuzz build -O decode
cargo fuzz build -O roundtrip >/dev/null 2>&1 || cargo fuzz build -O roundtrip
cargo fuzz build -O decode_v2 >/dev/null 2>&1 || cargo fuzz build -O decode_v2
cargo fuzz build -O kernel_decode >/dev/null 2>&1 || cargo fuzz build -O kernel_decode

status=0
run() {
    local target="$1" secs="$2" log
    log="$(mktemp)"
    set +e
    cargo fuzz run -O "$target" "corpus/$target" -- -max_total_time="$secs" -max_len=300000 \
        -print_final_stats=1 -rss_limit_mb=4096 >"$log" 2>&1
    local rc=$?
    set -e
    local execs crashes
    execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
    crashes="$(find "artifacts/$target" -type f 2>/dev/null | wc -l)"
    echo "fuzz $target: ${secs}s, ${execs} execs, ${crashes} crash artifacts, exit ${rc}"
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        tail -40 "$log"
        status=1
    fi
    rm -f "$log"
}
run decode $(( SECS / 2 ))
run roundtrip $(( SECS / 6 ))
run decode_v2 $(( SECS / 6 ))
run kernel_decode $(( SECS - SECS / 2 - 2 * (SECS / 6) ))
exit $status
