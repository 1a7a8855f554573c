//! AVX2 forms of version 2's `Z` split and join (FORMAT.md §V2.7) for bf16 and fp32:
//! the same results as the AVX-512 ones ([`crate::avx512::split_z_bf16`] and the
//! others), for CPUs without AVX-512. 32 elements a step, one line of bf16 (two of
//! fp32): the planes' bytes are gathered per byte, and each group of 8 is compacted
//! (encoder) or spread (decoder) by one byte shuffle whose control comes from a
//! table indexed by the group's 8-bit mask of elements that are not 0.
//!
//! They run where the CPU has AVX2 (the callers are compiled for it) unless
//! `NCCL_ZIP_CODEC_AVX2_Z=0` or [`set_enabled`] turned them off: the older path,
//! version 1's split then an 8-byte compaction (and a spread then version 1's
//! join), stays for fp16 and for tests and benchmarks that compare the two (same
//! bytes).

static SWITCH: crate::avx512::Switch = crate::avx512::Switch::new("NCCL_ZIP_CODEC_AVX2_Z");

/// Turns the AVX2 `Z` paths on or off for the whole process (tests and benchmarks
/// that compare them with the older path: frames are the same bytes either way).
pub fn set_enabled(on: bool) {
    SWITCH.set(on);
}

/// Whether blocks of `mode` take these paths where AVX-512's are off: bf16 and fp32.
#[inline]
pub(crate) fn z_paths(mode: u8) -> bool {
    crate::avx512::z_mode(mode) && SWITCH.get(|| true)
}

#[cfg(target_arch = "x86_64")]
pub(crate) use imp::*;

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    /// Shuffle controls by an 8-bit mask of kept bytes: `COMPACT[m]` gathers them
    /// to the front, `EXPAND[m]` spreads the front bytes to them (0x80: a zero).
    const COMPACT: [[u8; 8]; 256] = crate::v2::shuffles(false);
    const EXPAND: [[u8; 8]; 256] = crate::v2::shuffles(true);

    /// The `vpshufb` control for 32 bytes in four groups of 8, each by its byte of
    /// `m` through `t`: groups 1 and 3 are the upper halves of their 128-bit lanes
    /// (their indices + 8; a 0x80 stays a zero).
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn control(t: &[[u8; 8]; 256], m: u32) -> __m256i {
        let e =
            |g: u32| _mm_loadl_epi64(t[(m >> (8 * g)) as usize & 0xFF].as_ptr() as *const __m128i);
        let lo = _mm_unpacklo_epi64(e(0), e(1));
        let hi = _mm_unpacklo_epi64(e(2), e(3));
        let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
        _mm256_or_si256(
            v,
            _mm256_setr_epi64x(0, 0x0808_0808_0808_0808, 0, 0x0808_0808_0808_0808),
        )
    }

    /// Where groups 1, 2 and 3 of a 32-element step start among the kept bytes
    /// (counts of `m`'s bits below them).
    #[inline(always)]
    fn offsets(m: u32) -> [usize; 3] {
        [
            (m & 0xFF).count_ones() as usize,
            (m & 0xFFFF).count_ones() as usize,
            (m & 0xFF_FFFF).count_ones() as usize,
        ]
    }

    /// Stores the four 8-byte groups of `c` (each compacted to its front) at `p + q`
    /// and the three `offsets` after it: writes `p[q .. q + off[2] + 8]`, of which
    /// the first `m.count_ones()` bytes are the kept ones (`groups`: 2 for the
    /// low lane only).
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn store_groups(p: *mut u8, q: usize, off: [usize; 3], c: __m256i, groups: usize) {
        let lo = _mm256_castsi256_si128(c);
        _mm_storel_epi64(p.add(q) as *mut __m128i, lo);
        _mm_storeh_pd(p.add(q + off[0]) as *mut f64, _mm_castsi128_pd(lo));
        if groups == 4 {
            let hi = _mm256_extracti128_si256::<1>(c);
            _mm_storel_epi64(p.add(q + off[1]) as *mut __m128i, hi);
            _mm_storeh_pd(p.add(q + off[2]) as *mut f64, _mm_castsi128_pd(hi));
        }
    }

    /// Bit `t` set where byte `t` of `v` is 0.
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn zero_bytes(v: __m256i) -> u32 {
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_setzero_si256())) as u32
    }

    /// Per byte, from the top bytes `b3`, `b2` of fp32 elements (bytes 1, 0 of bf16):
    /// the key (the exponent field, `b3 << 1 | b2 >> 7`) and plane 1's byte (sign
    /// and mantissa top, `b3 & 0x80 | b2 & 0x7F`).
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn key_p1(b3: __m256i, b2: __m256i) -> [__m256i; 2] {
        let m80 = _mm256_set1_epi8(0x80u8 as i8);
        let ones = _mm256_set1_epi8(1);
        // (16-bit shift: the bits it moves across a byte are masked off)
        let top = _mm256_and_si256(_mm256_srli_epi16::<7>(b2), ones);
        [
            _mm256_or_si256(_mm256_add_epi8(b3, b3), top),
            _mm256_or_si256(_mm256_and_si256(b3, m80), _mm256_andnot_si256(m80, b2)),
        ]
    }

    /// The inverse of [`key_p1`]: the top bytes `[b2, b3]` from keys `k` and plane
    /// 1's bytes `p`: `(p & 0x7F) | (k << 7)` and `(p & 0x80) | (k >> 1)`.
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn top_bytes(k: __m256i, p: __m256i) -> [__m256i; 2] {
        let m80 = _mm256_set1_epi8(0x80u8 as i8);
        // 16-bit shifts: the bits they move across a byte are the ones masked off
        [
            _mm256_or_si256(
                _mm256_andnot_si256(m80, p),
                _mm256_and_si256(_mm256_slli_epi16::<7>(k), m80),
            ),
            _mm256_or_si256(
                _mm256_and_si256(p, m80),
                _mm256_andnot_si256(m80, _mm256_srli_epi16::<1>(k)),
            ),
        ]
    }

    /// bf16 under `Z`: as [`crate::avx512::split_z_bf16`] (`n` a multiple of 32;
    /// the same results), 32 elements (one line) a step.
    ///
    /// # Safety
    /// The CPU must support AVX2, BMI1, BMI2 and POPCNT.
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    pub(crate) unsafe fn split_z_bf16(
        src: &[u8],
        n: usize,
        keys: &mut [u8],
        p1: &mut [u8],
        mut q: usize,
    ) -> (usize, u32, bool, bool) {
        // every store below (32 bytes at q <= q0 + 32·g) stays inside p1
        assert!(n.is_multiple_of(32) && src.len() >= 2 * n && keys.len() >= n && p1.len() >= q + n);
        let mff = _mm256_set1_epi16(0xFF);
        let (mut nzs, mut e0, mut zl) = (0u32, false, false);
        for g in 0..n / 32 {
            let a = _mm256_loadu_si256(src.as_ptr().add(64 * g) as *const __m256i);
            let b = _mm256_loadu_si256(src.as_ptr().add(64 * g + 32) as *const __m256i);
            // bytes 0 and 1 of the 32 elements (`packus` works per 128-bit lane: the
            // quarters come out as 0, 2, 1, 3)
            let lo = _mm256_permute4x64_epi64::<0xD8>(_mm256_packus_epi16(
                _mm256_and_si256(a, mff),
                _mm256_and_si256(b, mff),
            ));
            let hi = _mm256_permute4x64_epi64::<0xD8>(_mm256_packus_epi16(
                _mm256_srli_epi16::<8>(a),
                _mm256_srli_epi16::<8>(b),
            ));
            let [k, pb] = key_p1(hi, lo);
            _mm256_storeu_si256(keys.as_mut_ptr().add(32 * g) as *mut __m256i, k);
            let kz = zero_bytes(k);
            let nz = !(kz & zero_bytes(pb));
            e0 |= kz & nz != 0;
            // a line is 32 elements
            zl |= nz == 0;
            let c = _mm256_shuffle_epi8(pb, control(&COMPACT, nz));
            store_groups(p1.as_mut_ptr(), q, offsets(nz), c, 4);
            let cnt = nz.count_ones();
            q += cnt as usize;
            nzs += cnt;
        }
        (q, n as u32 - nzs, e0, zl)
    }

    /// fp32 under `Z`: as [`crate::avx512::split_z_fp32`] (`n` a multiple of 16; the
    /// same results), 32 elements (two lines) a step, the last 16 alone.
    ///
    /// # Safety
    /// As [`split_z_bf16`].
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    pub(crate) unsafe fn split_z_fp32(
        src: &[u8],
        n: usize,
        keys: &mut [u8],
        planes: [&mut [u8]; 3],
        mut q: usize,
    ) -> (usize, u32, bool, bool, u32) {
        // every store below (32 bytes at q <= q0 + 32·g; 16 at q <= q0 + n − 16)
        // stays inside the planes
        assert!(
            n.is_multiple_of(16)
                && src.len() >= 4 * n
                && keys.len() >= n
                && planes.iter().all(|p| p.len() >= q + n)
        );
        let [p1, lo1, lo0] = planes;
        // per 128-bit lane (4 elements): bytes 0 of the 4, then bytes 1, 2, 3
        let tr = _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        let (mut nzs, mut e0, mut zl) = (0u32, false, false);
        let (mut or0, mut or1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let mut g = 0;
        while g < n {
            // elements g .. g + 32 (or + 16, the last alone)
            let whole = g + 32 <= n;
            let s = src.as_ptr().add(4 * g);
            // x_t: elements 4t .. 4t + 4 in its low lane, 16 + 4t .. 20 + 4t in its
            // high one, so that the unpacks below leave the elements in order
            let ld = |t: usize| {
                let l = _mm_loadu_si128(s.add(16 * t) as *const __m128i);
                let h = if whole {
                    _mm_loadu_si128(s.add(64 + 16 * t) as *const __m128i)
                } else {
                    _mm_setzero_si128()
                };
                _mm256_shuffle_epi8(
                    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(l), h),
                    tr,
                )
            };
            let (y0, y1, y2, y3) = (ld(0), ld(1), ld(2), ld(3));
            let (u01l, u01h) = (_mm256_unpacklo_epi32(y0, y1), _mm256_unpackhi_epi32(y0, y1));
            let (u23l, u23h) = (_mm256_unpacklo_epi32(y2, y3), _mm256_unpackhi_epi32(y2, y3));
            let b0 = _mm256_unpacklo_epi64(u01l, u23l);
            let b1 = _mm256_unpackhi_epi64(u01l, u23l);
            let b2 = _mm256_unpacklo_epi64(u01h, u23h);
            let b3 = _mm256_unpackhi_epi64(u01h, u23h);
            (or0, or1) = (_mm256_or_si256(or0, b0), _mm256_or_si256(or1, b1));
            let [k, pb] = key_p1(b3, b2);
            let kz = zero_bytes(k);
            let lz = zero_bytes(_mm256_or_si256(_mm256_or_si256(b0, b1), pb));
            // (a last 16's high lane is zero bytes: no bits set)
            let nz = !(kz & lz);
            let groups = if whole {
                _mm256_storeu_si256(keys.as_mut_ptr().add(g) as *mut __m256i, k);
                4
            } else {
                _mm_storeu_si128(
                    keys.as_mut_ptr().add(g) as *mut __m128i,
                    _mm256_castsi256_si128(k),
                );
                2
            };
            e0 |= kz & nz != 0;
            // a line is 16 elements
            zl |= nz & 0xFFFF == 0 || (whole && nz >> 16 == 0);
            let ctl = control(&COMPACT, nz);
            let off = offsets(nz);
            for (p, v) in [(&mut *p1, pb), (&mut *lo1, b1), (&mut *lo0, b0)] {
                store_groups(p.as_mut_ptr(), q, off, _mm256_shuffle_epi8(v, ctl), groups);
            }
            let cnt = nz.count_ones();
            q += cnt as usize;
            nzs += cnt;
            g += if whole { 32 } else { 16 };
        }
        let byte_or = |v: __m256i| {
            let mut b = [0u8; 32];
            _mm256_storeu_si256(b.as_mut_ptr() as *mut __m256i, v);
            b.iter().fold(0u8, |a, &x| a | x) as u32
        };
        (
            q,
            n as u32 - nzs,
            e0,
            zl,
            (byte_or(or1) << 8) | byte_or(or0),
        )
    }

    /// The plane bytes `p[j ..]` of the elements whose keys are not 0 (`nz`: 32
    /// keys), spread one per element (0 under a key 0). Reads `p[j .. j + 32]` where
    /// `p` has them, else only `p[j ..]`; `None` where `p` holds fewer than
    /// `nz.count_ones()` bytes from `j`.
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn expand(
        p: &[u8],
        j: usize,
        nz: u32,
        ctl: __m256i,
        off: [usize; 3],
    ) -> Option<__m256i> {
        if j + nz.count_ones() as usize > p.len() {
            return None;
        }
        let mut pad = [0u8; 32];
        let base = if j + 32 <= p.len() {
            p.as_ptr().add(j)
        } else {
            pad[..p.len() - j].copy_from_slice(&p[j..]);
            pad.as_ptr()
        };
        // groups 0 and 1 from base and base + off[0] (at most 24 + 8 bytes in all)
        let ld = |o: usize| _mm_loadl_epi64(base.add(o) as *const __m128i);
        let lo = _mm_unpacklo_epi64(ld(0), ld(off[0]));
        let hi = _mm_unpacklo_epi64(ld(off[1]), ld(off[2]));
        let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
        Some(_mm256_shuffle_epi8(v, ctl))
    }

    /// Keys `keys[i .. i + 32]`, or those left, zero-padded (a padded key is 0: it
    /// takes no plane byte).
    #[inline]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn load_keys(keys: &[u8], i: usize) -> __m256i {
        if i + 32 <= keys.len() {
            _mm256_loadu_si256(keys.as_ptr().add(i) as *const __m256i)
        } else {
            let mut pad = [0u8; 32];
            pad[..keys.len() - i].copy_from_slice(&keys[i..]);
            _mm256_loadu_si256(pad.as_ptr() as *const __m256i)
        }
    }

    /// Writes the first `len` bytes of `v` at `out[at ..]`: a last step's part (out
    /// of line, and whole steps store their vectors one by one: the compiler would
    /// otherwise make every step's stores one copy through the stack).
    #[cold]
    #[inline(never)]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    unsafe fn store_part(out: &mut [u8], at: usize, v: &[__m256i], len: usize) {
        let mut b = [0u8; 128];
        for (t, x) in v.iter().enumerate() {
            _mm256_storeu_si256(b.as_mut_ptr().add(32 * t) as *mut __m256i, *x);
        }
        out[at..at + len].copy_from_slice(&b[..len]);
    }

    /// bf16 under `Z`: as [`crate::avx512::join_z_bf16`] (the same output and
    /// result), 32 keys a step.
    ///
    /// # Safety
    /// As [`split_z_bf16`].
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    pub(crate) unsafe fn join_z_bf16(keys: &[u8], p1: &[u8], out: &mut [u8]) -> bool {
        let n = keys.len();
        assert!(out.len() >= 2 * n);
        let (mut i, mut j) = (0, 0);
        while i < n {
            let kv = load_keys(keys, i);
            let nz = !zero_bytes(kv);
            let off = offsets(nz);
            let Some(pe) = expand(p1, j, nz, control(&EXPAND, nz), off) else {
                return false;
            };
            let [b0, b1] = top_bytes(kv, pe);
            // elements 0..8 and 16..24 (lo), 8..16 and 24..32 (hi)
            let (lo, hi) = (_mm256_unpacklo_epi8(b0, b1), _mm256_unpackhi_epi8(b0, b1));
            let v0 = _mm256_permute2x128_si256::<0x20>(lo, hi);
            let v1 = _mm256_permute2x128_si256::<0x31>(lo, hi);
            if i + 32 <= n {
                let o = out.as_mut_ptr().add(2 * i) as *mut __m256i;
                _mm256_storeu_si256(o, v0);
                _mm256_storeu_si256(o.add(1), v1);
            } else {
                store_part(out, 2 * i, &[v0, v1], 2 * (n - i));
            }
            j += nz.count_ones() as usize;
            i += 32;
        }
        j == p1.len()
    }

    /// fp32 under `Z`: as [`crate::avx512::join_z_fp32`] (an empty `lo1` or `lo0`:
    /// an omitted plane, all 0; the same output and result), 32 keys a step.
    ///
    /// # Safety
    /// As [`split_z_bf16`].
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
    pub(crate) unsafe fn join_z_fp32(
        keys: &[u8],
        p1: &[u8],
        lo1: &[u8],
        lo0: &[u8],
        out: &mut [u8],
    ) -> bool {
        let n = keys.len();
        assert!(out.len() >= 4 * n);
        let (mut i, mut j) = (0, 0);
        while i < n {
            let kv = load_keys(keys, i);
            let nz = !zero_bytes(kv);
            let off = offsets(nz);
            let ctl = control(&EXPAND, nz);
            // a plane's bytes spread under `nz` (an omitted plane: 0)
            macro_rules! plane {
                ($p:expr) => {
                    if $p.is_empty() {
                        _mm256_setzero_si256()
                    } else {
                        let Some(v) = expand($p, j, nz, ctl, off) else {
                            return false;
                        };
                        v
                    }
                };
            }
            let [b2, b3] = top_bytes(kv, plane!(p1));
            let (l1, l0) = (plane!(lo1), plane!(lo0));
            // byte pairs: elements 0..8 and 16..24 (`*l`), 8..16 and 24..32 (`*h`)
            let (w01l, w01h) = (_mm256_unpacklo_epi8(l0, l1), _mm256_unpackhi_epi8(l0, l1));
            let (w23l, w23h) = (_mm256_unpacklo_epi8(b2, b3), _mm256_unpackhi_epi8(b2, b3));
            // elements 0..4 and 16..20, 4..8 and 20..24, 8..12 and 24..28, 12..16 and 28..32
            let d0 = _mm256_unpacklo_epi16(w01l, w23l);
            let d1 = _mm256_unpackhi_epi16(w01l, w23l);
            let d2 = _mm256_unpacklo_epi16(w01h, w23h);
            let d3 = _mm256_unpackhi_epi16(w01h, w23h);
            let v0 = _mm256_permute2x128_si256::<0x20>(d0, d1);
            let v1 = _mm256_permute2x128_si256::<0x20>(d2, d3);
            let v2 = _mm256_permute2x128_si256::<0x31>(d0, d1);
            let v3 = _mm256_permute2x128_si256::<0x31>(d2, d3);
            if i + 32 <= n {
                let o = out.as_mut_ptr().add(4 * i) as *mut __m256i;
                _mm256_storeu_si256(o, v0);
                _mm256_storeu_si256(o.add(1), v1);
                _mm256_storeu_si256(o.add(2), v2);
                _mm256_storeu_si256(o.add(3), v3);
            } else {
                store_part(out, 4 * i, &[v0, v1, v2, v3], 4 * (n - i));
            }
            j += nz.count_ones() as usize;
            i += 32;
        }
        j == p1.len() && [lo1, lo0].iter().all(|p| p.is_empty() || p.len() == j)
    }
}
