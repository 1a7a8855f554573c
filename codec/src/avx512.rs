//! AVX-512 pieces of version 2's encoder (AVX-512 F, BW, VL, VBMI and VBMI2: 32-lane masks
//! and byte compression). Same bytes as the AVX2 and scalar paths, by construction
//! and by test (`tests/v2_avx512.rs` codes every case both ways).
//!
//! They run where the CPU has the features and `NCCL_ZIP_CODEC_AVX512` is not `0`
//! ([`enabled`]); [`set_enabled`] switches them for tests and benchmarks.

use std::sync::atomic::{AtomicU8, Ordering};

/// A process-wide on/off switch for a vector path: first read from what the CPU has
/// and an environment variable (`0`: off), read once; tests and benchmarks set it.
pub(crate) struct Switch {
    /// 0: not yet known; 1: off; 2: on.
    state: AtomicU8,
    var: &'static str,
}

impl Switch {
    pub(crate) const fn new(var: &'static str) -> Switch {
        Switch {
            state: AtomicU8::new(0),
            var,
        }
    }

    /// Whether the path is on: where `avail()` and the variable is not `0`, unless
    /// [`Switch::set`] said otherwise.
    #[inline]
    pub(crate) fn get(&self, avail: impl Fn() -> bool) -> bool {
        match self.state.load(Ordering::Relaxed) {
            0 => {
                let off = std::env::var(self.var).is_ok_and(|v| v.trim() == "0");
                let on = avail() && !off;
                self.set(on);
                on
            }
            s => s == 2,
        }
    }

    pub(crate) fn set(&self, on: bool) {
        self.state.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    }
}

static SWITCH: Switch = Switch::new("NCCL_ZIP_CODEC_AVX512");

fn cpu_has() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vbmi")
            && std::is_x86_feature_detected!("avx512vbmi2")
            && std::is_x86_feature_detected!("bmi1")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the encoder takes its AVX-512 paths: the CPU has AVX-512 F, BW, VL, VBMI and VBMI2,
/// and `NCCL_ZIP_CODEC_AVX512` is not `0` (read once).
#[inline]
pub(crate) fn enabled() -> bool {
    SWITCH.get(cpu_has)
}

/// Whether blocks of `mode` take the AVX-512 paths of `Z` (the encoder's split with
/// its compaction, the decoder's spread and join): bf16 and fp32 where [`enabled`].
#[inline]
pub(crate) fn z_paths(mode: u8) -> bool {
    z_mode(mode) && enabled()
}

/// Whether blocks of `mode` have vector paths of `Z` at all (bf16 and fp32, x86-64).
#[inline]
pub(crate) fn z_mode(mode: u8) -> bool {
    use crate::format::{MODE_BF16, MODE_FP32};
    cfg!(target_arch = "x86_64") && (mode == MODE_BF16 || mode == MODE_FP32)
}

/// Turns the AVX-512 paths on (where the CPU has them) or off, for the whole
/// process; returns whether they are on. For tests and benchmarks that compare the
/// paths: frames are the same bytes either way.
pub fn set_enabled(on: bool) -> bool {
    let on = on && cpu_has();
    SWITCH.set(on);
    on
}

/// A byte permute's index vector: byte `i` is `f(i)`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn byte_index(f: impl Fn(usize) -> usize) -> std::arch::x86_64::__m512i {
    let ix: [u8; 64] = std::array::from_fn(|i| f(i) as u8);
    std::arch::x86_64::_mm512_loadu_si512(ix.as_ptr() as *const _)
}

/// Of 64 elements' top bytes, byte 3 (`b3`) and 2 (`b2`) of fp32 (bytes 1 and 0 of
/// bf16), per byte: the key (the exponent field, `b3 << 1 | b2 >> 7`) and plane
/// 1's byte (sign and mantissa top, `b3 & 0x80 | b2 & 0x7F`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn key_p1(
    b3: std::arch::x86_64::__m512i,
    b2: std::arch::x86_64::__m512i,
) -> [std::arch::x86_64::__m512i; 2] {
    use std::arch::x86_64::*;
    let ones = _mm512_set1_epi8(1);
    let m80 = _mm512_set1_epi8(0x80u8 as i8);
    // (16-bit shift: the bit it moves into a byte from the next is masked off)
    let top = _mm512_srli_epi16::<7>(b2);
    [
        _mm512_ternarylogic_epi32::<0xF8>(_mm512_add_epi8(b3, b3), top, ones),
        _mm512_ternarylogic_epi32::<0xCA>(m80, b3, b2),
    ]
}

/// Whether one of the four 16-bit parts of `nz` (a mask of elements that are not 0)
/// is 0.
#[inline(always)]
fn has_zero16(nz: u64) -> bool {
    (nz.wrapping_sub(0x0001_0001_0001_0001) & !nz & 0x8000_8000_8000_8000) != 0
}

/// bf16 under `Z` (FORMAT.md §V2.7): for elements `0 .. n` of `src` (`n` a multiple
/// of 32), `keys[i]` is element `i`'s exponent field, and the plane byte (sign,
/// mantissa) of each element that is not 0 is appended to `p1` at `q`. Returns the
/// new `q`, the number of elements equal to 0, whether an element that is not 0
/// has exponent field 0 (an escaped `e = 0`), and whether a step of 64 source bytes
/// was all zero (a zero line, where `src` starts on one). 64 elements a step (bytes
/// gathered by plane, then per byte), the last 32 alone.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL, VBMI, VBMI2, AVX2, BMI1, BMI2 and POPCNT ([`enabled`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
pub(crate) unsafe fn split_z_bf16(
    src: &[u8],
    n: usize,
    keys: &mut [u8],
    p1: &mut [u8],
    mut q: usize,
) -> (usize, u32, bool, bool) {
    use std::arch::x86_64::*;
    // every store below (64 bytes at q <= q0 + 64·g; 32 at q <= q0 + n − 32) stays
    // inside p1
    assert!(n.is_multiple_of(32) && src.len() >= 2 * n && keys.len() >= n && p1.len() >= q + n);
    // from two vectors (elements 0..32, 32..64): byte i is element i's byte 0 (1)
    let (ilo, ihi) = (byte_index(|i| 2 * i), byte_index(|i| 2 * i + 1));
    let (mut nzs, mut e0, mut zl) = (0u32, false, false);
    for g in 0..n / 64 {
        let a = _mm512_loadu_si512(src.as_ptr().add(128 * g) as *const _);
        let b = _mm512_loadu_si512(src.as_ptr().add(128 * g + 64) as *const _);
        let (lo, hi) = (
            _mm512_permutex2var_epi8(a, ilo, b),
            _mm512_permutex2var_epi8(a, ihi, b),
        );
        let nz = _mm512_test_epi8_mask(_mm512_or_si512(lo, hi), _mm512_set1_epi8(-1));
        let [k, pb] = key_p1(hi, lo);
        e0 |= _mm512_mask_testn_epi8_mask(nz, k, k) != 0;
        // a line is 32 elements
        zl |= nz as u32 == 0 || (nz >> 32) as u32 == 0;
        _mm512_storeu_si512(keys.as_mut_ptr().add(64 * g) as *mut _, k);
        let c = _mm512_maskz_compress_epi8(nz, pb);
        _mm512_storeu_si512(p1.as_mut_ptr().add(q) as *mut _, c);
        let cnt = nz.count_ones();
        q += cnt as usize;
        nzs += cnt;
    }
    let m7f = _mm512_set1_epi16(0x7F);
    let m80 = _mm512_set1_epi16(0x80);
    let fexp = _mm512_set1_epi16(0x7F80);
    for g in 2 * (n / 64)..n / 32 {
        let x = _mm512_loadu_si512(src.as_ptr().add(64 * g) as *const _);
        let nz = _mm512_test_epi16_mask(x, x);
        e0 |= _mm512_mask_testn_epi16_mask(nz, x, fexp) != 0;
        let k = _mm512_cvtepi16_epi8(_mm512_srli_epi16::<7>(x));
        _mm256_storeu_si256(keys.as_mut_ptr().add(32 * g) as *mut __m256i, k);
        let pb = _mm512_or_si512(
            _mm512_and_si512(x, m7f),
            _mm512_and_si512(_mm512_srli_epi16::<8>(x), m80),
        );
        zl |= nz == 0;
        let c = _mm256_maskz_compress_epi8(nz, _mm512_cvtepi16_epi8(pb));
        _mm256_storeu_si256(p1.as_mut_ptr().add(q) as *mut __m256i, c);
        let cnt = nz.count_ones();
        q += cnt as usize;
        nzs += cnt;
    }
    (q, n as u32 - nzs, e0, zl)
}

/// fp32 under `Z`, as [`split_z_bf16`]: keys, and the bytes of the three planes
/// (sign and mantissa top, mantissa middle, mantissa low) of each element that is
/// not 0 appended to `p1`, `lo1`, `lo0` at `q`; `n` a multiple of 16. Returns as
/// [`split_z_bf16`], and the OR of the elements' low 16 bits (planes `lo1`, `lo0`).
/// 64 elements a step (bytes gathered by plane, then per byte), the last 16s alone.
///
/// # Safety
/// As [`split_z_bf16`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
pub(crate) unsafe fn split_z_fp32(
    src: &[u8],
    n: usize,
    keys: &mut [u8],
    planes: [&mut [u8]; 3],
    mut q: usize,
) -> (usize, u32, bool, bool, u32) {
    use std::arch::x86_64::*;
    // every store below (64 bytes at q <= q0 + 64·g; 16 at q <= q0 + n − 16) stays
    // inside the planes
    assert!(
        n.is_multiple_of(16)
            && src.len() >= 4 * n
            && keys.len() >= n
            && planes.iter().all(|p| p.len() >= q + n)
    );
    let [p1, lo1, lo0] = planes;
    // from two vectors (32 elements): bytes 0..32 are the elements' byte 0, bytes
    // 32..64 their byte 1 (`i01`); bytes 2 and 3 (`i23`)
    let i01 = byte_index(|i| 4 * (i % 32) + i / 32);
    let i23 = byte_index(|i| 4 * (i % 32) + 2 + i / 32);
    let (mut nzs, mut e0, mut zl) = (0u32, false, false);
    // ORs of plane bytes 0 and 1 (64-element steps), of the last elements
    let (mut or0, mut or1, mut or_lo) = (
        _mm512_setzero_si512(),
        _mm512_setzero_si512(),
        _mm512_setzero_si512(),
    );
    for g in 0..n / 64 {
        let ld = |k: usize| _mm512_loadu_si512(src.as_ptr().add(256 * g + 64 * k) as *const _);
        let (x0, x1, x2, x3) = (ld(0), ld(1), ld(2), ld(3));
        // bytes 0 and 1 (2 and 3) of elements 0..32 and of 32..64
        let (l01, h01) = (
            _mm512_permutex2var_epi8(x0, i01, x1),
            _mm512_permutex2var_epi8(x2, i01, x3),
        );
        let (l23, h23) = (
            _mm512_permutex2var_epi8(x0, i23, x1),
            _mm512_permutex2var_epi8(x2, i23, x3),
        );
        let b0 = _mm512_shuffle_i64x2::<0x44>(l01, h01);
        let b1 = _mm512_shuffle_i64x2::<0xEE>(l01, h01);
        let b2 = _mm512_shuffle_i64x2::<0x44>(l23, h23);
        let b3 = _mm512_shuffle_i64x2::<0xEE>(l23, h23);
        let lo = _mm512_or_si512(b0, b1);
        (or0, or1) = (_mm512_or_si512(or0, b0), _mm512_or_si512(or1, b1));
        let nz = _mm512_test_epi8_mask(
            _mm512_ternarylogic_epi32::<0xFE>(lo, b2, b3),
            _mm512_set1_epi8(-1),
        );
        let [k, pb] = key_p1(b3, b2);
        e0 |= _mm512_mask_testn_epi8_mask(nz, k, k) != 0;
        // a line is 16 elements
        zl |= has_zero16(nz);
        _mm512_storeu_si512(keys.as_mut_ptr().add(64 * g) as *mut _, k);
        for (p, v) in [(&mut *p1, pb), (&mut *lo1, b1), (&mut *lo0, b0)] {
            let c = _mm512_maskz_compress_epi8(nz, v);
            _mm512_storeu_si512(p.as_mut_ptr().add(q) as *mut _, c);
        }
        let cnt = nz.count_ones();
        q += cnt as usize;
        nzs += cnt as u32;
    }
    let m7f = _mm512_set1_epi32(0x7F);
    let m80 = _mm512_set1_epi32(0x80);
    let fexp = _mm512_set1_epi32(0x7F80_0000);
    for g in 4 * (n / 64)..n / 16 {
        let x = _mm512_loadu_si512(src.as_ptr().add(64 * g) as *const _);
        or_lo = _mm512_or_si512(or_lo, x);
        let nz = _mm512_test_epi32_mask(x, x);
        e0 |= _mm512_mask_testn_epi32_mask(nz, x, fexp) != 0;
        zl |= nz == 0;
        let k = _mm512_cvtepi32_epi8(_mm512_srli_epi32::<23>(x));
        _mm_storeu_si128(keys.as_mut_ptr().add(16 * g) as *mut __m128i, k);
        let pb = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<16>(x), m7f),
            _mm512_and_si512(_mm512_srli_epi32::<24>(x), m80),
        );
        for (p, v) in [
            (&mut *p1, pb),
            (&mut *lo1, _mm512_srli_epi32::<8>(x)),
            (&mut *lo0, x),
        ] {
            let c = _mm_maskz_compress_epi8(nz, _mm512_cvtepi32_epi8(v));
            _mm_storeu_si128(p.as_mut_ptr().add(q) as *mut __m128i, c);
        }
        let cnt = nz.count_ones();
        q += cnt as usize;
        nzs += cnt;
    }
    let byte_or = |v: __m512i| {
        let w = _mm512_reduce_or_epi32(v) as u32;
        let w = w | (w >> 16);
        (w | (w >> 8)) & 0xFF
    };
    let lo16 = (byte_or(or1) << 8) | byte_or(or0) | (_mm512_reduce_or_epi32(or_lo) as u32 & 0xFFFF);
    (q, n as u32 - nzs, e0, zl, lo16)
}

/// Detection's pass over its `g` groups of 64 bytes (`v2::detect_groups`): the
/// statistics of `v2::group_stats` for each group that is not all one byte, the
/// 16-bit words at φ = 1 by one byte permute, the per-word fields by masks, the ORs
/// kept in vectors until the end; only the histograms are counted per word.
/// Returns how many groups were counted.
///
/// # Safety
/// As [`split_z_bf16`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
pub(crate) unsafe fn detect_groups(
    src: &[u8],
    g: usize,
    st: &mut [crate::v2::Stats; 8],
    h: &mut crate::v2::GroupHists,
    sub: &mut [u64; 2],
) -> u64 {
    use std::arch::x86_64::*;
    let units = src.len() / 64;
    // φ = 1: bytes 1 ..= 62 moved down one (bytes 62 and 63 zero: word 31 is none)
    let ix1 = byte_index(|i| (i + 1).min(63));
    // words moved down one: the 32-bit words at bytes 2 + 4i (fp32 at φ + 2)
    let mut iw = [0u16; 32];
    for (i, v) in iw.iter_mut().enumerate() {
        *v = (i as u16 + 1).min(31);
    }
    let iw1 = _mm512_loadu_si512(iw.as_ptr() as *const _);
    let (c7c00, c7fff) = (_mm512_set1_epi16(0x7C00), _mm512_set1_epi16(0x7FFF));
    // per φ: the OR of its words; of fp32's elements at φ; at φ + 2
    let mut or16 = [_mm512_setzero_si512(); 2];
    let mut or32 = [_mm512_setzero_si512(); 2];
    let mut or32s = [_mm512_setzero_si512(); 2];
    let mut eb = [0u16; 32];
    let mut used = 0u64;
    for j in 0..g {
        let off = 64 * (j * units / g);
        let s = &src[off..off + 64];
        let x0 = _mm512_loadu_si512(s.as_ptr() as *const _);
        if _mm512_cmpneq_epi8_mask(x0, _mm512_set1_epi8(s[0] as i8)) == 0 {
            continue;
        }
        used += 1;
        h.byte0[s[0] as usize] += 1;
        for phi in 0..2 {
            let x = if phi == 0 {
                x0
            } else {
                _mm512_maskz_permutexvar_epi8((1u64 << 62) - 1, ix1, x0)
            };
            _mm512_storeu_si512(eb.as_mut_ptr() as *mut _, _mm512_srli_epi16::<7>(x));
            let subm = _mm512_testn_epi16_mask(x, c7c00) & _mm512_test_epi16_mask(x, c7fff);
            sub[phi] += subm.count_ones() as u64;
            h.add_words(phi, &eb);
            crate::v2::group_counts(phi, _mm512_testn_epi16_mask(x, x), st);
            or16[phi] = _mm512_or_si512(or16[phi], x);
            // fp32 at φ: elements 0 .. (64 − φ) / 4; at φ + 2: 0 .. 15
            let m0: u16 = if phi == 0 { 0xFFFF } else { 0x7FFF };
            or32[phi] = _mm512_mask_or_epi32(or32[phi], m0, or32[phi], x);
            let x2 = _mm512_permutexvar_epi16(iw1, x);
            or32s[phi] = _mm512_mask_or_epi32(or32s[phi], 0x7FFF, or32s[phi], x2);
        }
    }
    for phi in 0..2 {
        let w = _mm512_reduce_or_epi32(or16[phi]) as u32;
        let w = (w & 0xFFFF) | (w >> 16);
        for (c, or) in [
            (phi, w),
            (2 + phi, w),
            (4 + phi, _mm512_reduce_or_epi32(or32[phi]) as u32),
            (6 + phi, _mm512_reduce_or_epi32(or32s[phi]) as u32),
        ] {
            st[c].lo_or |= or;
        }
    }
    used
}

/// Per-block symbol tables for [`code_keys`]: code word and code length of each
/// symbol (16-bit lanes, entries `0 .. NSYM`), and the anchor in every byte.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Tables {
    words: std::arch::x86_64::__m512i,
    lens: std::arch::x86_64::__m512i,
    anchor: std::arch::x86_64::__m512i,
}

#[cfg(target_arch = "x86_64")]
impl Tables {
    /// The tables of a code (`lens`, canonical `words`) anchored at `a`.
    ///
    /// # Safety
    /// As [`split_z_bf16`].
    #[target_feature(
        enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2"
    )]
    pub(crate) unsafe fn for_code(
        lens: &[u8; crate::codes::NSYM],
        words: &[u16; crate::codes::NSYM],
        a: u32,
    ) -> Tables {
        use std::arch::x86_64::*;
        let (mut wv, mut lv) = ([0u16; 32], [0u16; 32]);
        for s in 0..crate::codes::NSYM {
            wv[s] = words[s];
            lv[s] = lens[s] as u16;
        }
        Tables {
            words: _mm512_loadu_si512(wv.as_ptr() as *const _),
            lens: _mm512_loadu_si512(lv.as_ptr() as *const _),
            anchor: _mm512_set1_epi8(a as u8 as i8),
        }
    }
}

/// Appends the codes of `keys` (exponent fields, a multiple of 32 of them) to `w`:
/// the same bits as [`crate::encode::avx2::code_keys`], which codes any 64 keys
/// that hold an escape (`t2`, `lut`: its tables for the same code) and a last
/// 32. 64 keys per step: symbols by byte masks, code words and lengths by
/// `vpermw`, merged by variable shifts into 4-, 8- and 16-element chunks; each
/// 16-element chunk of at most 56 bits is one append (else its 8- or 4-element
/// chunks). `WIDE`: 8-element chunks (blocks with long codes; same bits).
///
/// # Safety
/// As [`split_z_bf16`], and as [`crate::encode::Bits::put`] for every 8 bytes of
/// at most 20 bits per key appended.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
pub(crate) unsafe fn code_keys<const WIDE: bool>(
    t: &Tables,
    t2: &crate::encode::avx2::VecTables,
    lut: &[u32; 256],
    keys: &[u8],
    w: &mut crate::encode::Bits,
) {
    use std::arch::x86_64::*;
    debug_assert_eq!(keys.len() % 32, 0);
    let n64 = keys.len() / 64 * 64;
    let c23 = _mm512_set1_epi8(23);
    let czero = _mm512_set1_epi8(crate::codes::ZERO as i8);
    let m16 = _mm512_set1_epi32(0xFFFF);
    let m32 = _mm512_set1_epi64(0xFFFF_FFFF);
    let ones = _mm512_set1_epi16(1);
    let c56 = _mm512_set1_epi64(56);
    // octet lanes 0, 2, 4, 6 of one vector interleaved with those of another
    let idx_ol = _mm512_setr_epi64(0, 8, 2, 10, 4, 12, 6, 14);
    // a copy whose address never escapes (its fields stay in registers)
    let mut lw = *w;
    for g in 0..n64 / 64 {
        let kb = &keys[64 * g..64 * g + 64];
        let kv = _mm512_loadu_si512(kb.as_ptr() as *const _);
        let d = _mm512_sub_epi8(t.anchor, kv);
        // as the AVX2 coder: an escape is a key e != 0 with e > A or A - e > 23
        let far = _mm512_or_si512(_mm512_subs_epu8(kv, t.anchor), _mm512_subs_epu8(d, c23));
        let nz = _mm512_test_epi8_mask(kv, kv);
        if _mm512_mask_test_epi8_mask(nz, far, far) != 0 {
            crate::encode::avx2::code_keys::<WIDE>(t2, lut, kb, &mut lw);
            continue;
        }
        let sym = _mm512_mask_mov_epi8(czero, nz, d);
        for h in 0..2 {
            let sh = if h == 0 {
                _mm512_castsi512_si256(sym)
            } else {
                _mm512_extracti64x4_epi64::<1>(sym)
            };
            let sw = _mm512_cvtepu8_epi16(sh);
            let cw = _mm512_permutexvar_epi16(sw, t.words);
            let ln = _mm512_permutexvar_epi16(sw, t.lens);
            // pairs: w0 | w1 << l0 (32-bit lanes), l0 + l1
            let pv = _mm512_or_si512(
                _mm512_and_si512(cw, m16),
                _mm512_sllv_epi32(_mm512_srli_epi32::<16>(cw), _mm512_and_si512(ln, m16)),
            );
            let pl = _mm512_madd_epi16(ln, ones);
            // quads (64-bit lanes: elements 4k .. 4k + 4, at most 48 bits)
            let q = _mm512_or_si512(
                _mm512_and_si512(pv, m32),
                _mm512_sllv_epi64(_mm512_srli_epi64::<32>(pv), _mm512_and_si512(pl, m32)),
            );
            let lq = _mm512_and_si512(_mm512_add_epi32(pl, _mm512_srli_epi64::<32>(pl)), m32);
            // octets in the even lanes (exact when at most 64 bits)
            let o = _mm512_or_si512(q, _mm512_sllv_epi64(_mm512_bsrli_epi128::<8>(q), lq));
            let l8 = _mm512_add_epi64(lq, _mm512_bsrli_epi128::<8>(lq));
            // 16-element chunks in lanes 0 and 4 (exact when at most 64 bits)
            let s16 = _mm512_or_si512(o, _mm512_sllv_epi64(_mm512_alignr_epi64::<2>(o, o), l8));
            let l16 = _mm512_add_epi64(l8, _mm512_alignr_epi64::<2>(l8, l8));
            macro_rules! lane0 {
                ($v:expr) => {
                    _mm_cvtsi128_si64(_mm512_castsi512_si128($v)) as u64
                };
            }
            macro_rules! lane4 {
                ($v:expr) => {
                    _mm_cvtsi128_si64(_mm512_extracti32x4_epi32::<2>($v)) as u64
                };
            }
            if WIDE {
                // the four octets and their lengths, interleaved, when each is at
                // most 56 bits: one store, four appends
                if _mm512_mask_cmple_epu64_mask(0x55, l8, c56) == 0x55 {
                    let mut ol = [0u64; 8];
                    let il = _mm512_permutex2var_epi64(o, idx_ol, l8);
                    _mm512_storeu_si512(ol.as_mut_ptr() as *mut _, il);
                    for j in 0..4 {
                        lw.put(ol[2 * j], ol[2 * j + 1] as u32);
                    }
                    continue;
                }
            }
            let ls = [lane0!(l16), lane4!(l16)];
            if !WIDE && ls[0] <= 56 && ls[1] <= 56 {
                lw.put(lane0!(s16), ls[0] as u32);
                lw.put(lane4!(s16), ls[1] as u32);
                continue;
            }
            let (mut qv, mut ql, mut ov, mut ol, mut sv) =
                ([0u64; 8], [0u64; 8], [0u64; 8], [0u64; 8], [0u64; 8]);
            _mm512_storeu_si512(qv.as_mut_ptr() as *mut _, q);
            _mm512_storeu_si512(ql.as_mut_ptr() as *mut _, lq);
            _mm512_storeu_si512(ov.as_mut_ptr() as *mut _, o);
            _mm512_storeu_si512(ol.as_mut_ptr() as *mut _, l8);
            _mm512_storeu_si512(sv.as_mut_ptr() as *mut _, s16);
            for c in 0..2 {
                if !WIDE && ls[c] <= 56 {
                    lw.put(sv[4 * c], ls[c] as u32);
                    continue;
                }
                for j in [4 * c, 4 * c + 2] {
                    if ol[j] <= 56 {
                        lw.put(ov[j], ol[j] as u32);
                    } else {
                        lw.put(qv[j], ql[j] as u32);
                        lw.put(qv[j + 1], ql[j + 1] as u32);
                    }
                }
            }
        }
    }
    *w = lw;
    if n64 < keys.len() {
        crate::encode::avx2::code_keys::<WIDE>(t2, lut, &keys[n64..], w);
    }
}

/// [`expand64`] for up to 32 keys.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn expand32(p: &[u8], j: usize, nz: u32) -> Option<std::arch::x86_64::__m256i> {
    // the low 32 lanes of the 64-lane spread (which reads the same bytes, or more
    // of `p` where it has them)
    expand64(p, j, nz as u64).map(|v| std::arch::x86_64::_mm512_castsi512_si256(v))
}

/// The plane bytes `p[j ..]` of the elements whose keys are not 0 (`nz`: up to 64
/// keys), spread one per element (0 under a key 0): the inverse of the encoder's
/// compaction. Reads `p[j .. j + nz.count_ones()]` only, or nothing and `None`
/// where `p` is shorter ([`expand32`] for 32 keys).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn expand64(p: &[u8], j: usize, nz: u64) -> Option<std::arch::x86_64::__m512i> {
    use std::arch::x86_64::*;
    let c = nz.count_ones();
    if j + c as usize > p.len() {
        return None;
    }
    let v = if j + 64 <= p.len() {
        _mm512_loadu_si512(p.as_ptr().add(j) as *const _)
    } else {
        _mm512_maskz_loadu_epi8(_bzhi_u64(!0, c), p.as_ptr().add(j) as *const i8)
    };
    Some(_mm512_maskz_expand_epi8(nz, v))
}

/// The low and high bytes of elements whose exponent field is `k` and whose byte
/// plane 1 (sign, top mantissa bits) is `p`, per byte: `(p & 0x7F) | (k << 7)`
/// and `(p & 0x80) | (k >> 1)` (bf16's two bytes; fp32's top two), 64 elements
/// ([`top_bytes`] for 32).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn top_bytes64(
    k: std::arch::x86_64::__m512i,
    p: std::arch::x86_64::__m512i,
) -> [std::arch::x86_64::__m512i; 2] {
    use std::arch::x86_64::*;
    let m80 = _mm512_set1_epi8(0x80u8 as i8);
    // 16-bit shifts: the bits they move across a byte are the ones masked off
    [
        _mm512_ternarylogic_epi32::<0xCA>(m80, _mm512_slli_epi16::<7>(k), p),
        _mm512_ternarylogic_epi32::<0xCA>(m80, p, _mm512_srli_epi16::<1>(k)),
    ]
}

/// Interleaving permutes (`vpermt2b`, `vpermt2w`): the `h`-th half (elements
/// `32h .. 32h + 32`) of two 64-lane vectors `a`, `b` as pairs `a[m], b[m]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn zip_index<const WORDS: bool>(h: usize) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    if WORDS {
        let ix: [u16; 32] = std::array::from_fn(|t| (32 * (t % 2) + 16 * h + t / 2) as u16);
        _mm512_loadu_si512(ix.as_ptr() as *const _)
    } else {
        byte_index(|t| 64 * (t % 2) + 32 * h + t / 2)
    }
}

/// [`top_bytes64`] for 32 elements.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
unsafe fn top_bytes(
    k: std::arch::x86_64::__m256i,
    p: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 2] {
    use std::arch::x86_64::*;
    // the low 32 lanes of the 64-lane form
    top_bytes64(_mm512_castsi256_si512(k), _mm512_castsi256_si512(p))
        .map(|v| _mm512_castsi512_si256(v))
}

/// bf16 under `Z`, the inverse of [`split_z_bf16`]: element `i` of `out` from
/// `keys[i]` and, where that key is not 0, the next byte of `p1` (elements whose
/// key is 0 are 0; the caller refused escaped `e = 0`). Writes `out[.. 2·keys.len()]`;
/// returns whether `p1` holds exactly one byte per key that is not 0 (if not, what
/// was written is not the block's: the caller decodes it another way).
///
/// # Safety
/// As [`split_z_bf16`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
pub(crate) unsafe fn join_z_bf16(keys: &[u8], p1: &[u8], out: &mut [u8]) -> bool {
    use std::arch::x86_64::*;
    let n = keys.len();
    assert!(out.len() >= 2 * n);
    // byte 2k + t of the output: byte k of part t (low bytes, high bytes)
    let ix = byte_index(|b| 32 * (b % 2) + b / 2);
    let (mut i, mut j) = (0, 0);
    // 64 keys a step: the two output halves by one `vpermt2b` each
    let (z0, z1) = (zip_index::<false>(0), zip_index::<false>(1));
    while i + 64 <= n {
        let kv = _mm512_loadu_si512(keys.as_ptr().add(i) as *const _);
        let nz = _mm512_test_epi8_mask(kv, kv);
        let Some(pe) = expand64(p1, j, nz) else {
            return false;
        };
        let [b0, b1] = top_bytes64(kv, pe);
        let o = out.as_mut_ptr().add(2 * i);
        _mm512_storeu_si512(o as *mut _, _mm512_permutex2var_epi8(b0, z0, b1));
        _mm512_storeu_si512(o.add(64) as *mut _, _mm512_permutex2var_epi8(b0, z1, b1));
        j += nz.count_ones() as usize;
        i += 64;
    }
    while i < n {
        let lm = _bzhi_u32(!0, (n - i).min(32) as u32);
        let kv = _mm256_maskz_loadu_epi8(lm, keys.as_ptr().add(i) as *const i8);
        let nz = _mm256_test_epi8_mask(kv, kv);
        let Some(pe) = expand32(p1, j, nz) else {
            return false;
        };
        let [b0, b1] = top_bytes(kv, pe);
        let x =
            _mm512_permutexvar_epi8(ix, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(b0), b1));
        _mm512_mask_storeu_epi16(out.as_mut_ptr().add(2 * i) as *mut i16, lm, x);
        j += nz.count_ones() as usize;
        i += 32;
    }
    j == p1.len()
}

/// fp32 under `Z`, the inverse of [`split_z_fp32`]: as [`join_z_bf16`] with three
/// planes (an empty `lo1` or `lo0`: an omitted plane, all 0). Writes
/// `out[.. 4·keys.len()]`; returns as [`join_z_bf16`] (each plane that is not
/// empty holds one byte per key that is not 0).
///
/// # Safety
/// As [`join_z_bf16`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt,avx2,bmi1,bmi2")]
pub(crate) unsafe fn join_z_fp32(
    keys: &[u8],
    p1: &[u8],
    lo1: &[u8],
    lo0: &[u8],
    out: &mut [u8],
) -> bool {
    use std::arch::x86_64::*;
    let n = keys.len();
    assert!(out.len() >= 4 * n);
    // byte 4k + t of the output: byte k of part t (lo0, lo1, then the top bytes)
    let ix = byte_index(|b| 16 * (b % 4) + b / 4);
    let (mut i, mut j) = (0, 0);
    // 64 keys a step: byte pairs (lo0, lo1) and (top bytes) by `vpermt2b`, then the
    // four output quarters from the pairs by `vpermt2w`
    let (z0, z1) = (zip_index::<false>(0), zip_index::<false>(1));
    let (w0, w1) = (zip_index::<true>(0), zip_index::<true>(1));
    // a plane's bytes spread under the mask `nz` (an omitted plane: 0)
    macro_rules! plane {
        ($p:expr, $nz:expr) => {
            if $p.is_empty() {
                _mm512_setzero_si512()
            } else {
                let Some(v) = expand64($p, j, $nz) else {
                    return false;
                };
                v
            }
        };
    }
    while i + 64 <= n {
        let kv = _mm512_loadu_si512(keys.as_ptr().add(i) as *const _);
        let nz = _mm512_test_epi8_mask(kv, kv);
        let [b2, b3] = top_bytes64(kv, plane!(p1, nz));
        let (l0, l1) = (plane!(lo0, nz), plane!(lo1, nz));
        let o = out.as_mut_ptr().add(4 * i);
        for (h, z) in [z0, z1].into_iter().enumerate() {
            let lo = _mm512_permutex2var_epi8(l0, z, l1);
            let hi = _mm512_permutex2var_epi8(b2, z, b3);
            _mm512_storeu_si512(
                o.add(128 * h) as *mut _,
                _mm512_permutex2var_epi16(lo, w0, hi),
            );
            _mm512_storeu_si512(
                o.add(128 * h + 64) as *mut _,
                _mm512_permutex2var_epi16(lo, w1, hi),
            );
        }
        j += nz.count_ones() as usize;
        i += 64;
    }
    while i < n {
        let lm = _bzhi_u32(!0, (n - i).min(16) as u32);
        let kv = _mm256_maskz_loadu_epi8(lm, keys.as_ptr().add(i) as *const i8);
        let nz = _mm256_test_epi8_mask(kv, kv);
        let pl32 = |v: __m512i| _mm512_castsi512_si256(v);
        let [b2, b3] = top_bytes(kv, pl32(plane!(p1, nz as u64)));
        let lo = _mm256_inserti128_si256::<1>(
            pl32(plane!(lo0, nz as u64)),
            _mm256_castsi256_si128(pl32(plane!(lo1, nz as u64))),
        );
        let hi = _mm256_inserti128_si256::<1>(b2, _mm256_castsi256_si128(b3));
        let x =
            _mm512_permutexvar_epi8(ix, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
        _mm512_mask_storeu_epi32(out.as_mut_ptr().add(4 * i) as *mut i32, lm as u16, x);
        j += nz.count_ones() as usize;
        i += 16;
    }
    j == p1.len() && [lo1, lo0].iter().all(|p| p.is_empty() || p.len() == j)
}
