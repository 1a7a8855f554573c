//! Detection's pass over its groups (FORMAT.md §V2.6 "Detection") in AVX2, for CPUs
//! without AVX-512: the same statistics as the portable pass (`v2::group_stats` per
//! group) and the AVX-512 one ([`crate::avx512::detect_groups`]); a test compares
//! the three. A group of 64 bytes is two vectors; its words at φ = 1 are the bytes
//! moved down one by a lane-crossing `alignr`. The per-word fields (zero words,
//! fp16 subnormals) are byte masks packed to one bit per word; the ORs stay in
//! vectors until the end, and only the histograms are counted per word.

#[cfg(target_arch = "x86_64")]
pub(crate) use imp::*;

#[cfg(target_arch = "x86_64")]
mod imp {
    use crate::v2::{GroupHists, Stats};
    use std::arch::x86_64::*;

    /// One bit per 16-bit word of `a` (words 0 .. 16) and `b` (16 .. 32): its top
    /// bit (the words are masks, all ones or zero).
    #[inline]
    #[target_feature(enable = "avx2,popcnt")]
    unsafe fn word_bits(a: __m256i, b: __m256i) -> u32 {
        // packs interleaves the 128-bit lanes: a.lo b.lo a.hi b.hi, put in order
        let p = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi16(a, b));
        _mm256_movemask_epi8(p) as u32
    }

    /// The OR of the eight 32-bit lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx2,popcnt")]
    unsafe fn reduce_or(v: __m256i) -> u32 {
        let x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let x = _mm_or_si128(x, _mm_shuffle_epi32::<0x4E>(x));
        let x = _mm_or_si128(x, _mm_shuffle_epi32::<0xB1>(x));
        _mm_cvtsi128_si32(x) as u32
    }

    /// `v2::detect_groups` on CPUs with AVX2: the statistics of each of the `g`
    /// groups of `src` that is not all one byte into `st`, `h` and `sub`; returns
    /// how many groups were counted.
    ///
    /// # Safety
    /// The CPU must support AVX2 and POPCNT.
    #[target_feature(enable = "avx2,popcnt")]
    pub(crate) unsafe fn detect_groups(
        src: &[u8],
        g: usize,
        st: &mut [Stats; 8],
        h: &mut GroupHists,
        sub: &mut [u64; 2],
    ) -> u64 {
        let units = src.len() / 64;
        let (c7c00, c7fff) = (_mm256_set1_epi16(0x7C00), _mm256_set1_epi16(0x7FFF));
        let zero = _mm256_setzero_si256();
        // φ = 1's second vector: bytes 33 ..= 63 moved down one, then byte 63 (the
        // half of word 31, not a word) cleared, as the portable pass's zero padding
        let keep30 = _mm256_setr_epi64x(-1, -1, -1, 0x0000_FFFF_FFFF_FFFF);
        // per φ: the OR of each of the two vectors' lanes (masked at the end)
        let mut or_a = [zero; 2];
        let mut or_b = [zero; 2];
        let mut eb = [0u16; 32];
        let mut used = 0u64;
        for j in 0..g {
            let off = 64 * (j * units / g);
            let s = &src[off..off + 64];
            let p = s.as_ptr() as *const __m256i;
            let (a0, b0) = (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)));
            let first = _mm256_set1_epi8(s[0] as i8);
            let eq = _mm256_and_si256(_mm256_cmpeq_epi8(a0, first), _mm256_cmpeq_epi8(b0, first));
            if _mm256_movemask_epi8(eq) == -1 {
                continue;
            }
            used += 1;
            h.byte0[s[0] as usize] += 1;
            for phi in 0..2 {
                let (a, b) = if phi == 0 {
                    (a0, b0)
                } else {
                    // bytes 1 .. 33 and 33 .. 64 (then zeros)
                    let t = _mm256_permute2x128_si256::<0x21>(a0, b0);
                    let tb = _mm256_permute2x128_si256::<0x81>(b0, b0);
                    (
                        _mm256_alignr_epi8::<1>(t, a0),
                        _mm256_and_si256(_mm256_alignr_epi8::<1>(tb, b0), keep30),
                    )
                };
                let ep = eb.as_mut_ptr() as *mut __m256i;
                _mm256_storeu_si256(ep, _mm256_srli_epi16::<7>(a));
                _mm256_storeu_si256(ep.add(1), _mm256_srli_epi16::<7>(b));
                // fp16 subnormals: e = 0 (x & 0x7C00 == 0) but x & 0x7FFF != 0
                let subn = |x: __m256i| {
                    _mm256_andnot_si256(
                        _mm256_cmpeq_epi16(_mm256_and_si256(x, c7fff), zero),
                        _mm256_cmpeq_epi16(_mm256_and_si256(x, c7c00), zero),
                    )
                };
                sub[phi] += word_bits(subn(a), subn(b)).count_ones() as u64;
                h.add_words(phi, &eb);
                let zm = word_bits(_mm256_cmpeq_epi16(a, zero), _mm256_cmpeq_epi16(b, zero));
                crate::v2::group_counts(phi, zm, st);
                or_a[phi] = _mm256_or_si256(or_a[phi], a);
                or_b[phi] = _mm256_or_si256(or_b[phi], b);
            }
        }
        // 32-bit lanes 0 .. 8 of `or_a`, 8 .. 16 of `or_b`: all 16 for the words at
        // φ; 0 ..= 14 for fp32 at φ = 1 (lane 15 is its word 30 and padding) and the
        // odd words of fp32 at φ + 2 (words 2i + 1, i < 15); 1 ..= 15 for its even
        // words (words 2i + 2)
        let not_last = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, -1, 0);
        let not_first = _mm256_setr_epi32(0, -1, -1, -1, -1, -1, -1, -1);
        for phi in 0..2 {
            let (a, b) = (or_a[phi], or_b[phi]);
            let all = reduce_or(_mm256_or_si256(a, b));
            let head = reduce_or(_mm256_or_si256(a, _mm256_and_si256(b, not_last)));
            let tail = reduce_or(_mm256_or_si256(_mm256_and_si256(a, not_first), b));
            let w = (all & 0xFFFF) | (all >> 16);
            for (c, or) in [
                (phi, w),
                (2 + phi, w),
                (4 + phi, if phi == 0 { all } else { head }),
                (6 + phi, (head >> 16) | (tail << 16)),
            ] {
                st[c].lo_or |= or;
            }
        }
        used
    }
}
