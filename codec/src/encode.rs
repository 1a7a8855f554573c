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
    let n = src.len();
    check_args(n, dst.len(), opts)?;
    let crc = if opts.checksum {
        crc32c::crc32c(src)
    } else {
        0
    };
    let dtype = resolve_dtype(src, opts.dtype);
    if dtype != Dtype::Raw
        || (opts.dtype == DtypeHint::Auto && has_fill_block(src, opts.block_log2))
    {
        let b = 1usize << opts.block_log2;
        let nb = n.div_ceil(b);
        let limit = HEADER_LEN + n;
        let table = HEADER_LEN;
        let mut pos = HEADER_LEN + 4 * nb;
        let mut stats = FrameStats {
            raw_len: n,
            dtype: Some(dtype),
            ..FrameStats::default()
        };
        let mut ok = pos < limit;
        if ok {
            for (i, blk) in src.chunks(b).enumerate() {
                match encode_block(dtype, blk, &mut dst[pos..limit]) {
                    Some((size, kind)) => {
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
        if ok && pos < limit {
            header(dtype, opts, n, crc, false).write(&mut dst[..HEADER_LEN]);
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

/// Best `(k, anchor, cost in bits)` for a histogram of exponent fields (FORMAT.md §6).
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
    let mut best = (0u8, lo, u64::MAX);
    for a in lo..=hi {
        // symbol counts under this anchor
        let mut cnt = [0u64; NSYM];
        for e in 0..=T::EMAX {
            let c = h[e as usize];
            if c != 0 {
                cnt[symbol_of(e, a)] += c as u64;
            }
        }
        let esc_extra = cnt[ESC] * T::EBITS as u64;
        for k in 0..NCODES {
            let mut cost = esc_extra;
            for s in 0..NSYM {
                cost += cnt[s] * CODE_LENGTHS[k][s] as u64;
            }
            if cost < best.2 {
                best = (k as u8, a, cost);
            }
        }
    }
    best
}

/// Encodes one block into `out` (the room left below the frame limit).
/// Returns its size and kind, or `None` if even the chosen form does not fit.
pub(crate) fn encode_block(dtype: Dtype, blk: &[u8], out: &mut [u8]) -> Option<(usize, BlockKind)> {
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
    let coded = match dtype {
        Dtype::Bf16 => encode_coded::<Bf16>(blk, &mut out[..cap]),
        Dtype::Fp16 => encode_coded::<Fp16>(blk, &mut out[..cap]),
        Dtype::Fp32 => encode_coded::<Fp32>(blk, &mut out[..cap]),
        Dtype::Raw => None,
    };
    if let Some(size) = coded {
        return Some((size, BlockKind::Coded));
    }
    if out.len() < 1 + l {
        return None;
    }
    out[0] = MODE_RAW;
    out[1..1 + l].copy_from_slice(blk);
    Some((1 + l, BlockKind::Raw))
}

/// Whether some block of the input is one repeated byte (a block frame of FILL and
/// RAW blocks then beats a stored frame even when nothing is coded).
pub(crate) fn has_fill_block(src: &[u8], block_log2: u8) -> bool {
    src.len() >= MIN_CODED_INPUT && src.chunks(1 << block_log2).any(all_equal)
}

fn all_equal(blk: &[u8]) -> bool {
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
    let mut t = [0u32; 256];
    for (key, slot) in t.iter_mut().enumerate() {
        let (e, x) = T::key_parts(key as u32);
        let s = symbol_of(e, a);
        let lc = CODE_LENGTHS[k][s] as u32;
        let mut bits = CODE_WORDS[k][s] as u32;
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

/// Encodes a coded block (FORMAT.md §4) into `out`; `None` if it does not fit
/// (the caller then stores the block raw).
fn encode_coded<T: Elem>(blk: &[u8], out: &mut [u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("bmi2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { encode_coded_avx2::<T>(blk, out) };
        }
    }
    encode_coded_body::<T>(blk, out)
}

/// # Safety
/// The CPU must support AVX2 and BMI2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2")]
unsafe fn encode_coded_avx2<T: Elem>(blk: &[u8], out: &mut [u8]) -> Option<usize> {
    encode_coded_body::<T>(blk, out)
}

#[inline(always)]
fn encode_coded_body<T: Elem>(blk: &[u8], out: &mut [u8]) -> Option<usize> {
    let l = blk.len();
    let m = l / T::W;
    if m < MIN_CODED_ELEMS {
        return None;
    }
    let mut h = [0u32; 256];
    for i in (0..m).step_by(SAMPLE_STRIDE) {
        h[T::exp_at(blk, i) as usize] += 1;
    }
    let (k, a, _) = best_cost::<T>(&h);
    let lut = enc_table::<T>(k as usize, a);

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
    let mut bufs = [[0u8; SEG_MAX_BYTES + 16]; 4];
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
            T::split(
                &blk[g0 * T::W..g1 * T::W],
                gk,
                &mut head[off1 + g0..off1 + g1],
                p2,
            );
        }
        let nsg = (g1 - g0).div_ceil(SEG_ELEMS);
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
