//! The encoder (FORMAT.md §6). Every decision is an integer function of the input
//! bytes and the options, so a GPU encoder can reproduce the frames byte for byte.

use crate::codes::{symbol_of, CODE_LENGTHS, CODE_WORDS, ESC, NCODES, NSYM};
use crate::elem::{Bf16, Elem, Fp16, Fp32};
use crate::format::*;
use crate::{CodecError, Dtype, DtypeHint, EncodeOptions, FrameStats};

/// Sample stride (in elements) of the per-block code choice.
pub(crate) const SAMPLE_STRIDE: usize = 13;
/// Longest coded segment: 1024 elements of at most 20 bits.
const SEG_MAX_BYTES: usize = SEG_ELEMS * 20 / 8;
/// Elements split and coded per group (4 segments, coded interleaved).
const GROUP: usize = 4 * SEG_ELEMS;

/// Compresses `src` into `dst` and returns the frame length.
///
/// `dst.len()` must be at least [`crate::max_compressed_size`]`(src.len())`.
/// Allocation-free; the frame depends only on `src` and `opts`.
pub fn compress(src: &[u8], dst: &mut [u8], opts: &EncodeOptions) -> Result<usize, CodecError> {
    compress_with_stats(src, dst, opts).map(|s| s.frame_len)
}

/// [`compress`], also reporting what the encoder chose (dtype, coded/raw/fill blocks).
pub fn compress_with_stats(
    src: &[u8],
    dst: &mut [u8],
    opts: &EncodeOptions,
) -> Result<FrameStats, CodecError> {
    compress_impl(src, dst, opts, true)
}

/// [`compress`] on the portable scalar path only (no SIMD, whatever the CPU): the
/// reference the vector encoders are tested against. Same bytes as [`compress`].
#[doc(hidden)]
pub fn compress_scalar(
    src: &[u8],
    dst: &mut [u8],
    opts: &EncodeOptions,
) -> Result<usize, CodecError> {
    compress_impl(src, dst, opts, false).map(|s| s.frame_len)
}

fn compress_impl(
    src: &[u8],
    dst: &mut [u8],
    opts: &EncodeOptions,
    simd: bool,
) -> Result<FrameStats, CodecError> {
    let n = src.len();
    check_args(n, dst.len(), opts)?;
    let crc = if opts.checksum {
        crc32c::crc32c(src)
    } else {
        0
    };
    let (dtype, det_phi) = resolve_dtype_phase(src, opts);
    if dtype != Dtype::Raw
        || (opts.dtype == DtypeHint::Auto && has_fill_block(src, opts.block_log2))
    {
        let b = 1usize << opts.block_log2;
        let nb = n.div_ceil(b);
        let limit = HEADER_LEN + n;
        let fast = opts.effort == crate::Effort::Fast;
        if opts.format == VERSION_2 {
            // a phase choice left by an earlier frame's table search is not this one's
            crate::v2::clear_phase_memo();
        }
        // version 2: the column table (FORMAT.md §V2.9) sits between header and block
        // table (not written by the fast effort, §V2.11)
        let ct = if opts.format == VERSION_2 && !fast {
            crate::coltab::encoder_table(dtype, src, b)
        } else {
            None
        };
        let mut table = HEADER_LEN + ct.as_ref().map_or(0, |c| c.bytes());
        let mut pos = table + 4 * nb;
        let mut any_col = false;
        let mut stats = FrameStats {
            raw_len: n,
            dtype: Some(dtype),
            ..FrameStats::default()
        };
        let mut ok = pos < limit;
        // version 2: the phase of the last block coded as mode 2..=4 (its byte 4's low
        // nibble), carried to the next block (FORMAT.md §V2.7 step 3); the fast
        // effort carries detection's phase into the first (§V2.11)
        let mut prev_phi: Option<usize> = if fast { det_phi } else { None };
        if ok {
            for (i, blk) in src.chunks(b).enumerate() {
                let coded = if opts.format == VERSION_2 {
                    let col = ct.as_ref().map(|c| (c, i * b));
                    let r = crate::v2::encode_block_v2(
                        dtype,
                        blk,
                        &mut dst[pos..limit],
                        simd,
                        col,
                        prev_phi,
                        fast,
                    );
                    if let Some((_, BlockKind::Coded)) = r {
                        if (MODE_BF16..=MODE_FP32).contains(&dst[pos]) {
                            prev_phi = Some((dst[pos + 4] & 0x0F) as usize);
                        }
                    }
                    r
                } else {
                    encode_block_with(dtype, blk, &mut dst[pos..limit], simd)
                };
                match coded {
                    Some((size, kind)) => {
                        // a version-2 coded block's byte 1 is its flags (COL: bit 2)
                        any_col |= ct.is_some()
                            && kind == BlockKind::Coded
                            && dst[pos + 1] & crate::v2::F_COL != 0;
                        dst[table + 4 * i..table + 4 * i + 4]
                            .copy_from_slice(&(size as u32).to_le_bytes());
                        pos += size;
                        stats.count(kind);
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
        }
        if ok && ct.is_some() && !any_col {
            // no block uses the table: the frame goes without it (FORMAT.md §V2.9)
            dst.copy_within(table..pos, HEADER_LEN);
            pos -= table - HEADER_LEN;
            table = HEADER_LEN;
        }
        let ct = if any_col { ct } else { None };
        if ok && pos < limit {
            let mut h = header(dtype, opts, n, crc, false);
            if let Some(c) = &ct {
                h.flags |= FLAG_COLTAB;
                c.write(&mut dst[HEADER_LEN..table]);
            }
            h.write(&mut dst[..HEADER_LEN]);
            stats.frame_len = pos;
            return Ok(stats);
        }
    }
    Ok(store(src, dst, opts, crc, dtype))
}

pub(crate) fn check_args(n: usize, dst_len: usize, opts: &EncodeOptions) -> Result<(), CodecError> {
    if !(MIN_BLOCK_LOG2..=MAX_BLOCK_LOG2).contains(&opts.block_log2) {
        return Err(CodecError::InvalidOptions("block_log2 must be in 12..=20"));
    }
    if opts.format != VERSION && opts.format != VERSION_2 {
        return Err(CodecError::InvalidOptions("format must be 1 or 2"));
    }
    let need = n
        .checked_add(HEADER_LEN)
        .ok_or(CodecError::InvalidOptions("input too large"))?;
    if dst_len < need {
        return Err(CodecError::DstTooSmall {
            needed: need as u64,
            available: dst_len,
        });
    }
    Ok(())
}

pub(crate) fn header(
    dtype: Dtype,
    opts: &EncodeOptions,
    n: usize,
    crc: u32,
    stored: bool,
) -> Header {
    Header {
        version: opts.format,
        flags: if opts.checksum { FLAG_CHECKSUM } else { 0 } | if stored { FLAG_STORED } else { 0 },
        dtype: dtype as u8,
        block_log2: opts.block_log2,
        raw_len: n as u64,
        crc,
    }
}

/// Writes a STORED frame.
pub(crate) fn store(
    src: &[u8],
    dst: &mut [u8],
    opts: &EncodeOptions,
    crc: u32,
    dtype: Dtype,
) -> FrameStats {
    let n = src.len();
    header(dtype, opts, n, crc, true).write(&mut dst[..HEADER_LEN]);
    dst[HEADER_LEN..HEADER_LEN + n].copy_from_slice(src);
    FrameStats {
        frame_len: HEADER_LEN + n,
        raw_len: n,
        dtype: Some(dtype),
        stored: true,
        ..FrameStats::default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockKind {
    Coded,
    Raw,
    Fill,
}

impl FrameStats {
    pub(crate) fn count(&mut self, kind: BlockKind) {
        match kind {
            BlockKind::Coded => self.blocks_coded += 1,
            BlockKind::Raw => self.blocks_raw += 1,
            BlockKind::Fill => self.blocks_fill += 1,
        }
    }
}

/// The frame's element type for `opts.format` (version 2 detects over (type,
/// phase)) and, where version 2's detection chose a float type, the phase of its
/// winning candidate.
fn resolve_dtype_phase(src: &[u8], opts: &EncodeOptions) -> (Dtype, Option<usize>) {
    if opts.format == VERSION_2 && opts.dtype == DtypeHint::Auto && src.len() >= MIN_CODED_INPUT {
        return crate::v2::detect_v2_phase(src);
    }
    let dt = if opts.format == VERSION_2
        && src.len() >= MIN_CODED_INPUT
        && opts.dtype == DtypeHint::Fp8E4m3
    {
        Dtype::Fp8E4m3
    } else if opts.format == VERSION_2
        && src.len() >= MIN_CODED_INPUT
        && opts.dtype == DtypeHint::Fp8E5m2
    {
        Dtype::Fp8E5m2
    } else {
        resolve_dtype(src, opts.dtype)
    };
    (dt, None)
}

/// The element type for the frame: the hint, or detection for `Auto`.
pub(crate) fn resolve_dtype(src: &[u8], hint: DtypeHint) -> Dtype {
    if src.len() < MIN_CODED_INPUT {
        return Dtype::Raw;
    }
    match hint {
        DtypeHint::Raw | DtypeHint::Fp8E4m3 | DtypeHint::Fp8E5m2 => Dtype::Raw,
        DtypeHint::Bf16 => Dtype::Bf16,
        DtypeHint::Fp16 => Dtype::Fp16,
        DtypeHint::Fp32 => Dtype::Fp32,
        DtypeHint::Auto => detect(src),
    }
}

/// Sample-based dtype detection (FORMAT.md §6 "Detection").
pub fn detect(src: &[u8]) -> Dtype {
    let n = src.len();
    if n < MIN_CODED_INPUT {
        return Dtype::Raw;
    }
    let g = (n / 1024).clamp(1, 64);
    let units = n / 64;
    let mut best = (u64::MAX, Dtype::Raw);
    let mut hb = [0u32; 256];
    let mut hh = [0u32; 256];
    let mut hf = [0u32; 256];
    let mut used = 0u64;
    for j in 0..g {
        let off = 64 * (j * units / g);
        let s = &src[off..off + 64];
        if all_equal(s) {
            continue; // constant runs become FILL blocks whatever the type
        }
        used += 1;
        for i in 0..32 {
            hb[Bf16::exp_at(s, i) as usize] += 1;
            hh[Fp16::exp_at(s, i) as usize] += 1;
        }
        for i in 0..16 {
            hf[Fp32::exp_at(s, i) as usize] += 1;
        }
    }
    if used == 0 {
        return Dtype::Raw;
    }
    let g64 = used;
    for (cost, dt) in [
        (
            best_cost::<Bf16>(&hb).2 + Bf16::RAWBITS * 32 * g64,
            Dtype::Bf16,
        ),
        (
            best_cost::<Fp16>(&hh).2 + Fp16::RAWBITS * 32 * g64,
            Dtype::Fp16,
        ),
        (
            best_cost::<Fp32>(&hf).2 + Fp32::RAWBITS * 16 * g64,
            Dtype::Fp32,
        ),
    ] {
        if cost < best.0 {
            best = (cost, dt);
        }
    }
    if best.0 * 32 >= 31 * 512 * g64 {
        Dtype::Raw
    } else {
        best.1
    }
}

/// `CODE_LENGTHS` transposed: per symbol, the length under each code.
pub(crate) const LENGTHS_BY_SYMBOL: [[u32; NCODES]; NSYM] = {
    let mut t = [[0u32; NCODES]; NSYM];
    let mut k = 0;
    while k < NCODES {
        let mut s = 0;
        while s < NSYM {
            t[s][k] = CODE_LENGTHS[k][s] as u32;
            s += 1;
        }
        k += 1;
    }
    t
};

/// Best `(k, anchor, cost in bits)` for a histogram of exponent fields (FORMAT.md §6).
/// Inlined so that the per-code sums are vectorised with the caller's features
/// (AVX2 `vpmulld` in the vector encoder; baseline x86-64 has no 32-bit vector multiply).
#[inline(always)]
pub(crate) fn best_cost<T: Elem>(h: &[u32; 256]) -> (u8, u32, u64) {
    let mut smax = 1u32;
    for e in (0..=T::EMAX).rev() {
        if h[e as usize] != 0 {
            smax = e.max(1);
            break;
        }
    }
    let lo = smax.saturating_sub(4).max(1);
    let hi = (smax + 1).min(T::EMAX);
    // The exponents that occur (a few dozen at most in practice).
    let mut es = [(0u32, 0u64); 256];
    let mut ne = 0;
    for e in 0..=T::EMAX {
        let c = h[e as usize];
        if c != 0 {
            es[ne] = (e, c as u64);
            ne += 1;
        }
    }
    let mut best = (0u8, lo, u64::MAX);
    for a in lo..=hi {
        // symbol counts under this anchor
        let mut cnt = [0u64; NSYM];
        for &(e, c) in &es[..ne] {
            cnt[symbol_of(e, a)] += c;
        }
        let esc_extra = cnt[ESC] * T::EBITS as u64;
        // Costs of all 32 codes at once (vectorised over k; sums fit in u32:
        // at most 80k sampled values of at most 12 bits).
        let mut cost = [0u32; NCODES];
        for s in 0..NSYM {
            let c = cnt[s] as u32;
            if c != 0 {
                for (x, &len) in cost.iter_mut().zip(LENGTHS_BY_SYMBOL[s].iter()) {
                    *x += c * len;
                }
            }
        }
        for (k, &c) in cost.iter().enumerate() {
            let c = c as u64 + esc_extra;
            if c < best.2 {
                best = (k as u8, a, c);
            }
        }
    }
    best
}

/// Encodes one block into `out` (the room left below the frame limit).
/// Returns its size and kind, or `None` if even the chosen form does not fit.
pub(crate) fn encode_block(dtype: Dtype, blk: &[u8], out: &mut [u8]) -> Option<(usize, BlockKind)> {
    encode_block_with(dtype, blk, out, true)
}

/// [`encode_block`]; `simd = false` forces the scalar reference path.
fn encode_block_with(
    dtype: Dtype,
    blk: &[u8],
    out: &mut [u8],
    simd: bool,
) -> Option<(usize, BlockKind)> {
    encode_block_by(blk, out, |o| match dtype {
        Dtype::Bf16 => encode_coded::<Bf16>(blk, o, simd),
        Dtype::Fp16 => encode_coded::<Fp16>(blk, o, simd),
        Dtype::Fp32 => encode_coded::<Fp32>(blk, o, simd),
        Dtype::Raw | Dtype::Fp8E4m3 | Dtype::Fp8E5m2 => None,
    })
}

/// One block, in either format: FILL when it is one repeated byte, else what
/// `code` writes into at most `L` bytes of `out` (a coded block strictly shorter
/// than RAW, or `None`), else RAW. `None` when `out` has no room for the choice.
pub(crate) fn encode_block_by(
    blk: &[u8],
    out: &mut [u8],
    code: impl FnOnce(&mut [u8]) -> Option<usize>,
) -> Option<(usize, BlockKind)> {
    encode_block_in(blk, out, |o, cap| code(&mut o[..cap]))
}

/// Whether some block of the input is one repeated byte (a block frame of FILL and
/// RAW blocks then beats a stored frame even when nothing is coded).
/// As [`encode_block_by`], but `code` gets all of `out` and the most bytes the coded
/// block may take, `min(blk.len(), out.len())` (version 2 codes in place when the
/// room allows).
pub(crate) fn encode_block_in(
    blk: &[u8],
    out: &mut [u8],
    code: impl FnOnce(&mut [u8], usize) -> Option<usize>,
) -> Option<(usize, BlockKind)> {
    let l = blk.len();
    if all_equal(blk) {
        if out.len() < 2 {
            return None;
        }
        out[0] = MODE_FILL;
        out[1] = blk[0];
        return Some((2, BlockKind::Fill));
    }
    let cap = l.min(out.len());
    if let Some(size) = code(out, cap) {
        return Some((size, BlockKind::Coded));
    }
    if out.len() < 1 + l {
        return None;
    }
    out[0] = MODE_RAW;
    out[1..1 + l].copy_from_slice(blk);
    Some((1 + l, BlockKind::Raw))
}

pub(crate) fn has_fill_block(src: &[u8], block_log2: u8) -> bool {
    src.len() >= MIN_CODED_INPUT && src.chunks(1 << block_log2).any(all_equal)
}

pub(crate) fn all_equal(blk: &[u8]) -> bool {
    let v = blk[0];
    let pat = [v; 64];
    let mut chunks = blk.chunks_exact(64);
    for c in &mut chunks {
        if c != pat {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == v)
}

/// Per-block encode table: key -> code word (with escape payload and fp16 extra
/// bits) in bits 0..24, total length in bits 24..32.
#[inline(always)]
fn enc_table<T: Elem>(k: usize, a: u32) -> [u32; 256] {
    enc_table_for::<T>(&CODE_LENGTHS[k], &CODE_WORDS[k], a)
}

/// [`enc_table`] for any code (`lens`, canonical `words`): version 2's static and
/// explicit codes (its keys, the exponent field or fp16's high byte, map to symbols
/// as version 1's when the element is not a ZERO under `Z`).
#[inline(always)]
pub(crate) fn enc_table_for<T: Elem>(lens: &[u8; NSYM], words: &[u16; NSYM], a: u32) -> [u32; 256] {
    let mut t = [0u32; 256];
    for (key, slot) in t.iter_mut().enumerate() {
        let (e, x) = T::key_parts(key as u32);
        let s = symbol_of(e, a);
        let lc = lens[s] as u32;
        let mut bits = words[s] as u32;
        let mut len = lc;
        if s == ESC {
            bits |= e << len;
            len += T::EBITS;
        }
        bits |= x << len;
        len += T::XBITS;
        *slot = bits | (len << 24);
    }
    t
}

/// One LSB-first bit writer over a segment scratch buffer.
struct SegWriter {
    acc: u64,
    nbits: u32,
    pos: usize,
}

impl SegWriter {
    #[inline(always)]
    fn put(&mut self, c: u32) {
        self.acc |= ((c & 0xFF_FFFF) as u64) << self.nbits;
        self.nbits += c >> 24;
    }
    #[inline(always)]
    fn flush(&mut self, buf: &mut [u8; SEG_MAX_BYTES + 16]) {
        let p = self.pos.min(SEG_MAX_BYTES + 8);
        buf[p..p + 8].copy_from_slice(&self.acc.to_le_bytes());
        let bytes = (self.nbits >> 3) as usize;
        self.pos += bytes;
        self.acc = if bytes == 8 {
            0
        } else {
            self.acc >> (bytes * 8)
        };
        self.nbits &= 7;
    }
    fn finish(&mut self, buf: &mut [u8; SEG_MAX_BYTES + 16]) -> usize {
        self.flush(buf);
        if self.nbits > 0 {
            self.flush_partial(buf);
        }
        self.pos
    }
    fn flush_partial(&mut self, buf: &mut [u8; SEG_MAX_BYTES + 16]) {
        let p = self.pos.min(SEG_MAX_BYTES + 8);
        buf[p] = self.acc as u8;
        self.pos += 1;
        self.nbits = 0;
        self.acc = 0;
    }
}

/// Codes `keys` (one segment) into `buf`; returns the byte length.
#[inline(always)]
fn code_segment(lut: &[u32; 256], keys: &[u8], buf: &mut [u8; SEG_MAX_BYTES + 16]) -> usize {
    let mut w = SegWriter {
        acc: 0,
        nbits: 0,
        pos: 0,
    };
    let mut pairs = keys.chunks_exact(2);
    for p in &mut pairs {
        w.put(lut[p[0] as usize]);
        w.put(lut[p[1] as usize]);
        w.flush(buf);
    }
    for &k in pairs.remainder() {
        w.put(lut[k as usize]);
    }
    w.finish(buf)
}

/// Codes two full segments interleaved (two independent dependency chains), two
/// elements per step: the pair's bits are combined before the shift into the accumulator.
#[inline(always)]
fn code_segments2(
    lut: &[u32; 256],
    ka: &[u8],
    kb: &[u8],
    ba: &mut [u8; SEG_MAX_BYTES + 16],
    bb: &mut [u8; SEG_MAX_BYTES + 16],
) -> (usize, usize) {
    let (mut acc_a, mut acc_b) = (0u64, 0u64);
    let (mut nb_a, mut nb_b) = (0u32, 0u32);
    let (mut pa, mut pb) = (0usize, 0usize);
    for (pa2, pb2) in ka.chunks_exact(2).zip(kb.chunks_exact(2)) {
        let (c0, c1) = (lut[pa2[0] as usize], lut[pa2[1] as usize]);
        let (d0, d1) = (lut[pb2[0] as usize], lut[pb2[1] as usize]);
        let pair_a = (c0 & 0xFF_FFFF) as u64 | (((c1 & 0xFF_FFFF) as u64) << (c0 >> 24));
        let pair_b = (d0 & 0xFF_FFFF) as u64 | (((d1 & 0xFF_FFFF) as u64) << (d0 >> 24));
        acc_a |= pair_a << nb_a;
        acc_b |= pair_b << nb_b;
        nb_a += (c0 >> 24) + (c1 >> 24);
        nb_b += (d0 >> 24) + (d1 >> 24);
        let qa = pa.min(SEG_MAX_BYTES + 8);
        let qb = pb.min(SEG_MAX_BYTES + 8);
        ba[qa..qa + 8].copy_from_slice(&acc_a.to_le_bytes());
        bb[qb..qb + 8].copy_from_slice(&acc_b.to_le_bytes());
        let (ya, yb) = ((nb_a >> 3) as usize, (nb_b >> 3) as usize);
        pa += ya;
        pb += yb;
        acc_a = if ya == 8 { 0 } else { acc_a >> (ya * 8) };
        acc_b = if yb == 8 { 0 } else { acc_b >> (yb * 8) };
        nb_a &= 7;
        nb_b &= 7;
    }
    let mut wa = SegWriter {
        acc: acc_a,
        nbits: nb_a,
        pos: pa,
    };
    let mut wb = SegWriter {
        acc: acc_b,
        nbits: nb_b,
        pos: pb,
    };
    (wa.finish(ba), wb.finish(bb))
}

/// Histogram of the exponent fields of elements `0, 13, 26, ...` (`< m`) of a block
/// (FORMAT.md §6 "Block"). Four interleaved sub-histograms, so that runs of equal
/// exponents do not serialise on one counter; same counts as the plain loop.
#[inline(always)]
pub(crate) fn sample_histogram<T: Elem>(blk: &[u8], m: usize) -> [u32; 256] {
    // At most 2^20 / 2 / 13 + 1 < 2^16 samples per block: u16 counts cannot overflow.
    const _: () = assert!((1usize << MAX_BLOCK_LOG2) / 2 / SAMPLE_STRIDE + 1 < 1 << 16);
    let mut hs = [[0u16; 256]; 4];
    let stride = SAMPLE_STRIDE * T::W;
    let mut chunks = blk[..m * T::W].chunks_exact(4 * stride);
    for c in &mut chunks {
        hs[0][T::exp_at(c, 0) as usize] += 1;
        hs[1][T::exp_at(c, SAMPLE_STRIDE) as usize] += 1;
        hs[2][T::exp_at(c, 2 * SAMPLE_STRIDE) as usize] += 1;
        hs[3][T::exp_at(c, 3 * SAMPLE_STRIDE) as usize] += 1;
    }
    let done = (m * T::W - chunks.remainder().len()) / T::W;
    for i in (done..m).step_by(SAMPLE_STRIDE) {
        hs[0][T::exp_at(blk, i) as usize] += 1;
    }
    let mut h = [0u32; 256];
    for (e, x) in h.iter_mut().enumerate() {
        *x = hs[0][e] as u32 + hs[1][e] as u32 + hs[2][e] as u32 + hs[3][e] as u32;
    }
    h
}

/// Encodes a coded block (FORMAT.md §4) into `out`; `None` if it does not fit
/// (the caller then stores the block raw).
fn encode_coded<T: Elem>(blk: &[u8], out: &mut [u8], simd: bool) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if simd && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("bmi2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { encode_coded_avx2::<T>(blk, out) };
        }
    }
    let _ = simd;
    encode_coded_body::<T, false>(blk, out)
}

/// # Safety
/// The CPU must support AVX2 and BMI2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2")]
unsafe fn encode_coded_avx2<T: Elem>(blk: &[u8], out: &mut [u8]) -> Option<usize> {
    encode_coded_body::<T, true>(blk, out)
}

/// The coded-block encoder. `V`: the caller is compiled for AVX2+BMI2 and the
/// vector packer (`avx2::code_segment`) may be used for full segments.
#[inline(always)]
fn encode_coded_body<T: Elem, const V: bool>(blk: &[u8], out: &mut [u8]) -> Option<usize> {
    let l = blk.len();
    let m = l / T::W;
    if m < MIN_CODED_ELEMS {
        return None;
    }
    let h = sample_histogram::<T>(blk, m);
    let (k, a, _cost) = best_cost::<T>(&h);
    let lut = enc_table::<T>(k as usize, a);
    // Blocks whose sample averages more than 3.25 code bits per element often
    // overflow 16-element chunks: the vector packer then appends 8-element chunks
    // without trying (a predictable branch instead of a mispredicted one). Speed
    // only: the bits are the same either way.
    #[cfg(target_arch = "x86_64")]
    let wide = _cost * 4 > 13 * m.div_ceil(SAMPLE_STRIDE) as u64;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: V is set only by callers compiled for AVX2 (checked at run time).
    // (bf16 and fp32 keys are exponent fields; fp16 keys hold sign, exponent and top
    // mantissa bits, `Fp16::key_parts`, and have their own packer.)
    let vt = (V && (T::XBITS == 0 || T::MODE == MODE_FP16))
        .then(|| unsafe { avx2::VecTables::new(k as usize, a, T::MODE == MODE_FP16) });
    #[cfg(target_arch = "x86_64")]
    let fp16 = T::MODE == MODE_FP16;

    let nseg = m.div_ceil(SEG_ELEMS);
    let off1 = BLOCK_HEADER_LEN + 2 * nseg;
    let off2 = off1 + m;
    let mut pos = off2 + T::P2 * m;
    let t = l - m * T::W;
    if pos + t > out.len() {
        return None;
    }
    out[0] = T::MODE;
    out[1] = k;
    out[2] = a as u8;
    out[3] = 0;

    let mut keys = [0u8; GROUP];
    // Segment scratch buffers, zeroed on first use only (the vector path rarely
    // needs one).
    let mut bufs_cell: Option<[[u8; SEG_MAX_BYTES + 16]; 4]> = None;
    let mut lens = [0usize; 4];
    let mut seg = 0usize;
    let mut g0 = 0usize;
    while g0 < m {
        let g1 = (g0 + GROUP).min(m);
        let gk = &mut keys[..g1 - g0];
        {
            let (head, tail) = out.split_at_mut(off2);
            let p2: &mut [u8] = if T::P2 > 0 {
                &mut tail[T::P2 * g0..T::P2 * g1]
            } else {
                &mut []
            };
            let src = &blk[g0 * T::W..g1 * T::W];
            let p1 = &mut head[off1 + g0..off1 + g1];
            #[cfg(target_arch = "x86_64")]
            if V && T::MODE == MODE_BF16 {
                // SAFETY: V means the CPU has AVX2.
                unsafe { avx2::split_bf16(src, gk, p1) };
            } else {
                T::split(src, gk, p1, p2);
            }
            #[cfg(not(target_arch = "x86_64"))]
            T::split(src, gk, p1, p2);
        }
        let nsg = (g1 - g0).div_ceil(SEG_ELEMS);
        #[cfg(target_arch = "x86_64")]
        if let Some(vt) = &vt {
            // Full segments are coded straight into `out` while a whole segment
            // (and the writer's overrun) fits; otherwise through a scratch buffer.
            for (i, ks) in gk.chunks(SEG_ELEMS).enumerate() {
                let len = if ks.len() == SEG_ELEMS && pos + SEG_MAX_BYTES + 16 <= out.len() {
                    // SAFETY: `vt` exists only when the CPU has AVX2 and BMI2, and
                    // `out[pos..]` holds `SEG_MAX_BYTES + 16` bytes.
                    let len = unsafe {
                        avx2::code_segment_dispatch(
                            vt,
                            &lut,
                            ks.try_into().unwrap(),
                            out.as_mut_ptr().add(pos),
                            wide,
                            fp16,
                        )
                    };
                    if pos + len + t > out.len() {
                        return None;
                    }
                    len
                } else {
                    let buf = &mut bufs_cell.get_or_insert([[0u8; SEG_MAX_BYTES + 16]; 4])[0];
                    let len = if ks.len() == SEG_ELEMS {
                        // SAFETY: as above, with `buf` as the destination.
                        unsafe {
                            avx2::code_segment_dispatch(
                                vt,
                                &lut,
                                ks.try_into().unwrap(),
                                buf.as_mut_ptr(),
                                wide,
                                fp16,
                            )
                        }
                    } else {
                        code_segment(&lut, ks, buf)
                    };
                    if pos + len + t > out.len() {
                        return None;
                    }
                    out[pos..pos + len].copy_from_slice(&buf[..len]);
                    len
                };
                pos += len;
                let so = BLOCK_HEADER_LEN + 2 * (seg + i);
                out[so..so + 2].copy_from_slice(&(len as u16).to_le_bytes());
            }
            seg += nsg;
            g0 = g1;
            continue;
        }
        let bufs = bufs_cell.get_or_insert([[0u8; SEG_MAX_BYTES + 16]; 4]);
        if g1 - g0 == GROUP {
            let (b01, b23) = bufs.split_at_mut(2);
            let (b0, b1) = b01.split_at_mut(1);
            let (b2, b3) = b23.split_at_mut(1);
            let (l0, l1) = code_segments2(
                &lut,
                &gk[..SEG_ELEMS],
                &gk[SEG_ELEMS..2 * SEG_ELEMS],
                &mut b0[0],
                &mut b1[0],
            );
            let (l2, l3) = code_segments2(
                &lut,
                &gk[2 * SEG_ELEMS..3 * SEG_ELEMS],
                &gk[3 * SEG_ELEMS..],
                &mut b2[0],
                &mut b3[0],
            );
            lens = [l0, l1, l2, l3];
        } else {
            for (i, ks) in gk.chunks(SEG_ELEMS).enumerate() {
                lens[i] = code_segment(&lut, ks, &mut bufs[i]);
            }
        }
        for i in 0..nsg {
            let len = lens[i];
            if pos + len + t > out.len() {
                return None;
            }
            out[pos..pos + len].copy_from_slice(&bufs[i][..len]);
            pos += len;
            let so = BLOCK_HEADER_LEN + 2 * (seg + i);
            out[so..so + 2].copy_from_slice(&(len as u16).to_le_bytes());
        }
        seg += nsg;
        g0 = g1;
    }
    out[pos..pos + t].copy_from_slice(&blk[m * T::W..]);
    Some(pos + t)
}

/// The segment coders' bit writer: little-endian, each append one unaligned
/// 8-byte store at `dst + pos`, at most 7 bits pending afterwards. `Copy`, so that
/// a hot loop can work on a copy whose address never escapes (its fields then
/// stay in registers), and store it back after.
#[derive(Clone, Copy)]
pub(crate) struct Bits {
    dst: *mut u8,
    pub(crate) pos: usize,
    pub(crate) acc: u64,
    pub(crate) nb: u32,
}

impl Bits {
    #[inline(always)]
    pub(crate) fn new(dst: *mut u8) -> Bits {
        Bits {
            dst,
            pos: 0,
            acc: 0,
            nb: 0,
        }
    }
    /// Appends `len` (<= 56) bits of `c`.
    ///
    /// # Safety
    /// `dst + pos` must be valid for an 8-byte write.
    #[inline(always)]
    pub(crate) unsafe fn put(&mut self, c: u64, len: u32) {
        self.acc |= c << self.nb;
        self.nb += len;
        self.dst
            .add(self.pos)
            .cast::<u64>()
            .write_unaligned(self.acc);
        self.pos += (self.nb >> 3) as usize;
        self.acc >>= self.nb & 56;
        self.nb &= 7;
    }
    /// Appends `len` (<= 64) bits of `c`.
    ///
    /// # Safety
    /// As [`Bits::put`], twice.
    #[inline(always)]
    unsafe fn put64(&mut self, c: u64, len: u32) {
        if len <= 56 {
            self.put(c, len);
        } else {
            self.put(c & 0xFFFF_FFFF, 32);
            self.put(c >> 32, len - 32);
        }
    }
    /// Appends the scalar code of each key (`lut`: code in bits 0..24, length
    /// in bits 24..32).
    ///
    /// # Safety
    /// As [`Bits::put`], once per key.
    #[inline(always)]
    unsafe fn put_scalar(&mut self, lut: &[u32; 256], keys: &[u8]) {
        for &k in keys {
            let c = lut[k as usize];
            self.put((c & 0xFF_FFFF) as u64, c >> 24);
        }
    }
    /// Moves the writer to `dst`, where the caller copied the `pos` bytes written.
    #[inline(always)]
    pub(crate) fn rebase(&mut self, dst: *mut u8) {
        self.dst = dst;
    }
    /// Flushes the pending bits; returns the byte length written.
    ///
    /// # Safety
    /// `dst + pos` must be valid for a 1-byte write.
    #[inline(always)]
    pub(crate) unsafe fn finish(mut self) -> usize {
        if self.nb > 0 {
            *self.dst.add(self.pos) = self.acc as u8;
            self.pos += 1;
        }
        self.pos
    }
}

/// AVX2 pieces of the encoder. Same bits as the scalar path, by construction and
/// by test (`tests/roundtrip.rs` and `tests/fp16_vector.rs` compare with
/// [`crate::compress_scalar`]).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::Bits;
    use crate::codes::{symbol_of, CODE_LENGTHS, CODE_WORDS, ESC, NSYM, ZERO};
    use crate::format::SEG_ELEMS;
    use std::arch::x86_64::*;

    /// Per-block 32-entry symbol tables (code length, code word low and high byte),
    /// each as two 16-entry `vpshufb` tables, and the anchor (element types whose
    /// key is the exponent field: bf16, fp32). For fp16 (`by_exp`) the tables are
    /// indexed by the exponent field instead and `len` holds the element length
    /// (code length + 3 extra bits; `0x80` for an escape), and `pow` holds the low
    /// and high bytes of `1 << code length` by element length.
    pub(crate) struct VecTables {
        len: [__m256i; 2],
        lo: [__m256i; 2],
        hi: [__m256i; 2],
        anchor: __m256i,
        pow: [__m256i; 2],
    }

    impl VecTables {
        /// # Safety
        /// The CPU must support AVX2.
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn new(k: usize, a: u32, by_exp: bool) -> VecTables {
            VecTables::for_code(&CODE_LENGTHS[k], &CODE_WORDS[k], a, by_exp, false)
        }

        /// [`VecTables::new`] for any code (`lens`, canonical `words`). `z` (with
        /// `by_exp`: fp16 under version 2's `Z`, where key 0 is an element 0 and
        /// codes as ZERO without extra bits): exponent field 0 has ZERO's code
        /// length alone.
        ///
        /// # Safety
        /// The CPU must support AVX2.
        #[target_feature(enable = "avx2")]
        pub(crate) unsafe fn for_code(
            lens: &[u8; NSYM],
            words: &[u16; NSYM],
            a: u32,
            by_exp: bool,
            z: bool,
        ) -> VecTables {
            let mut len = [0u8; 32];
            let mut lo = [0u8; 32];
            let mut hi = [0u8; 32];
            if by_exp {
                for e in 0..32 {
                    let s = symbol_of(e as u32, a);
                    if s == ESC {
                        len[e] = 0x80;
                    } else {
                        len[e] = lens[s] + if z && e == 0 { 0 } else { 3 };
                        lo[e] = words[s] as u8;
                        hi[e] = (words[s] >> 8) as u8;
                    }
                }
            } else {
                for s in 0..NSYM {
                    len[s] = lens[s];
                    lo[s] = words[s] as u8;
                    hi[s] = (words[s] >> 8) as u8;
                }
            }
            let mut pow = [0u8; 32];
            for l in 3..16 {
                pow[l] = (1u16 << (l - 3)) as u8;
                pow[16 + l] = ((1u16 << (l - 3)) >> 8) as u8;
            }
            let tab = |t: &[u8; 32], h: usize| {
                let mut v = [0u8; 32];
                v[..16].copy_from_slice(&t[16 * h..16 * h + 16]);
                v[16..].copy_from_slice(&t[16 * h..16 * h + 16]);
                _mm256_loadu_si256(v.as_ptr() as *const __m256i)
            };
            VecTables {
                len: [tab(&len, 0), tab(&len, 1)],
                lo: [tab(&lo, 0), tab(&lo, 1)],
                hi: [tab(&hi, 0), tab(&hi, 1)],
                anchor: _mm256_set1_epi8(a as u8 as i8),
                pow: [tab(&pow, 0), tab(&pow, 1)],
            }
        }
    }

    /// 32-entry byte table lookup: `t[idx]` for `idx` in 0..32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lookup32(t: &[__m256i; 2], idx: __m256i, sel: __m256i) -> __m256i {
        _mm256_blendv_epi8(
            _mm256_shuffle_epi8(t[0], idx),
            _mm256_shuffle_epi8(t[1], idx),
            sel,
        )
    }

    /// bf16 split: 32 elements per step into keys (exponent) and plane1 (sign, mantissa).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn split_bf16(src: &[u8], keys: &mut [u8], p1: &mut [u8]) {
        let n = keys.len().min(p1.len()).min(src.len() / 2);
        let mut i = 0;
        let m7f = _mm256_set1_epi16(0x7F);
        let m80 = _mm256_set1_epi16(0x80);
        let mff = _mm256_set1_epi16(0xFF);
        while i + 32 <= n {
            let sp = src.as_ptr().add(2 * i) as *const __m256i;
            let x0 = _mm256_loadu_si256(sp);
            let x1 = _mm256_loadu_si256(sp.add(1));
            let k0 = _mm256_and_si256(_mm256_srli_epi16(x0, 7), mff);
            let k1 = _mm256_and_si256(_mm256_srli_epi16(x1, 7), mff);
            let p0 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(x0, 8), m80),
                _mm256_and_si256(x0, m7f),
            );
            let q1 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(x1, 8), m80),
                _mm256_and_si256(x1, m7f),
            );
            let k = _mm256_permute4x64_epi64(_mm256_packus_epi16(k0, k1), 0xD8);
            let p = _mm256_permute4x64_epi64(_mm256_packus_epi16(p0, q1), 0xD8);
            _mm256_storeu_si256(keys.as_mut_ptr().add(i) as *mut __m256i, k);
            _mm256_storeu_si256(p1.as_mut_ptr().add(i) as *mut __m256i, p);
            i += 32;
        }
        for j in i..n {
            let x = u16::from_le_bytes([src[2 * j], src[2 * j + 1]]);
            keys[j] = (x >> 7) as u8;
            p1[j] = ((x >> 8) as u8 & 0x80) | (x as u8 & 0x7F);
        }
    }

    /// [`code_segment`] with `WIDE` chosen at run time, or (`fp16`)
    /// [`code_segment_fp16`].
    ///
    /// # Safety
    /// As [`code_segment`].
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2")]
    pub(super) unsafe fn code_segment_dispatch(
        t: &VecTables,
        lut: &[u32; 256],
        keys: &[u8; SEG_ELEMS],
        dst: *mut u8,
        wide: bool,
        fp16: bool,
    ) -> usize {
        if fp16 {
            code_segment_fp16(t, lut, keys, dst)
        } else if wide {
            code_segment::<true>(t, lut, keys, dst)
        } else {
            code_segment::<false>(t, lut, keys, dst)
        }
    }

    /// Codes one full segment (1024 keys that are exponent fields) at `dst`;
    /// returns its byte length (at most `SEG_MAX_BYTES`). 32 keys per step: symbols,
    /// code words and lengths by `vpshufb`, merged by variable shifts into 4-element
    /// chunks (at most 48 bits), then 8- and 16-element chunks; a 64-bit accumulator
    /// appends per 16 elements the largest merged chunks that hold at most 56 bits
    /// (nearly always one 16-element chunk). A step that holds an escape is coded by
    /// the scalar table `lut` instead. `WIDE`: skip the 16-element chunks (for
    /// blocks with long codes; same bits). Bytes past the returned length may be
    /// written (garbage, up to `SEG_MAX_BYTES + 16` in all).
    ///
    /// # Safety
    /// The CPU must support AVX2 and BMI2; `dst` must be valid for writes of
    /// `SEG_MAX_BYTES + 16` bytes.
    #[target_feature(enable = "avx2,bmi1,bmi2")]
    pub(super) unsafe fn code_segment<const WIDE: bool>(
        t: &VecTables,
        lut: &[u32; 256],
        keys: &[u8; SEG_ELEMS],
        dst: *mut u8,
    ) -> usize {
        let mut w = Bits::new(dst);
        code_keys::<WIDE>(t, lut, keys, &mut w);
        w.finish()
    }

    /// The body of [`code_segment`]: appends the codes of `keys` (a multiple of 32)
    /// to `w`, which may hold pending bits (version 2 codes one bitstream per
    /// block, its sub-segments not byte-aligned).
    ///
    /// # Safety
    /// As [`Bits::put`], for every 8 bytes of at most 20 bits per key appended.
    #[target_feature(enable = "avx2,bmi1,bmi2")]
    pub(crate) unsafe fn code_keys<const WIDE: bool>(
        t: &VecTables,
        lut: &[u32; 256],
        keys: &[u8],
        w: &mut Bits,
    ) {
        debug_assert_eq!(keys.len() % 32, 0);
        let c23 = _mm256_set1_epi8(23);
        let czero = _mm256_set1_epi8(ZERO as i8);
        let zero = _mm256_setzero_si256();
        for g in 0..keys.len() / 32 {
            let kv = _mm256_loadu_si256(keys.as_ptr().add(32 * g) as *const __m256i);
            let d = _mm256_sub_epi8(t.anchor, kv);
            // Coded without escape: e == 0, or e <= A and A - e <= 23. `far` is 0
            // exactly when e <= A (saturating e - A) and A - e <= 23 (then `d`
            // does not wrap); an escape is a byte with e != 0 and far != 0.
            let far = _mm256_or_si256(_mm256_subs_epu8(kv, t.anchor), _mm256_subs_epu8(d, c23));
            let esc = _mm256_min_epu8(kv, far);
            if _mm256_testz_si256(esc, esc) == 0 {
                // Rare: an escape. Scalar, same bits.
                w.put_scalar(lut, &keys[32 * g..32 * g + 32]);
                continue;
            }
            let is_zero = _mm256_cmpeq_epi8(kv, zero);
            let sym = _mm256_blendv_epi8(d, czero, is_zero);
            // Element order 0-7,16-23 | 8-15,24-31, so that the byte unpacks below
            // give elements 0..16 and 16..32 in order.
            let sym = _mm256_permute4x64_epi64(sym, 0xD8);
            let sel = _mm256_slli_epi16(sym, 3); // bit 4 -> bit 7: upper half table
            let ln = lookup32(&t.len, sym, sel);
            let lo = lookup32(&t.lo, sym, sel);
            let hi = lookup32(&t.hi, sym, sel);
            for h in 0..2 {
                let (c16, l16) = if h == 0 {
                    (_mm256_unpacklo_epi8(lo, hi), _mm256_unpacklo_epi8(ln, zero))
                } else {
                    (_mm256_unpackhi_epi8(lo, hi), _mm256_unpackhi_epi8(ln, zero))
                };
                // 4- and 8-element chunks (codes of at most 12 bits: quads of at
                // most 48 bits, octets exact when at most 64)
                let [q, lq, o, lo8] = merge16(c16, l16);
                // the 16-element chunk (exact when its length is <= 64)
                let o_lo = _mm256_castsi256_si128(o);
                let o_hi = _mm256_extracti128_si256(o, 1);
                let l_lo = _mm256_castsi256_si128(lo8);
                let l_hi = _mm256_extracti128_si256(lo8, 1);
                let s = _mm_or_si128(o_lo, _mm_sllv_epi64(o_hi, l_lo));
                let ls = _mm_cvtsi128_si64(_mm_add_epi64(l_lo, l_hi)) as u32;
                if !WIDE && ls <= 56 {
                    w.put(_mm_cvtsi128_si64(s) as u64, ls);
                } else {
                    let mut qv = [0u64; 4];
                    let mut ql = [0u64; 4];
                    let mut ov = [0u64; 4];
                    let mut ol = [0u64; 4];
                    _mm256_storeu_si256(qv.as_mut_ptr() as *mut __m256i, q);
                    _mm256_storeu_si256(ql.as_mut_ptr() as *mut __m256i, lq);
                    _mm256_storeu_si256(ov.as_mut_ptr() as *mut __m256i, o);
                    _mm256_storeu_si256(ol.as_mut_ptr() as *mut __m256i, lo8);
                    for j in [0, 2] {
                        if ol[j] <= 56 {
                            w.put(ov[j], ol[j] as u32);
                        } else {
                            w.put(qv[j], ql[j] as u32);
                            w.put(qv[j + 1], ql[j + 1] as u32);
                        }
                    }
                }
            }
        }
    }

    /// The 4-element chunks (64-bit lanes: elements 0-3, 4-7 | 8-11, 12-15) and
    /// their lengths, and the 8-element chunks (lanes 0 and 2, exact when at most 64
    /// bits long) and their lengths, of 16 element words `w` (16-bit lanes, each at
    /// most 16 bits) of lengths `l` (16-bit lanes).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn merge16(w: __m256i, l: __m256i) -> [__m256i; 4] {
        let m16 = _mm256_set1_epi32(0xFFFF);
        let m32 = _mm256_set1_epi64x(0xFFFF_FFFF);
        // pairs: w0 | w1 << l0 (<= 32 bits), l0 + l1
        let pv = _mm256_or_si256(
            _mm256_and_si256(w, m16),
            _mm256_sllv_epi32(_mm256_srli_epi32(w, 16), _mm256_and_si256(l, m16)),
        );
        let pl = _mm256_madd_epi16(l, _mm256_set1_epi16(1));
        // quads: p0 | p1 << lp0 (<= 64 bits), lp0 + lp1
        let q = _mm256_or_si256(
            _mm256_and_si256(pv, m32),
            _mm256_sllv_epi64(_mm256_srli_epi64(pv, 32), _mm256_and_si256(pl, m32)),
        );
        let lq = _mm256_and_si256(_mm256_add_epi32(pl, _mm256_srli_epi64(pl, 32)), m32);
        // octets in lanes 0 and 2
        let o = _mm256_or_si256(q, _mm256_sllv_epi64(_mm256_srli_si256(q, 8), lq));
        let lo8 = _mm256_add_epi64(lq, _mm256_srli_si256(lq, 8));
        [q, lq, o, lo8]
    }

    /// [`code_segment`] for fp16 keys (sign, exponent field, top 2 mantissa bits):
    /// each element is its exponent code followed by its 3 extra bits
    /// `((key >> 7) << 2) | (key & 3)` (as `Fp16::key_parts`), at least 4 and (without
    /// escape) at most 15 bits. 32 keys per step: code lengths and words by
    /// `vpshufb` on the exponent field (`t` built with `by_exp`), the extra bits
    /// shifted over the code word by a 16-bit multiply with `1 << len`, merged into
    /// 8-element chunks (16-element chunks never fit 56 bits: 64 bits at least).
    /// A chunk of 57..=64 bits is appended in two parts (split at bit 32); an
    /// 8-element chunk over 64 bits as its two 4-element chunks (at most 60 bits
    /// each, likewise split). A step that holds an escape is coded by `lut`.
    ///
    /// # Safety
    /// As [`code_segment`].
    #[target_feature(enable = "avx2,bmi1,bmi2")]
    pub(super) unsafe fn code_segment_fp16(
        t: &VecTables,
        lut: &[u32; 256],
        keys: &[u8; SEG_ELEMS],
        dst: *mut u8,
    ) -> usize {
        let mut w = Bits::new(dst);
        code_keys_fp16(t, lut, keys, &mut w);
        w.finish()
    }

    /// The body of [`code_segment_fp16`], as [`code_keys`].
    ///
    /// # Safety
    /// As [`code_keys`].
    #[target_feature(enable = "avx2,bmi1,bmi2")]
    pub(crate) unsafe fn code_keys_fp16(
        t: &VecTables,
        lut: &[u32; 256],
        keys: &[u8],
        w: &mut Bits,
    ) {
        debug_assert_eq!(keys.len() % 32, 0);
        let zero = _mm256_setzero_si256();
        let m1f = _mm256_set1_epi8(0x1F);
        let m03 = _mm256_set1_epi8(0x03);
        let m80 = _mm256_set1_epi8(0x80u8 as i8);
        let c70 = _mm256_set1_epi8(0x70);
        for g in 0..keys.len() / 32 {
            let key = _mm256_loadu_si256(keys.as_ptr().add(32 * g) as *const __m256i);
            // Element order 0-7,16-23 | 8-15,24-31, so that the byte unpacks below
            // give elements 0..16 and 16..32 in order.
            let key = _mm256_permute4x64_epi64(key, 0xD8);
            // exponent field; the 16-bit shifts move no bit across a byte (masked)
            let e = _mm256_and_si256(_mm256_srli_epi16(key, 2), m1f);
            // 32-entry lookups as two `vpshufb` whose index has bit 7 set (result 0)
            // in the other half: e + 0x70 selects t[0][e] for e < 16, its bit 7
            // flipped t[1][e - 16] for e >= 16.
            let ia = _mm256_add_epi8(e, c70);
            let ib = _mm256_xor_si256(ia, m80);
            macro_rules! lookup {
                ($t:expr) => {
                    _mm256_or_si256(
                        _mm256_shuffle_epi8($t[0], ia),
                        _mm256_shuffle_epi8($t[1], ib),
                    )
                };
            }
            let ln = lookup!(t.len);
            if _mm256_testz_si256(ln, m80) == 0 {
                // Rare: an escape. Scalar, same bits.
                w.put_scalar(lut, &keys[32 * g..32 * g + 32]);
                continue;
            }
            let lo = lookup!(t.lo);
            let hi = lookup!(t.hi);
            let x = _mm256_or_si256(
                _mm256_srli_epi16(_mm256_and_si256(key, m80), 5),
                _mm256_and_si256(key, m03),
            );
            let pw_lo = _mm256_shuffle_epi8(t.pow[0], ln);
            let pw_hi = _mm256_shuffle_epi8(t.pow[1], ln);
            // element words code | x << len (x <= 7, len <= 12) and their lengths
            let w0 = _mm256_or_si256(
                _mm256_unpacklo_epi8(lo, hi),
                _mm256_mullo_epi16(
                    _mm256_unpacklo_epi8(x, zero),
                    _mm256_unpacklo_epi8(pw_lo, pw_hi),
                ),
            );
            let w1 = _mm256_or_si256(
                _mm256_unpackhi_epi8(lo, hi),
                _mm256_mullo_epi16(
                    _mm256_unpackhi_epi8(x, zero),
                    _mm256_unpackhi_epi8(pw_lo, pw_hi),
                ),
            );
            let l0 = _mm256_unpacklo_epi8(ln, zero);
            let l1 = _mm256_unpackhi_epi8(ln, zero);
            // elements 0..16, then 16..32
            macro_rules! emit {
                ($w:expr, $l:expr) => {{
                    let [q, lq, o, lo8] = merge16($w, $l);
                    let mut ov = [0u64; 4];
                    let mut ol = [0u64; 4];
                    _mm256_storeu_si256(ov.as_mut_ptr() as *mut __m256i, o);
                    _mm256_storeu_si256(ol.as_mut_ptr() as *mut __m256i, lo8);
                    for j in [0, 2] {
                        if ol[j] <= 64 {
                            w.put64(ov[j], ol[j] as u32);
                        } else {
                            let mut qv = [0u64; 4];
                            let mut ql = [0u64; 4];
                            _mm256_storeu_si256(qv.as_mut_ptr() as *mut __m256i, q);
                            _mm256_storeu_si256(ql.as_mut_ptr() as *mut __m256i, lq);
                            w.put64(qv[j], ql[j] as u32);
                            w.put64(qv[j + 1], ql[j + 1] as u32);
                        }
                    }
                }};
            }
            emit!(w0, l0);
            emit!(w1, l1);
        }
    }

    const _: () = assert!(ESC == 25 && ZERO == 24);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fp16 vector packer writes exactly the scalar segment coder's bytes, for
    /// every code and anchor, on keys that reach each of its paths: 8-element
    /// chunks of at most 56, 57..=64 and more than 64 bits (then 4-element chunks
    /// of at most 56 and 57..=60 bits), and steps with escapes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fp16_vector_segment_matches_scalar() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("bmi2")) {
            return;
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // chunk lengths seen: [oct <= 56, oct 57..=64, quad <= 56, quad 57..=60, escape]
        let mut seen = [0u64; 5];
        for k in 0..NCODES {
            for a in 1..=Fp16::EMAX {
                let lut = enc_table::<Fp16>(k, a);
                // SAFETY: AVX2 and BMI2 checked above.
                let vt = unsafe { avx2::VecTables::new(k, a, true) };
                // exponent fields by element length, without escapes
                let mut by_len: Vec<Vec<u32>> = vec![Vec::new(); 16];
                for e in 0..=Fp16::EMAX {
                    let s = symbol_of(e, a);
                    if s != ESC {
                        by_len[CODE_LENGTHS[k][s] as usize + 3].push(e);
                    }
                }
                let longest: Vec<u32> =
                    by_len.iter().rev().find(|v| !v.is_empty()).unwrap().clone();
                for round in 0..6 {
                    let mut keys = [0u8; SEG_ELEMS];
                    for (i, key) in keys.iter_mut().enumerate() {
                        let r = next();
                        let e = match (round, (i / 8) % 4) {
                            // any key (escapes where the anchor leaves some out)
                            (0, _) => (r >> 2) as u32 & 31,
                            // long codes in some octets only
                            (_, 0) if round >= 2 => longest[(r >> 8) as usize % longest.len()],
                            (_, m) if round >= 2 && (r >> 20) % 4 < m as u64 => {
                                let l = 4 + (r >> 24) as usize % 12;
                                match by_len[l..].iter().find(|v| !v.is_empty()) {
                                    Some(v) => v[(r >> 32) as usize % v.len()],
                                    None => longest[0],
                                }
                            }
                            _ => {
                                let l = 4 + (r >> 24) as usize % (2 * round + 2).min(12);
                                match by_len[l..].iter().find(|v| !v.is_empty()) {
                                    Some(v) => v[(r >> 32) as usize % v.len()],
                                    None => longest[0],
                                }
                            }
                        };
                        let xb = (r >> 40) as u32 & 7;
                        *key = Fp16::make_key(e, xb) as u8;
                    }
                    for step in keys.chunks(32) {
                        if step
                            .iter()
                            .any(|&k| symbol_of(Fp16::key_parts(k as u32).0, a) == ESC)
                        {
                            seen[4] += 1;
                            continue;
                        }
                        for o in step.chunks(8) {
                            let ln =
                                |q: &[u8]| q.iter().map(|&k| lut[k as usize] >> 24).sum::<u32>();
                            match ln(o) {
                                0..=56 => seen[0] += 1,
                                57..=64 => seen[1] += 1,
                                _ => {
                                    for q in o.chunks(4) {
                                        seen[if ln(q) <= 56 { 2 } else { 3 }] += 1;
                                    }
                                }
                            }
                        }
                    }
                    let mut want = [0u8; SEG_MAX_BYTES + 16];
                    let wl = code_segment(&lut, &keys, &mut want);
                    let mut got = [0u8; SEG_MAX_BYTES + 16];
                    // SAFETY: as above; `got` holds `SEG_MAX_BYTES + 16` bytes.
                    let gl = unsafe { avx2::code_segment_fp16(&vt, &lut, &keys, got.as_mut_ptr()) };
                    assert_eq!(gl, wl, "k {k} a {a} round {round}");
                    assert!(got[..gl] == want[..wl], "k {k} a {a} round {round}");
                }
            }
        }
        assert!(
            seen.iter().all(|&c| c > 0),
            "paths not all reached: {seen:?}"
        );
    }

    /// The interleaved sample histogram counts exactly what the plain loop of
    /// FORMAT.md §6 counts, for every remainder of the 4-sample unrolling.
    #[test]
    fn sample_histogram_matches_plain_loop() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let blk: Vec<u8> = (0..9000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        fn plain<T: Elem>(blk: &[u8], m: usize) -> [u32; 256] {
            let mut h = [0u32; 256];
            for i in (0..m).step_by(SAMPLE_STRIDE) {
                h[T::exp_at(blk, i) as usize] += 1;
            }
            h
        }
        for l in (0..600).chain([4095, 4096, 8191, 9000]) {
            let b = &blk[..l];
            assert_eq!(sample_histogram::<Bf16>(b, l / 2), plain::<Bf16>(b, l / 2));
            assert_eq!(sample_histogram::<Fp16>(b, l / 2), plain::<Fp16>(b, l / 2));
            assert_eq!(sample_histogram::<Fp32>(b, l / 4), plain::<Fp32>(b, l / 4));
        }
    }
}
