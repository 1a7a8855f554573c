//! The column table of frame format version 2 (docs/FORMAT.md §V2.9): a period `P`
//! found from the frame's bytes and a 4-bit exponent offset per column, shared by the
//! frame's blocks. A block with the `COL` flag codes each element's exponent field `e`
//! rotated by its column's offset, `rot(e, c) = 1 + (e − 1 − c) mod EMAX` (`e = 0`
//! stays 0), so an activation whose channels sit at different scales codes as if they
//! shared one. The rotation is a bijection of `1..=EMAX`, so every element stays
//! exact, and it is a pass over the elements before the encoder's split (and after the
//! decoder's join): the coding loops do not change.
//!
//! Every decision here is an integer function of the input bytes (a GPU encoder can
//! reproduce it, or take the table from the host as a parameter).

use std::cell::{Cell, RefCell};

use crate::elem::{Bf16, Fp16, Fp32};
use crate::encode::SAMPLE_STRIDE;
use crate::format::*;
use crate::v2::{choose, Stats, V2};
use crate::{CodecError, Dtype};

/// Smallest and largest period (elements).
pub const PMIN: usize = 16;
pub const PMAX: usize = 8192;
/// The period search compares the first `LAG_N` elements with those `p` later.
const LAG_N: usize = 2048;
/// Elements the search and the offsets read: `min(m, WINDOW)` from the frame start.
const WINDOW: usize = 32768;
/// Most stride-13 samples of the table's gain estimate.
const GAIN_SAMPLES: usize = 16384;

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
        t.fill(0);
        for j in 0..self.p {
            t[j / 2] |= ((self.off[j] as u8) & 15) << (4 * (j % 2));
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
        for j in 0..p {
            let nib = (src[2 + j / 2] >> (4 * (j % 2))) & 15;
            ct.off[j] = ((nib << 4) as i8) >> 4;
        }
        if p % 2 == 1 && src[len - 1] >> 4 != 0 {
            return Err(CodecError::Corrupt("nonzero column table padding"));
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
/// exponent field `e` in `0..=emax`; 0 stays 0.
#[inline(always)]
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
/// `buf` in place; element 0 of `buf` lies in column `col0 mod P`.
pub(crate) fn rotate<T: V2, const INV: bool>(buf: &mut [u8], col0: usize, ct: &ColTab) {
    let n = buf.len() / T::W;
    let (p, sh, emax) = (ct.p, eshift::<T>(), T::EMAX);
    let mut col = col0 % p;
    let mut i = 0;
    while i < n {
        let len = (n - i).min(p - col);
        let offs = &ct.off[col..col + len];
        let run = &mut buf[i * T::W..(i + len) * T::W];
        for (xb, &c) in run.chunks_exact_mut(T::W).zip(offs.iter()) {
            let x = T::load(xb, 0);
            let e = (x >> sh) & emax;
            let r = rot::<INV>(e, c, emax);
            T::store(xb, 0, (x & !(emax << sh)) | (r << sh));
        }
        i += len;
        col = 0;
    }
}

/// Rotates (`INV = false`) or un-rotates the kept elements `kept` of a block's grid
/// whose grid element 0 lies in column `col0`: without lines they are the grid; with
/// lines (`elided[j]`: grid line `j` is elided) they are the grid's kept lines in
/// order, `gbytes` the grid's length in bytes.
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
    let mut q = 0;
    for (j, &z) in el.iter().enumerate() {
        if z {
            continue;
        }
        let lb = crate::v2::LINE.min(gbytes - j * crate::v2::LINE);
        rotate::<T, INV>(&mut kept[q..q + lb], col0 + j * crate::v2::LINE / T::W, ct);
        q += lb;
    }
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

/// The period of exponent fields `e` (the first `min(m, WINDOW)` elements): `None`
/// when no lag stands out. Lags `p = 16, 32, … ≤ min(8192, len − 2048)`;
/// `D(p) = Σ_{i<2048} |e_i − e_{i+p}|`; a period only if `8·Dmin·L < 7·ΣD` (the best
/// lag at least 1/8 below the mean of the `L` lags), then the smallest `p` with
/// `4·D(p) ≤ 5·Dmin` (multiples of a period score alike: take the fundamental). A
/// period that divides 16 is not found (every lag is its multiple).
pub fn find_period(e: &[u8]) -> Option<usize> {
    if e.len() < LAG_N + PMIN {
        return None;
    }
    let pmax = PMAX.min(e.len() - LAG_N) / PMIN * PMIN;
    let a = &e[..LAG_N];
    let mut d = [0u32; PMAX / PMIN];
    let nl = pmax / PMIN;
    for (k, dk) in d.iter_mut().enumerate().take(nl) {
        let b = &e[(k + 1) * PMIN..(k + 1) * PMIN + LAG_N];
        *dk = sad(a, b);
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

/// `Σ |a_i − b_i|` (vectorises to `psadbw` with AVX2 or SSE2).
#[inline(always)]
fn sad(a: &[u8], b: &[u8]) -> u32 {
    let mut s = 0u32;
    for (ca, cb) in a.chunks_exact(64).zip(b.chunks_exact(64)) {
        let mut t = 0u16;
        for (&x, &y) in ca.iter().zip(cb.iter()) {
            t += x.abs_diff(y) as u16;
        }
        s += t as u32;
    }
    s
}

/// Column offsets for period `p` from exponent fields `e`: per column `j`, `S_j` and
/// `n_j`, the sum and count of the nonzero `e_i` with `i mod p = j`;
/// `ref = floor(ΣS / Σn)`; `c_j = clamp(floor((2(S_j − ref·n_j) + n_j) / (2 n_j)),
/// −8, 7)` (the column mean minus `ref`, rounded half up), 0 where `n_j = 0`.
/// `None` if every `e_i` is 0.
pub fn column_offsets(e: &[u8], p: usize) -> Option<ColTab> {
    let mut s = vec_sum(e, p);
    let (tot, cnt) = s.iter().fold((0u64, 0u64), |a, &(x, y)| (a.0 + x as u64, a.1 + y as u64));
    if cnt == 0 {
        return None;
    }
    let r = (tot / cnt) as i64;
    let mut ct = ColTab { p, off: [0; PMAX] };
    for (j, (sj, nj)) in s.drain(..).enumerate() {
        if nj == 0 {
            continue;
        }
        let (sj, nj) = (sj as i64, nj as i64);
        let c = (2 * (sj - r * nj) + nj).div_euclid(2 * nj);
        ct.off[j] = c.clamp(-8, 7) as i8;
    }
    Some(ct)
}

/// Per column of period `p`: (sum, count) of the nonzero values of `e`, row by row
/// (each row is a vector add).
fn vec_sum(e: &[u8], p: usize) -> Vec<(u32, u32)> {
    let mut s = vec![0u32; p];
    let mut n = vec![0u32; p];
    for row in e.chunks(p) {
        for ((sj, nj), &x) in s.iter_mut().zip(n.iter_mut()).zip(row.iter()) {
            *sj += x as u32;
            *nj += (x != 0) as u32;
        }
    }
    s.into_iter().zip(n).collect()
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
        Dtype::Raw => None,
    }
}

fn table_for<T: V2>(src: &[u8], b: usize) -> Option<ColTab> {
    if src.len() < T::W * (LAG_N + PMIN) + T::W {
        return None;
    }
    // the grid of block 0 (its phase, V2.7 step 3): element i is in column i mod P
    let phi = crate::v2::choose_phase::<T>(&src[..src.len().min(b)]).0;
    let src = &src[phi..];
    let m = src.len() / T::W;
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        let nw = m.min(WINDOW);
        s.keys.clear();
        let sh = eshift::<T>();
        s.keys.extend(
            src[..nw * T::W]
                .chunks_exact(T::W)
                .map(|xb| ((T::load(xb, 0) >> sh) & T::EMAX) as u8),
        );
        // exponent fields 0 (zeros, subnormals) take the mean of the others in the
        // search, so that scattered zeros or zero lines do not drown the channels
        let (tot, cnt) = s.keys.iter().fold((0u64, 0u64), |a, &e| (a.0 + e as u64, a.1 + (e != 0) as u64));
        if cnt == 0 {
            return None;
        }
        let r = (tot / cnt) as u8;
        s.search.clear();
        s.search.extend(s.keys.iter().map(|&e| if e == 0 { r } else { e }));
        let p = find_period(&s.search)?;
        let ct = column_offsets(&s.keys, p)?;
        // the gain: stride-13 sample over the first min(m, 13·16384) elements
        let ms = m.min(SAMPLE_STRIDE * GAIN_SAMPLES);
        let (mut hp, mut hc) = ([0u32; 256], [0u32; 256]);
        let (mut nzero, mut lo_or, mut count) = (0u64, 0u32, 0u64);
        let mut col = 0usize;
        for i in (0..ms).step_by(SAMPLE_STRIDE) {
            let x = T::load(src, i);
            let e = (x >> sh) & T::EMAX;
            hp[e as usize] += 1;
            hc[rot::<false>(e, ct.off[col], T::EMAX) as usize] += 1;
            nzero += (x == 0) as u64;
            lo_or |= x;
            count += 1;
            col += SAMPLE_STRIDE;
            if col >= p {
                col -= p;
            }
        }
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
        (0..n).flat_map(|i| bf16(r.gauss() * scales[i % p])).collect()
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
            let mut c = ColTab { p: 37, off: [0; PMAX] };
            for j in 0..37 {
                c.off[j] = (r.next() % 16) as i8 - 8;
            }
            c
        };
        let d: Vec<u8> = (0..4 * 1000).map(|_| r.next() as u8).collect();
        let mut b = d.clone();
        rotate::<Bf16, false>(&mut b, 11, &ct);
        assert_ne!(b, d);
        rotate::<Bf16, true>(&mut b, 11, &ct);
        assert_eq!(b, d);
        rotate::<Fp16, false>(&mut b, 3, &ct);
        rotate::<Fp16, true>(&mut b, 3, &ct);
        assert_eq!(b, d);
        rotate::<Fp32, false>(&mut b, 40, &ct);
        rotate::<Fp32, true>(&mut b, 40, &ct);
        assert_eq!(b, d);
    }

    #[test]
    fn table_bytes_round_trip() {
        for p in [16usize, 17, 385, 8192] {
            let mut ct = ColTab { p, off: [0; PMAX] };
            for j in 0..p {
                ct.off[j] = ((j * 5) % 16) as i8 - 8;
            }
            let mut b = vec![0u8; ct.bytes()];
            ct.write(&mut b);
            let (c2, len) = ColTab::read(&b).unwrap();
            assert_eq!(len, ct.bytes());
            assert_eq!(c2.p, p);
            assert_eq!(&c2.off[..p], &ct.off[..p]);
        }
        assert!(ColTab::read(&[15, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(ColTab::read(&[0x01, 0x20, 0]).is_err());
        assert!(matches!(ColTab::read(&[16, 0, 0]), Err(CodecError::Truncated)));
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
