// nccl-zip GPU codec: the encoder and decoder of docs/FORMAT.md, written once for
// the CUDA kernels and the host test harness.
//
// Every algorithm is a template over an executor X that stands for "one CTA":
//   x.par(n, f)      f(i) for i in 0..n, spread over the CTA's threads, then a barrier
//   x.one(f)         f() on one thread, then a barrier
//   x.any(n, pred)   whether pred(i) holds for some i (early exit), uniform result
//   x.sum64(n, slot, f)   sum of f(i) over i < n, uniform result (sc64[slot] scratch)
//   x.rounds(n, f)   like par, but unit i is done no later than any unit >= i + nthreads
//                    starts (ascending store rounds, for NCCL LL/LL128 consumers)
//   X::add32/add64/or32   atomics on shared memory
//   x.lookback(scan, b, size)   decoupled look-back over the blocks of a frame
//   x.finish(state, items)      "this CTA finished the last work item of the job"
//   x.publish(result, len, st)  write a job's result and make it visible to the host
// The device executor (nzc_kernels.cu) maps these to threads and barriers; the host
// executor (host/harness.cpp) runs every unit sequentially in order, which is one
// valid schedule of the same program. Values computed inside `one` must go through
// shared memory (Smem), never through captured locals: on the device only thread 0
// runs the lambda.
#pragma once
#include "nzc_codes.cuh"
#include "nzc_common.cuh"

namespace nzc {

// ---- job descriptors (host <-> device ABI; mirrored in src/gpu/abi.rs) ---------
// Pointers travel as u64 so the layout is the same for nvcc, g++ and Rust.
struct EncJob {         // 64 bytes
    u64 src;            // const u8*: n input bytes
    u64 dst;            // u8*: frame, capacity dst_cap >= n + 24
    u64 n;
    u64 dst_cap;
    u64 ws;             // job workspace (JobState, then scan[nb] u64, then crc[nb] u32), zeroed
    u64 result;         // JobResult* (device or host-mapped memory)
    u32 hint;           // HINT_*
    u32 checksum;       // 0/1
    u32 block_log2;     // 12..=20
    u32 nb;             // ceil(n / 2^block_log2), computed by the host
};
struct DecJob {         // 64 bytes
    u64 src;            // const u8*: the frame
    u64 src_len;        // its exact length
    u64 dst;            // u8*: output
    u64 dst_cap;        // output capacity (NCCL's posted receive size)
    u64 ws;             // job workspace, zeroed; room for ws_blocks blocks
    u64 result;         // JobResult*
    u64 ws_blocks;      // >= ceil(dst_cap / 4096)
    u64 reserved;
};
struct JobState {       // 32 bytes at the start of a job workspace
    u32 claim;          // next work item (block) to hand out
    u32 done;           // work items finished
    u32 err;            // first nonzero status
    u32 pad0;
    u64 pad1, pad2;
};
struct JobResult {      // 16 bytes
    u64 len;            // encode: frame length; decode: uncompressed length
    u32 status;         // ST_*
    u32 done;           // set to 1 last, after a system-scope fence
};
#if defined(__cplusplus) && __cplusplus >= 201103L
static_assert(sizeof(EncJob) == 64, "EncJob is mirrored in src/gpu/abi.rs");
static_assert(sizeof(DecJob) == 64, "DecJob is mirrored in src/gpu/abi.rs");
static_assert(sizeof(JobState) == 32, "workspace layout is computed by the host");
static_assert(sizeof(JobResult) == 16, "JobResult is mirrored in src/gpu/abi.rs");
#endif

NZC_HD u64 ws_bytes(u64 nb) { return sizeof(JobState) + 8 * nb + 4 * nb; }
NZC_HD u64* ws_scan(u64 ws) { return (u64*)(ws + sizeof(JobState)); }
NZC_HD u32* ws_crc(u64 ws, u64 nb) { return (u32*)(ws + sizeof(JobState) + 8 * nb); }

// ---- shared memory (one CTA) ---------------------------------------------------
// Sized for the largest block_log2 of a launch; see smem_bytes().
enum : u32 {
    COST_UNITS = 6 * NCODES,   // anchors smax-4..smax+1 x codes
    DEC_GROUP_SEGS = 32,       // segments decoded per smem round (keys buffer)
    KEY_STRIDE = SEG_ELEMS + 4, // keys of one segment: padded so that the 32 decoding
                                // threads' byte stores fall in 32 different banks
    CRC_PARTS = 256,           // a block's CRC is computed in this many parts
    NSCAL = 64,
};
struct Smem {
    u32* hist;       // 3 x 256 exponent histograms
    u64* cost;       // 3 x COST_UNITS costs
    u32* nz;         // 3 x 256 (count << 8 | exponent) of nonzero histogram bins
    u32* lut;        // encode: 256 entries; decode: DEC_TABLE entries
    u16* lanebits;   // nseg_max x LANES
    u16* laneoff;    // nseg_max x LANES
    u32* seglen;     // nseg_max
    u32* segoff;     // nseg_max
    u32* crc_tab;    // 256
    u32* crc_x2n;    // 32
    u32* crc_part;   // CRC_PARTS
    u8* keys;        // DEC_GROUP_SEGS x KEY_STRIDE
    u8* codelen;     // NSYM x NCODES: CODE_LENGTHS transposed, [sym][k] (best_cost's
                     // warp reads 32 codes of one symbol: 32 consecutive bytes)
    u32* sc;         // NSCAL scalars (broadcast slots)
    u64* sc64;       // NSCAL 64-bit scalars
    // v2 decoder (V2Smem): its per-block arrays, and the staging buffer of decoded
    // elements. smem_carve points them into v1-only regions (lanebits, laneoff,
    // keys); smem_carve_v2 (nzc_decode_v2) gives them their own, staging sized
    // so that every sub-segment of a 64 KiB block decodes at once.
    u32* v2a;        // 4 x B/512
    u32* v2b;        // B/512 + 2 x B/2048
    u8* stage;
    u32 stage_bytes;
    // v2 decoder: a COL block's copy of the frame's column table (FORMAT.md V2.9:
    // P <= 8192 4-bit offsets, packed as in the frame), CTAB_BYTES. smem_carve
    // points it into the encoder-only cost array (4,608 bytes).
    u8* ctab;
};
enum : u32 { CTAB_BYTES = 4096 };
NZC_HD u32 nseg_max(u32 block_log2) { return ((1u << block_log2) / 2 + SEG_ELEMS - 1) / SEG_ELEMS; }

NZC_HD u64 align16(u64 v) { return (v + 15) & ~(u64)15; }
// Carves the regions out of `base` (16-aligned); returns the bytes used.
NZC_HD u64 smem_carve(u8* base, u32 block_log2, Smem* s) {
    u64 o = 0;
    u32 ns = nseg_max(block_log2);
#define NZC_CARVE(field, type, count)            \
    s->field = (type*)(base + o);                \
    o = align16(o + (u64)sizeof(type) * (count));
    NZC_CARVE(sc64, u64, NSCAL)
    NZC_CARVE(cost, u64, 3 * COST_UNITS)
    NZC_CARVE(sc, u32, NSCAL)
    NZC_CARVE(hist, u32, 3 * 256)
    NZC_CARVE(nz, u32, 3 * 256)
    NZC_CARVE(lut, u32, DEC_TABLE)
    NZC_CARVE(seglen, u32, ns)
    NZC_CARVE(segoff, u32, ns)
    NZC_CARVE(crc_tab, u32, 256)
    NZC_CARVE(crc_x2n, u32, 32)
    NZC_CARVE(crc_part, u32, CRC_PARTS)
    NZC_CARVE(lanebits, u16, ns * LANES)
    NZC_CARVE(laneoff, u16, ns * LANES)
    NZC_CARVE(keys, u8, DEC_GROUP_SEGS * KEY_STRIDE)
    NZC_CARVE(codelen, u8, NSYM * NCODES)
#undef NZC_CARVE
    s->v2a = (u32*)s->lanebits;  // B/32 bytes
    s->v2b = (u32*)s->laneoff;   // B/32 bytes
    s->stage = s->keys;
    s->stage_bytes = DEC_GROUP_SEGS * KEY_STRIDE;
    s->ctab = (u8*)s->cost;  // 3 x COST_UNITS x 8 >= CTAB_BYTES
    return o;
}
NZC_HD u64 smem_bytes(u32 block_log2) {
    Smem s;
    return smem_carve((u8*)0, block_log2, &s);
}

// Staging of the v2 decoder in nzc_decode_v2: the kept elements of up to 64 KiB
// (all of a 64 KiB block) with V2_PAD bytes after each sub-segment (>= 256 bf16
// values, 512 bytes).
NZC_HD u32 v2_stage_bytes(u32 block_log2) {
    const u32 b = block_log2 < 16 ? 1u << block_log2 : 1u << 16;
    return b + b / 128;
}
// nzc_decode_v2's carve: what the frame checks, the CRC and the v2 decoder use;
// the v1-only regions are absent (null).
NZC_HD u64 smem_carve_v2(u8* base, u32 block_log2, Smem* s) {
    u64 o = 0;
    const u64 B = (u64)1 << block_log2;
#define NZC_CARVE(field, type, count)            \
    s->field = (type*)(base + o);                \
    o = align16(o + (u64)sizeof(type) * (count));
    NZC_CARVE(sc64, u64, NSCAL)
    NZC_CARVE(sc, u32, NSCAL)
    NZC_CARVE(lut, u32, DEC_TABLE)
    NZC_CARVE(crc_tab, u32, 256)
    NZC_CARVE(crc_x2n, u32, 32)
    NZC_CARVE(crc_part, u32, CRC_PARTS)
    NZC_CARVE(codelen, u8, NSYM * NCODES)
    NZC_CARVE(ctab, u8, CTAB_BYTES)
    NZC_CARVE(v2a, u32, 4 * B / 512)
    NZC_CARVE(v2b, u32, B / 512 + 2 * B / 2048)
    NZC_CARVE(stage, u8, v2_stage_bytes(block_log2))
#undef NZC_CARVE
    s->stage_bytes = v2_stage_bytes(block_log2);
    s->hist = s->nz = s->seglen = s->segoff = 0;
    s->cost = 0;
    s->lanebits = s->laneoff = 0;
    s->keys = 0;
    return o;
}
NZC_HD u64 smem_bytes_v2(u32 block_log2) {
    Smem s;
    return smem_carve_v2((u8*)0, block_log2, &s);
}

// Scalar slots in Smem::sc / sc64.
enum : u32 {
    SC_USED = 0,      // detection: sampled groups not constant
    SC_FLAG = 1,      // generic flag (any/err)
    SC_ERR = 2,       // block decode error (ST_*)
    SC_TOTAL = 3,     // decode: sum of segment lengths
    SC_KA = 8,        // best_cost result h: k | a << 8 (3 slots)
    SC_LOHI = 12,     // best_cost anchors h: lo | hi << 16 (3 slots)
    SC_WORDS = 32,    // 26 canonical code words of the block's code (encoder, decoder)
    S64_COST = 0,     // best_cost result cost h (3 slots)
    S64_A = 4,        // table prefix / generic
    S64_B = 5,
};

// ---- small pure helpers ---------------------------------------------------------
// Canonical code word of symbol s under the code lengths len(t) (0 = unused),
// bit-reversed for LSB-first writing (FORMAT.md §5; v2's explicit codes, V2.4).
template <class Len>
NZC_HD u32 canon_word_by(Len len_of, u32 s) {
    u32 code = 0, prev_len = 0;
    bool first = true;
    for (u32 len = 1; len <= MAXLEN; len++) {
        for (u32 t = 0; t < NSYM; t++) {
            if (len_of(t) != len) continue;
            if (first) {
                code = 0;
                first = false;
            } else {
                code = (code + 1) << (len - prev_len);
            }
            prev_len = len;
            if (t == s) {
                u32 r = 0;
                for (u32 i = 0; i < len; i++) r = (r << 1) | ((code >> i) & 1);
                return r;
            }
        }
    }
    return 0;
}

// Canonical code word of symbol s in static code k.
NZC_HD u32 canon_word(u32 k, u32 s) {
    return canon_word_by([&](u32 t) -> u32 { return CODE_LENGTHS[k][t]; }, s);
}

// Encode-table entry for a key: code word (+ escape payload, + fp16 extra bits) in
// bits 0..24, total bit length in bits 24..32 (as codec/src/encode.rs enc_table).
// words[s] = canon_word(k, s), computed once per table.
NZC_HD u32 enc_entry(u32 dt, u32 k, u32 a, u32 key, const u32* words) {
    TypeInfo ti = type_info(dt);
    u32 e, x;
    key_parts(dt, key, &e, &x);
    u32 s = symbol_of(e, a);
    u32 lc = CODE_LENGTHS[k][s];
    u32 bits = words[s];
    u32 len = lc;
    if (s == SYM_ESC) {
        bits |= e << len;
        len += ti.ebits;
    }
    bits |= x << len;
    len += ti.xbits;
    return bits | (len << 24);
}

// Decode-table entry layout (as codec/src/decode.rs dec_table): bits 0..8 exponent
// (0 for ESC), 8..12 code length, 12..17 length incl. escape payload, bit 17 invalid,
// bits 24..32 escape payload mask.
enum : u32 { DEC_INVALID = 1u << 17 };
NZC_HD u32 dec_entry(u32 dt, u32 k, u32 a, u32 s) {
    TypeInfo ti = type_info(dt);
    u32 lc = CODE_LENGTHS[k][s];
    if (s < ND) {
        if (s < a) return (a - s) | (lc << 8) | (lc << 12);
        return DEC_INVALID | (lc << 8) | (lc << 12);
    }
    if (s == SYM_ZERO) return (lc << 8) | (lc << 12);
    return (lc << 8) | ((lc + ti.ebits) << 12) | (((1u << ti.ebits) - 1) << 24);
}

NZC_HD void write_header(u8* dst, u32 flags, u32 dt, u32 block_log2, u64 n, u32 crc) {
    dst[0] = 'N';
    dst[1] = 'Z';
    dst[2] = 'C';
    dst[3] = 'F';
    dst[4] = 1;
    dst[5] = (u8)flags;
    dst[6] = (u8)dt;
    dst[7] = (u8)block_log2;
    st_u64(dst + 8, n);
    st_u32(dst + 16, crc);
    st_u32(dst + 20, crc32c_bitwise(dst, 20));
}

// 16 bytes (cnt <= 16) to d; one 16-byte store when possible (LL/LL128 lines).
NZC_HD void store_chunk(u8* d, const u8* v, u32 cnt) {
#if defined(__CUDA_ARCH__)
    if (cnt == 16 && (((uintptr_t)d) & 15) == 0) {
        uint4 w;
        w.x = ld_u32(v);
        w.y = ld_u32(v + 4);
        w.z = ld_u32(v + 8);
        w.w = ld_u32(v + 12);
        *(uint4*)d = w;
        return;
    }
#endif
NZC_UNROLL
    for (u32 i = 0; i < 16; i++)
        if (i < cnt) d[i] = v[i];
}

// ---- cooperative building blocks ---------------------------------------------------
// dst[0..len) = src[0..len), in ascending 16-byte rounds.
// 16-byte chunk c of a len-byte copy.
NZC_HD void copy_chunk(u8* dst, const u8* src, u64 len, u64 c) {
    u8 v[16];
    u32 cnt = (u32)(len - 16 * c < 16 ? len - 16 * c : 16);
    for (u32 i = 0; i < cnt; i++) v[i] = src[16 * c + i];
    store_chunk(dst + 16 * c, v, cnt);
}

template <class X>
NZC_HD void copy_rounds(X& x, u8* dst, const u8* src, u64 len) {
    x.rounds((len + 15) / 16, [&](u64 c) { copy_chunk(dst, src, len, c); });
}

// The same copy without the order (and without a fence per round): for the
// encoder's frames, which nothing reads while they are written.
template <class X>
NZC_HD void copy_par(X& x, u8* dst, const u8* src, u64 len) {
    x.par((len + 15) / 16, [&](u64 c) { copy_chunk(dst, src, len, c); });
}

template <class X>
NZC_HD void fill_rounds(X& x, u8* dst, u8 val, u64 len) {
    x.rounds((len + 15) / 16, [&](u64 c) {
        u8 v[16];
        u32 cnt = (u32)(len - 16 * c < 16 ? len - 16 * c : 16);
        for (u32 i = 0; i < 16; i++) v[i] = val;
        store_chunk(dst + 16 * c, v, cnt);
    });
}

// out[lo..hi) = byte_at(lo..hi), in ascending 16-byte rounds aligned to out (the
// write order NCCL's pollers need, FORMAT.md / issue 19 item 6).
template <class X, class F>
NZC_HD void gather_rounds(X& x, u8* out, u32 lo, u32 hi, F byte_at) {
    if (hi <= lo) return;
    const u32 c0 = lo / 16, c1 = (hi + 15) / 16;
    x.rounds(c1 - c0, [&](u64 c) {
        const u32 a0 = (c0 + (u32)c) * 16 > lo ? (c0 + (u32)c) * 16 : lo;
        const u32 a1 = (c0 + (u32)c) * 16 + 16 < hi ? (c0 + (u32)c) * 16 + 16 : hi;
        // constant indices: b stays in registers
        u8 b[16];
NZC_UNROLL
        for (u32 i = 0; i < 16; i++) b[i] = a0 + i < a1 ? (u8)byte_at(a0 + i) : 0;
        store_chunk(out + a0, b, a1 - a0);
    });
}

// Whether all len (>= 1) bytes of p equal p[0].
template <class X>
NZC_HD bool all_equal(X& x, const u8* p, u64 len) {
    const u8 v = p[0];
    return !x.any((len + 15) / 16, [&](u64 c) {
        u64 e = 16 * c + 16 < len ? 16 * c + 16 : len;
        for (u64 i = 16 * c; i < e; i++)
            if (p[i] != v) return true;
        return false;
    });
}

// CRC tables into shared memory (once per CTA and job that needs them).
template <class X>
NZC_HD void crc_init(X& x, Smem& s) {
    x.par(256, [&](u64 i) { s.crc_tab[i] = crc32c_table_entry((u32)i); });
    x.one([&]() { crc_x2n_table(s.crc_x2n); });
}

// In place: arr[0] = CRC of the concatenation of `count` parts whose CRCs are arr[i];
// every part is part_len bytes except the last, which ends at total_len.
template <class X>
NZC_HD void crc_tree(X& x, Smem& s, u32* arr, u64 count, u64 part_len, u64 total_len) {
    // step = 2^sh: shifts, not a 64-bit division (a subroutine call on the device)
    for (u32 sh = 0; ((u64)1 << sh) < count; sh++) {
        const u64 step = (u64)1 << sh;
        x.par((count + 2 * step - 1) >> (sh + 1), [&](u64 u) {
            u64 i = u * 2 * step, r = i + step;
            if (r >= count) return;
            u64 rend = (r + step) * part_len;
            if (rend > total_len) rend = total_len;
            arr[i] = crc32c_combine(s.crc_x2n, arr[i], arr[r], rend - r * part_len);
        });
    }
}

// CRC32C of p[0..len) (1 <= len <= 2^MAX_BLOCK_LOG2: one block); crc_init must
// have run.
template <class X>
NZC_HD u32 block_crc(X& x, Smem& s, const u8* p, u32 len) {
    u32 part = (len + CRC_PARTS - 1) / CRC_PARTS;
    part = (part + 63) & ~63u;
    const u32 parts = (len + part - 1) / part;  // 32-bit: no division subroutine
    x.par(parts, [&](u64 i) {
        u64 o = i * part;
        u64 l = len - o < part ? len - o : part;
        s.crc_part[i] = crc32c_tab(s.crc_tab, p + o, l);
    });
    crc_tree(x, s, s.crc_part, parts, part, len);
    return s.crc_part[0];
}

// best_cost (FORMAT.md §6) for nh histograms at s.hist + 256*h, element types dts[h].
// Result h: s.sc[SC_KA + h] = k | a << 8, s.sc64[S64_COST + h] = cost.
template <class X>
NZC_HD void best_cost(X& x, Smem& s, u32 nh, const u32* dts) {
    x.par(NSYM * NCODES, [&](u64 i) { s.codelen[i] = CODE_LENGTHS[i % NCODES][i / NCODES]; });
    // anchors and the nonzero bins of each histogram
    x.par(nh, [&](u64 h) {
        TypeInfo ti = type_info(dts[h]);
        const u32* hist = s.hist + 256 * h;
        u32 smax = 1;
        for (int e = (int)ti.emax; e >= 0; e--) {
            if (hist[e]) {
                smax = e > 1 ? (u32)e : 1;
                break;
            }
        }
        u32 lo = smax > 5 ? smax - 4 : 1;
        u32 hi = smax + 1 < ti.emax ? smax + 1 : ti.emax;
        s.sc[SC_LOHI + h] = lo | (hi << 16);
        u32 nnz = 0;
        for (u32 e = 0; e <= ti.emax; e++)
            if (hist[e]) s.nz[256 * h + nnz++] = (hist[e] << 8) | e;
        if (nnz < 256) s.nz[256 * h + nnz] = 0;  // terminator (count 0)
    });
    x.par(nh * COST_UNITS, [&](u64 u) {
        u32 h = (u32)(u / COST_UNITS), r = (u32)(u % COST_UNITS);
        u32 ai = r / NCODES, k = r % NCODES;
        u32 lo = s.sc[SC_LOHI + h] & 0xFFFF, hi = s.sc[SC_LOHI + h] >> 16;
        u32 a = lo + ai;
        u64 cost = ~(u64)0;
        if (a <= hi) {
            TypeInfo ti = type_info(dts[h]);
            cost = 0;
            for (u32 i = 0; i < 256; i++) {
                u32 v = s.nz[256 * h + i];
                if ((v >> 8) == 0) break;
                u32 sym = symbol_of(v & 0xFF, a);
                u32 bits = s.codelen[sym * NCODES + k] + (sym == SYM_ESC ? ti.ebits : 0);
                cost += (u64)(v >> 8) * bits;
            }
        }
        s.cost[u] = cost;
    });
    x.par(nh, [&](u64 h) {
        u64 best = ~(u64)0;
        u32 bk = 0, ba = s.sc[SC_LOHI + h] & 0xFFFF;
        for (u32 r = 0; r < COST_UNITS; r++) {
            u64 c = s.cost[h * COST_UNITS + r];
            if (c < best) {  // first minimum in (anchor, k) order
                best = c;
                bk = r % NCODES;
                ba = (s.sc[SC_LOHI + h] & 0xFFFF) + r / NCODES;
            }
        }
        s.sc[SC_KA + h] = bk | (ba << 8);
        s.sc64[S64_COST + h] = best;
    });
}

// ---- encoder: frame level -------------------------------------------------------
// Sample-based dtype detection (FORMAT.md §6), n >= 64. Returns DT_*.
template <class X>
NZC_HD u32 detect_dtype(X& x, Smem& s, const u8* src, u64 n) {
    u64 g = n / 1024;
    if (g < 1) g = 1;
    if (g > 64) g = 64;
    const u64 units = n / 64;
    x.par(3 * 256, [&](u64 i) { s.hist[i] = 0; });
    x.one([&]() { s.sc[SC_USED] = 0; });
    x.par(g, [&](u64 j) {
        const u8* p = src + 64 * (j * units / g);
        bool eq = true;
        for (u32 i = 1; i < 64; i++) eq = eq && p[i] == p[0];
        if (eq) return;  // constant runs become FILL blocks whatever the type
        X::add32(&s.sc[SC_USED], 1);
        for (u32 i = 0; i < 32; i++) {
            u32 v = load_elem(p, i, 2);
            X::add32(&s.hist[exp_field(DT_BF16, v)], 1);
            X::add32(&s.hist[256 + exp_field(DT_FP16, v)], 1);
        }
        for (u32 i = 0; i < 16; i++) X::add32(&s.hist[512 + exp_field(DT_FP32, load_elem(p, i, 4))], 1);
    });
    if (s.sc[SC_USED] == 0) return DT_RAW;
    const u32 dts[3] = {DT_BF16, DT_FP16, DT_FP32};
    best_cost(x, s, 3, dts);
    const u64 used = s.sc[SC_USED];
    const u64 c[3] = {s.sc64[S64_COST + 0] + 8 * 32 * used, s.sc64[S64_COST + 1] + 11 * 32 * used,
                      s.sc64[S64_COST + 2] + 24 * 16 * used};
    u32 best = 0;
    for (u32 i = 1; i < 3; i++)
        if (c[i] < c[best]) best = i;
    if (c[best] * 32 >= 31 * 512 * used) return DT_RAW;
    return dts[best];
}

// Whether some block of src is one repeated byte (FORMAT.md §6, raw-typed frames).
template <class X>
NZC_HD bool has_fill_block(X& x, const u8* src, u64 n, u32 block_log2) {
    const u64 b = (u64)1 << block_log2;
    for (u64 o = 0; o < n; o += b) {
        u64 l = n - o < b ? n - o : b;
        if (all_equal(x, src + o, l)) return true;
    }
    return false;
}

struct FramePlan {
    u32 dt;            // header dtype
    u32 stored_early;  // STORED decided before any block is coded
};

template <class X>
NZC_HD FramePlan frame_plan(X& x, Smem& s, const u8* src, u64 n, u32 hint, u32 block_log2) {
    FramePlan fp;
    fp.stored_early = 0;
    if (n < MIN_CODED_INPUT) fp.dt = DT_RAW;
    else if (hint == HINT_BF16) fp.dt = DT_BF16;
    else if (hint == HINT_FP16) fp.dt = DT_FP16;
    else if (hint == HINT_FP32) fp.dt = DT_FP32;
    else if (hint == HINT_AUTO) fp.dt = detect_dtype(x, s, src, n);
    else fp.dt = DT_RAW;
    if (fp.dt == DT_RAW)
        fp.stored_early = !(hint == HINT_AUTO && n >= MIN_CODED_INPUT && has_fill_block(x, src, n, block_log2));
    return fp;
}

// ---- encoder: one block ------------------------------------------------------------
struct BlockPlan {
    u32 mode;
    u32 k, a;
    u32 size;  // bytes of the block in the frame
    u32 m, nseg, t;
};

// Chooses the block's form and computes its exact size without writing anything.
// Leaves s.lut (encode table), s.laneoff/lanebits and s.seglen/segoff ready for
// block_write when the block is coded.
template <class X>
NZC_HD BlockPlan block_plan(X& x, Smem& s, u32 dt, const u8* blk, u32 L) {
    BlockPlan bp;
    bp.k = bp.a = bp.m = bp.nseg = bp.t = 0;
    if (all_equal(x, blk, L)) {
        bp.mode = MODE_FILL;
        bp.size = 2;
        return bp;
    }
    bp.mode = MODE_RAW;
    bp.size = 1 + L;
    if (dt == DT_RAW) return bp;
    const TypeInfo ti = type_info(dt);
    const u32 m = L / ti.w;
    if (m < MIN_CODED_ELEMS) return bp;
    // code choice from a 1/13 sample
    x.par(256, [&](u64 i) { s.hist[i] = 0; });
    x.par((m + SAMPLE_STRIDE - 1) / SAMPLE_STRIDE,
          [&](u64 j) { X::add32(&s.hist[exp_field(dt, load_elem(blk, SAMPLE_STRIDE * j, ti.w))], 1); });
    best_cost(x, s, 1, &dt);
    const u32 k = s.sc[SC_KA] & 0xFF, a = s.sc[SC_KA] >> 8;
    x.par(NSYM, [&](u64 sy) { s.sc[SC_WORDS + sy] = canon_word(k, (u32)sy); });
    x.par(256, [&](u64 key) { s.lut[key] = enc_entry(dt, k, a, (u32)key, s.sc + SC_WORDS); });
    // bit length of every lane (32 elements) of every segment
    const u32 nseg = (m + SEG_ELEMS - 1) / SEG_ELEMS;
    x.par((u64)nseg * LANES, [&](u64 u) {
        u32 e0 = (u32)u * LANE_ELEMS, e1 = e0 + LANE_ELEMS < m ? e0 + LANE_ELEMS : m;
        u32 bits = 0;
        for (u32 i = e0; i < e1; i++) bits += s.lut[key_of(dt, load_elem(blk, i, ti.w))] >> 24;
        s.lanebits[u] = (u16)bits;
    });
    x.par(nseg, [&](u64 j) {
        u32 o = 0;
        for (u32 l = 0; l < LANES; l++) {
            s.laneoff[j * LANES + l] = (u16)o;
            o += s.lanebits[j * LANES + l];
        }
        s.seglen[j] = (o + 7) / 8;
    });
    x.one([&]() {
        u32 o = 0;
        for (u32 j = 0; j < nseg; j++) {
            s.segoff[j] = o;
            o += s.seglen[j];
        }
        s.sc[SC_TOTAL] = o;
    });
    const u32 t = L - m * ti.w;
    const u64 size = (u64)BLOCK_HEADER_LEN + 2 * nseg + (u64)m * (1 + ti.p2) + s.sc[SC_TOTAL] + t;
    if (size > L) return bp;  // coded must be strictly shorter than 1 + L
    bp.mode = ti.mode;
    bp.k = k;
    bp.a = a;
    bp.size = (u32)size;
    bp.m = m;
    bp.nseg = nseg;
    bp.t = t;
    return bp;
}

// Writes the bytes of segment-lane u (FORMAT.md §4 bitstream): the segment bytes whose
// first bit lies in the lane's bit range. Bits of the following elements complete the
// lane's last byte, so every byte has exactly one writer and no atomics are needed.
NZC_HD void emit_lane(const u32* lut, u32 dt, u32 w, const u8* blk, u32 m, u32 u, u32 off, u32 nbits,
                      u8* seg, u32 seg_bytes) {
    const u32 p0 = (off + 7) / 8, p1 = (off + nbits + 7) / 8;
    if (p0 >= p1) return;
    const u32 seg_end = (u / LANES) * SEG_ELEMS + SEG_ELEMS < m ? (u / LANES) * SEG_ELEMS + SEG_ELEMS : m;
    u32 i = u * LANE_ELEMS;
    u32 cur = off;          // absolute bit position of element i in the segment
    u64 acc = 0;            // bits from position 8*p onwards
    u32 nacc = 0;
    u32 p = p0;
    while (p < p1) {
        if (i < seg_end) {
            u32 c = lut[key_of(dt, load_elem(blk, i, w))];
            u32 len = c >> 24;
            u64 bits = c & 0xFFFFFF;
            i++;
            if (cur + len <= 8 * p0) {
                cur += len;
                continue;
            }
            if (cur < 8 * p0) {  // straddles the first owned byte: drop its head
                u32 drop = 8 * p0 - cur;
                bits >>= drop;
                len -= drop;
                cur = 8 * p0;
            }
            acc |= bits << nacc;
            nacc += len;
            cur += len;
        } else {
            nacc = 64;  // segment ended: zero padding
        }
        while (nacc >= 8 && p < p1) {
            if (p < seg_bytes) seg[p] = (u8)acc;
            acc >>= 8;
            nacc -= 8;
            p++;
        }
    }
}

// Writes the planned block at out (bytes out[0..bp.size)).
template <class X>
NZC_HD void block_write(X& x, Smem& s, u32 dt, const BlockPlan& bp, const u8* blk, u32 L, u8* out) {
    if (bp.mode == MODE_FILL) {
        x.one([&]() {
            out[0] = MODE_FILL;
            out[1] = blk[0];
        });
        return;
    }
    if (bp.mode == MODE_RAW) {
        x.one([&]() { out[0] = MODE_RAW; });
        copy_par(x, out + 1, blk, L);
        return;
    }
    const TypeInfo ti = type_info(dt);
    const u32 m = bp.m, nseg = bp.nseg;
    const u32 off1 = BLOCK_HEADER_LEN + 2 * nseg, off2 = off1 + m, streams = off2 + ti.p2 * m;
    x.par(4 + nseg, [&](u64 j) {
        if (j == 0) out[0] = (u8)bp.mode;
        else if (j == 1) out[1] = (u8)bp.k;
        else if (j == 2) out[2] = (u8)bp.a;
        else if (j == 3) out[3] = 0;
        else st_u16(out + 4 + 2 * (j - 4), s.seglen[j - 4]);
    });
    x.par(m, [&](u64 i) {
        u32 v = load_elem(blk, i, ti.w);
        out[off1 + i] = (u8)plane1_of(dt, v);
        if (ti.p2) st_u16(out + off2 + 2 * i, v & 0xFFFF);
    });
    x.par((u64)nseg * LANES, [&](u64 u) {
        u32 j = (u32)u / LANES;
        emit_lane(s.lut, dt, ti.w, blk, m, (u32)u, s.laneoff[u], s.lanebits[u], out + streams + s.segoff[j],
                  s.seglen[j]);
    });
    const u32 tail = streams + s.sc[SC_TOTAL];
    x.par(bp.t, [&](u64 i) { out[tail + i] = blk[m * ti.w + i]; });
}

// ---- encoder: one work item (block b of a job) and the job's finish ----------------
template <class X>
NZC_HD void encode_item(X& x, Smem& s, const EncJob& job, const FramePlan& fp, u32 b) {
    const u8* src = (const u8*)job.src;
    u8* dst = (u8*)job.dst;
    const u64 B = (u64)1 << job.block_log2;
    const u64 o = (u64)b * B;
    const u32 L = (u32)(job.n - o < B ? job.n - o : B);
    if (job.checksum && L > 0) ws_crc(job.ws, job.nb)[b] = block_crc(x, s, src + o, L);
    if (fp.stored_early) {
        copy_par(x, dst + HEADER_LEN + o, src + o, L);
        return;
    }
    BlockPlan bp = block_plan(x, s, fp.dt, src + o, L);
    const u64 excl = x.lookback(ws_scan(job.ws), b, bp.size);
    const u64 pos = HEADER_LEN + 4 * (u64)job.nb + excl;
    if (pos + bp.size > job.n + HEADER_LEN) return;  // frame overflows: STORED at finish
    x.one([&]() { st_u32(dst + HEADER_LEN + 4 * (u64)b, bp.size); });
    block_write(x, s, fp.dt, bp, src + o, L, dst + pos);
}

template <class X>
NZC_HD void encode_finish(X& x, Smem& s, const EncJob& job, const FramePlan& fp) {
    const u8* src = (const u8*)job.src;
    u8* dst = (u8*)job.dst;
    const u64 limit = job.n + HEADER_LEN;
    u64 total = limit;
    bool stored = fp.stored_early != 0;
    if (!stored) {
        // Written by other CTAs: one thread reads it and every thread takes its
        // branch from the same copy (the copy below has barriers).
        x.one([&]() { s.sc64[S64_A] = ws_scan(job.ws)[job.nb - 1] & ((1ull << 62) - 1); });
        total = HEADER_LEN + 4 * (u64)job.nb + s.sc64[S64_A];
        stored = total >= limit;
    }
    u32 crc = 0;
    if (job.checksum && job.n > 0) {
        u32* bc = ws_crc(job.ws, job.nb);
        crc_tree(x, s, bc, job.nb, (u64)1 << job.block_log2, job.n);
        crc = bc[0];
    }
    if (stored && !fp.stored_early) copy_par(x, dst + HEADER_LEN, src, job.n);
    const u32 flags = (job.checksum ? (u32)FLAG_CHECKSUM : 0u) | (stored ? (u32)FLAG_STORED : 0u);
    x.one([&]() { write_header(dst, flags, fp.dt, job.block_log2, job.n, crc); });
    x.publish((JobResult*)job.result, stored ? limit : total, ST_OK);
}

// ---- decoder ------------------------------------------------------------------------
struct DecFrame {
    u32 status;      // ST_OK or why the frame is rejected before any block
    u32 version;     // 1 or 2 (FORMAT.md §2, V2.1)
    u32 flags, dt, block_log2;
    u64 n, nb;       // uncompressed length; blocks (stored frames: B-sized copy items)
    u32 crc;
    u32 t0;          // the block table's offset: 24, or 24 + TB after a column table
    u32 period;      // the column table's P (FORMAT.md V2.9), 0 without one
};

// Which frame versions a decoder accepts (bit v-1 for version v).
enum : u32 { VERS_1 = 1, VERS_2 = 2, VERS_ALL = 3 };

// Header, length and block-table checks (FORMAT.md §2, §3, §7; V2.1: version 2
// has the same header, flags, dtypes and table). Reads at most 24 + 4*nb bytes,
// each checked against src_len.
template <class X>
NZC_HD DecFrame parse_frame(X& x, const u8* src, u64 src_len, u64 dst_cap, u32 versions = VERS_ALL) {
    DecFrame f;
    f.version = f.flags = f.dt = f.block_log2 = f.crc = 0;
    f.n = f.nb = 0;
    f.t0 = HEADER_LEN;
    f.period = 0;
    f.status = ST_HEADER;
    if (src_len < HEADER_LEN) return f;
    if (src[0] != 'N' || src[1] != 'Z' || src[2] != 'C' || src[3] != 'F') return f;
    f.version = src[4];
    if (f.version < 1 || f.version > 2 || !(versions & (1u << (f.version - 1)))) return f;
    if (crc32c_bitwise(src, 20) != ld_u32(src + 20)) return f;
    f.flags = src[5];
    f.dt = src[6];
    f.block_log2 = src[7];
    f.n = ld_u64(src + 8);
    f.crc = ld_u32(src + 16);
    // version 2 also: COLTAB without STORED (V2.1), dtypes 4, 5 (fp8)
    if ((f.flags & ~(u32)(FLAG_CHECKSUM | FLAG_STORED)) &&
        (f.version != 2 || (f.flags & ~(u32)(FLAG_CHECKSUM | FLAG_COLTAB))))
        return f;
    if (f.dt > 3 && !(f.version == 2 && f.dt <= 5)) return f;
    if (f.block_log2 < MIN_BLOCK_LOG2 || f.block_log2 > MAX_BLOCK_LOG2) return f;
    if (!(f.flags & FLAG_CHECKSUM) && f.crc != 0) return f;
    if (f.n > dst_cap) {
        f.status = ST_DST_TOO_SMALL;
        return f;
    }
    f.nb = (f.n + ((u64)1 << f.block_log2) - 1) >> f.block_log2;
    f.status = ST_LENGTH;
    if (f.flags & FLAG_STORED) {
        if (src_len != HEADER_LEN + f.n) return f;
    } else {
        if (f.flags & FLAG_COLTAB) {
            // the column table (V2.9): u16 P in 16..=8192, ceil(P/2) bytes of
            // offsets, an odd P's last high nibble 0
            if (src_len < HEADER_LEN + 2) return f;
            const u32 P = ld_u16(src + HEADER_LEN);
            if (P < 16 || P > 8192) {
                f.status = ST_HEADER;
                return f;
            }
            f.t0 = HEADER_LEN + 2 + (P + 1) / 2;
            if (src_len < f.t0) return f;
            if ((P & 1) && (src[f.t0 - 1] >> 4)) {
                f.status = ST_HEADER;
                return f;
            }
            f.period = P;
        }
        if (f.t0 + 4 * f.nb > src_len) return f;
        const u64 coded = x.sum64(f.nb, S64_A, [&](u64 i) -> u64 { return ld_u32(src + f.t0 + 4 * i); });
        if (f.t0 + 4 * f.nb + coded != src_len) return f;
    }
    f.status = ST_OK;
    return f;
}

// RAW and FILL blocks (both versions). Returns false for a coded mode.
template <class X>
NZC_HD bool decode_plain(X& x, const u8* blk, u32 size, u8* out, u32 L, u32* st) {
    const u32 mode = blk[0];
    if (mode == MODE_RAW) {
        *st = (u64)size == 1 + (u64)L ? (u32)ST_OK : (u32)ST_BLOCK;
        if (*st == ST_OK) copy_rounds(x, out, blk + 1, L);
        return true;
    }
    if (mode == MODE_FILL) {
        *st = size == 2 ? (u32)ST_OK : (u32)ST_BLOCK;
        if (*st == ST_OK) fill_rounds(x, out, blk[1], L);
        return true;
    }
    return false;
}

// Decodes one block (FORMAT.md §3-§4) of `size` bytes at blk into out[0..L).
// Every read is within blk[0..size); every write within out[0..L), ascending rounds.
template <class X>
NZC_HD u32 decode_block(X& x, Smem& s, const u8* blk, u32 size, u8* out, u32 L) {
    if (size == 0) return ST_BLOCK;
    u32 st = ST_OK;
    if (decode_plain(x, blk, size, out, L, &st)) return st;
    const u32 mode = blk[0];
    if (mode != MODE_BF16 && mode != MODE_FP16 && mode != MODE_FP32) return ST_BLOCK;
    const u32 dt = dtype_of_mode(mode);
    const TypeInfo ti = type_info(dt);
    const u32 m = L / ti.w, t = L - m * ti.w;
    const u32 nseg = (m + SEG_ELEMS - 1) / SEG_ELEMS;
    const u64 off1 = BLOCK_HEADER_LEN + 2 * (u64)nseg, off2 = off1 + m, streams = off2 + (u64)ti.p2 * m;
    if (m == 0 || streams > size) return ST_BLOCK;
    const u32 k = blk[1], a = blk[2];
    if (k >= NCODES || a == 0 || a > ti.emax || blk[3] != 0) return ST_BLOCK;
    x.par(nseg, [&](u64 j) { s.seglen[j] = ld_u16(blk + 4 + 2 * j); });
    x.one([&]() {
        u32 o = 0;
        for (u32 j = 0; j < nseg; j++) {
            s.segoff[j] = o;
            o += s.seglen[j];
        }
        s.sc[SC_TOTAL] = o;
        s.sc[SC_ERR] = ST_OK;
    });
    if (streams + s.sc[SC_TOTAL] + t != size) return ST_BLOCK;
    // 12-bit decode table
    x.par(NSYM, [&](u64 sy) { s.sc[SC_WORDS + sy] = canon_word(k, (u32)sy); });
    x.par(DEC_TABLE, [&](u64 idx) {
        for (u32 sy = 0; sy < NSYM; sy++) {
            u32 len = CODE_LENGTHS[k][sy];
            if ((idx & ((1u << len) - 1)) == s.sc[SC_WORDS + sy]) {
                s.lut[idx] = dec_entry(dt, k, a, sy);
                return;
            }
        }
    });
    const u8* streams_p = blk + streams;
    for (u32 g0 = 0; g0 < nseg; g0 += DEC_GROUP_SEGS) {
        const u32 g1 = g0 + DEC_GROUP_SEGS < nseg ? g0 + DEC_GROUP_SEGS : nseg;
        // one thread per segment: bit-serial prefix decode into the keys buffer
        x.par(g1 - g0, [&](u64 gi) {
            const u32 j = g0 + (u32)gi;
            const u8* sp = streams_p + s.segoff[j];
            const u32 slen = s.seglen[j];
            const u32 e0 = j * SEG_ELEMS, e1 = e0 + SEG_ELEMS < m ? e0 + SEG_ELEMS : m;
            u8* keys = s.keys + (u64)gi * KEY_STRIDE;
            u64 bp = 0;
            u32 bad = 0;
            // Bit buffer: bits [bp, bp + have) of the segment, zero past its end;
            // refilled a byte at a time to at least 57 bits whenever fewer than 32
            // remain (an element uses at most 12 code + 8 escape + 3 extra bits), so
            // each stream byte is loaded once.
            u64 buf = 0;
            u32 have = 0, rp = 0;
            for (u32 i = e0; i < e1; i++) {
                if (bp > 8 * (u64)slen) {
                    bad = 1;
                    break;
                }
                if (have < 32) {
                    while (have <= 56) {
                        buf |= (u64)(rp < slen ? sp[rp] : 0) << have;
                        rp++;
                        have += 8;
                    }
                }
                const u32 ent = s.lut[buf & (DEC_TABLE - 1)];
                const u32 lc = (ent >> 8) & 0xF;
                const u32 e = (ent & 0xFF) | ((u32)(buf >> lc) & (ent >> 24));
                u32 len = (ent >> 12) & 0x1F;
                u32 key = e;
                if (ti.xbits) {
                    key = make_key(dt, e, (u32)(buf >> len) & 7);
                    len += ti.xbits;
                }
                bad |= ent & DEC_INVALID;
                keys[i - e0] = (u8)key;
                bp += len;
                buf >>= len;
                have -= len;
            }
            // the segment ends in its last byte, and its padding bits are zero (FORMAT.md)
            if (bad || (bp + 7) / 8 != slen || ((bp & 7) && (sp[bp >> 3] >> (bp & 7)) != 0))
                X::or32(&s.sc[SC_ERR], ST_STREAM);
        });
        if (s.sc[SC_ERR]) return ST_STREAM;
        // join keys and planes into output, ascending 16-byte rounds
        const u64 b0 = (u64)g0 * SEG_ELEMS * ti.w;
        const u64 b1 = g1 == nseg ? (u64)L : (u64)g1 * SEG_ELEMS * ti.w;
        x.rounds((b1 - b0 + 15) / 16, [&](u64 c) {
            u8 v[16];
            const u64 cb = b0 + 16 * c;
            const u32 cnt = (u32)(b1 - cb < 16 ? b1 - cb : 16);
            // cb is a multiple of 16, so of w: whole elements until the block's
            // trailing bytes (t < w), which follow the last element.
            u32 q = 0;
            while (q < cnt) {
                const u64 byte = cb + q;
                const u64 ei = byte / ti.w;
                if (ei < m) {
                    const u64 le = ei - (u64)g0 * SEG_ELEMS;
                    const u32 key = s.keys[(le / SEG_ELEMS) * KEY_STRIDE + le % SEG_ELEMS];
                    const u32 p1 = blk[off1 + ei];
                    const u32 p2 = ti.p2 ? ld_u16(blk + off2 + 2 * ei) : 0;
                    const u32 el = join_elem(dt, key, p1, p2);
                    for (u32 r = 0; r < ti.w; r++) v[q + r] = (u8)(el >> (8 * r));
                    q += ti.w;
                } else {
                    v[q] = blk[size - t + (byte - (u64)m * ti.w)];
                    q++;
                }
            }
            store_chunk(out + cb, v, cnt);
        });
    }
    return ST_OK;
}

// ---- decoder, format version 2 (FORMAT.md V2.2-V2.4, V2.8) ---------------------------
enum : u32 {
    V2_Z = 1,
    V2_LINES = 2,
    V2_COL = 4,
    V2_EXPLICIT = 8,
    V2_NO_LO0 = 16,
    V2_NO_LO1 = 32,
    V2_BYTECODE = 64,
    LINE = 64,
    // Decoded elements of a group of sub-segments are staged in Smem::stage, one
    // sub-segment every SS*W + 4 bytes: the decoding threads' stores then fall in
    // different banks.
    V2_PAD = 4,
};
// v2 decode-table entry: bits 0..5 code length, 8..16 exponent of a d symbol,
// then the kind (as codec/src/v2.rs); an unused or d < 1 symbol is invalid.
enum : u32 { E2_ESC = 1u << 16, E2_ZERO = 1u << 17, E2_INVALID = 1u << 18 };
// Scalar slots of the v2 decoder (Smem::sc).
enum : u32 { SC2_BAD = 16, SC2_NE = 17, SC2_BITS = 18, SC2_ZSUM = 19 };

// The v2 decoder's per-block arrays, carved out of the regions only the v1 coder
// uses (lanebits, laneoff: B/32 bytes each for a launch sized for B = 2^log2 >=
// the frame's block size): NS <= B/512 sub-segments (K <= B/2 elements, SS >=
// 256), B/64 lines = B/2048 bitmap words.
struct V2Smem {
    u32* bit0;    // [NS] first stream bit of sub-segment j
    u32* nbits;   // [NS] its length in bits
    u32* p0;      // [NS] its first plane element
    u32* zeros;   // [NS] its ZERO count
    u32* line0;   // [NS] the grid line where its first kept element lies
    u32* elided;  // [B/2048] elided lines, bit l % 32 of word l / 32
    u32* before;  // [B/2048] elided lines in the words before w
};
NZC_HD V2Smem v2_view(const Smem& s, u32 block_log2) {
    const u32 cap = (1u << block_log2) / 512, words = (1u << block_log2) / 2048;
    V2Smem v;
    u32* a = s.v2a;
    v.bit0 = a;
    v.nbits = a + cap;
    v.p0 = a + 2 * cap;
    v.zeros = a + 3 * cap;
    u32* b = s.v2b;
    v.line0 = b;
    v.elided = b + cap;
    v.before = b + cap + words;
    return v;
}

NZC_HD u32 popc32(u32 v) {
#if defined(__CUDA_ARCH__)
    return __popc(v);
#else
    return (u32)__builtin_popcount(v);
#endif
}

// Entry j of a packed index of w-bit entries (V2.3 "index": LSB-first) whose
// nbytes bytes are at p.
NZC_HD u32 packed_entry(const u8* p, u32 nbytes, u32 j, u32 w) {
    if (w == 0) return 0;
    const u32 bit = j * w, q = bit >> 3;
    u32 v = 0;
    for (u32 i = 0; i < 3; i++)
        if (q + i < nbytes) v |= (u32)p[q + i] << (8 * i);
    return (v >> (bit & 7)) & ((1u << w) - 1);
}

NZC_HD u32 ctz32(u32 v) {  // v != 0
#if defined(__CUDA_ARCH__)
    return (u32)(__ffs(v) - 1);
#else
    return (u32)__builtin_ctz(v);
#endif
}

// The frame's column table as decode_item hands it to a block (FORMAT.md V2.9):
// the offsets' bytes in the frame, P (0: no table), the block's index and size.
struct V2Col {
    const u8* tab;
    u32 period, blk, block_log2;
};
// Offset c[col] (-8..7) of a column table packed as in the frame (nibbles).
NZC_HD int ctab_off(const u8* tab, u32 col) {
    const u32 nib = (tab[col >> 1] >> (4 * (col & 1))) & 15;
    return (int)nib - (int)((nib & 8) << 1);
}
// unrot(e, c) (V2.9) on an exponent field e in 0..=emax: 0 stays 0.
NZC_HD u32 unrot(u32 e, int c, u32 emax) {
    int t = (int)e - 1 + c;
    if (t < 0) t += (int)emax;
    else if (t >= (int)emax) t -= (int)emax;
    return e ? (u32)(t + 1) : 0u;
}
// The first grid line after l that is not elided (bit l of the bitmap el, nw
// words; bits past the grid are 0): a word at a time.
NZC_HD u32 next_kept_line(const u32* el, u32 l, u32 nw) {
    l++;
    u32 wi = l >> 5;
    if (wi >= nw) return l;
    u32 m = ~el[wi] & (0xFFFFFFFFu << (l & 31));
    while (!m) {
        if (++wi >= nw) return wi << 5;
        m = ~el[wi];
    }
    return (wi << 5) + ctz32(m);
}
// A COL sub-segment's column walk (V2.9 "Columns"): the column of its next kept
// element, advanced by one per element and, at the end of each kept line, by the
// elided lines skipped (one modulo per sub-segment, at its start, and one per
// skip of P or more elements).
struct V2ColWalk {
    const u8* tab;     // the table in shared memory
    const u32* elided; // null without LINES
    u32 period, col, line, inl, epl, nw;
};

// A sub-segment's bounds: stream bits [bit, end), plane elements [pp, pend), n values.
struct V2Lane {
    u32 bit;
    u64 end;
    u32 pp, pend, n;
};
// The planes: plane1 at p1[0..P), lo1 at p1 + lo1o, lo0 at p1 + lo0o where present
// (u32 offsets keep the decode loop's live registers down).
struct V2Planes {
    const u8* p1;
    bool has_lo1, has_lo0;
    u32 lo1o, lo0o;
};

// Tops up a sub-segment decoder's bit buffer (stream bits LSB-first, zero past
// the stream's `sbytes`) a byte at a time to at least 57 bits.
NZC_HD void bits_fill(u64& buf, u32& rp, u32& have, const u8* sp, u32 sbytes) {
    while (have <= 56) {
        buf |= (u64)(rp < sbytes ? sp[rp] : 0) << have;
        rp++;
        have += 8;
    }
}

// Decodes one sub-segment (V2.3 "Stream", "Element value") of dtype DT into o (W
// bytes per value); false unless its values end exactly at `end` and use exactly
// its plane elements. Reads the stream only below sbytes (zero beyond).
template <u32 DT, bool COL>
NZC_HD bool v2_subseg(const u32* lut, const u8* sp, u32 sbytes, V2Lane ln, bool z, const V2Planes& pw, u8* o,
                      V2ColWalk cw) {
    const TypeInfo ti = type_info(DT);
    const u32 emask = (1u << ti.ebits) - 1;
    // 32-bit positions: a block's stream has < 2^32 bits (total_bits is a u32)
    u32 bit = ln.bit, pp = ln.pp;
    // Bit buffer: stream bits [bit, bit + have), zero past the stream's end;
    // refilled a byte at a time to >= 57 bits when fewer than 32 remain (an
    // element takes at most 12 + 8 or 12 + 5 + 3 bits).
    u64 buf = 0;
    u32 rp = bit >> 3, have = 0;
    bits_fill(buf, rp, have, sp, sbytes);
    buf >>= bit & 7;
    have -= bit & 7;
    for (u32 i = 0; i < ln.n; i++) {
        if (have < 32) bits_fill(buf, rp, have, sp, sbytes);
        const u32 ent = lut[buf & (DEC_TABLE - 1)];
        u32 len = ent & 31, e = (ent >> 8) & 0xFF, el = 0;
        if (ent & E2_INVALID) return false;
        if (ent & E2_ESC) {
            e = (u32)(buf >> len) & emask;
            len += ti.ebits;
        }
        if (COL) {
            // the decoded field is e* (V2.9): un-rotate by the column's offset, and
            // step to the next kept element's column
            e = unrot(e, ctab_off(cw.tab, cw.col), ti.emax);
            if (++cw.col == cw.period) cw.col = 0;
            if (cw.elided && ++cw.inl == cw.epl) {
                cw.inl = 0;
                const u32 nx = next_kept_line(cw.elided, cw.line, cw.nw);
                const u32 skip = (nx - cw.line - 1) * cw.epl;
                cw.line = nx;
                if (skip) {
                    cw.col += skip;
                    if (cw.col >= cw.period) cw.col = skip < cw.period ? cw.col - cw.period : cw.col % cw.period;
                }
            }
        }
        if (!(z && (ent & E2_ZERO))) {
            u32 xb = 0;
            if (ti.xbits) {
                xb = (u32)(buf >> len) & 7;
                len += ti.xbits;
            }
            if (pp >= ln.pend) return false;
            u32 lo = 0;
            if (DT == DT_FP32) {
                lo = (pw.has_lo1 ? (u32)pw.p1[pw.lo1o + pp] << 8 : 0u) | (pw.has_lo0 ? (u32)pw.p1[pw.lo0o + pp] : 0u);
            }
            el = join_elem(DT, make_key(DT, e, xb), pw.p1[pp], lo);
            pp++;
        }
        if ((u64)bit + len > ln.end) return false;
        bit += len;
        buf >>= len;
        have -= len;
        if (ti.w == 2) {
            *(u16*)(o + 2 * i) = (u16)el;
        } else {
            *(u32*)(o + 4 * i) = el;
        }
    }
    return bit == ln.end && pp == ln.pend;
}

// ---- version 2's symbol-code blocks: fp8 (modes 5, 6), FP16N (mode 7), FORMAT.md V2.10
// (codec/src/v2_byte.rs). One canonical code of <= 12 bits over N symbols per block
// (fp8: N = 256, the byte; FP16N: N = 42, then r(s) raw bits), sub-segments of
// 2048 (fp8) or 512 (FP16N) elements with a bit-length index as the float blocks.
enum : u32 {
    SYM_FIXED = 6,          // mode, flags, grid, iw, base (u16)
    SYM_T_SHIFT = 1,
    SYM_T_LAG = 2,
    SYM_SHIFT_LINE = 128,
    // Smem::codelen (NSYM x NCODES = 832 bytes) while a symbol-code block decodes:
    // lengths [0, 256), symbols sorted by (length, symbol) [256, 512), then u16
    // per-length count, first canonical code and first sorted index (13 each)
    SYM_SORTED = 256,
    SYM_CNT = 512,
    SYM_FIRST = SYM_CNT + 2 * 16,
    SYM_OFFS = SYM_FIRST + 2 * 16,
};

// FP16N's raw bit count of symbol s (V2.10 "FP16N symbols").
NZC_HD u32 f16n_rawbits(u32 s) { return s == 0 ? 1u : s <= 10 ? s : 11u; }
// The fp16 element of FP16N symbol s and raw field r.
NZC_HD u32 f16n_join(u32 s, u32 r) {
    if (s == 0) return r << 15;
    if (s <= 10) return ((r >> (s - 1)) << 15) | (1u << (s - 1)) | (r & ((1u << (s - 1)) - 1));
    return ((r >> 10) << 15) | ((s - 10) << 10) | (r & 1023);
}

// Decodes one symbol-code sub-segment: n elements from stream bit `bit`, which
// must end exactly at `end` (a code word is >= 1 bit, so a position past `end`
// can never come back to it: the loop stops there). fp8 (F16N false): the byte,
// plus SHIFT's per-line offset (line = 128 elements; i0, the sub-segment's first
// element, starts a line) when nib != null; FP16N: symbol and raw field, stored
// as u16. Reads the stream only below sbytes (zero beyond).
template <bool F16N>
NZC_HD bool sym_subseg(const u32* lut, const u8* sp, u32 sbytes, u32 bit, u32 end, u32 n, u32 i0, const u8* nib,
                       u32 centre, u8* o) {
    u64 buf = 0;
    u32 rp = bit >> 3, have = 0;
    bits_fill(buf, rp, have, sp, sbytes);
    buf >>= bit & 7;
    have -= bit & 7;
    u32 sh = 0;
    for (u32 i = 0; i < n; i++) {
        if (have < 32) bits_fill(buf, rp, have, sp, sbytes);
        const u32 ent = lut[buf & (DEC_TABLE - 1)];
        const u32 sy = ent & 0xFF;
        u32 len = ent >> 8;
        if (F16N) {
            const u32 rb = f16n_rawbits(sy);
            const u32 el = f16n_join(sy, (u32)(buf >> len) & ((1u << rb) - 1));
            len += rb;
            *(u16*)(o + 2 * i) = (u16)el;
        } else {
            if (nib && (i & (SYM_SHIFT_LINE - 1)) == 0) {
                // SHIFT: k_l = 4 (c + n_l - 8) mod 128 for line l
                const u32 l = (i0 + i) / SYM_SHIFT_LINE;
                sh = (4 * (centre + ((nib[l >> 1] >> (4 * (l & 1))) & 15) + 120)) & 0x7F;
            }
            o[i] = (u8)((sy & 0x80) | ((sy + sh) & 0x7F));
        }
        if (bit + len > end) return false;
        bit += len;
        buf >>= len;
        have -= len;
    }
    return bit == end;
}

// Decodes a block of mode 5, 6 or 7 (V2.10) of `size` bytes at blk into
// out[0..L): every check of codec/src/v2_byte.rs; reads within blk[0..size),
// writes within out[0..L) in ascending rounds (head, grid, tail). The code table:
// lengths and their Kraft sum, then the 4096-entry table (one thread per entry,
// a canonical decode of its 12 bits). One thread per sub-segment decodes into the
// staging buffer, a group at a time (as the float blocks); LAG is resolved after
// the group's symbols, one thread per residue class mod P walking its elements in
// ascending order (element i - P is in the staging, or in the output of an
// earlier group, written before this group by this CTA).
template <class X>
NZC_HD u32 decode_block_sym(X& x, Smem& s, const u8* blk, u32 size, u8* out, u32 L, u32 block_log2) {
    const u32 mode = blk[0];
    const bool f16n = mode == MODE_FP16N;
    const u32 wl = f16n ? 1 : 0, nsym = f16n ? 42 : 256, tbl = nsym / 2, ssl = f16n ? 9 : 11;
    if (size < SYM_FIXED + tbl) return ST_BLOCK;
    const u32 tr = blk[1], phi = blk[2] & 3, iw = blk[3], base = ld_u16(blk + 4);
    if (f16n ? tr != 0 : tr > SYM_T_LAG) return ST_BLOCK;
    if ((blk[2] & ~3u) || phi >= (1u << wl)) return ST_BLOCK;
    if (iw > 16) return ST_BLOCK;
    if ((u64)L < phi + ((u64)MIN_CODED_ELEMS << wl)) return ST_BLOCK;
    const u32 m = (L - phi) >> wl, t = (L - phi) & ((1u << wl) - 1), gbytes = m << wl;
    // code lengths (<= 12, Kraft sum exactly 2^12), per-length counts, first
    // codes, symbols sorted by (length, symbol): one thread, N + 12 steps
    u8* lens = s.codelen;
    u8* sorted = s.codelen + SYM_SORTED;
    u16* cnt = (u16*)(s.codelen + SYM_CNT);
    u16* first = (u16*)(s.codelen + SYM_FIRST);
    u16* offs = (u16*)(s.codelen + SYM_OFFS);
    x.par(nsym, [&](u64 sy) { lens[sy] = (blk[SYM_FIXED + sy / 2] >> (4 * (sy & 1))) & 15; });
    x.one([&]() {
        u32 bad = 0, kraft = 0;
        for (u32 l = 0; l <= MAXLEN; l++) cnt[l] = 0;
        for (u32 sy = 0; sy < nsym; sy++) {
            const u32 l = lens[sy];
            if (l > MAXLEN) {
                bad = 1;
                continue;
            }
            if (l) {
                kraft += 1u << (MAXLEN - l);
                cnt[l]++;
            }
        }
        if (kraft != 1u << MAXLEN) bad = 1;
        u32 code = 0, o = 0;
        for (u32 l = 1; l <= MAXLEN; l++) {
            code = (code + (l > 1 ? cnt[l - 1] : 0)) << 1;
            first[l] = (u16)code;
            offs[l] = (u16)o;
            o += cnt[l];
        }
        if (!bad) {
            // counting sort (offs advanced, then restored)
            for (u32 sy = 0; sy < nsym; sy++)
                if (lens[sy]) sorted[offs[lens[sy]]++] = (u8)sy;
            for (u32 l = 1; l <= MAXLEN; l++) offs[l] = (u16)(offs[l] - cnt[l]);
        }
        s.sc[SC2_BAD] = bad;
    });
    if (s.sc[SC2_BAD]) return ST_BLOCK;
    // side bytes, head, index (uniform: every thread parses them)
    u64 p = SYM_FIXED + tbl;
    const u32 nlines = (m + SYM_SHIFT_LINE - 1) / SYM_SHIFT_LINE;
    u32 centre = 0, lag = 0;
    const u8* nib = 0;
    if (tr == SYM_T_SHIFT) {
        if (p + 1 > size) return ST_BLOCK;
        centre = blk[p++];
        if (centre > 31) return ST_BLOCK;
        const u32 nb = (nlines + 1) / 2;
        if (p + nb > size) return ST_BLOCK;
        nib = blk + p;
        p += nb;
        if ((nlines & 1) && (blk[p - 1] >> 4)) return ST_BLOCK;
    } else if (tr == SYM_T_LAG) {
        if (p + 2 > size) return ST_BLOCK;
        lag = ld_u16(blk + p);
        p += 2;
        if (lag == 0 || lag >= m) return ST_BLOCK;
    }
    if (p + phi > size) return ST_BLOCK;
    const u64 head_at = p;
    p += phi;
    const u32 ss = 1u << ssl, ns = (m + ss - 1) >> ssl;
    const u32 ib = (ns * iw + 7) / 8;
    if (p + ib > size) return ST_BLOCK;
    const u8* ix = blk + p;
    if ((ns * iw) & 7 && (ix[ib - 1] >> ((ns * iw) & 7))) return ST_BLOCK;
    p += ib;
    const V2Smem v = v2_view(s, block_log2);
    x.par(ns, [&](u64 j) { v.nbits[j] = base + packed_entry(ix, ib, (u32)j, iw); });
    x.one([&]() {
        u32 bits = 0;
        for (u32 j = 0; j < ns; j++) {
            v.bit0[j] = bits;
            bits += v.nbits[j];
        }
        s.sc[SC2_BITS] = bits;
    });
    const u32 total_bits = s.sc[SC2_BITS];
    const u32 sbytes = (u32)(((u64)total_bits + 7) / 8);
    const u64 stream_at = p;
    if (p + sbytes + t != size) return ST_BLOCK;
    const u64 tail_at = p + sbytes;
    if ((total_bits & 7) && (blk[tail_at - 1] >> (total_bits & 7))) return ST_BLOCK;
    const u8* sp = blk + stream_at;
    // decode table: entry = symbol | length << 8 (the code is complete: every
    // 12-bit pattern starts with one code word)
    x.par(DEC_TABLE, [&](u64 idx) {
        u32 code = 0, ent = 0;
        for (u32 l = 1; l <= MAXLEN; l++) {
            code = (code << 1) | (((u32)idx >> (l - 1)) & 1);
            const u32 d = code - first[l];
            if (d < cnt[l]) {
                ent = sorted[offs[l] + d] | (l << 8);
                break;
            }
        }
        s.lut[idx] = ent;
    });
    const u32 ssw = ss << wl, stride = ssw + V2_PAD, gmax = s.stage_bytes / stride;
    x.one([&]() { s.sc[SC_ERR] = ST_OK; });
    u8* grid = out + phi;
    for (u32 j0 = 0; j0 < ns; j0 += gmax) {
        const u32 j1 = ns - j0 < gmax ? ns : j0 + gmax;
        const u32 a0 = j0 << ssl, e0 = j1 == ns ? m : j1 << ssl;  // the group's elements
        x.par(j1 - j0, [&](u64 gi) {
            const u32 j = j0 + (u32)gi;
            const u32 i0 = j << ssl, nj = m - i0 < ss ? m - i0 : ss;
            u8* o = s.stage + gi * stride;
            const u32 b0 = v.bit0[j], b1 = b0 + v.nbits[j];
            const bool ok = f16n ? sym_subseg<true>(s.lut, sp, sbytes, b0, b1, nj, i0, 0, 0, o)
                                 : sym_subseg<false>(s.lut, sp, sbytes, b0, b1, nj, i0, nib, centre, o);
            if (!ok) X::or32(&s.sc[SC_ERR], ST_STREAM);
        });
        if (s.sc[SC_ERR]) return ST_STREAM;
        auto stage_at = [&](u32 k) -> u8* { return s.stage + (k >> ssl) * stride + ((k & (ss - 1)) << wl); };
        if (lag) {
            // x_i = ((s_i ^ y) & 0x80) | ((s_i + y) & 0x7F), y = x_{i-P} (0 for i < P)
            const u32 n = e0 - a0, classes = lag < n ? lag : n;
            x.par(classes, [&](u64 r) {
                for (u32 i = a0 + (u32)r; i < e0; i += lag) {
                    const u32 y = i < lag ? 0u : i - lag >= a0 ? *stage_at(i - lag - a0) : grid[i - lag];
                    u8* q = stage_at(i - a0);
                    *q = (u8)(((*q ^ y) & 0x80) | ((*q + y) & 0x7F));
                }
            });
        }
        // this group's span of the block, ascending
        const u32 lo = j0 == 0 ? 0 : phi + (a0 << wl);
        const u32 hi = j1 == ns ? L : phi + (e0 << wl);
        const u32 gb0 = a0 << wl;
        auto byte_at = [&](u32 q) -> u32 {
            if (q < phi) return blk[head_at + q];
            const u32 g = q - phi;
            if (g >= gbytes) return blk[tail_at + (g - gbytes)];
            const u32 r = g - gb0;
            return s.stage[(r >> (ssl + wl)) * stride + (r & (ssw - 1))];
        };
        gather_rounds(x, out, lo, hi, byte_at);
    }
    return ST_OK;
}

// Decodes one version-2 block of `size` (>= 1) bytes at blk into out[0..L); the
// launch's shared memory is sized for blocks of 2^block_log2 >= L bytes. Rejects
// exactly what codec/src/v2.rs rejects; every read is within blk[0..size), every
// write within out[0..L), in ascending rounds (head, grid, tail).
//
// Sub-segments are decoded one thread each, a group at a time (as many as
// Smem::stage holds: in nzc_decode_v2 all of a 64 KiB block, 64 of 512 bf16
// values; in the v1 carve 63 of 256, 31 of 512), each from its own first bit
// (the prefix of the stored index) and first plane element, into the staging
// buffer; then the group's span of the block (the lines from its first kept line
// to the next group's, elided ones included) is written in 16-byte rounds.
template <class X>
NZC_HD u32 decode_block_v2(X& x, Smem& s, const u8* blk, u32 size, u8* out, u32 L, u32 block_log2,
                           const V2Col& col) {
    if (size == 0) return ST_BLOCK;
    u32 st = ST_OK;
    if (decode_plain(x, blk, size, out, L, &st)) return st;
    const u32 mode = blk[0];
    if (mode >= MODE_E4M3 && mode <= MODE_FP16N) return decode_block_sym(x, s, blk, size, out, L, block_log2);
    if (mode != MODE_BF16 && mode != MODE_FP16 && mode != MODE_FP32) return ST_BLOCK;
    const u32 dt = dtype_of_mode(mode);
    const TypeInfo ti = type_info(dt);
    const u32 wl = ti.w == 4 ? 2 : 1;  // log2 W
    // fixed fields (every thread parses them: uniform values, no barrier)
    if (size < 8) return ST_BLOCK;
    const u32 flags = blk[1], k = blk[2], a = blk[3], grid = blk[4], iw = blk[5], base = ld_u16(blk + 6);
    if (flags & (V2_BYTECODE | 0x80)) return ST_BLOCK;
    const bool colb = (flags & V2_COL) != 0;
    if (colb && col.period == 0) return ST_BLOCK;  // COL without COLTAB (V2.9)
    if (ti.w != 4 && (flags & (V2_NO_LO0 | V2_NO_LO1))) return ST_BLOCK;
    if (a < 1 || a > ti.emax) return ST_BLOCK;
    const u32 phi = grid & 3, ssl = (grid >> 4) & 3;
    if ((grid & 0xCC) || ssl == 3 || phi >= ti.w) return ST_BLOCK;
    if (iw > 16) return ST_BLOCK;
    const bool z = (flags & V2_Z) != 0, lines = (flags & V2_LINES) != 0;
    const u32 ss = 256u << ssl, ssw = ss << wl;
    u64 p = 8;
    u32 zw = 0, zbase = 0;
    if (z) {
        if (p + 3 > size) return ST_BLOCK;
        zw = blk[8];
        zbase = ld_u16(blk + 9);
        p += 3;
        if (zw > 16) return ST_BLOCK;
    }
    u64 lens_at = 0;  // explicit lengths' offset; 0: static code k
    if (flags & V2_EXPLICIT) {
        if (k != 0 || p + 13 > size) return ST_BLOCK;
        lens_at = p;
        p += 13;
        u32 kraft = 0;
        for (u32 sy = 0; sy < NSYM; sy++) {
            const u32 l = (blk[lens_at + sy / 2] >> (4 * (sy % 2))) & 15;
            if (l > MAXLEN) return ST_BLOCK;
            if (l) kraft += 1u << (MAXLEN - l);
        }
        if (kraft != 1u << MAXLEN) return ST_BLOCK;
    } else if (k >= NCODES) {
        return ST_BLOCK;
    }
    if (L < phi) return ST_BLOCK;
    const u32 m = (L - phi) >> wl, t = (L - phi) & (ti.w - 1), gbytes = m << wl;
    const u32 nl = (gbytes + LINE - 1) / LINE, nw = (nl + 31) / 32;
    const V2Smem v = v2_view(s, block_log2);
    // elided lines: bitmap, rank per word, count
    x.par(nw, [&](u64 i) { v.elided[i] = 0; });
    x.one([&]() { s.sc[SC2_BAD] = 0; });
    if (lines) {
        if (p + 1 > size) return ST_BLOCK;
        const u32 form = blk[p++];
        if (form == 0) {
            const u32 nbm = (nl + 7) / 8;
            if (p + nbm > size) return ST_BLOCK;
            const u8* bm = blk + p;
            p += nbm;
            x.par(nw, [&](u64 i) {
                u32 wd = 0;
                for (u32 q = 0; q < 4; q++)
                    if (4 * i + q < nbm) wd |= (u32)bm[4 * i + q] << (8 * q);
                const u32 valid = nl - 32 * (u32)i >= 32 ? 0xFFFFFFFFu : (1u << (nl - 32 * (u32)i)) - 1;
                if (wd & ~valid) X::or32(&s.sc[SC2_BAD], 1);
                v.elided[i] = wd & valid;
            });
        } else if (form == 1) {
            if (p + 2 > size) return ST_BLOCK;
            const u32 count = ld_u16(blk + p);
            p += 2;
            if (p + 4 * (u64)count > size) return ST_BLOCK;
            const u8* runs = blk + p;
            p += 4 * (u64)count;
            x.par(count, [&](u64 r) {
                const u32 first = ld_u16(runs + 4 * r), len = ld_u16(runs + 4 * r + 2);
                bool ok = len >= 1 && first + len <= nl;
                if (r > 0) ok = ok && first > ld_u16(runs + 4 * r - 4) + ld_u16(runs + 4 * r - 2);
                if (!ok) {
                    X::or32(&s.sc[SC2_BAD], 1);
                    return;
                }
                for (u32 l = first; l < first + len;) {
                    const u32 bit = l & 31, nb = first + len - l < 32 - bit ? first + len - l : 32 - bit;
                    X::or32(&v.elided[l >> 5], (nb == 32 ? 0xFFFFFFFFu : (1u << nb) - 1) << bit);
                    l += nb;
                }
            });
        } else {
            return ST_BLOCK;
        }
        if (s.sc[SC2_BAD]) return ST_BLOCK;
    }
    x.one([&]() {
        u32 acc = 0;
        for (u32 i = 0; i < nw; i++) {
            v.before[i] = acc;
            acc += popc32(v.elided[i]);
        }
        s.sc[SC2_NE] = acc;
    });
    const u32 ne = s.sc[SC2_NE];
    if (lines && ne == 0) return ST_BLOCK;
    // elided bytes: whole lines, but the grid's last line may be short
    const bool last_elided = nl && ((v.elided[(nl - 1) >> 5] >> ((nl - 1) & 31)) & 1);
    const u32 eb = ne * LINE - (last_elided && (gbytes & (LINE - 1)) ? LINE - (gbytes & (LINE - 1)) : 0);
    const u32 K = (gbytes - eb) >> wl, ns = (K + ss - 1) >> (8 + ssl);
    // head; the index and zero index sit between the stream and the tail
    if (p + phi > size) return ST_BLOCK;
    const u64 head_at = p;
    p += phi;
    const u32 ib = (ns * iw + 7) / 8, zb = z ? (ns * zw + 7) / 8 : 0;
    if (p + ib + zb + t > size) return ST_BLOCK;
    const u64 ix_at = size - t - ib - zb;
    const u8* ix = blk + ix_at;
    const u8* zx = blk + ix_at + ib;
    if ((ns * iw) & 7 && (ix[ib - 1] >> ((ns * iw) & 7))) return ST_BLOCK;
    if (z && (ns * zw) & 7 && (zx[zb - 1] >> ((ns * zw) & 7))) return ST_BLOCK;
    x.par(ns, [&](u64 j) {
        const u32 nj = K - (u32)j * ss < ss ? K - (u32)j * ss : ss;
        v.nbits[j] = base + packed_entry(ix, ib, (u32)j, iw);
        v.zeros[j] = z ? zbase + packed_entry(zx, zb, (u32)j, zw) : 0;
        if (v.zeros[j] > nj) X::or32(&s.sc[SC2_BAD], 1);
    });
    if (s.sc[SC2_BAD]) return ST_BLOCK;
    x.one([&]() {
        u32 bits = 0, zs = 0;
        for (u32 j = 0; j < ns; j++) {
            v.bit0[j] = bits;
            v.p0[j] = j * ss - zs;
            bits += v.nbits[j];
            zs += v.zeros[j];
        }
        s.sc[SC2_BITS] = bits;
        s.sc[SC2_ZSUM] = zs;
    });
    const u32 total_bits = s.sc[SC2_BITS], P = K - s.sc[SC2_ZSUM];
    const u32 nlo = ti.w == 4 ? !(flags & V2_NO_LO1) + !(flags & V2_NO_LO0) : 0;
    const u64 planes_at = p;
    p += (u64)P * (1 + nlo);
    const u32 sbytes = (u32)(((u64)total_bits + 7) / 8);
    const u64 stream_at = p;
    if (p + sbytes != ix_at) return ST_BLOCK;
    const u64 tail_at = size - t;
    if ((total_bits & 7) && (blk[ix_at - 1] >> (total_bits & 7))) return ST_BLOCK;
    V2Planes pw;
    pw.p1 = blk + planes_at;
    pw.has_lo1 = ti.w == 4 && !(flags & V2_NO_LO1);
    pw.has_lo0 = ti.w == 4 && !(flags & V2_NO_LO0);
    pw.lo1o = P;
    pw.lo0o = pw.has_lo1 ? 2 * P : P;
    const u8* sp = blk + stream_at;
    // code lengths, canonical words, 12-bit decode table
    x.par(NSYM, [&](u64 sy) {
        s.codelen[sy] = lens_at ? (blk[lens_at + sy / 2] >> (4 * (sy % 2))) & 15 : CODE_LENGTHS[k][sy];
    });
    x.par(NSYM, [&](u64 sy) {
        s.sc[SC_WORDS + sy] = canon_word_by([&](u32 q) -> u32 { return s.codelen[q]; }, (u32)sy);
    });
    x.par(DEC_TABLE, [&](u64 idx) {
        u32 ent = E2_INVALID;
        for (u32 sy = 0; sy < NSYM; sy++) {
            const u32 len = s.codelen[sy];
            if (len && (idx & ((1u << len) - 1)) == s.sc[SC_WORDS + sy]) {
                ent = len | (sy == SYM_ZERO  ? (u32)E2_ZERO
                             : sy == SYM_ESC ? (u32)E2_ESC
                             : sy < a        ? (a - sy) << 8
                                             : (u32)E2_INVALID);
                break;
            }
        }
        s.lut[idx] = ent;
    });
    // the grid line of each sub-segment's first kept element (SS*W/64 kept lines each)
    const u32 lps = ssw / LINE;
    if (!lines) {
        x.par(ns, [&](u64 j) { v.line0[j] = (u32)j * lps; });
    } else {
        x.par(nl, [&](u64 l) {
            if ((v.elided[l >> 5] >> (l & 31)) & 1) return;
            const u32 r = (u32)l - v.before[l >> 5] - popc32(v.elided[l >> 5] & ((1u << (l & 31)) - 1));
            if (r % lps == 0 && r / lps < ns) v.line0[r / lps] = (u32)l;
        });
    }
    // COL: the column table in shared memory (coalesced), and the column of grid
    // element 0, (floor((b*B + phi) / W)) mod P = (b * 2^(log2 - wl)) mod P in
    // 32-bit arithmetic (B, a multiple of W, absorbs phi < W)
    u32 col0 = 0;
    if (colb) {
        x.par((col.period + 1) / 2, [&](u64 i) { s.ctab[i] = col.tab[i]; });
        const u32 P = col.period;
        col0 = ((col.blk % P) * ((1u << (col.block_log2 - wl)) % P)) % P;
    }
    const u32 stride = ssw + V2_PAD, gmax = s.stage_bytes / stride;
    x.one([&]() { s.sc[SC_ERR] = ST_OK; });
    for (u32 j0 = 0; j0 == 0 || j0 < ns; j0 += gmax) {
        const u32 j1 = ns - j0 < gmax ? ns : j0 + gmax;
        x.par(j1 - j0, [&](u64 gi) {
            const u32 j = j0 + (u32)gi;
            const u32 nj = K - j * ss < ss ? K - j * ss : ss;
            const u32 pp = v.p0[j];
            const V2Lane ln = {v.bit0[j], (u64)v.bit0[j] + v.nbits[j], pp, pp + nj - v.zeros[j], nj};
            u8* o = s.stage + gi * stride;
            V2ColWalk cw;
            cw.tab = s.ctab;
            cw.elided = lines ? v.elided : 0;
            cw.period = colb ? col.period : 1;
            cw.line = v.line0[j];
            cw.inl = 0;
            cw.epl = LINE >> wl;
            cw.nw = nw;
            // sub-segment j starts a kept line: grid element line0[j] * 64 / W
            cw.col = colb ? (col0 + cw.line * cw.epl) % cw.period : 0;
            // the dtype and COL as template arguments: no per-value branches on them
            const bool ok = !colb ? (dt == DT_BF16   ? v2_subseg<DT_BF16, false>(s.lut, sp, sbytes, ln, z, pw, o, cw)
                                     : dt == DT_FP16 ? v2_subseg<DT_FP16, false>(s.lut, sp, sbytes, ln, z, pw, o, cw)
                                                     : v2_subseg<DT_FP32, false>(s.lut, sp, sbytes, ln, z, pw, o, cw))
                                  : (dt == DT_BF16   ? v2_subseg<DT_BF16, true>(s.lut, sp, sbytes, ln, z, pw, o, cw)
                                     : dt == DT_FP16 ? v2_subseg<DT_FP16, true>(s.lut, sp, sbytes, ln, z, pw, o, cw)
                                                     : v2_subseg<DT_FP32, true>(s.lut, sp, sbytes, ln, z, pw, o, cw));
            if (!ok) X::or32(&s.sc[SC_ERR], ST_STREAM);
        });
        if (s.sc[SC_ERR]) return ST_STREAM;
        // this group's span of the block, ascending
        const u32 lo = j0 == 0 ? 0 : phi + LINE * v.line0[j0];
        const u32 hi = j1 == ns ? L : phi + LINE * v.line0[j1];
        const u32 kb0 = j0 * ssw;  // first kept byte of the group
        auto byte_at = [&](u32 q) -> u32 {
            if (q < phi) return blk[head_at + q];
            const u32 g = q - phi;
            if (g >= gbytes) return blk[tail_at + (g - gbytes)];
            u32 kb = g;
            if (lines) {
                const u32 l = g / LINE, wd = v.elided[l >> 5];
                if ((wd >> (l & 31)) & 1) return 0;
                kb = g - LINE * (v.before[l >> 5] + popc32(wd & ((1u << (l & 31)) - 1)));
            }
            const u32 r = kb - kb0;
            return s.stage[(r >> (8 + ssl + wl)) * stride + (r & (ssw - 1))];
        };
        gather_rounds(x, out, lo, hi, byte_at);
        if (j1 == ns) break;
    }
    return ST_OK;
}

// Decodes work item b of a parsed frame. Returns ST_*.
template <u32 VERS = VERS_ALL, class X>
NZC_HD u32 decode_item(X& x, Smem& s, const DecJob& job, const DecFrame f, u32 b) {
    const u8* src = (const u8*)job.src;
    u8* dst = (u8*)job.dst;
    if (f.status != ST_OK) return f.status;
    if (f.nb == 0) return ST_OK;
    const u64 B = (u64)1 << f.block_log2;
    const u64 o = (u64)b * B;
    const u32 L = (u32)(f.n - o < B ? f.n - o : B);
    u32 st = ST_OK;
    if (f.flags & FLAG_STORED) {
        copy_rounds(x, dst + o, src + HEADER_LEN + o, L);
    } else {
        const u64 pos = f.t0 + 4 * f.nb +
                        x.sum64(b, S64_B, [&](u64 i) -> u64 { return ld_u32(src + f.t0 + 4 * i); });
        const u32 size = ld_u32(src + f.t0 + 4 * (u64)b);
        // parse_frame checked that all blocks end within src_len
        V2Col col;
        col.tab = src + HEADER_LEN + 2;
        col.period = f.period;
        col.blk = b;
        col.block_log2 = f.block_log2;
        st = (VERS & VERS_2) && f.version == 2 ? decode_block_v2(x, s, src + pos, size, dst + o, L, f.block_log2, col)
             : (VERS & VERS_1)                  ? decode_block(x, s, src + pos, size, dst + o, L)
                                                : (u32)ST_HEADER;
    }
    if (st == ST_OK && (f.flags & FLAG_CHECKSUM)) ws_crc(job.ws, f.nb)[b] = block_crc(x, s, dst + o, L);
    return st;
}

template <class X>
NZC_HD void decode_finish(X& x, Smem& s, const DecJob& job, const DecFrame f, u32 err) {
    u32 st = err;
    if (st == ST_OK && (f.flags & FLAG_CHECKSUM)) {
        u32 crc = 0;
        if (f.nb > 0) {
            u32* bc = ws_crc(job.ws, f.nb);
            crc_tree(x, s, bc, f.nb, (u64)1 << f.block_log2, f.n);
            crc = bc[0];
        }
        if (crc != f.crc) st = ST_CHECKSUM;
    }
    x.publish((JobResult*)job.result, st == ST_OK ? f.n : 0, st);
}

// ---- launches ------------------------------------------------------------------
// The body of one CTA of a launch: the device kernels (nzc_kernels.cu) and the
// host harness's concurrent executor (kernels/host/harness.cpp) run this same
// code. A CTA walks the jobs in order and claims blocks of each job from the
// job's claim counter, so block b is always claimed after block b-1: the
// encoder's look-back only waits on blocks already held by running CTAs.
// Besides the primitives listed at the top, the executor provides
//   x.claim(counter)  fetch-and-add on a job's claim counter, uniform result
//   x.bcast(f)        f() on one thread, its u32 result in every thread
//   X::ld32(p)        an acquire load of a word other CTAs write (ld.acquire.gpu on the device)
//   X::xchg32(p, v), X::cas32(p, old, v)   atomics on such words
template <class X>
NZC_HD void encode_jobs(X& x, Smem& s, const EncJob* jobs, u32 njobs, u32 smem_log2) {
    for (u32 j = 0; j < njobs; j++) {
        const EncJob job = jobs[j];
        JobState* st = (JobState*)job.ws;
        const bool bad = job.block_log2 < MIN_BLOCK_LOG2 || job.block_log2 > MAX_BLOCK_LOG2 ||
                         job.block_log2 > smem_log2 || job.dst_cap < job.n + HEADER_LEN ||
                         job.nb != ((job.n + (1ull << (job.block_log2 & 31)) - 1) >> (job.block_log2 & 31));
        const u32 items = bad ? 1 : (job.nb ? job.nb : 1);
        bool planned = false;
        FramePlan fp;
        for (;;) {
            const u32 item = x.claim(&st->claim);
            if (item >= items) break;
            if (bad) {
                x.publish((JobResult*)job.result, 0, ST_BAD_ARGS);
                break;
            }
            if (!planned) {
                fp = frame_plan(x, s, (const u8*)job.src, job.n, job.hint, job.block_log2);
                if (job.checksum) crc_init(x, s);
                planned = true;
            }
            encode_item(x, s, job, fp, item);
            if (x.finish(st, items)) encode_finish(x, s, job, fp);
        }
    }
}

// VERS (VERS_*) selects the frame versions the launch accepts: nzc_decode takes
// version 1, nzc_decode_v2 version 2 (each kernel's code holds one decoder); the
// host harness's fuzzing entry takes both.
template <u32 VERS = VERS_ALL, class X>
NZC_HD void decode_jobs(X& x, Smem& s, const DecJob* jobs, u32 njobs, u32 smem_log2) {
    for (u32 j = 0; j < njobs; j++) {
        const DecJob job = jobs[j];
        JobState* st = (JobState*)job.ws;
        // Skip jobs whose items are all claimed (pad0 = items + 1 once someone parsed it).
        const bool skip = x.bcast([&]() -> u32 {
            const u32 known = X::ld32(&st->pad0);
            return known != 0 && X::ld32(&st->claim) >= known - 1;
        }) != 0;
        if (skip) continue;
        DecFrame f = parse_frame(x, (const u8*)job.src, job.src_len, job.dst_cap, VERS);
        if (f.status == ST_OK && f.nb > job.ws_blocks) f.status = ST_BAD_ARGS;
        if (f.status == ST_OK && f.block_log2 > smem_log2) f.status = ST_BAD_ARGS;
        const u32 items = f.status != ST_OK ? 1 : (f.nb ? (u32)f.nb : 1);
        x.bcast([&]() -> u32 { return X::xchg32(&st->pad0, items + 1); });
        bool crc_ready = false;
        for (;;) {
            const u32 item = x.claim(&st->claim);
            if (item >= items) break;
            if (!crc_ready && f.status == ST_OK && (f.flags & FLAG_CHECKSUM)) {
                crc_init(x, s);
                crc_ready = true;
            }
            const u32 r = decode_item<VERS>(x, s, job, f, item);
            if (r != ST_OK) x.bcast([&]() -> u32 { return X::cas32(&st->err, 0u, r); });
            if (x.finish(st, items)) {
                const u32 err = x.bcast([&]() -> u32 { return X::ld32(&st->err); });
                decode_finish(x, s, job, f, err);
            }
        }
    }
}

}  // namespace nzc
