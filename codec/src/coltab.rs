//! The column table of frame format version 2 (docs/FORMAT.md §V2.9): a period `P`
//! found from the frame's bytes and a 4-bit exponent offset per column, shared by the
//! frame's blocks. A block with the `COL` flag codes each element's exponent field `e`
//! rotated by its column's offset, `rot(e, c) = 1 + (e − 1 − c) mod EMAX` (`e = 0`
//! stays 0), so an activation whose channels sit at different scales codes as if they
//! shared one. The rotation is a bijection of `1..=EMAX`, so every element stays
//! exact, and it is a pass over the exponent keys after the encoder's split (bf16,
//! fp32; fp16's elements before it) and, in the decoder, over the keys before its
//! join or the elements after it: the coding loops do not change.
//!
//! Every decision here is an integer function of the input bytes (a GPU encoder can
//! reproduce it, or take the table from the host as a parameter).

use std::cell::{Cell, RefCell};

use crate::decode::copy_ascending;
use crate::elem::{Bf16, Fp16, Fp32};
use crate::encode::SAMPLE_STRIDE;
use crate::format::*;
use crate::v2::{choose, Stats, V2};
use crate::{CodecError, Dtype};

/// Smallest and largest period (elements).
pub const PMIN: usize = 16;
pub const PMAX: usize = 8192;
/// The period search compares the first `LAG_N` elements with those `p` later.
const LAG_N: usize = 1024;
/// Elements the period search reads: `LAG_N` and the largest lag.
const SEARCH_N: usize = LAG_N + PMAX;
/// Fewest elements for a table (2048 + 16, the minimum of the 2048-element search
/// before 2026-11-26 s13: smaller frames rarely repay a table's bytes).
const MIN_M: usize = 2048 + PMIN;
/// Elements the offsets read: `min(m, WINDOW)` from the frame start (the search the
/// first `SEARCH_N` of them).
const WINDOW: usize = 32768;
/// Most stride-13 samples of the table's gain estimate.
const GAIN_SAMPLES: usize = 4096;

/// A frame's column table: period `p` and the offsets `off[0..p]` (−8..=7).
#[derive(Clone)]
pub struct ColTab {
    pub p: usize,
    pub off: [i8; PMAX],
}

impl ColTab {
    /// Bytes the table takes after the frame header: u16 `P`, then `ceil(P/2)`.
    pub fn bytes(&self) -> usize {
        2 + self.p.div_ceil(2)
    }

    /// Writes the table (`self.bytes()` bytes).
    pub fn write(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&(self.p as u16).to_le_bytes());
        let t = &mut out[2..2 + self.p.div_ceil(2)];
        // a pair of offsets per byte; an odd P's last byte has a high nibble of 0
        let pairs = self.off[..self.p].chunks_exact(2);
        if let [c] = pairs.remainder() {
            t[self.p / 2] = (*c as u8) & 15;
        }
        for (b, c) in t.iter_mut().zip(pairs) {
            *b = ((c[0] as u8) & 15) | ((c[1] as u8) << 4);
        }
    }

    /// Reads a table from `src` (the bytes after the header); returns it and its length.
    pub fn read(src: &[u8]) -> Result<(ColTab, usize), CodecError> {
        if src.len() < 2 {
            return Err(CodecError::Truncated);
        }
        let p = u16::from_le_bytes([src[0], src[1]]) as usize;
        if !(PMIN..=PMAX).contains(&p) {
            return Err(CodecError::Corrupt("column table period out of range"));
        }
        let len = 2 + p.div_ceil(2);
        if src.len() < len {
            return Err(CodecError::Truncated);
        }
        let mut ct = ColTab { p, off: [0; PMAX] };
        // a pair per byte, sign-extended nibbles (an odd P's padding nibble lands in
        // off[P], reset below after its check)
        for (c, &b) in ct.off.chunks_exact_mut(2).zip(&src[2..len]) {
            c[0] = ((b << 4) as i8) >> 4;
            c[1] = (b as i8) >> 4;
        }
        if p % 2 == 1 {
            if src[len - 1] >> 4 != 0 {
                return Err(CodecError::Corrupt("nonzero column table padding"));
            }
            ct.off[p] = 0;
        }
        Ok((ct, len))
    }
}

/// Where a frame's block table starts, and its column table if the header says
/// `COLTAB` (version 2 block frames only; the header parser refuses it elsewhere).
pub(crate) fn frame_table(h: &Header, src: &[u8]) -> Result<(Option<ColTab>, usize), CodecError> {
    if h.flags & FLAG_COLTAB == 0 {
        return Ok((None, HEADER_LEN));
    }
    let (ct, len) = ColTab::read(&src[HEADER_LEN.min(src.len())..])?;
    Ok((Some(ct), HEADER_LEN + len))
}

/// `rot(e, c)` (`INV = false`) or its inverse `1 + (e − 1 + c) mod EMAX` on an
/// exponent field `e` in `0..=emax`; 0 stays 0. The encoder reads it through
/// `rot_table` (tests compare the two).
#[cfg(test)]
pub(crate) fn rot<const INV: bool>(e: u32, c: i8, emax: u32) -> u32 {
    let c = if INV { -(c as i32) } else { c as i32 };
    let mut t = e as i32 - 1 - c;
    if t < 0 {
        t += emax as i32;
    } else if t >= emax as i32 {
        t -= emax as i32;
    }
    if e == 0 {
        0
    } else {
        (t + 1) as u32
    }
}

/// `rot(e, c)` for every offset `c` in −8..=7 (row `c + 8`) and field `e` in
/// `0..=emax` (entries above `emax` are 0, never read): a table lookup instead of
/// `rot`'s compares in the per-sample loops of [`sample_hist_rotated`] and the
/// table's gain estimate.
const fn rot_table(emax: u32) -> [[u8; 256]; 16] {
    let mut t = [[0u8; 256]; 16];
    let mut ci = 0;
    while ci < 16 {
        let c = ci as i32 - 8;
        let mut e = 1;
        while e <= emax {
            let mut r = e as i32 - 1 - c;
            if r < 0 {
                r += emax as i32;
            } else if r >= emax as i32 {
                r -= emax as i32;
            }
            t[ci][e as usize] = (r + 1) as u8;
            e += 1;
        }
        ci += 1;
    }
    t
}

static ROT255: [[u8; 256]; 16] = rot_table(255);
static ROT31: [[u8; 256]; 16] = rot_table(31);

/// [`rot_table`] for `T`'s exponent fields.
#[inline(always)]
fn rot_lut<T: V2>() -> &'static [[u8; 256]; 16] {
    if T::EMAX == 31 {
        &ROT31
    } else {
        &ROT255
    }
}

/// Bit position of the exponent field of `T`.
#[inline(always)]
fn eshift<T: V2>() -> u32 {
    match T::MODE {
        MODE_BF16 => 7,
        MODE_FP16 => 10,
        _ => 23,
    }
}

/// Rotates (`INV = false`) or un-rotates the exponent field of every whole element of
/// `buf` in place; element 0 of `buf` lies in column `col0 mod P`. Inlined, so that it
/// is vectorised with the caller's target features (the AVX2 encoder and decoder).
#[inline(always)]
pub(crate) fn rotate<T: V2, const INV: bool>(buf: &mut [u8], col0: usize, ct: &ColTab) {
    let n = buf.len() / T::W;
    let p = ct.p;
    let mut col = col0 % p;
    let mut i = 0;
    while i < n {
        let len = (n - i).min(p - col);
        let offs = &ct.off[col..col + len];
        let run = &mut buf[i * T::W..(i + len) * T::W];
        if T::W == 2 {
            rot16::<INV>(run, offs, eshift::<T>() as u16, T::EMAX as i16);
        } else {
            rot32::<INV>(run, offs);
        }
        i += len;
        col = 0;
    }
}

/// [`rot`] on 16-bit lanes, branch-free (bf16, fp16), 16 elements at a time so
/// that the loop vectorises.
#[inline(always)]
fn rot16<const INV: bool>(run: &mut [u8], offs: &[i8], sh: u16, emax: i16) {
    #[inline(always)]
    fn one<const INV: bool>(x: u16, c: i8, sh: u16, emax: i16) -> u16 {
        let e = ((x >> sh) as i16) & emax;
        let c = if INV { -(c as i16) } else { c as i16 };
        let mut t = e - 1 - c;
        t += emax & (t >> 15);
        t -= emax & !((t - emax) >> 15);
        let r = (t + 1) & -((e != 0) as i16);
        (x & !((emax as u16) << sh)) | ((r as u16) << sh)
    }
    let mut xs = run.chunks_exact_mut(32);
    let mut os = offs.chunks_exact(16);
    for (xb, o) in (&mut xs).zip(&mut os) {
        let xb: &mut [u8; 32] = xb.try_into().unwrap();
        let o: &[i8; 16] = o.try_into().unwrap();
        let mut y = [0u16; 16];
        for k in 0..16 {
            y[k] = one::<INV>(
                u16::from_le_bytes([xb[2 * k], xb[2 * k + 1]]),
                o[k],
                sh,
                emax,
            );
        }
        for k in 0..16 {
            xb[2 * k..2 * k + 2].copy_from_slice(&y[k].to_le_bytes());
        }
    }
    for (xb, &c) in xs
        .into_remainder()
        .chunks_exact_mut(2)
        .zip(os.remainder().iter())
    {
        let y = one::<INV>(u16::from_le_bytes([xb[0], xb[1]]), c, sh, emax);
        xb.copy_from_slice(&y.to_le_bytes());
    }
}

/// [`rot`] on fp32 elements, branch-free, 8 at a time.
#[inline(always)]
fn rot32<const INV: bool>(run: &mut [u8], offs: &[i8]) {
    #[inline(always)]
    fn one<const INV: bool>(x: u32, c: i8) -> u32 {
        let e = ((x >> 23) & 0xFF) as i32;
        let c = if INV { -(c as i32) } else { c as i32 };
        let mut t = e - 1 - c;
        t += 255 & (t >> 31);
        t -= 255 & !((t - 255) >> 31);
        let r = (t + 1) & -((e != 0) as i32);
        (x & !(0xFF << 23)) | ((r as u32) << 23)
    }
    let mut xs = run.chunks_exact_mut(32);
    let mut os = offs.chunks_exact(8);
    for (xb, o) in (&mut xs).zip(&mut os) {
        let xb: &mut [u8; 32] = xb.try_into().unwrap();
        let mut y = [0u32; 8];
        for k in 0..8 {
            let x = u32::from_le_bytes([xb[4 * k], xb[4 * k + 1], xb[4 * k + 2], xb[4 * k + 3]]);
            y[k] = one::<INV>(x, o[k]);
        }
        for k in 0..8 {
            xb[4 * k..4 * k + 4].copy_from_slice(&y[k].to_le_bytes());
        }
    }
    for (xb, &c) in xs
        .into_remainder()
        .chunks_exact_mut(4)
        .zip(os.remainder().iter())
    {
        let y = one::<INV>(u32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]), c);
        xb.copy_from_slice(&y.to_le_bytes());
    }
}

/// Rotates (`INV = false`) or un-rotates the kept elements `kept` of a block's grid
/// whose grid element 0 lies in column `col0`: without lines they are the grid; with
/// lines (`elided[j]`: grid line `j` is elided) they are the grid's kept lines in
/// order, `gbytes` the grid's length in bytes.
#[inline(always)]
pub(crate) fn rotate_kept<T: V2, const INV: bool>(
    kept: &mut [u8],
    elided: Option<&[bool]>,
    gbytes: usize,
    col0: usize,
    ct: &ColTab,
) {
    let Some(el) = elided else {
        return rotate::<T, INV>(kept, col0, ct);
    };
    for (q, g, len) in kept_lines::<T>(el, gbytes / T::W) {
        rotate::<T, INV>(&mut kept[q * T::W..(q + len) * T::W], col0 + g, ct);
    }
}

/// The kept lines of a grid of `m` elements whose line `j` is elided where
/// `elided[j]`, in order: (first kept element, first grid element, elements).
#[inline(always)]
fn kept_lines<T: V2>(
    elided: &[bool],
    m: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let per = crate::v2::LINE / T::W;
    let mut q = 0;
    elided
        .iter()
        .enumerate()
        .filter(|(_, &z)| !z)
        .map(move |(j, _)| {
            let len = per.min(m - j * per);
            q += len;
            (q - len, j * per, len)
        })
}

/// The decoder's un-rotation of exponent keys in place, for the types whose key is the
/// element's 8-bit exponent field (bf16, fp32: `emax` 255): key `i` lies in column
/// `col0 + i` (mod `P`) and becomes [`rot`]`::<true>(key, off, 255)`, 0 staying 0.
/// The elements joined from the keys then equal the un-rotated joined elements, so
/// the joins can write the output directly. Branch-free on bytes, inlined so that it
/// is vectorised (32 keys a vector) with the caller's target features.
#[inline(always)]
pub(crate) fn unrotate_keys(keys: &mut [u8], col0: usize, ct: &ColTab) {
    rot_keys::<true>(keys, col0, ct)
}

/// [`unrotate_keys`] (`INV`) or the encoder's rotation ([`rot`]`::<false>`, the
/// un-rotation by the negated offset: `rot(e, c) = unrot(e, −c)`, and `−c` lies in
/// −7..=8) of 8-bit exponent keys in place.
#[inline(always)]
fn rot_keys<const INV: bool>(keys: &mut [u8], col0: usize, ct: &ColTab) {
    /// `rot::<true>(k, c, 255)` mod 256: `k + c`, one more where that carried past
    /// 255 (`c >= 0`: the sum wrapped below `k`), one less where it reached 0 or
    /// below (`c < 0`: the sum minus 1 wrapped to `k` or above); 0 stays 0.
    #[inline(always)]
    fn one(k: u8, c: i8) -> u8 {
        let r = k.wrapping_add(c as u8);
        let up = (c >= 0) & (r < k);
        let down = (c < 0) & (r.wrapping_sub(1) >= k);
        let r = r.wrapping_add(up as u8).wrapping_sub(down as u8);
        if k == 0 {
            0
        } else {
            r
        }
    }
    let n = keys.len();
    let p = ct.p;
    let mut col = col0 % p;
    let mut i = 0;
    while i < n {
        let len = (n - i).min(p - col);
        let ks = &mut keys[i..i + len];
        let cs = &ct.off[col..col + len];
        if INV {
            for (k, &c) in ks.iter_mut().zip(cs) {
                *k = one(*k, c);
            }
        } else {
            for (k, &c) in ks.iter_mut().zip(cs) {
                *k = one(*k, c.wrapping_neg());
            }
        }
        i += len;
        col = 0;
    }
}

/// The encoder's rotation ([`rot`]`::<false>`) of the 8-bit exponent keys (bf16,
/// fp32) of a block's kept elements, in place; columns as [`rotate_kept`] (`elided`:
/// the grid's elided lines, `m` the grid's elements). Equal to splitting the
/// elements [`rotate_kept`] rotated, without rotating (or copying) the elements.
#[inline(always)]
pub(crate) fn rotate_kept_keys<T: V2>(
    keys: &mut [u8],
    elided: Option<&[bool]>,
    m: usize,
    col0: usize,
    ct: &ColTab,
) {
    debug_assert!(T::EMAX == 255);
    let Some(el) = elided else {
        return rot_keys::<false>(keys, col0, ct);
    };
    for (q, g, len) in kept_lines::<T>(el, m) {
        rot_keys::<false>(&mut keys[q..q + len], col0 + g, ct);
    }
}

/// The decoder's un-rotation ([`rotate`]`::<T, true>`) of `src` (scratch: it may be
/// changed), written to `dst` once, in ascending address order (as
/// [`copy_ascending`]); with AVX2 where `V` (the caller is compiled for it): 16
/// bf16/fp16 or 8 fp32 elements a step, loaded from `src` and stored to `dst`.
#[inline(always)]
pub(crate) fn unrotate_copy<T: V2, const V: bool>(
    dst: &mut [u8],
    src: &mut [u8],
    col0: usize,
    ct: &ColTab,
) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if V {
        // SAFETY: V is set only in functions compiled for AVX2, called after the CPU
        // was checked.
        unsafe { unrotate_avx2::<T>(dst, src, col0, ct) };
        return;
    }
    rotate::<T, true>(src, col0, ct);
    copy_ascending(dst, src);
}

/// [`unrotate_copy`] with AVX2: [`rotate`]'s runs (a column table period at most),
/// each in whole vectors and a scalar rest (un-rotated in `src`, then copied).
///
/// # Safety
/// The CPU supports AVX2; `dst` and `src` have one length.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn unrotate_avx2<T: V2>(dst: &mut [u8], src: &mut [u8], col0: usize, ct: &ColTab) {
    use std::arch::x86_64::*;
    use std::sync::atomic::{compiler_fence, Ordering};
    let n = src.len() / T::W;
    let p = ct.p;
    let mut col = col0 % p;
    let mut i = 0;
    // the lanes of `rot::<true>`: e = field, t = e - 1 + c moved into 0..emax, the
    // field set to t + 1 unless e = 0
    let (sh, emax) = (eshift::<T>(), T::EMAX);
    let step = 32 / T::W;
    while i < n {
        let len = (n - i).min(p - col);
        let whole = len - len % step;
        for k in (0..whole).step_by(step) {
            let at = (i + k) * T::W;
            let xb: &[u8; 32] = (&src[at..at + 32]).try_into().unwrap();
            let yb: &mut [u8; 32] = (&mut dst[at..at + 32]).try_into().unwrap();
            let o = &ct.off[col + k..col + k + step];
            // SAFETY: the loads and the store cover `xb`, `yb` (32 bytes each) and `o`
            // (`step` bytes: 8 or 16) exactly.
            let x = _mm256_loadu_si256(xb.as_ptr() as *const __m256i);
            let y = if T::W == 2 {
                let c = _mm256_cvtepi8_epi16(_mm_loadu_si128(o.as_ptr() as *const __m128i));
                let em = _mm256_set1_epi16(emax as i16);
                let one = _mm256_set1_epi16(1);
                let cnt = _mm_cvtsi32_si128(sh as i32);
                let e = _mm256_and_si256(_mm256_srl_epi16(x, cnt), em);
                let t = _mm256_add_epi16(_mm256_sub_epi16(e, one), c);
                let t = _mm256_add_epi16(t, _mm256_and_si256(em, _mm256_srai_epi16(t, 15)));
                let ge = _mm256_srai_epi16(_mm256_sub_epi16(t, em), 15);
                let t = _mm256_sub_epi16(t, _mm256_andnot_si256(ge, em));
                let z = _mm256_cmpeq_epi16(e, _mm256_setzero_si256());
                let r = _mm256_andnot_si256(z, _mm256_add_epi16(t, one));
                let keep = _mm256_set1_epi16(!((emax as u16) << sh) as i16);
                _mm256_or_si256(_mm256_and_si256(x, keep), _mm256_sll_epi16(r, cnt))
            } else {
                let c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(o.as_ptr() as *const __m128i));
                let em = _mm256_set1_epi32(emax as i32);
                let one = _mm256_set1_epi32(1);
                let cnt = _mm_cvtsi32_si128(sh as i32);
                let e = _mm256_and_si256(_mm256_srl_epi32(x, cnt), em);
                let t = _mm256_add_epi32(_mm256_sub_epi32(e, one), c);
                let t = _mm256_add_epi32(t, _mm256_and_si256(em, _mm256_srai_epi32(t, 31)));
                let ge = _mm256_srai_epi32(_mm256_sub_epi32(t, em), 31);
                let t = _mm256_sub_epi32(t, _mm256_andnot_si256(ge, em));
                let z = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
                let r = _mm256_andnot_si256(z, _mm256_add_epi32(t, one));
                let keep = _mm256_set1_epi32(!(emax << sh) as i32);
                _mm256_or_si256(_mm256_and_si256(x, keep), _mm256_sll_epi32(r, cnt))
            };
            _mm256_storeu_si256(yb.as_mut_ptr() as *mut __m256i, y);
            // ascending stores (see `copy_ascending`)
            compiler_fence(Ordering::Release);
        }
        // the run's last elements (fewer than a vector), from their column
        let rest = (i + whole) * T::W..(i + len) * T::W;
        rotate::<T, true>(&mut src[rest.clone()], col + whole, ct);
        copy_ascending(&mut dst[rest.clone()], &src[rest]);
        i += len;
        col = 0;
    }
    copy_ascending(&mut dst[n * T::W..], &src[n * T::W..]);
}

/// The tests' seeded generator: a 64-bit LCG, its high 31 bits per draw.
#[cfg(test)]
fn test_lcg(seed: u64) -> impl FnMut() -> u32 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    }
}

#[cfg(test)]
mod unrotate_keys_tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(keys: &mut [u8], col0: usize, ct: &ColTab) {
        unrotate_keys(keys, col0, ct)
    }

    /// Every key byte at every offset, against [`rot`] (and the AVX2 instance against
    /// the portable one): the same bytes.
    #[test]
    fn unrotate_keys_matches_rot() {
        // exhaustive: key k in the 16 columns of offsets -8..=7, 32 keys (a vector)
        let mut ct = ColTab {
            p: 16,
            off: [0; PMAX],
        };
        for (j, o) in ct.off.iter_mut().take(16).enumerate() {
            *o = j as i8 - 8;
        }
        for k in 0..=255u8 {
            let want: Vec<u8> = (0..32)
                .map(|i| rot::<true>(k as u32, ct.off[i % 16], 255) as u8)
                .collect();
            let mut got = vec![k; 32];
            unrotate_keys(&mut got, 0, &ct);
            assert_eq!(got, want, "key {k}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                let mut got = vec![k; 32];
                // SAFETY: the CPU supports AVX2 (checked).
                unsafe { avx2(&mut got, 0, &ct) };
                assert_eq!(got, want, "avx2: key {k}");
            }
        }
        let mut next = test_lcg(7);
        for p in [16, 17, 100, 1000, PMAX] {
            let mut ct = ColTab { p, off: [0; PMAX] };
            for o in ct.off.iter_mut().take(p) {
                *o = (next() % 16) as i8 - 8;
            }
            for (len, col0) in [(1, 0), (31, 5), (256, 15), (1024, 99), (5000, 12345)] {
                let keys: Vec<u8> = (0..len).map(|i| (i as u32 + next()) as u8).collect();
                let want: Vec<u8> = keys
                    .iter()
                    .enumerate()
                    .map(|(i, &k)| rot::<true>(k as u32, ct.off[(col0 + i) % p], 255) as u8)
                    .collect();
                let mut got = keys.clone();
                unrotate_keys(&mut got, col0, &ct);
                assert_eq!(got, want, "p {p} len {len} col0 {col0}");
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx2") {
                    let mut got = keys.clone();
                    // SAFETY: the CPU supports AVX2 (checked).
                    unsafe { avx2(&mut got, col0, &ct) };
                    assert_eq!(got, want, "avx2: p {p} len {len} col0 {col0}");
                }
            }
        }
    }

    /// The encoder's key rotation equals splitting the elements [`rotate_kept`]
    /// rotated (bf16, fp32; with and without elided lines, every offset).
    #[test]
    fn rotate_kept_keys_matches_rotated_elements() {
        fn check<T: V2>(seed: u64) {
            let mut next = test_lcg(seed);
            let line = crate::v2::LINE;
            for (p, m, col0) in [
                (16, 64, 0),
                (17, 1000, 5),
                (1536, 4099, 777),
                (PMAX, 9000, 3),
            ] {
                let mut ct = ColTab { p, off: [0; PMAX] };
                for o in ct.off.iter_mut().take(p) {
                    *o = (next() % 16) as i8 - 8;
                }
                // every exponent field, 0 and EMAX included
                let grid: Vec<u8> = (0..m * T::W).map(|_| next() as u8).collect();
                let nl = (m * T::W).div_ceil(line);
                for lines in [false, true] {
                    let el: Vec<bool> = (0..nl).map(|_| lines && next() % 3 == 0).collect();
                    let kept: Vec<u8> = grid
                        .chunks(line)
                        .zip(&el)
                        .filter(|(_, &z)| !z)
                        .flat_map(|(c, _)| c.iter().copied())
                        .collect();
                    let elided = lines.then_some(&el[..]);
                    let mut rot_el = kept.clone();
                    rotate_kept::<T, false>(&mut rot_el, elided, m * T::W, col0, &ct);
                    let want: Vec<u8> = (0..kept.len() / T::W)
                        .map(|i| T::exp(T::load(&rot_el, i)) as u8)
                        .collect();
                    let mut got: Vec<u8> = (0..kept.len() / T::W)
                        .map(|i| T::exp(T::load(&kept, i)) as u8)
                        .collect();
                    rotate_kept_keys::<T>(&mut got, elided, m, col0, &ct);
                    assert_eq!(got, want, "W {} p {p} m {m} lines {lines}", T::W);
                }
            }
        }
        check::<crate::elem::Bf16>(3);
        check::<crate::elem::Fp32>(4);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod unrotate_tests {
    use super::*;
    use crate::elem::{Fp16, Fp32};

    #[target_feature(enable = "avx2")]
    unsafe fn avx2<T: V2>(dst: &mut [u8], src: &mut [u8], col0: usize, ct: &ColTab) {
        unrotate_copy::<T, true>(dst, src, col0, ct)
    }

    fn check<T: V2>(seed: u64) {
        let mut next = test_lcg(seed);
        for p in [16, 17, 31, 40, 100, 1000, PMAX] {
            let mut ct = ColTab { p, off: [0; PMAX] };
            for o in ct.off.iter_mut().take(p) {
                *o = (next() % 16) as i8 - 8;
            }
            for (len, col0) in [
                (1, 0),
                (7, 3),
                (64, 15),
                (333, 16),
                (4096, 99),
                (5000, 12345),
            ] {
                // every exponent field, 0 (kept as 0) among them, in random elements
                let mut buf: Vec<u8> = (0..len * T::W + 1).map(|_| next() as u8).collect();
                for (k, c) in buf
                    .chunks_exact_mut(T::W)
                    .enumerate()
                    .filter(|(k, _)| k % 5 == 0)
                {
                    c.fill(if k % 10 == 0 { 0 } else { 0xFF });
                }
                let mut want = buf.clone();
                rotate::<T, true>(&mut want, col0, &ct);
                let mut out = vec![0u8; buf.len()];
                // SAFETY: checked just now.
                unsafe { avx2::<T>(&mut out, &mut buf, col0, &ct) };
                assert!(out == want, "p {p} len {len} col0 {col0}");
                // the portable path: the same un-rotation, copied
                let mut out = vec![0u8; buf.len()];
                unrotate_copy::<T, false>(&mut out, &mut want.clone(), 0, &ct);
                let mut twice = want.clone();
                rotate::<T, true>(&mut twice, 0, &ct);
                assert!(out == twice);
            }
        }
    }

    /// The AVX2 un-rotation equals the portable one, for every element type.
    #[test]
    fn unrotate_avx2_matches_rotate() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        check::<Bf16>(1);
        check::<Fp16>(2);
        check::<Fp32>(3);
    }
}

/// Columns a quad of samples spans past its first (4 x 13): [`row_bases`] runs that
/// far past `P`, so that the samples of a quad need no wrap.
const QUAD_SPAN: usize = 4 * SAMPLE_STRIDE;

thread_local! {
    /// [`row_bases`]' buffer for the per-sample loops
    static ROWS: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// The row of [`rot_table`] of every column `j < P + QUAD_SPAN` (column `j mod P`),
/// as its offset in the flattened table: `((c[j] + 8) & 15) << 8`.
fn row_bases(ct: &ColTab, rb: &mut Vec<u16>) {
    let p = ct.p;
    rb.clear();
    rb.extend(
        ct.off[..p]
            .iter()
            .map(|&c| (((c as u8).wrapping_add(8) & 15) as u16) << 8),
    );
    for j in 0..QUAD_SPAN {
        let r = rb[j % p];
        rb.push(r);
    }
}

/// The exponent histogram of a block's sample, kept elements `0, 13, 26, … < k` of
/// `kept` (as [`rotate_kept`] lays them out), with every field rotated: the `hc` of
/// the rotated sample's statistics (rotation changes neither zeros nor low bits, so
/// the rest of the statistics is the plain sample's).
pub(crate) fn sample_hist_rotated<T: V2>(
    kept: &[u8],
    k: usize,
    elided: Option<&[bool]>,
    col0: usize,
    ct: &ColTab,
) -> [u32; 256] {
    let (sh, emax, p) = (eshift::<T>(), T::EMAX, ct.p);
    let per = crate::v2::LINE / T::W;
    let lut = rot_lut::<T>();
    let mut h = [0u32; 256];
    if elided.is_none() {
        // the kept elements are the grid: element j is in column (col0 + j) mod P
        return sample_both::<T>(kept, k.div_ceil(SAMPLE_STRIDE), col0, ct).1;
    }
    // the grid line of kept line `kl` (asked in ascending order): lines walked once
    let mut cur: Option<(usize, usize)> = None;
    let mut grid_line = |kl: usize| -> usize {
        let Some(el) = elided else { return kl };
        loop {
            match cur {
                Some((k, g)) if k == kl => return g,
                _ => {
                    let (nk, mut g) = cur.map_or((0, 0), |(k, g)| (k + 1, g + 1));
                    while el[g] {
                        g += 1;
                    }
                    cur = Some((nk, g));
                }
            }
        }
    };
    // the column of grid element g, advanced from the previous one (no division
    // per sample unless a jump of P or more, over elided lines)
    let (mut gp, mut cg) = (0usize, col0 % p);
    for j in (0..k).step_by(SAMPLE_STRIDE) {
        let g = grid_line(j / per) * per + j % per;
        let d = g - gp;
        if d < p {
            cg += d;
            if cg >= p {
                cg -= p;
            }
        } else {
            cg = (col0 + g) % p;
        }
        gp = g;
        let x = T::load(kept, j);
        let e = (x >> sh) & emax;
        h[lut[(ct.off[cg] as u8).wrapping_add(8) as usize & 15][e as usize] as usize] += 1;
    }
    h
}

/// The stride-13 sample of `xs` (`count` samples: sample `i` is element `13·i`, in
/// column `(col0 + 13·i) mod P`): its exponent histogram as the elements are and
/// with every field rotated by its column's offset, its zero count and the OR of
/// its elements. Four interleaved copies of each histogram (sample `i` to copy
/// `i mod 4`, unrolled so that each copy sits at a fixed address): consecutive
/// samples mostly hit one bin, and one histogram would chain their increments.
#[inline(always)]
fn sample_both<T: V2>(
    xs: &[u8],
    count: usize,
    col0: usize,
    ct: &ColTab,
) -> ([u32; 256], [u32; 256], u32, u32) {
    assert!(count == 0 || SAMPLE_STRIDE * (count - 1) < xs.len() / T::W);
    // u16 counts: at most ceil(count / 4) per bin and copy
    debug_assert!(count <= 4 * u16::MAX as usize);
    let (sh, p) = (eshift::<T>(), ct.p);
    let lut = rot_lut::<T>().as_flattened();
    let base = xs.as_ptr();
    let (mut hp, mut hc) = ([[0u16; 256]; 4], [[0u16; 256]; 4]);
    let (mut nzero, mut lo_or) = (0u32, 0u32);
    ROWS.with(|rb| {
        let rb = &mut *rb.borrow_mut();
        row_bases(ct, rb);
        let rb = &rb[..p + QUAD_SPAN];
        // one sample: its plain and rotated bins (`r`: its column's row base)
        #[inline(always)]
        fn one<T: V2>(
            x: u32,
            sh: u32,
            r: u16,
            lut: &[u8],
            hp: &mut [u16; 256],
            hc: &mut [u16; 256],
        ) {
            let e = ((x >> sh) & T::EMAX) as u8;
            hp[e as usize] += 1;
            // SAFETY: r <= 15 << 8 and e <= 255: inside the 16 x 256 table
            let rot = unsafe { *lut.get_unchecked(r as usize + e as usize) };
            hc[rot as usize] += 1;
        }
        // samples 4q .. 4q + 4 sit in columns col, col + 13, col + 26, col + 39
        // (`rb` runs QUAD_SPAN columns past P: no wrap inside a quad)
        let (step, step4) = (SAMPLE_STRIDE % p, QUAD_SPAN % p);
        let mut col = col0 % p;
        let quads = count / 4;
        for q in 0..quads {
            for k in 0..4 {
                // SAFETY: sample 4q + k < count: inside `xs` (asserted above)
                let x = unsafe { T::load_raw(base, SAMPLE_STRIDE * (4 * q + k)) };
                // SAFETY: col < P and 13k < QUAD_SPAN: inside `rb`
                let r = unsafe { *rb.get_unchecked(col + SAMPLE_STRIDE * k) };
                one::<T>(x, sh, r, lut, &mut hp[k], &mut hc[k]);
                nzero += (x == 0) as u32;
                lo_or |= x;
            }
            col += step4;
            if col >= p {
                col -= p;
            }
        }
        for i in 4 * quads..count {
            // SAFETY: i < count (asserted above)
            let x = unsafe { T::load_raw(base, SAMPLE_STRIDE * i) };
            one::<T>(x, sh, rb[col], lut, &mut hp[0], &mut hc[0]);
            nzero += (x == 0) as u32;
            lo_or |= x;
            col += step;
            if col >= p {
                col -= p;
            }
        }
    });
    let (mut h, mut hr) = ([0u32; 256], [0u32; 256]);
    for e in 0..256 {
        h[e] = (0..4).map(|k| hp[k][e] as u32).sum();
        hr[e] = (0..4).map(|k| hc[k][e] as u32).sum();
    }
    (h, hr, nzero, lo_or)
}

/// [`Stats::sample`] of the grid `b` (`m` elements, element 0 in column `col0 mod P`)
/// and, from the same reads, [`sample_hist_rotated`]'s histogram of the grid (no
/// elided lines): the carried phase's sample in a frame with a column table, whose
/// block then needs no second pass for `COL` (FORMAT.md §V2.7 step 5).
#[inline(always)]
pub(crate) fn sample_fused<T: V2>(
    b: &[u8],
    m: usize,
    col0: usize,
    ct: &ColTab,
) -> (Stats, [u32; 256]) {
    let (h, hr, nzero, lo_or) =
        sample_both::<T>(&b[..m * T::W], m.div_ceil(SAMPLE_STRIDE), col0, ct);
    // (`lo_or` only where `choose` reads it: fp32, as `Stats::sample`)
    let lo_or = if T::W == 4 { lo_or } else { 0 };
    let st = Stats::from_parts(h, nzero as u64, m.div_ceil(SAMPLE_STRIDE) as u64, lo_or);
    (st, hr)
}

/// Column of grid element 0 of the block that starts at input byte `blk_start`, with
/// phase `phi`: `floor((blk_start + phi) / W)` (mod `P` where used).
pub(crate) fn grid_col0<T: V2>(blk_start: usize, phi: usize) -> usize {
    (blk_start + phi) / T::W
}

// ---------------------------------------------------------------------------------
// The encoder's table (FORMAT.md §V2.9, normative)

#[derive(Default)]
struct Scratch {
    keys: Vec<u8>,
    /// `keys` with zeros replaced by the mean of the nonzero ones (the search's input)
    search: Vec<u8>,
    /// column sums and counts
    acc: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static ENCODER_TABLE: Cell<bool> = const { Cell::new(true) };
}

/// Benchmarks only (`examples/coltab_speed.rs`): `false` makes this thread's version-2
/// encoder write no column table (frames that do not follow §V2.9's rule).
#[doc(hidden)]
pub fn set_encoder_table(on: bool) {
    ENCODER_TABLE.with(|c| c.set(on));
}

/// The period of exponent fields `e` (the first `min(m, SEARCH_N)` elements): `None`
/// when no lag stands out. Lags `p = 16, 32, … ≤ min(8192, len − 1024)`;
/// `D(p) = Σ_{i<1024} |e_i − e_{i+p}|`; a period only if `8·Dmin·L < 7·ΣD` (the best
/// lag at least 1/8 below the mean of the `L` lags), then the smallest `p` with
/// `4·D(p) ≤ 5·Dmin` (multiples of a period score alike: take the fundamental). A
/// period that divides 16 is not found (every lag is its multiple).
pub fn find_period(e: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { find_period_avx2(e) };
        }
    }
    find_period_body::<false>(e)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_period_avx2(e: &[u8]) -> Option<usize> {
    find_period_body::<true>(e)
}

/// `V`: compiled for AVX2 (32-byte `vpsadbw`).
#[inline(always)]
fn find_period_body<const V: bool>(e: &[u8]) -> Option<usize> {
    if e.len() < LAG_N + PMIN {
        return None;
    }
    let pmax = PMAX.min(e.len() - LAG_N) / PMIN * PMIN;
    let a = &e[..LAG_N];
    let mut d = [0u32; PMAX / PMIN];
    let nl = pmax / PMIN;
    let mut k0 = 0;
    #[cfg(target_arch = "x86_64")]
    if V {
        // four lags per read of `a`
        while k0 + 4 <= nl {
            // SAFETY: V: AVX2; lags up to (k0 + 4)·PMIN <= pmax <= e.len() − LAG_N.
            d[k0..k0 + 4].copy_from_slice(&unsafe { sad4_avx2(e, (k0 + 1) * PMIN) });
            k0 += 4;
        }
    }
    for (k, dk) in d.iter_mut().enumerate().take(nl).skip(k0) {
        let b = &e[(k + 1) * PMIN..(k + 1) * PMIN + LAG_N];
        *dk = sad::<V>(a, b);
    }
    let d = &d[..nl];
    let dmin = *d.iter().min()? as u64;
    let dsum: u64 = d.iter().map(|&x| x as u64).sum();
    if 8 * dmin * nl as u64 >= 7 * dsum {
        return None;
    }
    let k = d.iter().position(|&x| 4 * x as u64 <= 5 * dmin)?;
    Some((k + 1) * PMIN)
}

/// `sad(e[..LAG_N], e[p + t·PMIN..][..LAG_N])` for `t < 4`.
///
/// # Safety
/// The CPU must support AVX2; `p + 3·PMIN + LAG_N <= e.len()`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sad4_avx2(e: &[u8], p: usize) -> [u32; 4] {
    use std::arch::x86_64::*;
    debug_assert!(p + 3 * PMIN + LAG_N <= e.len());
    let mut acc = [_mm256_setzero_si256(); 4];
    for c in (0..LAG_N).step_by(32) {
        let x = _mm256_loadu_si256(e.as_ptr().add(c) as *const __m256i);
        for (t, at) in acc.iter_mut().enumerate() {
            let y = _mm256_loadu_si256(e.as_ptr().add(p + t * PMIN + c) as *const __m256i);
            *at = _mm256_add_epi64(*at, _mm256_sad_epu8(x, y));
        }
    }
    acc.map(|v| {
        let h = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        (_mm_cvtsi128_si64(h) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(h, h))) as u32
    })
}

/// `Σ |a_i − b_i|` over whole 32-byte chunks (`psadbw` on x86-64; `V`: the caller is
/// compiled for AVX2).
#[inline(always)]
fn sad<const V: bool>(a: &[u8], b: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        if V {
            let n = a.len().min(b.len()) / 32;
            // SAFETY: V: AVX2; every load reads 32 bytes inside `a` or `b`.
            return unsafe {
                let mut acc = _mm256_setzero_si256();
                for k in 0..n {
                    let x = _mm256_loadu_si256(a.as_ptr().add(32 * k) as *const __m256i);
                    let y = _mm256_loadu_si256(b.as_ptr().add(32 * k) as *const __m256i);
                    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(x, y));
                }
                let h = _mm_add_epi64(
                    _mm256_castsi256_si128(acc),
                    _mm256_extracti128_si256(acc, 1),
                );
                (_mm_cvtsi128_si64(h) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(h, h))) as u32
            };
        }
        let n = a.len().min(b.len()) / 16;
        // SAFETY: SSE2 is part of x86-64; every load reads 16 bytes inside `a` or `b`.
        unsafe {
            let mut acc = _mm_setzero_si128();
            for k in 0..n {
                let x = _mm_loadu_si128(a.as_ptr().add(16 * k) as *const __m128i);
                let y = _mm_loadu_si128(b.as_ptr().add(16 * k) as *const __m128i);
                acc = _mm_add_epi64(acc, _mm_sad_epu8(x, y));
            }
            (_mm_cvtsi128_si64(acc) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc))) as u32
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        a.iter()
            .zip(b.iter())
            .map(|(&x, &y)| x.abs_diff(y) as u32)
            .sum()
    }
}

/// Column offsets for period `p` from exponent fields `e`: per column `j`, `S_j` and
/// `n_j`, the sum and count of the nonzero `e_i` with `i mod p = j`;
/// `ref = floor(ΣS / Σn)`; `c_j = clamp(floor((2(S_j − ref·n_j) + n_j) / (2 n_j)),
/// −8, 7)` (the column mean minus `ref`, rounded half up), 0 where `n_j = 0`.
/// `None` if every `e_i` is 0.
pub fn column_offsets(e: &[u8], p: usize) -> Option<ColTab> {
    let mut ct = ColTab { p, off: [0; PMAX] };
    column_offsets_into(e, p, &mut Vec::new(), &mut ct).then_some(ct)
}

/// Adds the rows of `batch` (each `pk.len()` long, the last may be shorter) to the
/// packed accumulators `pk`: `x | [x ≠ 0] << 16` per element.
#[inline(always)]
fn add_packed_rows_body(batch: &[u8], pk: &mut [u32]) {
    for row in batch.chunks(pk.len()) {
        for (a, &x) in pk.iter_mut().zip(row.iter()) {
            *a += x as u32 | ((x != 0) as u32) << 16;
        }
    }
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_packed_rows_avx2(batch: &[u8], pk: &mut [u32]) {
    add_packed_rows_body(batch, pk)
}

/// [`add_packed_rows_body`], vectorised with AVX2 where the CPU has it.
fn add_packed_rows(batch: &[u8], pk: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { add_packed_rows_avx2(batch, pk) };
        }
    }
    add_packed_rows_body(batch, pk)
}

/// [`column_offsets`] into `ct`, with `acc` as scratch; false if every `e_i` is 0.
fn column_offsets_into(e: &[u8], p: usize, acc: &mut Vec<u32>, ct: &mut ColTab) -> bool {
    // per column: sum and count of the nonzero values, row by row (vector adds),
    // over rows of q = a multiple of p of at least 256 (then folded to p)
    let q = p * 256usize.div_ceil(p);
    acc.clear();
    acc.resize(3 * q, 0);
    let (s, rest) = acc.split_at_mut(q);
    let (n, pk) = rest.split_at_mut(q);
    // per batch of up to 256 rows, one packed accumulator per position: the sum in
    // bits 0..16 (at most 256 · 255 < 2^16) and the nonzero count from bit 16 (one
    // add per element, vectorised), then unpacked into `s`, `n`
    for batch in e.chunks(256 * q) {
        pk.fill(0);
        add_packed_rows(batch, pk);
        for ((sj, nj), &a) in s.iter_mut().zip(n.iter_mut()).zip(pk.iter()) {
            *sj += a & 0xFFFF;
            *nj += a >> 16;
        }
    }
    for j in p..q {
        s[j % p] += s[j];
        n[j % p] += n[j];
    }
    let (s, n) = (&s[..p], &n[..p]);
    let tot: u64 = s.iter().map(|&x| x as u64).sum();
    let cnt: u64 = n.iter().map(|&x| x as u64).sum();
    if cnt == 0 {
        return false;
    }
    let r = (tot / cnt) as i64;
    ct.p = p;
    for j in 0..p {
        let (sj, nj) = (s[j] as i64, n[j] as i64);
        ct.off[j] = if nj == 0 {
            0
        } else {
            (2 * (sj - r * nj) + nj).div_euclid(2 * nj).clamp(-8, 7) as i8
        };
    }
    true
}

/// The encoder's column table for a frame of type `dtype` and blocks of `b` bytes
/// (FORMAT.md §V2.9): period and offsets from the first `min(m, 32768)` elements at
/// block 0's phase, kept only if the frame's stride-13 sample codes cheaper with it
/// by more than twice the table's bits.
pub(crate) fn encoder_table(dtype: Dtype, src: &[u8], b: usize) -> Option<ColTab> {
    if !ENCODER_TABLE.with(|c| c.get()) {
        return None;
    }
    match dtype {
        Dtype::Bf16 => table_for::<Bf16>(src, b),
        Dtype::Fp16 => table_for::<Fp16>(src, b),
        Dtype::Fp32 => table_for::<Fp32>(src, b),
        Dtype::Raw | Dtype::Fp8E4m3 | Dtype::Fp8E5m2 => None,
    }
}

fn table_for<T: V2>(src: &[u8], b: usize) -> Option<ColTab> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { table_for_avx2::<T>(src, b) };
        }
    }
    table_for_body::<T>(src, b)
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn table_for_avx2<T: V2>(src: &[u8], b: usize) -> Option<ColTab> {
    table_for_body::<T>(src, b)
}

/// 16-bit types' exponent fields `(x >> sh) & (0xFFFF >> (sh + 1))`, 32 at a time,
/// into `keys`, with their sum and nonzero count; returns (sum, count, fields done).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exps16_avx2(src: &[u8], keys: &mut [u8], sh: u32) -> (u32, u32, usize) {
    use std::arch::x86_64::*;
    let n = keys.len().min(src.len() / 2) / 32 * 32;
    let mask = _mm256_set1_epi16((0xFFFFu32 >> (sh + 1)) as i16);
    let shc = _mm_cvtsi32_si128(sh as i32);
    let zero = _mm256_setzero_si256();
    let (mut sum, mut cnt) = (_mm256_setzero_si256(), 0u32);
    let mut i = 0;
    while i < n {
        let p = src.as_ptr().add(2 * i) as *const __m256i;
        let a = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(p), shc), mask);
        let b = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(p.add(1)), shc), mask);
        // packus interleaves the 128-bit lanes: (a0 b0 a1 b1) -> (a0 a1 b0 b1)
        let e = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
        _mm256_storeu_si256(keys.as_mut_ptr().add(i) as *mut __m256i, e);
        sum = _mm256_add_epi64(sum, _mm256_sad_epu8(e, zero));
        let z = _mm256_movemask_epi8(_mm256_cmpeq_epi8(e, zero)) as u32;
        cnt += 32 - z.count_ones();
        i += 32;
    }
    let h = _mm_add_epi64(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256(sum, 1),
    );
    let tot = (_mm_cvtsi128_si64(h) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(h, h))) as u32;
    (tot, cnt, n)
}

/// The exponent fields of the elements of `src` into `keys` (one per element),
/// with their sum and nonzero count; 16-bit types 32 at a time with AVX2, else
/// 16 at a time (the compiler's vector loop).
#[inline(always)]
fn exps<T: V2>(src: &[u8], keys: &mut [u8], sh: u32) -> (u32, u32) {
    let (mut tot, mut cnt) = (0u32, 0u32);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if T::W == 2 && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        (tot, cnt, done) = unsafe { exps16_avx2(src, keys, sh) };
    }
    let n = keys.len();
    let (ks, xs) = (&mut keys[done..n], &src[done * T::W..n * T::W]);
    for (ks, xs) in ks.chunks_mut(16).zip(xs.chunks(16 * T::W)) {
        let (mut t16, mut c16) = (0u32, 0u32);
        for (k, xb) in ks.iter_mut().zip(xs.chunks_exact(T::W)) {
            let e = ((T::load(xb, 0) >> sh) & T::EMAX) as u8;
            *k = e;
            t16 += e as u32;
            c16 += (e != 0) as u32;
        }
        tot += t16;
        cnt += c16;
    }
    (tot, cnt)
}

#[inline(always)]
fn table_for_body<T: V2>(src: &[u8], b: usize) -> Option<ColTab> {
    if src.len() < T::W * MIN_M + T::W {
        return None;
    }
    // the grid of block 0 (its phase, V2.7 step 3): element i is in column i mod P
    // (kept for block 0's encoder: the same choice)
    let phi = crate::v2::choose_phase_memo::<T>(&src[..src.len().min(b)]);
    let src = &src[phi..];
    let m = src.len() / T::W;
    if m < MIN_M {
        return None;
    }
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        let nw = m.min(WINDOW);
        // the search reads the first `ns` fields; the offsets all `nw` (extracted
        // only once a period is found)
        let ns = nw.min(SEARCH_N);
        let sh = eshift::<T>();
        s.keys.resize(nw, 0);
        // exponent fields 0 (zeros, subnormals) take the mean of the others in the
        // search, so that scattered zeros or zero lines do not drown the channels
        // (sums below 2^24: at most 32768 fields of at most 255)
        let (tot, cnt) = exps::<T>(&src[..ns * T::W], &mut s.keys[..ns], sh);
        if cnt == 0 {
            return None;
        }
        let r = (tot / cnt) as u8;
        s.search.resize(ns, 0);
        for (f, &e) in s.search.iter_mut().zip(s.keys.iter()) {
            *f = if e == 0 { r } else { e };
        }
        let p = find_period(&s.search)?;
        exps::<T>(&src[ns * T::W..nw * T::W], &mut s.keys[ns..nw], sh);
        let mut ct = ColTab { p, off: [0; PMAX] };
        if !column_offsets_into(&s.keys, p, &mut s.acc, &mut ct) {
            return None;
        }
        // every offset 0: the rotation is the identity, `v_c = v_p` and the gain is 0
        // (step 4 refuses it): no sample needed
        if ct.off[..p].iter().all(|&c| c == 0) {
            return None;
        }
        // the gain: stride-13 sample over the first min(m, 13·GAIN_SAMPLES) elements
        let ms = m.min(SAMPLE_STRIDE * GAIN_SAMPLES);
        let count = ms.div_ceil(SAMPLE_STRIDE) as u64;
        let (hp, hc, nzero, lo_or) = sample_both::<T>(&src[..ms * T::W], count as usize, 0, &ct);
        let nzero = nzero as u64;
        let vp = choose::<T>(&Stats::from_parts(hp, nzero, count, lo_or), false).value;
        let vc = choose::<T>(&Stats::from_parts(hc, nzero, count, lo_or), false).value;
        // value ≈ bits of the ms sampled-over elements; saved frame bits ≈ (vp − vc)·m/ms
        let gain = (vp.saturating_sub(vc) as u128) * m as u128;
        (gain > 16 * ct.bytes() as u128 * ms as u128).then_some(ct)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rotation tables equal [`rot`] for every offset and field.
    #[test]
    fn rot_tables_match_rot() {
        for (t, emax) in [(&ROT255, 255u32), (&ROT31, 31)] {
            for c in -8i8..=7 {
                for e in 0..=emax {
                    let row = (c as u8).wrapping_add(8) as usize & 15;
                    assert_eq!(
                        t[row][e as usize] as u32,
                        rot::<false>(e, c, emax),
                        "{c} {e}"
                    );
                }
            }
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Roughly Gaussian in units of 1 (sum of 4 uniforms, centred).
        fn gauss(&mut self) -> f32 {
            let mut s = 0.0;
            for _ in 0..4 {
                s += (self.next() >> 40) as f32 / (1u64 << 24) as f32;
            }
            (s - 2.0) * 1.7
        }
    }

    fn bf16(v: f32) -> [u8; 2] {
        ((v.to_bits() >> 16) as u16).to_le_bytes()
    }

    /// bf16 values whose scale depends on the column (`i mod p`): 2^(k mod 9 − 4)·σ.
    fn channels(n: usize, p: usize, seed: u64) -> Vec<u8> {
        let mut r = Rng(seed | 1);
        let scales: Vec<f32> = (0..p)
            .map(|j| 2f32.powi(((j * 7 + (r.next() as usize % 5)) % 11) as i32 - 5) * 0.02)
            .collect();
        (0..n)
            .flat_map(|i| bf16(r.gauss() * scales[i % p]))
            .collect()
    }

    fn exps(b: &[u8]) -> Vec<u8> {
        b.chunks_exact(2)
            .map(|c| ((u16::from_le_bytes([c[0], c[1]]) >> 7) & 0xFF) as u8)
            .collect()
    }

    #[test]
    fn finds_a_known_period() {
        // (a period dividing 16 is not found: every lag tried is its multiple)
        for p in [48, 80, 384, 1536, 4096] {
            let d = channels(WINDOW, p, p as u64);
            assert_eq!(find_period(&exps(&d)), Some(p), "period {p}");
        }
    }

    #[test]
    fn lag_sums_agree_across_paths() {
        // the AVX2 search (four lags per read) against the portable one
        let mut r = Rng(5);
        for (n, p) in [(WINDOW, 384usize), (LAG_N + 16 * 37 + 5, 80), (WINDOW, 0)] {
            let mut e = if p > 0 {
                exps(&channels(n, p, 7))
            } else {
                (0..n).map(|_| (r.next() % 7) as u8 + 120).collect()
            };
            e.truncate(n);
            let want = find_period_body::<false>(&e);
            assert_eq!(find_period(&e), want, "n {n}, p {p}");
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                for q in (PMIN..=n - LAG_N - 3 * PMIN).step_by(16 * 29) {
                    // SAFETY: AVX2 checked; q + 3·PMIN + LAG_N <= n.
                    let got = unsafe { sad4_avx2(&e, q) };
                    for (t, &g) in got.iter().enumerate() {
                        let b = &e[q + t * PMIN..q + t * PMIN + LAG_N];
                        assert_eq!(g, sad::<false>(&e[..LAG_N], b), "lag {}", q + t * PMIN);
                    }
                }
            }
        }
    }

    #[test]
    fn no_period_in_iid_data() {
        let mut r = Rng(99);
        let d: Vec<u8> = (0..WINDOW).flat_map(|_| bf16(r.gauss() * 0.01)).collect();
        assert_eq!(find_period(&exps(&d)), None);
        assert!(table_for::<Bf16>(&d, 1 << 16).is_none());
        // constant exponents: no lag differs
        assert_eq!(find_period(&[120u8; WINDOW]), None);
        // too short for the search
        assert_eq!(find_period(&exps(&channels(LAG_N, 16, 1))), None);
    }

    #[test]
    fn offsets_follow_the_column_means() {
        // column j's exponent is 100 + (j mod 5) − 2: mean 100, offsets j mod 5 − 2
        let p = 40;
        let e: Vec<u8> = (0..4000).map(|i| (100 + (i % p) % 5) as u8 - 2).collect();
        let ct = column_offsets(&e, p).unwrap();
        for j in 0..p {
            assert_eq!(ct.off[j] as i32, (j % 5) as i32 - 2, "column {j}");
        }
        // clamped to -8..=7, zeros ignored, an all-zero column has offset 0
        let e: Vec<u8> = (0..1600)
            .map(|i| match i % 16 {
                0 => 130,
                1 => 70,
                2 => 0,
                _ => 100,
            })
            .collect();
        let ct = column_offsets(&e, 16).unwrap();
        assert_eq!((ct.off[0], ct.off[1], ct.off[2], ct.off[3]), (7, -8, 0, 0));
        assert!(column_offsets(&[0u8; 64], 16).is_none());
    }

    /// The packed per-batch sums equal the rule's plain per-column sums, for periods
    /// below and above 256 and inputs longer than one batch of 256 rows.
    #[test]
    fn offsets_match_plain_sums() {
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        for (p, len) in [
            (16usize, 140_000usize),
            (40, 70_000),
            (300, 32768),
            (1536, 200_000),
        ] {
            let e: Vec<u8> = (0..len)
                .map(|_| match r.next() % 5 {
                    0 => 0,
                    1 => 255,
                    _ => 100 + (r.next() % 30) as u8,
                })
                .collect();
            let (mut sj, mut nj) = (vec![0i64; p], vec![0i64; p]);
            for (i, &x) in e.iter().enumerate() {
                sj[i % p] += x as i64;
                nj[i % p] += (x != 0) as i64;
            }
            let rf = sj.iter().sum::<i64>() / nj.iter().sum::<i64>();
            let ct = column_offsets(&e, p).unwrap();
            for j in 0..p {
                let want = if nj[j] == 0 {
                    0
                } else {
                    (2 * (sj[j] - rf * nj[j]) + nj[j])
                        .div_euclid(2 * nj[j])
                        .clamp(-8, 7)
                };
                assert_eq!(ct.off[j] as i64, want, "p {p} column {j}");
            }
        }
    }

    #[test]
    fn rotation_is_a_bijection() {
        for (emax, ws) in [(255u32, 8), (31, 5)] {
            let _ = ws;
            for c in -8i8..=7 {
                let mut seen = vec![false; emax as usize + 1];
                for e in 0..=emax {
                    let r = rot::<false>(e, c, emax);
                    assert!(r <= emax);
                    assert_eq!(r == 0, e == 0);
                    assert!(!seen[r as usize]);
                    seen[r as usize] = true;
                    assert_eq!(rot::<true>(r, c, emax), e);
                }
            }
        }
        // e − c where it stays in 1..=EMAX
        assert_eq!(rot::<false>(120, 3, 255), 117);
        assert_eq!(rot::<false>(2, 3, 255), 254);
        assert_eq!(rot::<false>(250, -7, 255), 2);
    }

    #[test]
    fn rotate_round_trips_every_type() {
        let mut r = Rng(5);
        let ct = {
            let mut c = ColTab {
                p: 37,
                off: [0; PMAX],
            };
            for j in 0..37 {
                c.off[j] = (r.next() % 16) as i8 - 8;
            }
            c
        };
        let d: Vec<u8> = (0..4 * 1000).map(|_| r.next() as u8).collect();
        let mut b = d.clone();
        rotate::<Bf16, false>(&mut b, 11, &ct);
        assert_ne!(b, d);
        // the vector loops compute `rot` exactly
        for (i, (x, y)) in d.chunks_exact(2).zip(b.chunks_exact(2)).enumerate() {
            let (x, y) = (
                u16::from_le_bytes([x[0], x[1]]),
                u16::from_le_bytes([y[0], y[1]]),
            );
            let e = ((x >> 7) & 0xFF) as u32;
            assert_eq!(
                ((y >> 7) & 0xFF) as u32,
                rot::<false>(e, ct.off[(11 + i) % 37], 255)
            );
            assert_eq!(x & 0x807F, y & 0x807F);
        }
        let mut f = d.clone();
        rotate::<Fp16, true>(&mut f, 5, &ct);
        for (i, (x, y)) in d.chunks_exact(2).zip(f.chunks_exact(2)).enumerate() {
            let (x, y) = (
                u16::from_le_bytes([x[0], x[1]]),
                u16::from_le_bytes([y[0], y[1]]),
            );
            let e = ((x >> 10) & 31) as u32;
            assert_eq!(
                ((y >> 10) & 31) as u32,
                rot::<true>(e, ct.off[(5 + i) % 37], 31)
            );
        }
        let mut f = d.clone();
        rotate::<Fp32, false>(&mut f, 0, &ct);
        for (i, (x, y)) in d.chunks_exact(4).zip(f.chunks_exact(4)).enumerate() {
            let x = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            let y = u32::from_le_bytes([y[0], y[1], y[2], y[3]]);
            let e = (x >> 23) & 0xFF;
            assert_eq!((y >> 23) & 0xFF, rot::<false>(e, ct.off[i % 37], 255));
            assert_eq!(x & 0x807F_FFFF, y & 0x807F_FFFF);
        }
        rotate::<Bf16, true>(&mut b, 11, &ct);
        assert_eq!(b, d);
        rotate::<Fp16, false>(&mut b, 3, &ct);
        rotate::<Fp16, true>(&mut b, 3, &ct);
        assert_eq!(b, d);
        rotate::<Fp32, false>(&mut b, 40, &ct);
        rotate::<Fp32, true>(&mut b, 40, &ct);
        assert_eq!(b, d);
    }

    /// The rotated sample histogram equals the histogram of the rotated elements'
    /// sample, with and without elided lines.
    #[test]
    fn rotated_sample_histogram_matches_rotation() {
        let mut r = Rng(8);
        let mut ct = ColTab {
            p: 96,
            off: [0; PMAX],
        };
        for j in 0..96 {
            ct.off[j] = (r.next() % 16) as i8 - 8;
        }
        let grid = channels(4000, 96, 3);
        let gbytes = grid.len();
        let nl = gbytes.div_ceil(crate::v2::LINE);
        for pattern in [0u64, 3, 7] {
            let elided: Vec<bool> = (0..nl)
                .map(|j| pattern != 0 && (j as u64 * 7 + 1) % 11 < pattern)
                .collect();
            let mut kept: Vec<u8> = grid
                .chunks(crate::v2::LINE)
                .zip(elided.iter())
                .filter(|(_, &z)| !z)
                .flat_map(|(c, _)| c.iter().copied())
                .collect();
            let k = kept.len() / 2;
            let el = (pattern != 0).then_some(&elided[..]);
            let h = sample_hist_rotated::<Bf16>(&kept, k, el, 1234, &ct);
            rotate_kept::<Bf16, false>(&mut kept, el, gbytes, 1234, &ct);
            let want = crate::encode::sample_histogram::<Bf16>(&kept, k);
            assert_eq!(h, want, "pattern {pattern}");
        }
    }

    #[test]
    fn table_bytes_round_trip() {
        for p in [16usize, 17, 385, 8192] {
            let mut ct = ColTab { p, off: [0; PMAX] };
            for j in 0..p {
                ct.off[j] = ((j * 5) % 16) as i8 - 8;
            }
            // entries past P are not the table's: the writer must not read them
            ct.off[p..].fill(-1);
            let mut b = vec![0xAAu8; ct.bytes()];
            ct.write(&mut b);
            let (c2, len) = ColTab::read(&b).unwrap();
            assert_eq!(len, ct.bytes());
            assert_eq!(c2.p, p);
            assert_eq!(&c2.off[..p], &ct.off[..p]);
            // and the reader leaves them 0 (the padding nibble included)
            assert!(c2.off[p..].iter().all(|&c| c == 0));
        }
        assert!(ColTab::read(&[15, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(ColTab::read(&[0x01, 0x20, 0]).is_err());
        assert!(matches!(
            ColTab::read(&[16, 0, 0]),
            Err(CodecError::Truncated)
        ));
        let mut odd = vec![0u8; 2 + 9];
        odd[0] = 17;
        odd[10] = 0x10;
        assert!(ColTab::read(&odd).is_err());
    }

    #[test]
    fn the_encoder_takes_a_table_on_channel_data() {
        let d = channels(131072, 384, 7);
        let ct = table_for::<Bf16>(&d, 1 << 16).expect("a table");
        assert_eq!(ct.p, 384);
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    /// `cargo test --release -p nccl-zip-codec --lib coltab_timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn coltab_timing() {
        let Ok(d) = std::fs::read("../bench/data/adam_updates.bf16") else {
            return;
        };
        let src = &d[..262144];
        let t = std::time::Instant::now();
        for _ in 0..200 {
            std::hint::black_box(encoder_table(Dtype::Bf16, src, 1 << 16));
        }
        eprintln!(
            "encoder_table: {:.1} us",
            t.elapsed().as_secs_f64() * 1e6 / 200.0
        );
        let t = std::time::Instant::now();
        for _ in 0..200 {
            std::hint::black_box(crate::v2::choose_phase::<Bf16>(&src[..65536]));
        }
        eprintln!(
            "choose_phase: {:.1} us",
            t.elapsed().as_secs_f64() * 1e6 / 200.0
        );
        let e: Vec<u8> = src
            .chunks_exact(2)
            .take(WINDOW)
            .map(|c| ((u16::from_le_bytes([c[0], c[1]]) >> 7) & 0xFF) as u8)
            .collect();
        let t = std::time::Instant::now();
        for _ in 0..200 {
            std::hint::black_box(find_period(&e));
        }
        eprintln!(
            "find_period: {:.1} us",
            t.elapsed().as_secs_f64() * 1e6 / 200.0
        );
        let t = std::time::Instant::now();
        let mut keys = Vec::new();
        for _ in 0..200 {
            keys.clear();
            keys.extend(
                src[..WINDOW * 2]
                    .chunks_exact(2)
                    .map(|xb| ((Bf16::load(xb, 0) >> 7) & 255) as u8),
            );
            std::hint::black_box(&keys);
        }
        eprintln!("extract: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 200.0);
        let t = std::time::Instant::now();
        let mut ct = ColTab {
            p: 384,
            off: [0; PMAX],
        };
        let mut acc = Vec::new();
        for _ in 0..200 {
            std::hint::black_box(column_offsets_into(&keys, 384, &mut acc, &mut ct));
        }
        eprintln!("offsets: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 200.0);
        eprintln!("period of adam chunk 0: {:?}", find_period(&keys));
        let mut opts = crate::EncodeOptions::default();
        opts.format = 2;
        let mut f = vec![0u8; 262144 + 24];
        let t = std::time::Instant::now();
        for _ in 0..200 {
            std::hint::black_box(crate::compress(src, &mut f, &opts).unwrap());
        }
        eprintln!(
            "compress: {:.1} us",
            t.elapsed().as_secs_f64() * 1e6 / 200.0
        );
    }
}
