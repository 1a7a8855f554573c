// nccl-zip GPU codec: format constants and per-element helpers shared by the CUDA
// kernels (nvcc) and the host test harness (g++). docs/FORMAT.md is the contract;
// every function here is a pure function of its arguments.
//
// Compiled two ways:
//   * nvcc, device side: NZC_HD = __host__ __device__, tables in __constant__;
//   * g++ (kernels/host/harness.cpp): NZC_HD = static inline, tables in .rodata.
#pragma once
#if defined(__CUDACC_RTC__)
// NVRTC (fallback for old drivers) has no C library headers.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <stdint.h>
#endif

// Full unrolling of a constant-trip loop (array indices become constants: registers,
// not local memory); g++ leaves it to -O.
#if defined(__CUDACC__)
#define NZC_UNROLL _Pragma("unroll")
#else
#define NZC_UNROLL
#endif

#if defined(__CUDACC__)
#define NZC_HD __host__ __device__ __forceinline__
#define NZC_TABLE static __constant__ const
#else
#define NZC_HD static inline
#define NZC_TABLE static const
#endif

namespace nzc {

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

// ---- format constants (docs/FORMAT.md §2-§6) --------------------------------
enum : u32 {
    HEADER_LEN = 24,
    BLOCK_HEADER_LEN = 4,
    SEG_ELEMS = 1024,
    MIN_CODED_INPUT = 64,
    MIN_CODED_ELEMS = 64,
    SAMPLE_STRIDE = 13,
    MIN_BLOCK_LOG2 = 12,
    MAX_BLOCK_LOG2 = 20,
    ND = 24,
    SYM_ZERO = 24,
    SYM_ESC = 25,
    NSYM = 26,
    NCODES = 32,
    MAXLEN = 12,
    DEC_TABLE = 1u << MAXLEN,
};
// FLAG_COLTAB: version 2 only, a column table follows the header (FORMAT.md V2.9).
enum : u32 { FLAG_CHECKSUM = 1, FLAG_STORED = 2, FLAG_COLTAB = 4 };
enum : u32 { MODE_RAW = 0, MODE_FILL = 1, MODE_BF16 = 2, MODE_FP16 = 3, MODE_FP32 = 4 };
// Version 2's symbol-code blocks (FORMAT.md V2.10).
enum : u32 { MODE_E4M3 = 5, MODE_E5M2 = 6, MODE_FP16N = 7 };
// Header dtype byte (FORMAT.md §2).
enum : u32 { DT_RAW = 0, DT_BF16 = 1, DT_FP16 = 2, DT_FP32 = 3 };
// Encoder hint (matches nccl_zip_codec::DtypeHint order; fp8 hints encode as raw).
enum : u32 {
    HINT_AUTO = 0,
    HINT_RAW = 1,
    HINT_BF16 = 2,
    HINT_FP16 = 3,
    HINT_FP32 = 4,
    HINT_FP8E4M3 = 5,
    HINT_FP8E5M2 = 6
};

// Work decomposition inside one CTA (see docs/GPU.md): a segment of 1024 elements is
// coded by 32 "lanes" of 32 consecutive elements each.
enum : u32 { LANES = 32, LANE_ELEMS = SEG_ELEMS / LANES };

// Status codes written to a job's result (0 = ok). Decoder errors are all "corrupt"
// for the caller; the code says which check fired.
enum : u32 {
    ST_OK = 0,
    ST_BAD_ARGS = 1,       // descriptor invalid (dst too small, bad block_log2, ...)
    ST_HEADER = 2,         // magic/version/header crc/flags/dtype/block size
    ST_DST_TOO_SMALL = 3,  // raw_len > dst capacity
    ST_LENGTH = 4,         // frame length != what header + table imply
    ST_BLOCK = 5,          // block mode / block length / coded header
    ST_STREAM = 6,         // segment decode error (exponent range, segment length)
    ST_CHECKSUM = 7,       // CRC32C of the output differs from the header's
};

// ---- element types -----------------------------------------------------------
struct TypeInfo {
    u32 w, ebits, emax, rawbits, xbits, p2, mode;
};

NZC_HD TypeInfo type_info(u32 dt) {
    TypeInfo t;
    switch (dt) {
        case DT_FP16: t.w = 2; t.ebits = 5; t.emax = 31; t.rawbits = 11; t.xbits = 3; t.p2 = 0; t.mode = MODE_FP16; break;
        case DT_FP32: t.w = 4; t.ebits = 8; t.emax = 255; t.rawbits = 24; t.xbits = 0; t.p2 = 2; t.mode = MODE_FP32; break;
        default:      t.w = 2; t.ebits = 8; t.emax = 255; t.rawbits = 8; t.xbits = 0; t.p2 = 0; t.mode = MODE_BF16; break;
    }
    return t;
}

NZC_HD u32 dtype_of_mode(u32 mode) {
    return mode == MODE_FP16 ? DT_FP16 : mode == MODE_FP32 ? DT_FP32 : DT_BF16;
}

// Little-endian element i (width w) of p; byte loads, any alignment.
NZC_HD u32 load_elem(const u8* p, u64 i, u32 w) {
    const u8* q = p + i * w;
    if (w == 2) return (u32)q[0] | ((u32)q[1] << 8);
    return (u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24);
}

NZC_HD u32 exp_field(u32 dt, u32 x) {
    if (dt == DT_FP16) return (x >> 10) & 0x1F;
    if (dt == DT_FP32) return (x >> 23) & 0xFF;
    return (x >> 7) & 0xFF;
}

// The byte the exponent code covers (codec/src/elem.rs "key").
NZC_HD u32 key_of(u32 dt, u32 x) {
    if (dt == DT_FP16) return (x >> 8) & 0xFF;
    if (dt == DT_FP32) return (x >> 23) & 0xFF;
    return (x >> 7) & 0xFF;
}

NZC_HD u32 plane1_of(u32 dt, u32 x) {
    if (dt == DT_FP16) return x & 0xFF;
    if (dt == DT_FP32) return ((x >> 24) & 0x80) | ((x >> 16) & 0x7F);
    return ((x >> 8) & 0x80) | (x & 0x7F);
}

// key -> (exponent field, stream extra bits)
NZC_HD void key_parts(u32 dt, u32 key, u32* e, u32* x) {
    if (dt == DT_FP16) {
        *e = (key >> 2) & 0x1F;
        *x = ((key >> 7) << 2) | (key & 3);
    } else {
        *e = key;
        *x = 0;
    }
}

NZC_HD u32 make_key(u32 dt, u32 e, u32 x) {
    if (dt == DT_FP16) return ((x >> 2) << 7) | (e << 2) | (x & 3);
    return e;
}

// Rebuilds the element from its key and planes.
NZC_HD u32 join_elem(u32 dt, u32 key, u32 p1, u32 p2) {
    if (dt == DT_FP16) return (key << 8) | p1;
    u32 hi = ((p1 & 0x80) << 8) | (key << 7) | (p1 & 0x7F);
    if (dt == DT_FP32) return (hi << 16) | p2;
    return hi;
}

NZC_HD u32 symbol_of(u32 e, u32 a) {
    if (e == 0) return SYM_ZERO;
    u32 d = a - e;  // wraps when e > a
    return d < ND ? d : SYM_ESC;
}

// ---- little-endian stores/loads of header fields ----------------------------
NZC_HD void st_u16(u8* p, u32 v) {
    p[0] = (u8)v;
    p[1] = (u8)(v >> 8);
}
NZC_HD void st_u32(u8* p, u32 v) {
    for (int i = 0; i < 4; i++) p[i] = (u8)(v >> (8 * i));
}
NZC_HD void st_u64(u8* p, u64 v) {
    for (int i = 0; i < 8; i++) p[i] = (u8)(v >> (8 * i));
}
NZC_HD u32 ld_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
NZC_HD u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
NZC_HD u64 ld_u64(const u8* p) { return (u64)ld_u32(p) | ((u64)ld_u32(p + 4) << 32); }

// ---- CRC32C (Castagnoli, reflected, init/xorout 0xFFFFFFFF) -------------------
enum : u32 { CRC_POLY = 0x82F63B78u };

// Bit-serial CRC of a short buffer (the 20 header bytes).
NZC_HD u32 crc32c_bitwise(const u8* p, u32 n) {
    u32 c = 0xFFFFFFFFu;
    for (u32 i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1)));
    }
    return ~c;
}

NZC_HD u32 crc32c_table_entry(u32 i) {
    u32 c = i;
    for (int b = 0; b < 8; b++) c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1)));
    return c;
}

// Finished CRC32C of p[0..n) with a 256-entry table.
NZC_HD u32 crc32c_tab(const u32* table, const u8* p, u64 n) {
    u32 c = 0xFFFFFFFFu;
    for (u64 i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

// a*b mod P in the reflected representation (x^0 = 0x80000000), as in zlib.
NZC_HD u32 crc_multmodp(u32 a, u32 b) {
    u32 p = 0;
    // Ends after the lowest set bit of a (at once for a == 0: no endless loop).
    for (u32 m = 1u << 31; m && a; m >>= 1) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        b = (b & 1) ? (b >> 1) ^ CRC_POLY : b >> 1;
    }
    return p;
}

// x2n[k] = x^(2^k) mod P, k = 0..31.
NZC_HD void crc_x2n_table(u32* x2n) {
    u32 p = 1u << 30;  // x^1
    for (int k = 0; k < 32; k++) {
        x2n[k] = p;
        p = crc_multmodp(p, p);
    }
}

// x^(2^k) mod P for any k: the table up to 31, squaring beyond. The powers do not
// repeat with period 32 for the Castagnoli polynomial (x^(2^32) mod P is x^2, not
// x, unlike zlib's CRC-32 polynomial), so `x2n[k & 31]` would be wrong for
// len(B) >= 2^29 bytes (k >= 32). Squaring runs only for parts of 512 MiB or more.
NZC_HD u32 crc_x2n_at(const u32* x2n, u32 k) {
    if (k < 32) return x2n[k];
    u32 p = x2n[31];
    for (u32 j = 31; j < k; j++) p = crc_multmodp(p, p);
    return p;
}

// crc32c(A || B) from crc32c(A), crc32c(B) and len(B).
NZC_HD u32 crc32c_combine(const u32* x2n, u32 crc_a, u32 crc_b, u64 len_b) {
    u32 op = 1u << 31;  // x^0
    u32 k = 3;          // x^(8*len) = product of x^(2^(k+3)) over set bits
    while (len_b) {
        if (len_b & 1) op = crc_multmodp(crc_x2n_at(x2n, k), op);
        len_b >>= 1;
        k++;
    }
    return crc_multmodp(op, crc_a) ^ crc_b;
}

}  // namespace nzc
