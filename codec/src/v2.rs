//! Frame format version 2 (docs/FORMAT.md, "Version 2"): coded blocks with a Z flag
//! (+0.0 as a ZERO symbol with no plane bytes), zero lines, omitted all-zero fp32 low
//! planes, a per-block phase, one bitstream per block with a sub-segment bit-length
//! index, and static or explicit code lengths. Header, block table, RAW and FILL
//! blocks are as in version 1.
//!
//! Every encoder decision is an integer function of the block's bytes (FORMAT.md
//! §V2.6), so a GPU encoder can reproduce the frames byte for byte.

use std::cell::{Cell, RefCell};

use crate::codes::{symbol_of, CODE_LENGTHS, ESC, MAXLEN, NCODES, ND, NSYM, ZERO};
use crate::coltab::ColTab;
use crate::decode::{
    copy_ascending, dec_segments4, dec_segments4_unchecked, fill_ascending, lane_finish,
    Lane as DLane, TableSource, KEY_SLACK,
};
use crate::elem::{Bf16, Elem, Fp16, Fp32};
use crate::encode::{BlockKind, LENGTHS_BY_SYMBOL, SAMPLE_STRIDE};
use crate::format::*;
use crate::{CodecError, Dtype};

/// Block flag bits (coded block byte 1).
pub const F_Z: u8 = 1;
pub const F_LINES: u8 = 2;
/// Exponents rotated by the frame's column table (FORMAT.md §V2.9).
pub const F_COL: u8 = 4;
pub const F_EXPLICIT: u8 = 8;
pub const F_NO_LO0: u8 = 16;
pub const F_NO_LO1: u8 = 32;
/// Reserved for fp8 byte codes (draft §6); rejected by this decoder.
pub const F_BYTECODE: u8 = 64;

/// A zero line: 64 bytes of the element grid.
pub const LINE: usize = 64;
/// `LENGTHS_BY_SYMBOL` as f32 (exact small integers).
const LENGTHS_F32: [[f32; NCODES]; NSYM] = {
    let mut t = [[0f32; NCODES]; NSYM];
    let mut s = 0;
    while s < NSYM {
        let mut k = 0;
        while k < NCODES {
            t[s][k] = LENGTHS_BY_SYMBOL[s][k] as f32;
            k += 1;
        }
        s += 1;
    }
    t
};

/// Sub-segment size the encoder writes (byte 4 bits 4-5 = 1).
pub const SS_LOG2: u32 = 9;
/// Fixed part of a coded block header; +3 with Z.
const FIXED: usize = 8;

const TABLE: usize = 1 << MAXLEN;
const E_ESC: u32 = 1 << 16;
const E_ZERO: u32 = 1 << 17;
const E_INVALID: u32 = 1 << 18;

/// Per-type element access for version 2 (`x` is the element read little-endian).
pub(crate) trait V2: Elem {
    fn load(b: &[u8], i: usize) -> u32;
    /// [`V2::load`] of element `i` at `p`, without a bounds check (the sampling
    /// loops, where the index is checked once for the whole sample).
    ///
    /// # Safety
    /// Bytes `p .. p + W·(i + 1)` lie inside one allocation.
    #[inline(always)]
    unsafe fn load_raw(p: *const u8, i: usize) -> u32 {
        if Self::W == 2 {
            u16::from_le(std::ptr::read_unaligned(p.add(2 * i) as *const u16)) as u32
        } else {
            u32::from_le(std::ptr::read_unaligned(p.add(4 * i) as *const u32))
        }
    }
    fn store(b: &mut [u8], i: usize, x: u32);
    fn exp(x: u32) -> u32;
    /// plane1 byte (as version 1).
    fn p1(x: u32) -> u8;
    /// fp16: the 3 raw stream bits; 0 otherwise.
    fn xb(x: u32) -> u32;
    fn build(e: u32, p1: u8, xb: u32, lo1: u8, lo0: u8) -> u32;
    /// Splits whole elements `src` into keys (as version 1: the exponent field,
    /// fp16's high byte), plane1 and (fp32) the low byte planes.
    #[inline(always)]
    fn split_v2(src: &[u8], keys: &mut [u8], p1: &mut [u8], _lo1: &mut [u8], _lo0: &mut [u8]) {
        Self::split(src, keys, p1, &mut [])
    }
    /// Inverse of `split_v2` (an empty low plane is all zero).
    #[inline(always)]
    fn join_v2(keys: &[u8], p1: &[u8], _lo1: &[u8], _lo0: &[u8], out: &mut [u8]) {
        Self::join(keys, p1, &[], out)
    }
}

impl V2 for Bf16 {
    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u32 {
        u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32
    }
    #[inline(always)]
    fn store(b: &mut [u8], i: usize, x: u32) {
        b[2 * i..2 * i + 2].copy_from_slice(&(x as u16).to_le_bytes());
    }
    #[inline(always)]
    fn exp(x: u32) -> u32 {
        (x >> 7) & 0xFF
    }
    #[inline(always)]
    fn p1(x: u32) -> u8 {
        (((x >> 8) & 0x80) | (x & 0x7F)) as u8
    }
    #[inline(always)]
    fn xb(_x: u32) -> u32 {
        0
    }
    #[inline(always)]
    fn build(e: u32, p1: u8, _xb: u32, _lo1: u8, _lo0: u8) -> u32 {
        (((p1 & 0x80) as u32) << 8) | (e << 7) | (p1 & 0x7F) as u32
    }
}

impl V2 for Fp16 {
    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u32 {
        u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32
    }
    #[inline(always)]
    fn store(b: &mut [u8], i: usize, x: u32) {
        b[2 * i..2 * i + 2].copy_from_slice(&(x as u16).to_le_bytes());
    }
    #[inline(always)]
    fn exp(x: u32) -> u32 {
        (x >> 10) & 0x1F
    }
    #[inline(always)]
    fn p1(x: u32) -> u8 {
        x as u8
    }
    #[inline(always)]
    fn xb(x: u32) -> u32 {
        ((x >> 15) << 2) | ((x >> 8) & 3)
    }
    #[inline(always)]
    fn build(e: u32, p1: u8, xb: u32, _lo1: u8, _lo0: u8) -> u32 {
        ((xb >> 2) << 15) | (e << 10) | ((xb & 3) << 8) | p1 as u32
    }
}

impl V2 for Fp32 {
    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u32 {
        u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
    }
    #[inline(always)]
    fn store(b: &mut [u8], i: usize, x: u32) {
        b[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
    }
    #[inline(always)]
    fn exp(x: u32) -> u32 {
        (x >> 23) & 0xFF
    }
    #[inline(always)]
    fn p1(x: u32) -> u8 {
        (((x >> 24) & 0x80) | ((x >> 16) & 0x7F)) as u8
    }
    #[inline(always)]
    fn xb(_x: u32) -> u32 {
        0
    }
    #[inline(always)]
    fn build(e: u32, p1: u8, _xb: u32, lo1: u8, lo0: u8) -> u32 {
        (((p1 & 0x80) as u32) << 24)
            | (e << 23)
            | (((p1 & 0x7F) as u32) << 16)
            | ((lo1 as u32) << 8)
            | lo0 as u32
    }
    #[inline(always)]
    fn split_v2(src: &[u8], keys: &mut [u8], p1: &mut [u8], lo1: &mut [u8], lo0: &mut [u8]) {
        for ((((x, k), p), l1), l0) in src
            .chunks_exact(4)
            .zip(keys.iter_mut())
            .zip(p1.iter_mut())
            .zip(lo1.iter_mut())
            .zip(lo0.iter_mut())
        {
            let x = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            *k = (x >> 23) as u8;
            *p = Self::p1(x);
            *l1 = (x >> 8) as u8;
            *l0 = x as u8;
        }
    }
    #[inline(always)]
    fn join_v2(keys: &[u8], p1: &[u8], lo1: &[u8], lo0: &[u8], out: &mut [u8]) {
        // one loop per plane set, so that each vectorises
        #[inline(always)]
        fn go<const L1: bool, const L0: bool>(
            keys: &[u8],
            p1: &[u8],
            lo1: &[u8],
            lo0: &[u8],
            out: &mut [u8],
        ) {
            let n = keys.len().min(p1.len()).min(out.len() / 4);
            let (lo1, lo0) = (
                &lo1[..if L1 { n } else { 0 }],
                &lo0[..if L0 { n } else { 0 }],
            );
            for (i, o) in out[..4 * n].chunks_exact_mut(4).enumerate() {
                let l1 = if L1 { lo1[i] } else { 0 };
                let l0 = if L0 { lo0[i] } else { 0 };
                let x = Fp32::build(keys[i] as u32, p1[i], 0, l1, l0);
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        match (lo1.is_empty(), lo0.is_empty()) {
            (false, false) => go::<true, true>(keys, p1, lo1, lo0, out),
            (false, true) => go::<true, false>(keys, p1, lo1, lo0, out),
            (true, false) => go::<false, true>(keys, p1, lo1, lo0, out),
            (true, true) => go::<false, false>(keys, p1, lo1, lo0, out),
        }
    }
}

/// Byte shuffles by an 8-bit mask `m` of kept bytes: `COMPACT[m]` gathers the
/// kept bytes to the front, `EXPAND[m]` spreads the front bytes to the kept
/// positions (0x80: a zero byte).
const COMPACT: [[u8; 8]; 256] = shuffles(false);
const EXPAND: [[u8; 8]; 256] = shuffles(true);

pub(crate) const fn shuffles(expand: bool) -> [[u8; 8]; 256] {
    let mut t = [[0x80u8; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let mut n = 0;
        let mut i = 0;
        while i < 8 {
            if m >> i & 1 != 0 {
                if expand {
                    t[m][i] = n;
                } else {
                    t[m][n as usize] = i as u8;
                }
                n += 1;
            }
            i += 1;
        }
        m += 1;
    }
    t
}

/// Byte `i` of the result is byte `idx[i]` of `v`, or 0 where `idx[i]` has bit 7.
/// `V`: the caller is compiled for AVX2 (`pshufb`).
#[inline(always)]
fn shuffle8<const V: bool>(v: u64, idx: &[u8; 8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if V {
        use std::arch::x86_64::*;
        // SAFETY: V is set only in functions compiled for AVX2 (which has SSSE3),
        // called after the CPU was checked; the load reads the 8 bytes of `idx`.
        return unsafe {
            let r = _mm_shuffle_epi8(
                _mm_cvtsi64_si128(v as i64),
                _mm_loadl_epi64(idx.as_ptr() as *const __m128i),
            );
            _mm_cvtsi128_si64(r) as u64
        };
    }
    let b = v.to_le_bytes();
    let mut o = [0u8; 8];
    for (o, &i) in o.iter_mut().zip(idx.iter()) {
        *o = if i & 0x80 != 0 { 0 } else { b[i as usize & 7] };
    }
    u64::from_le_bytes(o)
}

/// Bits needed for `v` (0 for 0).
#[inline]
pub(crate) fn bits_for(v: u32) -> u32 {
    32 - v.leading_zeros()
}

// ---------------------------------------------------------------------------------
// Codes

/// Kraft sum in units of 2^-12; lengths 0 are unused symbols.
fn kraft(lens: &[u8; NSYM]) -> u32 {
    lens.iter()
        .filter(|&&l| l != 0)
        .map(|&l| 1u32 << (MAXLEN - l as u32))
        .sum()
}

/// Length-limited Huffman code lengths (FORMAT.md §V2.6 "Explicit code"): weights
/// `16 * count + 1`, two smallest (weight, node id) merged first, then limited to
/// 12 bits by the normative adjustment. Every symbol gets a length in 1..=12.
pub(crate) fn explicit_lengths(cnt: &[u64; NSYM]) -> [u8; NSYM] {
    let mut weight = [0u64; 2 * NSYM];
    let mut parent = [0usize; 2 * NSYM];
    // Two queues, each sorted by (weight, node number): the leaves, sorted once, and
    // the merged nodes in the order they are made (a merged weight is never below
    // an earlier one, and numbers grow), so the smaller front is the live node with
    // the smallest (weight, number), as the rule removes it. (weight, symbol) sorts
    // as one integer.
    let mut leaves = [0u64; NSYM];
    for s in 0..NSYM {
        weight[s] = 16 * cnt[s] + 1;
        leaves[s] = weight[s] << 5 | s as u64;
    }
    leaves.sort_unstable();
    let (mut li, mut mi) = (0usize, NSYM);
    let mut next = NSYM;
    for _ in 0..NSYM - 1 {
        let mut pick = [0usize; 2];
        for p in pick.iter_mut() {
            // a leaf wins a tie on weight: its number is smaller
            let leaf = (leaves.get(li).copied().unwrap_or(0) & 31) as usize;
            *p = if li < NSYM && (mi >= next || weight[leaf] <= weight[mi]) {
                li += 1;
                leaf
            } else {
                mi += 1;
                mi - 1
            };
        }
        weight[next] = weight[pick[0]] + weight[pick[1]];
        parent[pick[0]] = next;
        parent[pick[1]] = next;
        next += 1;
    }
    // depths, parents before children (a parent's number is larger)
    let mut depth = [0u32; 2 * NSYM];
    for n in (0..next - 1).rev() {
        depth[n] = depth[parent[n]] + 1;
    }
    let mut lens = [0u32; NSYM];
    lens.copy_from_slice(&depth[..NSYM]);
    if lens.iter().any(|&l| l > MAXLEN) {
        for l in lens.iter_mut() {
            *l = (*l).min(MAXLEN);
        }
        let mut k: u32 = lens.iter().map(|&l| 1u32 << (MAXLEN - l)).sum();
        while k > 1 << MAXLEN {
            // lengthen the longest code shorter than 12 (ties: smaller weight, then larger symbol)
            let mut best = usize::MAX;
            for s in 0..NSYM {
                if lens[s] >= MAXLEN {
                    continue;
                }
                if best == usize::MAX
                    || lens[s] > lens[best]
                    || (lens[s] == lens[best] && weight[s] <= weight[best])
                {
                    best = s;
                }
            }
            lens[best] += 1;
            k -= 1 << (MAXLEN - lens[best]);
        }
        while k < 1 << MAXLEN {
            // shorten the longest code (ties: larger weight, then smaller symbol)
            let mut best = usize::MAX;
            for s in 0..NSYM {
                if best == usize::MAX
                    || lens[s] > lens[best]
                    || (lens[s] == lens[best] && weight[s] > weight[best])
                {
                    best = s;
                }
            }
            k += 1 << (MAXLEN - lens[best]);
            lens[best] -= 1;
        }
    }
    let mut out = [0u8; NSYM];
    for s in 0..NSYM {
        out[s] = lens[s] as u8;
    }
    out
}

// ---------------------------------------------------------------------------------
// Encoder

#[derive(Default)]
struct Scratch {
    kept: Vec<u8>,
    stream: Vec<u8>,
    /// per kept element: key (version 1's)
    keys: Vec<u8>,
    /// per sub-segment: holds an element with `e = 0`, `x != 0` (escaped under Z)
    esc0: Vec<bool>,
    elided: Vec<bool>,
    seg_bits: Vec<u32>,
    seg_zeros: Vec<u32>,
    /// the kept elements rotated by the column table
    rot: Vec<u8>,
    /// a block coded here when the room left is too small to code it in place
    spill: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Encodes one block as version 2 into `out` (the room left below the frame limit).
/// `simd = false`: the portable path only ([`crate::compress_scalar`]). `col`: the
/// frame's column table and the block's first input byte. `prev_phi`: the phase of
/// the frame's last block coded as mode 2..=4 before this one (FORMAT.md §V2.7 step 3).
/// `fast`: [`crate::Effort::Fast`]'s rules (FORMAT.md §V2.11).
pub(crate) fn encode_block_v2(
    dtype: Dtype,
    blk: &[u8],
    out: &mut [u8],
    simd: bool,
    col: Option<(&ColTab, usize)>,
    prev_phi: Option<usize>,
    fast: bool,
) -> Option<(usize, BlockKind)> {
    crate::encode::encode_block_in(blk, out, |o, cap| match dtype {
        Dtype::Bf16 => encode_coded::<Bf16>(blk, o, cap, simd, col, prev_phi, fast),
        // fp16 blocks mostly of subnormals code as FP16N (FORMAT.md §V2.10)
        Dtype::Fp16 => match crate::v2_byte::f16n_phase(blk) {
            Some(phi) => crate::v2_byte::encode_f16n(blk, phi, &mut o[..cap]),
            None => encode_coded::<Fp16>(blk, o, cap, simd, col, prev_phi, fast),
        },
        Dtype::Fp32 => encode_coded::<Fp32>(blk, o, cap, simd, col, prev_phi, fast),
        Dtype::Fp8E4m3 | Dtype::Fp8E5m2 => crate::v2_byte::encode_fp8(dtype, blk, &mut o[..cap]),
        Dtype::Raw => None,
    })
}

/// The block's phase: the `φ < W` whose 1/13 sample has the smallest estimated
/// cost (FORMAT.md §V2.6; ties: smaller φ), that sample's statistics and its static
/// code choice.
#[inline(always)]
pub(crate) fn choose_phase<T: V2>(blk: &[u8]) -> (usize, Stats, Static) {
    let mut best: Option<(usize, Stats, Static)> = None;
    for phi in 0..T::W {
        let m = (blk.len() - phi) / T::W;
        let b = &blk[phi..];
        // a phase whose lower bound is no smaller than the best value cannot
        // replace it (strictly smaller only): not evaluated. The bound is first
        // taken with every `e = 0` sample counted as a zero (`nzero` at most
        // `h[0]`: a lower bound still), so that a phase it rules out (a misaligned
        // one: its fields hold mantissa bits, often 0) is not read again for zeros
        let st = match &best {
            None => Stats::sample::<T>(b, m),
            Some(bst) => {
                let st = Stats::sample_hist::<T>(b, m);
                if static_lb::<T>(&st) >= bst.2.best.value {
                    continue;
                }
                let st = st.count_zeros::<T>(b, m, SAMPLE_STRIDE);
                if static_lb::<T>(&st) >= bst.2.best.value {
                    continue;
                }
                st
            }
        };
        let c = choose_static::<T>(&st);
        if best.as_ref().is_none_or(|b| c.best.value < b.2.best.value) {
            best = Some((phi, st, c));
        }
    }
    best.unwrap()
}

type PhaseMemo = Option<(usize, usize, u8, (usize, Stats, Static))>;

thread_local! {
    /// Block 0's phase choice, made by the column table's search
    /// ([`crate::coltab`]) and taken by block 0's encoder in the same `compress`
    /// (cleared at its start): keyed by the block's address, length and mode.
    static PHASE_MEMO: RefCell<PhaseMemo> = const { RefCell::new(None) };
}

/// Forgets a phase choice [`choose_phase_memo`] left (called as a frame begins).
pub(crate) fn clear_phase_memo() {
    PHASE_MEMO.with(|m| *m.borrow_mut() = None);
}

/// [`choose_phase`]'s φ, the choice kept for the block's encoder.
#[inline(always)]
pub(crate) fn choose_phase_memo<T: V2>(blk: &[u8]) -> usize {
    let c = choose_phase::<T>(blk);
    let phi = c.0;
    PHASE_MEMO.with(|m| *m.borrow_mut() = Some((blk.as_ptr() as usize, blk.len(), T::MODE, c)));
    phi
}

/// [`choose_phase`], or the choice [`choose_phase_memo`] made for this block.
#[inline(always)]
fn choose_phase_once<T: V2>(blk: &[u8]) -> (usize, Stats, Static) {
    let key = (blk.as_ptr() as usize, blk.len(), T::MODE);
    match PHASE_MEMO.with(|m| m.borrow_mut().take()) {
        Some((p, l, mode, c)) if (p, l, mode) == key => c,
        _ => choose_phase::<T>(blk),
    }
}

/// Sub-sample stride of the other phases' check in [`choose_phase_carried`]:
/// 8 × the sample's (FORMAT.md §V2.7 step 3).
const CHECK_STRIDE: usize = 8 * SAMPLE_STRIDE;

/// The phase of a block after a coded block with phase `pp` (FORMAT.md §V2.7 step
/// 3): `pp`, with its sample's statistics and static choice, unless the lower bound
/// ([`static_lb`]) of another phase's 1/104 sub-sample is below `pp`'s value per
/// sampled element; then [`choose_phase`]'s full search.
#[inline(always)]
fn choose_phase_carried<T: V2>(blk: &[u8], pp: usize) -> (usize, Stats, Static) {
    let m = (blk.len() - pp) / T::W;
    let st = Stats::sample::<T>(&blk[pp..], m);
    choose_phase_carried_from::<T>(blk, pp, st)
}

/// [`choose_phase_carried`] with `pp`'s sample statistics `st` already taken.
#[inline(always)]
fn choose_phase_carried_from<T: V2>(blk: &[u8], pp: usize, st: Stats) -> (usize, Stats, Static) {
    let c = choose_static::<T>(&st);
    // fp32's three other phases read in one pass (the same bytes)
    let subs = (T::W == 4).then(|| Stats::sample_sparse_fp32_phases(blk, pp, CHECK_STRIDE));
    for phi in (0..T::W).filter(|&p| p != pp) {
        let sub = match &subs {
            Some(s) => s[phi],
            None => Stats::sample_sparse::<T>(&blk[phi..], (blk.len() - phi) / T::W, CHECK_STRIDE),
        };
        // lb / sub.count < value / st.count: phi might code cheaper
        if (static_lb::<T>(&sub) as u128) * (st.count as u128)
            < (c.best.value as u128) * (sub.count as u128)
        {
            return choose_phase::<T>(blk);
        }
    }
    (pp, st, c)
}

/// What the encoder chose for a block's code.
#[derive(Clone, Copy)]
pub(crate) struct Choice {
    z: bool,
    a: u32,
    /// `None`: explicit lengths.
    k: Option<u8>,
    lens: [u8; NSYM],
    /// 13 × estimated sample bits + header overhead bits.
    pub(crate) value: u64,
    /// Code bits (with escape payloads) of the sample.
    code_bits: u64,
}

/// Sample statistics of a block or a detection sample (FORMAT.md §V2.6). Its `hz`
/// is `hc` on `e >= 1` (an element with `e != 0` is not 0) and 0 at `e = 0`, and
/// `nesc0 = hc[0] - nzero`: both are derived, not counted.
#[derive(Clone, Copy)]
pub(crate) struct Stats {
    /// exponent histogram, all sampled elements
    hc: [u32; 256],
    /// x == 0
    nzero: u64,
    count: u64,
    /// OR of the elements (read by fp32's `choose` only: [`Stats::sample`] leaves it 0
    /// for 16-bit types)
    pub(crate) lo_or: u32,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            hc: [0; 256],
            nzero: 0,
            count: 0,
            lo_or: 0,
        }
    }
}

impl Stats {
    /// Statistics from their parts (the column table's gain estimate, `coltab`).
    pub(crate) fn from_parts(hc: [u32; 256], nzero: u64, count: u64, lo_or: u32) -> Stats {
        Stats {
            hc,
            nzero,
            count,
            lo_or,
        }
    }

    /// Adds elements `0 .. n` of `b` (detection).
    #[inline(always)]
    #[cfg(test)]
    pub(crate) fn add<T: V2>(&mut self, b: &[u8], n: usize) {
        let (mut nzero, mut lo_or) = (0u64, 0u32);
        for xb in b[..n * T::W].chunks_exact(T::W) {
            let x = T::load(xb, 0);
            self.hc[T::exp(x) as usize] += 1;
            nzero += (x == 0) as u64;
            lo_or |= x;
        }
        self.nzero += nzero;
        self.lo_or |= lo_or;
        self.count += n as u64;
    }

    /// Statistics of elements `0, stride, 2·stride, ... < m` of `b` (the carried
    /// phase's check, [`choose_phase_carried`]).
    #[inline(always)]
    pub(crate) fn sample_sparse<T: V2>(b: &[u8], m: usize, stride: usize) -> Stats {
        let mut h = [0u32; 256];
        let (mut nzero, mut lo_or) = (0u64, 0u32);
        for i in (0..m).step_by(stride) {
            let x = T::load(b, i);
            h[T::exp(x) as usize] += 1;
            nzero += (x == 0) as u64;
            if T::W == 4 {
                lo_or |= x;
            }
        }
        Stats {
            hc: h,
            nzero,
            count: m.div_ceil(stride) as u64,
            lo_or,
        }
    }

    /// [`Stats::sample_sparse`] of fp32 elements at every phase of `blk` but `pp`
    /// (entry `pp` is left empty), in one pass: phase `phi`'s element `i` is bytes
    /// `4i + phi ..` of one 8-byte load.
    pub(crate) fn sample_sparse_fp32_phases(blk: &[u8], pp: usize, stride: usize) -> [Stats; 4] {
        let l = blk.len();
        let mut h = [[0u32; 256]; 4];
        let (mut nzero, mut lo_or) = ([0u64; 4], [0u32; 4]);
        let mut add = |phi: usize, x: u32| {
            h[phi][((x >> 23) & 0xFF) as usize] += 1;
            nzero[phi] += (x == 0) as u64;
            lo_or[phi] |= x;
        };
        let mut i = 0;
        while 4 * i + 8 <= l {
            let v = u64::from_le_bytes(blk[4 * i..4 * i + 8].try_into().unwrap());
            for phi in (0..4).filter(|&p| p != pp) {
                add(phi, (v >> (8 * phi)) as u32);
            }
            i += stride;
        }
        // the last sample, where the 8 bytes run past the block
        for phi in (0..4).filter(|&p| p != pp) {
            let mut k = i;
            while 4 * k + phi + 4 <= l {
                add(
                    phi,
                    u32::from_le_bytes(blk[4 * k + phi..4 * k + phi + 4].try_into().unwrap()),
                );
                k += stride;
            }
        }
        std::array::from_fn(|phi| Stats {
            hc: h[phi],
            nzero: nzero[phi],
            count: if phi == pp || l < phi {
                0
            } else {
                ((l - phi) / 4).div_ceil(stride) as u64
            },
            lo_or: lo_or[phi],
        })
    }

    /// Statistics of elements `0, 13, 26, ... < m` of `b` (a block's sample): the
    /// histogram is version 1's sample histogram (same elements, same counts).
    /// Where the last sample on this thread had no element with `e = 0` (dense
    /// data), the zeros are counted only where the histogram has `e = 0`
    /// ([`Stats::count_zeros`]), else in the same loop ([`Stats::sample_counting`]):
    /// the same statistics either way.
    #[inline(always)]
    pub(crate) fn sample<T: V2>(b: &[u8], m: usize) -> Stats {
        let st = if ZEROS_SEEN.get() {
            Self::sample_counting::<T>(b, m)
        } else {
            Self::sample_hist::<T>(b, m).count_zeros::<T>(b, m, SAMPLE_STRIDE)
        };
        ZEROS_SEEN.set(st.hc[0] != 0);
        st
    }

    /// [`Stats::sample`] with the zeros counted in the sampling loop.
    #[inline(always)]
    pub(crate) fn sample_counting<T: V2>(b: &[u8], m: usize) -> Stats {
        Self::sample_loop::<T, true>(b, m)
    }

    /// [`Stats::sample`]'s histogram, count and `lo_or`, without reading for zeros:
    /// `nzero` is `h[0]`, an upper bound ([`Stats::count_zeros`] makes it exact).
    #[inline(always)]
    pub(crate) fn sample_hist<T: V2>(b: &[u8], m: usize) -> Stats {
        Self::sample_loop::<T, false>(b, m)
    }

    /// The sampling loop: one read of each sampled element for the histogram,
    /// `lo_or` and (`ZEROS`) the zeros, else `nzero = h[0]`; four interleaved
    /// sub-histograms as `sample_histogram` (same counts; at most 2^20 / 2 / 13 + 1
    /// < 2^16 samples per block: u16 counts suffice) (`lo_or` only where `choose`
    /// reads it: fp32; 16-bit samples leave it 0).
    #[inline(always)]
    fn sample_loop<T: V2, const ZEROS: bool>(b: &[u8], m: usize) -> Stats {
        let mut hs = [[0u16; 256]; 4];
        let (mut nzero, mut lo_or) = (0u32, 0u32);
        let mut add = |h: &mut [u16; 256], x: u32| {
            h[T::exp(x) as usize] += 1;
            if ZEROS {
                nzero += (x == 0) as u32;
            }
            if T::W == 4 {
                lo_or |= x;
            }
        };
        let stride = SAMPLE_STRIDE * T::W;
        let mut chunks = b[..m * T::W].chunks_exact(4 * stride);
        for c in &mut chunks {
            for (k, hk) in hs.iter_mut().enumerate() {
                add(hk, T::load(c, k * SAMPLE_STRIDE));
            }
        }
        let done = (m * T::W - chunks.remainder().len()) / T::W;
        for i in (done..m).step_by(SAMPLE_STRIDE) {
            add(&mut hs[0], T::load(b, i));
        }
        let hc = Self::sum4(&hs);
        Stats {
            nzero: if ZEROS { nzero as u64 } else { hc[0] as u64 },
            hc,
            count: m.div_ceil(SAMPLE_STRIDE) as u64,
            lo_or,
        }
    }

    /// The sample's exact `nzero`: the elements `x == 0` among `0, stride, ... < m`
    /// of `b`, read only where the histogram has `e = 0` (an element 0 has).
    #[inline(always)]
    pub(crate) fn count_zeros<T: V2>(mut self, b: &[u8], m: usize, stride: usize) -> Stats {
        self.nzero = if self.hc[0] == 0 {
            0
        } else {
            (0..m)
                .step_by(stride)
                .filter(|&i| T::load(b, i) == 0)
                .count() as u64
        };
        self
    }

    /// The four interleaved sub-histograms' sum.
    #[inline(always)]
    fn sum4(hs: &[[u16; 256]; 4]) -> [u32; 256] {
        let mut h = [0u32; 256];
        for (e, x) in h.iter_mut().enumerate() {
            *x = hs[0][e] as u32 + hs[1][e] as u32 + hs[2][e] as u32 + hs[3][e] as u32;
        }
        h
    }
}

thread_local! {
    /// Whether the last block this thread scanned for zero lines had one: the next
    /// fast block scans again rather than leave it to the AVX-512 split (speed only).
    static LINES_SEEN: Cell<bool> = const { Cell::new(false) };
    /// Whether the last [`Stats::sample`] on this thread had an element with `e = 0`
    /// (a zero or a subnormal): which of its two loops the next one takes (speed
    /// only).
    static ZEROS_SEEN: Cell<bool> = const { Cell::new(false) };
}

/// The anchor search centre: the largest `e >= 1` such that more than 1/64 of the
/// histogram's elements with `e >= 1` have an exponent `>= e` (1 if none): a few
/// outliers (a non-float prefix, one huge value) cannot move it.
fn robust_max(h: &[u32; 256], emax: u32) -> u32 {
    let total: u64 = h[1..=emax as usize].iter().map(|&c| c as u64).sum();
    let mut suffix = 0u64;
    for e in (1..=emax).rev() {
        suffix += h[e as usize] as u64;
        if 64 * suffix > total {
            return e;
        }
    }
    1
}

/// Anchors `choose` tries: `smax - 4 ..= smax + 3`.
const NANCHORS: usize = 8;

/// The static part of [`choose`]: the best static candidate and what the explicit
/// candidates need (per Z: the anchor of its best static code).
#[derive(Clone, Copy)]
pub(crate) struct Static {
    best: Choice,
    /// per Z (clear, set): the index of the anchor of this Z's first cheapest
    /// static code
    best_ai: [usize; 2],
    lo: u32,
    dcnt: [[u64; ND]; NANCHORS],
    desc: [u64; NANCHORS],
    r: u64,
}

/// Cost and code choice on the sample (FORMAT.md §V2.6).
#[inline(always)]
pub(crate) fn choose<T: V2>(st: &Stats, explicit: bool) -> Choice {
    let s = choose_static::<T>(st);
    if explicit {
        choose_explicit::<T>(st, &s)
    } else {
        s.best
    }
}

/// Static codes (FORMAT.md §V2.6). The distance symbols' counts and code costs are
/// the same under both Z (they count elements with `e >= 1`), so they are summed
/// once per anchor; Z changes only ZERO and ESC. Inlined so that the per-code sums
/// are vectorised with the caller's features.
#[inline(always)]
pub(crate) fn choose_static<T: V2>(st: &Stats) -> Static {
    let r: u64 = if T::W == 4 {
        8 + if st.lo_or & 0xFF00 != 0 { 8 } else { 0 } + if st.lo_or & 0xFF != 0 { 8 } else { 0 }
    } else {
        T::RAWBITS
    };
    let h = &st.hc;
    let nesc0 = h[0] as u64 - st.nzero;
    let smax = robust_max(h, T::EMAX);
    let lo = smax.saturating_sub(4).max(1);
    let hi = (smax + 3).min(T::EMAX);
    let total1: u64 = h[1..=T::EMAX as usize].iter().map(|&c| c as u64).sum();
    // per anchor: distance counts, their code costs (all 32 codes), escapes e >= 1
    let mut dcnt = [[0u64; ND]; NANCHORS];
    let mut dcost = [[0f32; NCODES]; NANCHORS];
    let mut desc = [0u64; NANCHORS];
    for (ai, a) in (lo..=hi).enumerate() {
        let mut inwin = 0u64;
        for d in 0..(ND as u32).min(a) {
            let c = h[(a - d) as usize] as u64;
            dcnt[ai][d as usize] = c;
            inwin += c;
            if c != 0 {
                // All 32 codes at once, in f32 lanes (SSE2 has no 32-bit integer
                // multiply): exact, as every product and sum is an integer below
                // 2^24 (at most 2^16 samples of at most 12 bits).
                let cf = c as f32;
                for (x, &len) in dcost[ai].iter_mut().zip(LENGTHS_F32[d as usize].iter()) {
                    *x += cf * len;
                }
            }
        }
        desc[ai] = total1 - inwin;
    }
    let mut best = Choice {
        z: false,
        a: 1,
        k: Some(0),
        lens: CODE_LENGTHS[0],
        value: u64::MAX,
        code_bits: 0,
    };
    let mut best_ai = [0usize; 2];
    // Z set with no `e = 0` in the sample (`h[0] = 0`, so `nzero = 0` too) has Z
    // clear's counts and costs plus 24: it never wins (strictly smaller only), so it
    // is not evaluated
    for z in [false, true] {
        if z && h[0] == 0 {
            break;
        }
        let raw_bits = if z {
            r * (st.count - st.nzero)
        } else {
            r * st.count
        };
        let overhead = if z { 24 } else { 0 };
        // ZERO: e = 0 (Z clear) or x = 0 (Z set, where e = 0, x != 0 escapes)
        let (czero, esc0) = if z {
            (st.nzero, nesc0)
        } else {
            (h[0] as u64, 0)
        };
        // static codes at every anchor
        let mut best_z = u64::MAX;
        for (ai, a) in (lo..=hi).enumerate() {
            let cesc = desc[ai] + esc0;
            let base = raw_bits + cesc * T::EBITS as u64;
            let (zf, ef) = (czero as f32, cesc as f32);
            // exact integers in f32 (as above), below 2^24: exact as i32
            let mut bits = [0i32; NCODES];
            for (k, b) in bits.iter_mut().enumerate() {
                let f = dcost[ai][k] + zf * LENGTHS_F32[ZERO][k] + ef * LENGTHS_F32[ESC][k];
                // SAFETY: `f` is a finite integer in 0..2^24 (above).
                *b = unsafe { f.to_int_unchecked::<i32>() };
            }
            // `value` grows with the bits: the anchor's first cheapest code is the
            // only one that can replace a best (strictly smaller, first wins)
            let bmin = *bits.iter().min().unwrap();
            let k = bits.iter().position(|&b| b == bmin).unwrap();
            let bits = bmin as u64;
            let v = SAMPLE_STRIDE as u64 * (bits + base) + overhead;
            if v < best_z {
                best_z = v;
                best_ai[z as usize] = ai;
            }
            if v < best.value {
                best = Choice {
                    z,
                    a,
                    k: Some(k as u8),
                    lens: CODE_LENGTHS[k],
                    value: v,
                    code_bits: bits + base - raw_bits,
                };
            }
        }
    }
    Static {
        best,
        best_ai,
        lo,
        dcnt,
        desc,
        r,
    }
}

/// A lower bound of `choose_static(st).best.value`: every code word is at least 1
/// bit, the raw bits are at least those of the nonzero elements, and at every anchor
/// tried the elements `e >= 1` outside its window escape (`EBITS` each, the
/// fewest over the anchors). A few hundred operations, against the 32 codes ×
/// 8 anchors of `choose_static`.
#[inline(always)]
pub(crate) fn static_lb<T: V2>(st: &Stats) -> u64 {
    let r: u64 = if T::W == 4 {
        8 + if st.lo_or & 0xFF00 != 0 { 8 } else { 0 } + if st.lo_or & 0xFF != 0 { 8 } else { 0 }
    } else {
        T::RAWBITS
    };
    let h = &st.hc;
    let smax = robust_max(h, T::EMAX);
    let lo = smax.saturating_sub(4).max(1);
    let hi = (smax + 3).min(T::EMAX);
    let total1: u64 = h[1..=T::EMAX as usize].iter().map(|&c| c as u64).sum();
    let mut desc = u64::MAX;
    for a in lo..=hi {
        let lo_e = a + 1 - (ND as u32).min(a);
        let inwin: u64 = h[lo_e as usize..=a as usize]
            .iter()
            .map(|&c| c as u64)
            .sum();
        desc = desc.min(total1 - inwin);
    }
    SAMPLE_STRIDE as u64 * (st.count + r * (st.count - st.nzero) + desc * T::EBITS as u64)
}

/// The explicit candidates (FORMAT.md §V2.6), after the static ones of both Z. The
/// rule visits Z clear's explicit candidate before Z set's static ones: it wins a
/// tie with the static best when that best has Z set.
#[inline(always)]
pub(crate) fn choose_explicit<T: V2>(st: &Stats, s: &Static) -> Choice {
    let h = &st.hc;
    let nesc0 = h[0] as u64 - st.nzero;
    let mut best = s.best;
    for z in [false, true] {
        // as in `choose_static`: with `h[0] = 0`, Z set's counts are Z clear's, its
        // lengths the same, its value 24 more: it cannot win
        if z && h[0] == 0 {
            break;
        }
        let raw_bits = if z {
            s.r * (st.count - st.nzero)
        } else {
            s.r * st.count
        };
        let overhead = if z { 24 } else { 0 };
        let (czero, esc0) = if z {
            (st.nzero, nesc0)
        } else {
            (h[0] as u64, 0)
        };
        let ai = s.best_ai[z as usize];
        let a = s.lo + ai as u32;
        let mut cnt = [0u64; NSYM];
        cnt[..ND].copy_from_slice(&s.dcnt[ai]);
        cnt[ZERO] = czero;
        cnt[ESC] = s.desc[ai] + esc0;
        let base = raw_bits + cnt[ESC] * T::EBITS as u64;
        let lens = explicit_lengths(&cnt);
        let bits: u64 = (0..NSYM).map(|s| cnt[s] * lens[s] as u64).sum();
        let v = SAMPLE_STRIDE as u64 * (bits + base) + overhead + 104;
        if v < best.value || (!z && v == best.value && best.z) {
            best = Choice {
                z,
                a,
                k: None,
                lens,
                value: v,
                code_bits: bits + base - raw_bits,
            };
        }
    }
    best
}

/// Writes `n` entries of `w` bits LSB-first, padded to a byte; returns bytes written.
pub(crate) fn put_packed(out: &mut [u8], vals: impl Iterator<Item = u32>, w: u32) -> usize {
    let mut acc = 0u64;
    let mut nacc = 0u32;
    let mut p = 0;
    if w == 0 {
        return 0;
    }
    for v in vals {
        acc |= (v as u64) << nacc;
        nacc += w;
        while nacc >= 8 {
            out[p] = acc as u8;
            p += 1;
            acc >>= 8;
            nacc -= 8;
        }
    }
    if nacc > 0 {
        out[p] = acc as u8;
        p += 1;
    }
    p
}

/// Whether a whole line (`LINE` = 64 bytes) is all zero. `V`: the caller is compiled
/// for AVX2 (two 32-byte loads, one `vptest`).
#[inline(always)]
fn zero_line<const V: bool>(c: &[u8]) -> bool {
    debug_assert_eq!(c.len(), LINE);
    #[cfg(target_arch = "x86_64")]
    if V && c.len() >= 64 {
        use std::arch::x86_64::*;
        // SAFETY: V: the CPU has AVX2; both loads read inside `c` (64 bytes).
        return unsafe {
            let a = _mm256_loadu_si256(c.as_ptr() as *const __m256i);
            let b = _mm256_loadu_si256(c.as_ptr().add(32) as *const __m256i);
            let o = _mm256_or_si256(a, b);
            _mm256_testz_si256(o, o) != 0
        };
    }
    c.chunks_exact(8)
        .fold(0u64, |a, b| a | u64::from_le_bytes(b.try_into().unwrap()))
        == 0
}

/// The nonzero mask of 32 whole elements `xs` (bit `t`: element `t` is not 0) and
/// whether one of them is nonzero with exponent field 0 (an escaped `e = 0` under
/// `Z`). `V`: the caller is compiled for AVX2 (16-bit lanes compared 32 at a time,
/// fp32's 8 at a time).
#[inline(always)]
fn nz_mask32<T: V2, const V: bool>(xs: &[u8]) -> (u32, bool) {
    assert_eq!(xs.len(), 32 * T::W);
    // the exponent field in place
    let fm: u32 = match T::MODE {
        MODE_BF16 => 0x7F80,
        MODE_FP16 => 0x7C00,
        _ => 0x7F80_0000,
    };
    #[cfg(target_arch = "x86_64")]
    if V {
        use std::arch::x86_64::*;
        // SAFETY: V: the CPU has AVX2; every load reads inside `xs` (asserted).
        return unsafe {
            let p = xs.as_ptr() as *const __m256i;
            let zero = _mm256_setzero_si256();
            let (z, f) = if T::W == 2 {
                let fv = _mm256_set1_epi16(fm as i16);
                let (a, b) = (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)));
                // packs interleaves the 128-bit lanes: (a0 b0 a1 b1) -> (a0 a1 b0 b1)
                let bits = |x: __m256i, y: __m256i| {
                    _mm256_movemask_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(x, y), 0xD8))
                        as u32
                };
                let z = bits(_mm256_cmpeq_epi16(a, zero), _mm256_cmpeq_epi16(b, zero));
                let f = bits(
                    _mm256_cmpeq_epi16(_mm256_and_si256(a, fv), zero),
                    _mm256_cmpeq_epi16(_mm256_and_si256(b, fv), zero),
                );
                (z, f)
            } else {
                let fv = _mm256_set1_epi32(fm as i32);
                let (mut z, mut f) = (0u32, 0u32);
                for k in 0..4 {
                    let a = _mm256_loadu_si256(p.add(k));
                    let za = _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, zero));
                    let fa = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(a, fv), zero));
                    z |= (_mm256_movemask_ps(za) as u32) << (8 * k);
                    f |= (_mm256_movemask_ps(fa) as u32) << (8 * k);
                }
                (z, f)
            };
            (!z, f & !z != 0)
        };
    }
    let (mut nz, mut e0) = (0u32, false);
    for (t, xb) in xs.chunks_exact(T::W).enumerate() {
        let x = T::load(xb, 0);
        nz |= ((x != 0) as u32) << t;
        e0 |= x != 0 && x & fm == 0;
    }
    (nz, e0)
}

/// Codes `blk` into `out` if it takes at most `cap <= out.len()` bytes. The planes
/// and the stream are written in place, which needs `blk.len() + 64` bytes of room;
/// with less, the block is coded in scratch and copied.
fn encode_coded<T: V2>(
    blk: &[u8],
    out: &mut [u8],
    cap: usize,
    simd: bool,
    col: Option<(&ColTab, usize)>,
    prev_phi: Option<usize>,
    fast: bool,
) -> Option<usize> {
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        let room = blk.len() + 64;
        if out.len() >= room {
            return encode_coded_in::<T>(blk, out, cap, simd, s, col, prev_phi, fast);
        }
        let mut buf = std::mem::take(&mut s.spill);
        if buf.len() < room {
            buf.resize(room, 0);
        }
        let r = encode_coded_in::<T>(blk, &mut buf, cap, simd, s, col, prev_phi, fast);
        if let Some(n) = r {
            out[..n].copy_from_slice(&buf[..n]);
        }
        s.spill = buf;
        r
    })
}

#[allow(clippy::too_many_arguments)]
fn encode_coded_in<T: V2>(
    blk: &[u8],
    out: &mut [u8],
    cap: usize,
    simd: bool,
    s: &mut Scratch,
    col: Option<(&ColTab, usize)>,
    prev_phi: Option<usize>,
    fast: bool,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if simd
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("popcnt")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { encode_coded_avx2::<T>(blk, out, cap, s, col, prev_phi, fast) };
        }
    }
    let _ = simd;
    encode_coded_body::<T, false>(blk, out, cap, s, col, prev_phi, fast)
}

/// # Safety
/// The CPU must support AVX2, BMI2 and POPCNT (the Z masks' counts).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
#[allow(clippy::too_many_arguments)]
unsafe fn encode_coded_avx2<T: V2>(
    blk: &[u8],
    out: &mut [u8],
    cap: usize,
    s: &mut Scratch,
    col: Option<(&ColTab, usize)>,
    prev_phi: Option<usize>,
    fast: bool,
) -> Option<usize> {
    encode_coded_body::<T, true>(blk, out, cap, s, col, prev_phi, fast)
}

/// The coded-block encoder (FORMAT.md §V2.7). `V`: compiled for AVX2+BMI2, so full
/// runs of 32 keys may go through version 1's vector packer (`avx2::code_keys`).
/// `fast`: [`crate::Effort::Fast`] (FORMAT.md §V2.11): zero lines are looked for
/// only when the phase's sample has an exact zero, and codes are static.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn encode_coded_body<T: V2, const V: bool>(
    blk: &[u8],
    out: &mut [u8],
    cap: usize,
    s: &mut Scratch,
    col: Option<(&ColTab, usize)>,
    prev_phi: Option<usize>,
    fast: bool,
) -> Option<usize> {
    let l = blk.len();
    let w = T::W;
    if l / w < MIN_CODED_ELEMS {
        return None;
    }
    {
        // in a frame with a column table, the carried phase's sample also gives the
        // rotated histogram of the grid (`sample_fused`), used when the block keeps
        // that phase and has no elided line
        let mut grid_rot: Option<[u32; 256]> = None;
        let (phi, phase_st, phase_static) = match (prev_phi, col) {
            (Some(pp), Some((ct, blk_start))) if pp < T::W => {
                let m = (l - pp) / w;
                let col0 = crate::coltab::grid_col0::<T>(blk_start, pp);
                let (st, hr) = crate::coltab::sample_fused::<T>(&blk[pp..], m, col0, ct);
                let c = choose_phase_carried_from::<T>(blk, pp, st);
                if c.0 == pp {
                    grid_rot = Some(hr);
                }
                c
            }
            (Some(pp), None) if pp < T::W => choose_phase_carried::<T>(blk, pp),
            _ => choose_phase_once::<T>(blk),
        };
        let m = (l - phi) / w;
        let t = (l - phi) % w;
        let gbytes = m * w;
        let grid = &blk[phi..phi + gbytes];
        // zero lines (Fast: only where the phase's sample has an exact zero; a
        // block with none is coded whole)
        let nl = gbytes.div_ceil(LINE);
        let find_lines = !fast || phase_st.nzero != 0;
        // Fast, Z, fused split (bf16, fp32; AVX-512 or AVX2): the split finds zero
        // lines itself (its steps are one or two whole lines) in place of the
        // scan; a block that has one is coded again with the scan. Tried where the
        // last block this thread scanned had none (same frames either way).
        let avx512 = V && crate::avx512::z_paths(T::MODE);
        let z_fused = avx512 || (V && crate::avx2_z::z_paths(T::MODE));
        let mut split_lines =
            fast && find_lines && z_fused && phase_static.best.z && !LINES_SEEN.get();
        loop {
            // whole lines (`chunks_exact`: no per-line length clamp), then the short one;
            // runs counted only when a line is elided
            let scan = find_lines && !split_lines;
            // every entry is written below: no clear
            s.elided.resize(nl, false);
            if scan {
                let full = grid.chunks_exact(LINE);
                let last = full.remainder();
                for (z, c) in s.elided.iter_mut().zip(full) {
                    *z = zero_line::<V>(c);
                }
                if !last.is_empty() {
                    s.elided[nl - 1] = last.iter().fold(0u8, |a, &b| a | b) == 0;
                }
            } else {
                s.elided.fill(false);
            }
            let n_elided = s.elided.iter().map(|&z| z as usize).sum::<usize>();
            if scan {
                LINES_SEEN.set(n_elided > 0);
            }
            let mut runs = 0;
            if n_elided > 0 {
                let mut prev = false;
                for &z in s.elided.iter() {
                    runs += (z && !prev) as usize;
                    prev = z;
                }
            }
            let lines = n_elided > 0;
            let kept: &[u8] = if lines {
                s.kept.clear();
                for (c, &z) in grid.chunks(LINE).zip(s.elided.iter()) {
                    if !z {
                        s.kept.extend_from_slice(c);
                    }
                }
                &s.kept
            } else {
                grid
            };
            let k_elems = kept.len() / w;
            // without lines the kept elements are the grid: the phase's sample
            let (st, ch) = if lines {
                let st = Stats::sample::<T>(kept, k_elems);
                let ch = choose::<T>(&st, !fast);
                (st, ch)
            } else if fast {
                (phase_st, phase_static.best)
            } else {
                let ch = choose_explicit::<T>(&phase_st, &phase_static);
                (phase_st, ch)
            };
            // column table (FORMAT.md §V2.9): the kept elements with their exponents
            // rotated by their columns' offsets, when that sample codes cheaper
            // (bf16, fp32: the keys are the exponent fields, rotated after the split
            // below; fp16's keys hold more than the field: its elements are rotated)
            let keys_rot = T::MODE != MODE_FP16;
            let mut use_col: Option<(&ColTab, usize)> = None;
            let (kept, st, ch) = match col {
                Some((ct, blk_start)) => {
                    let col0 = crate::coltab::grid_col0::<T>(blk_start, phi);
                    let el = lines.then_some(&s.elided[..]);
                    let hc = match grid_rot {
                        Some(hr) if !lines => hr,
                        _ => crate::coltab::sample_hist_rotated::<T>(kept, k_elems, el, col0, ct),
                    };
                    let st_c = Stats::from_parts(hc, st.nzero, st.count, st.lo_or);
                    let ch_c = choose::<T>(&st_c, true);
                    if ch_c.value < ch.value {
                        use_col = Some((ct, col0));
                        if keys_rot {
                            (kept, st_c, ch_c)
                        } else {
                            s.rot.clear();
                            s.rot.extend_from_slice(&kept[..k_elems * w]);
                            crate::coltab::rotate_kept::<T, false>(
                                &mut s.rot, el, gbytes, col0, ct,
                            );
                            (&s.rot[..], st_c, ch_c)
                        }
                    } else {
                        (kept, st, ch)
                    }
                }
                None => (kept, st, ch),
            };
            let words = match ch.k {
                Some(k) => crate::codes::CODE_WORDS[k as usize],
                None => crate::codes::canonical_words(&ch.lens),
            };
            let ss = 1usize << SS_LOG2;
            let ns = k_elems.div_ceil(ss);
            let bitmap_len = nl.div_ceil(8);
            let runs_len = 2 + 4 * runs;
            let list_len = if lines {
                1 + bitmap_len.min(runs_len)
            } else {
                0
            };
            // the planes start right after the head (FORMAT.md §V2.3): version 1's split
            // writes them in place, fp32's low planes at `k_elems` and `2·k_elems` (moved
            // down below when ZERO elements or an omitted plane leave them short)
            let pa = FIXED
                + if ch.z { 3 } else { 0 }
                + if ch.k.is_none() { 13 } else { 0 }
                + list_len
                + phi;
            let lo_len = if T::W == 4 { k_elems } else { 0 };
            if s.keys.len() < k_elems + 32 {
                s.keys.resize(k_elems + 32, 0);
            }
            let kept = &kept[..k_elems * w];
            let (p1, rest) = out[pa..].split_at_mut(k_elems);
            let (lo1, rest) = rest.split_at_mut(lo_len);
            let lo0 = &mut rest[..lo_len];
            // bf16 and fp32 under Z: the split and the Z compaction below are one pass
            // (`avx512::split_z_*`, `avx2_z::split_z_*`)
            let fused = z_fused && ch.z;
            if !fused {
                let keys = &mut s.keys[..k_elems];
                #[cfg(target_arch = "x86_64")]
                if V && T::MODE == MODE_BF16 {
                    // SAFETY: V means the CPU has AVX2.
                    unsafe { crate::encode::avx2::split_bf16(kept, keys, p1) };
                } else {
                    T::split_v2(kept, keys, p1, lo1, lo0);
                }
                #[cfg(not(target_arch = "x86_64"))]
                T::split_v2(kept, keys, p1, lo1, lo0);
            }
            // Under Z, drop the planes' bytes of ZERO elements (x == 0) and count them
            // per sub-segment.
            s.seg_zeros.clear();
            s.esc0.clear();
            let mut zsum = 0usize;
            // a zero line seen by the AVX-512 split (`split_lines`); the OR of the
            // elements' low 16 bits (fp32's planes `lo1`, `lo0`) it saw
            let mut zero_line = false;
            let mut fused_lo = 0u32;
            if ch.z {
                let mut q = 0;
                for j in 0..ns {
                    let (mut zc, mut e0) = (0u32, false);
                    let (i0, i1) = (j * ss, ((j + 1) * ss).min(k_elems));
                    // 8 elements at a time: plane bytes compacted by a byte shuffle
                    // (in place: q <= i, and the 8 bytes stored at q end by i + 8);
                    // the nonzero masks of 32 elements at a time (`nz_mask32`)
                    let planes: [*mut u8; 3] =
                        [p1.as_mut_ptr(), lo1.as_mut_ptr(), lo0.as_mut_ptr()];
                    // every plane holds k_elems >= i1 bytes: the loads (i + 8 <= i1) and
                    // stores (q + 8 <= i + 8) below stay inside
                    assert!(p1.len() >= i1 && (T::W != 4 || (lo1.len() >= i1 && lo0.len() >= i1)));
                    let compact8 = |i: usize, m: usize, q: &mut usize| {
                        debug_assert!(*q <= i && i + 8 <= i1);
                        let sh = &COMPACT[m];
                        for &pl in &planes[..if T::W == 4 { 3 } else { 1 }] {
                            // SAFETY: asserted above: bytes i..i + 8 and q..q + 8 lie in
                            // the plane (q <= i)
                            unsafe {
                                let v = std::ptr::read_unaligned(pl.add(i) as *const u64);
                                let c = shuffle8::<V>(u64::from_le(v), sh).to_le();
                                std::ptr::write_unaligned(pl.add(*q) as *mut u64, c);
                            }
                        }
                        *q += m.count_ones() as usize;
                    };
                    #[cfg(target_arch = "x86_64")]
                    if fused {
                        // whole lines; the rest is the grid's short last line
                        let nv = (i1 - i0) / (LINE / w) * (LINE / w);
                        let xs = &kept[i0 * w..];
                        let keys = &mut s.keys[i0..];
                        // SAFETY: `fused`: V (the CPU has AVX2, BMI2 and POPCNT), and
                        // `avx512`: it has the AVX-512 features (`avx512::enabled`).
                        let (q1, z, e, zl, lo) = unsafe {
                            use crate::{avx2_z, avx512};
                            if T::W == 2 {
                                let (q1, z, e, zl) = if avx512 {
                                    avx512::split_z_bf16(xs, nv, keys, p1, q)
                                } else {
                                    avx2_z::split_z_bf16(xs, nv, keys, p1, q)
                                };
                                (q1, z, e, zl, 0)
                            } else if avx512 {
                                avx512::split_z_fp32(xs, nv, keys, [p1, lo1, lo0], q)
                            } else {
                                avx2_z::split_z_fp32(xs, nv, keys, [p1, lo1, lo0], q)
                            }
                        };
                        (q, zc, e0) = (q1, z, e);
                        zero_line |= zl;
                        fused_lo |= lo;
                        let mut or = 0;
                        for i in i0 + nv..i1 {
                            let x = T::load(kept, i);
                            s.keys[i] = T::exp(x) as u8;
                            p1[q] = T::p1(x);
                            if T::W == 4 {
                                lo1[q] = (x >> 8) as u8;
                                lo0[q] = x as u8;
                            }
                            q += (x != 0) as usize;
                            zc += (x == 0) as u32;
                            e0 |= x != 0 && T::exp(x) == 0;
                            or |= x;
                        }
                        zero_line |= i0 + nv < i1 && or == 0;
                        fused_lo |= or & 0xFFFF;
                        s.seg_zeros.push(zc);
                        s.esc0.push(e0);
                        zsum += zc as usize;
                        continue;
                    }
                    let n32 = i0 + (i1 - i0) / 32 * 32;
                    let n8 = i0 + (i1 - i0) / 8 * 8;
                    for (c, xs) in kept[i0 * w..n32 * w].chunks_exact(32 * w).enumerate() {
                        let (nz, e) = nz_mask32::<T, V>(xs);
                        e0 |= e;
                        zc += 32 - nz.count_ones();
                        for k in 0..4 {
                            compact8(i0 + 32 * c + 8 * k, (nz >> (8 * k)) as usize & 0xFF, &mut q);
                        }
                    }
                    for (c, xs) in kept[n32 * w..n8 * w].chunks_exact(8 * w).enumerate() {
                        let mut m = 0usize;
                        for (t, xb) in xs.chunks_exact(w).enumerate() {
                            let x = T::load(xb, 0);
                            m |= ((x != 0) as usize) << t;
                            e0 |= x != 0 && T::exp(x) == 0;
                        }
                        zc += 8 - m.count_ones();
                        compact8(n32 + 8 * c, m, &mut q);
                    }
                    for i in n8..i1 {
                        let x = T::load(kept, i);
                        // in place: q <= i
                        p1[q] = p1[i];
                        if T::W == 4 {
                            lo1[q] = lo1[i];
                            lo0[q] = lo0[i];
                        }
                        q += (x != 0) as usize;
                        zc += (x == 0) as u32;
                        e0 |= x != 0 && T::exp(x) == 0;
                    }
                    s.seg_zeros.push(zc);
                    s.esc0.push(e0);
                    zsum += zc as usize;
                }
            } else {
                s.seg_zeros.resize(ns, 0);
                s.esc0.resize(ns, false);
            }
            if split_lines && zero_line {
                LINES_SEEN.set(true);
                split_lines = false;
                continue;
            }
            if let (Some((ct, col0)), true) = (use_col, keys_rot) {
                let el = lines.then_some(&s.elided[..]);
                crate::coltab::rotate_kept_keys::<T>(&mut s.keys[..k_elems], el, m, col0, ct);
            }
            let p_elems = k_elems - zsum;
            let lo_or = if T::W == 4 && fused {
                fused_lo
            } else if T::W == 4 {
                let or = |v: &[u8]| v.iter().fold(0u8, |a, &b| a | b) as u32;
                (or(&lo1[..p_elems]) << 8) | or(&lo0[..p_elems])
            } else {
                0
            };
            let no_lo0 = T::W == 4 && lo_or & 0xFF == 0;
            let no_lo1 = T::W == 4 && lo_or & 0xFF00 == 0;
            let mut sa = pa + p_elems;
            if T::W == 4 {
                if !no_lo1 {
                    out.copy_within(pa + k_elems..pa + k_elems + p_elems, sa);
                    sa += p_elems;
                }
                if !no_lo0 {
                    out.copy_within(pa + 2 * k_elems..pa + 2 * k_elems + p_elems, sa);
                    sa += p_elems;
                }
            }
            // per exponent field: (code word + escape payload, its length, extra raw bits);
            // entry 256 is ZERO under Z (an index, not a branch: zeros are scattered)
            // (built when the first element is coded by the scalar loop: with the
            // vector packer, often never)
            let build_enc = || {
                let mut enc = [(0u64, 0u32, 0u32); 257];
                for e in 0..=T::EMAX {
                    let sym = if e == 0 && ch.z {
                        ESC
                    } else {
                        symbol_of(e, ch.a)
                    };
                    let len = ch.lens[sym] as u32;
                    enc[e as usize] = if sym == ESC {
                        (
                            words[sym] as u64 | ((e as u64) << len),
                            len + T::EBITS,
                            T::XBITS,
                        )
                    } else {
                        (words[sym] as u64, len, T::XBITS)
                    };
                }
                enc[256] = (words[ZERO] as u64, ch.lens[ZERO] as u32, 0);
                enc
            };
            let mut enc_cell: Option<[(u64, u32, u32); 257]> = None;
            let zsel = ch.z as u32;
            // Version 1's vector packer codes runs of 32 keys whose symbols are version
            // 1's: everywhere without Z; under Z (x == 0 is key 0, ZERO) in
            // sub-segments with no escaped e = 0 (fp16's ZERO drops its 3 extra bits:
            // its tables give exponent field 0 ZERO's length alone).
            #[cfg(target_arch = "x86_64")]
            let vec = V.then(|| {
                let fp16 = T::MODE == MODE_FP16;
                (
                    // SAFETY: V means the CPU has AVX2.
                    unsafe {
                        crate::encode::avx2::VecTables::for_code(&ch.lens, &words, ch.a, fp16, ch.z)
                    },
                    {
                        let mut lut = crate::encode::enc_table_for::<T>(&ch.lens, &words, ch.a);
                        if fp16 && ch.z {
                            // key 0 is an element 0 (sub-segments without an escaped
                            // e = 0): ZERO without extra bits
                            lut[0] = words[ZERO] as u32 | ((ch.lens[ZERO] as u32) << 24);
                        }
                        lut
                    },
                    fp16,
                    ch.code_bits * 4 > 13 * st.count,
                    // SAFETY: `enabled`: the CPU has the AVX-512 features.
                    (!fp16 && crate::avx512::enabled()).then(|| unsafe {
                        crate::avx512::Tables::for_code(&ch.lens, &words, ch.a)
                    }),
                )
            });
            // The stream is written in place behind the planes while `out` has room for
            // the next sub-segment's worst case (3 bytes per element + 64: more than 20
            // bits per element and the writer's 8-byte stores); else it goes on in
            // scratch (`spilled`) and is copied in place once its length is known.
            s.seg_bits.clear();
            // SAFETY: `sa <= out.len()` (the planes were written below it).
            let mut wr = crate::encode::Bits::new(unsafe { out.as_mut_ptr().add(sa) });
            let mut spilled = false;
            let mut total_bits = 0u64;
            for j in 0..ns {
                let (i0, i1) = (j * ss, ((j + 1) * ss).min(k_elems));
                if !spilled && sa + wr.pos + 3 * (i1 - i0) + 64 > out.len() {
                    let need = k_elems * 3 + 64;
                    if s.stream.len() < need {
                        s.stream.resize(need, 0);
                    }
                    s.stream[..wr.pos].copy_from_slice(&out[sa..sa + wr.pos]);
                    wr.rebase(s.stream.as_mut_ptr());
                    spilled = true;
                }
                let bit0 = 8 * wr.pos as u64 + wr.nb as u64;
                let mut i = i0;
                #[cfg(target_arch = "x86_64")]
                if let Some((vt, lut, fp16, wide, t512)) = &vec {
                    if !(ch.z && s.esc0[j]) {
                        let n32 = (i1 - i0) / 32 * 32;
                        let keys = &s.keys[i0..i0 + n32];
                        // SAFETY: V: AVX2 and BMI2 (`t512`: and the AVX-512 features);
                        // the writer has 3 bytes per element + 64 of room, more than
                        // 20 bits per element and the 8-byte stores.
                        unsafe {
                            use crate::avx512::code_keys as code_keys512;
                            use crate::encode::avx2::{code_keys, code_keys_fp16};
                            match (fp16, wide, t512) {
                                (true, _, _) => code_keys_fp16(vt, lut, keys, &mut wr),
                                (false, true, Some(t)) => {
                                    code_keys512::<true>(t, vt, lut, keys, &mut wr)
                                }
                                (false, false, Some(t)) => {
                                    code_keys512::<false>(t, vt, lut, keys, &mut wr)
                                }
                                (false, true, None) => code_keys::<true>(vt, lut, keys, &mut wr),
                                (false, false, None) => code_keys::<false>(vt, lut, keys, &mut wr),
                            }
                        }
                        i += n32;
                    }
                }
                let enc: &[(u64, u32, u32); 257] = if i < i1 {
                    enc_cell.get_or_insert_with(build_enc)
                } else {
                    &[(0, 0, 0); 257]
                };
                // a copy of the writer: `wr` itself is lent to the vector coders above,
                // so its fields would be loaded and stored in memory every element
                let mut lw = wr;
                for (xb, &key) in kept[i * w..i1 * w].chunks_exact(w).zip(&s.keys[i..i1]) {
                    let x = T::load(xb, 0);
                    // x == 0 as arithmetic (x - 1 wraps to the top bit only for 0):
                    // compiled as a compare, it became a branch, mispredicted on
                    // every other element of ReLU outputs
                    let is0 = zsel & ((x as u64).wrapping_sub(1) >> 63) as u32;
                    // the (rotated) exponent field: bf16's and fp32's key
                    let e = if keys_rot { key as u32 } else { T::exp(x) };
                    let (c, len, xl) = enc[(e | (is0 << 8)) as usize];
                    let (c, len) = if T::XBITS != 0 {
                        (c | (((T::xb(x) & 7) as u64) << len), len + xl)
                    } else {
                        (c, len)
                    };
                    // SAFETY: as above (at most 23 bits per element).
                    unsafe { lw.put(c, len) };
                }
                wr = lw;
                let bits = (8 * wr.pos as u64 + wr.nb as u64 - bit0) as u32;
                s.seg_bits.push(bits);
                total_bits += bits as u64;
            }
            // SAFETY: as above.
            let stream_bytes = unsafe { wr.finish() };
            debug_assert_eq!(stream_bytes as u64, total_bits.div_ceil(8));
            let base = s.seg_bits.iter().copied().min().unwrap_or(0);
            let iw = bits_for(s.seg_bits.iter().copied().max().unwrap_or(0) - base);
            let zbase = s.seg_zeros.iter().copied().min().unwrap_or(0);
            let zw = bits_for(s.seg_zeros.iter().copied().max().unwrap_or(0) - zbase);
            let size = sa
                + stream_bytes
                + (ns * iw as usize).div_ceil(8)
                + if ch.z {
                    (ns * zw as usize).div_ceil(8)
                } else {
                    0
                }
                + t;
            if size > cap {
                return None;
            }
            if spilled {
                out[sa..sa + stream_bytes].copy_from_slice(&s.stream[..stream_bytes]);
            }
            // header
            let mut flags = 0u8;
            if ch.z {
                flags |= F_Z;
            }
            if lines {
                flags |= F_LINES;
            }
            if use_col.is_some() {
                flags |= F_COL;
            }
            if ch.k.is_none() {
                flags |= F_EXPLICIT;
            }
            if no_lo0 {
                flags |= F_NO_LO0;
            }
            if no_lo1 {
                flags |= F_NO_LO1;
            }
            out[0] = T::MODE;
            out[1] = flags;
            out[2] = ch.k.unwrap_or(0);
            out[3] = ch.a as u8;
            out[4] = phi as u8 | (((SS_LOG2 - 8) as u8) << 4);
            out[5] = iw as u8;
            out[6..8].copy_from_slice(&(base as u16).to_le_bytes());
            let mut p = FIXED;
            if ch.z {
                out[p] = zw as u8;
                out[p + 1..p + 3].copy_from_slice(&(zbase as u16).to_le_bytes());
                p += 3;
            }
            if ch.k.is_none() {
                for i in 0..13 {
                    out[p + i] = ch.lens[2 * i] | (ch.lens[2 * i + 1] << 4);
                }
                p += 13;
            }
            if lines {
                if bitmap_len <= runs_len {
                    out[p] = 0;
                    p += 1;
                    out[p..p + bitmap_len].fill(0);
                    for (j, &z) in s.elided.iter().enumerate() {
                        if z {
                            out[p + j / 8] |= 1 << (j % 8);
                        }
                    }
                    p += bitmap_len;
                } else {
                    out[p] = 1;
                    out[p + 1..p + 3].copy_from_slice(&(runs as u16).to_le_bytes());
                    p += 3;
                    let mut j = 0;
                    while j < nl {
                        if s.elided[j] {
                            let first = j;
                            while j < nl && s.elided[j] {
                                j += 1;
                            }
                            out[p..p + 2].copy_from_slice(&(first as u16).to_le_bytes());
                            out[p + 2..p + 4].copy_from_slice(&((j - first) as u16).to_le_bytes());
                            p += 4;
                        } else {
                            j += 1;
                        }
                    }
                }
            }
            out[p..p + phi].copy_from_slice(&blk[..phi]);
            p += phi;
            debug_assert_eq!(p, pa);
            // planes and stream are in place; then index, zero index, tail
            p = sa + stream_bytes;
            p += put_packed(&mut out[p..], s.seg_bits.iter().map(|&b| b - base), iw);
            if ch.z {
                p += put_packed(&mut out[p..], s.seg_zeros.iter().map(|&z| z - zbase), zw);
            }
            out[p..p + t].copy_from_slice(&blk[l - t..]);
            p += t;
            debug_assert_eq!(p, size);
            return Some(size);
        }
    }
}

// ---------------------------------------------------------------------------------
// Decoder

fn corrupt(why: &'static str) -> CodecError {
    CodecError::Corrupt(why)
}

/// Decodes block `src[start..start + size]` of a version-2 frame into `out`. `col`:
/// the frame's column table and the block's first output byte (in the frame).
pub(crate) fn decode_block_v2<S: TableSource>(
    src: &[u8],
    start: usize,
    size: usize,
    out: &mut [u8],
    tables: &mut S,
    col: Option<(&ColTab, usize)>,
) -> Result<(), CodecError> {
    if size == 0 {
        return Err(corrupt("empty block"));
    }
    let b = &src[start..start + size];
    let l = out.len();
    match b[0] {
        MODE_RAW => {
            if size != 1 + l {
                return Err(corrupt("raw block length mismatch"));
            }
            copy_ascending(out, &b[1..]);
            Ok(())
        }
        MODE_FILL => {
            if size != 2 {
                return Err(corrupt("fill block length mismatch"));
            }
            fill_ascending(out, b[1]);
            Ok(())
        }
        MODE_BF16 => decode_coded::<Bf16, S>(b, out, tables, col),
        MODE_FP16 => decode_coded::<Fp16, S>(b, out, tables, col),
        MODE_FP32 => decode_coded::<Fp32, S>(b, out, tables, col),
        crate::v2_byte::MODE_E4M3 | crate::v2_byte::MODE_E5M2 | crate::v2_byte::MODE_FP16N => {
            crate::v2_byte::decode_block(b, out)
        }
        _ => Err(corrupt("unknown block mode")),
    }
}

/// Bounds-checked little cursor over a block's bytes.
struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self.p.checked_add(n).ok_or(CodecError::Truncated)?;
        if end > self.b.len() {
            return Err(corrupt("coded block shorter than its layout"));
        }
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
}

/// Reads `n` packed `w`-bit entries (padding bits must be zero) as `base + entry`.
fn read_packed(
    cur: &mut Cur,
    n: usize,
    w: u32,
    base: u32,
    out: &mut [u32],
) -> Result<(), CodecError> {
    let used = n * w as usize;
    let bytes = cur.take(used.div_ceil(8))?;
    // entry i at bit i·w: one 64-bit window each (w <= 16 bits at a bit offset
    // below 8)
    let mask = (1u64 << w) - 1;
    for (i, o) in out.iter_mut().take(n).enumerate() {
        let bit = i * w as usize;
        *o = base + ((load64(bytes, bit >> 3) >> (bit & 7)) & mask) as u32;
    }
    // the bits after the last entry, up to the byte boundary
    if used & 7 != 0 && bytes[used >> 3] >> (used & 7) != 0 {
        return Err(corrupt("nonzero index padding"));
    }
    Ok(())
}

/// Most sub-segments a block can have: 2^20 bytes / 2 / 256.
const MAX_NS: usize = (1 << MAX_BLOCK_LOG2) / 2 / 256;
/// Sub-segments of a 64 KiB block (at most; 256-element sub-segments of bf16).
const SMALL_NS: usize = (1 << 16) / 2 / 256;
/// Most lines a block can have.
const MAX_LINES: usize = (1 << MAX_BLOCK_LOG2) / LINE;

#[inline(always)]
pub(crate) fn load64(s: &[u8], p: usize) -> u64 {
    if p + 8 <= s.len() {
        u64::from_le_bytes(s[p..p + 8].try_into().unwrap())
    } else {
        let mut t = [0u8; 8];
        if p < s.len() {
            t[..s.len() - p].copy_from_slice(&s[p..]);
        }
        u64::from_le_bytes(t)
    }
}

/// Sub-segments decoded side by side.
pub(crate) const LANES: usize = 4;

/// One sub-segment's decoder state.
#[derive(Clone, Copy, Default)]
struct Lane {
    bit: u64,
    end: u64,
    /// next plane element and the end of this sub-segment's plane elements
    pp: usize,
    pend: usize,
    /// next element slot in the group buffer
    out: usize,
    n: usize,
}

/// A coded block's working memory, kept across blocks (in the [`crate::Decoder`], or
/// once per frame for [`crate::decompress`]) instead of cleared per block: every
/// byte a block reads from it was written earlier in the same block, except the
/// zero counts (`seg[1]`, read without `Z`) and the line bitmap (`elided`, read with
/// `LINES`), whose parts the block reads it clears first.
pub(crate) struct DecScratch {
    /// the lanes' keys (key path)
    keys: [[u8; SEG_ELEMS + KEY_SLACK]; LANES],
    /// the group buffer: a group's elements before un-rotation and line placement
    tmp: [u8; LANES * 1024 * 4],
    /// Z's spread planes (key path)
    ex: [[u8; 1024 + 8]; 3],
    /// per sub-segment bits and ZERO counts, blocks of up to [`SMALL_NS`]
    seg: [[u32; SMALL_NS]; 2],
    /// elided lines (`LINES`)
    elided: [u64; MAX_LINES / 64],
}

impl DecScratch {
    pub(crate) fn new() -> DecScratch {
        DecScratch {
            keys: [[0; SEG_ELEMS + KEY_SLACK]; LANES],
            tmp: [0; LANES * 1024 * 4],
            ex: [[0; 1024 + 8]; 3],
            seg: [[0; SMALL_NS]; 2],
            elided: [0; MAX_LINES / 64],
        }
    }
}

/// The exact path's table where no group needs it.
static NO_LUT: [u32; TABLE] = [E_INVALID; TABLE];

#[derive(Clone, Copy)]
struct Planes<'a> {
    p1: &'a [u8],
    lo1: &'a [u8],
    lo0: &'a [u8],
    z: bool,
    a_lut: &'a [u32; TABLE],
}

/// One element of a lane without per-element bounds checks: returns the element and
/// advances the lane's bit position `bit` and plane index `pp`.
///
/// # Safety
/// `stream` holds at least 8 bytes past byte `bit / 8` for every element the lane
/// can still decode (the caller checks this for all its elements at 20 bits each),
/// and the planes hold `pp + remaining elements` elements.
#[inline(always)]
unsafe fn fast_elem<T: V2>(
    bit: &mut u64,
    pp: &mut usize,
    stream: &[u8],
    pl: &Planes,
) -> Result<u32, CodecError> {
    let p = (*bit >> 3) as usize;
    let v = u64::from_le_bytes(*(stream.as_ptr().add(p) as *const [u8; 8])) >> (*bit & 7);
    let ent = *pl.a_lut.get_unchecked((v & (TABLE as u64 - 1)) as usize);
    let mut len = ent & 31;
    // ZERO's exponent field is 0 in the table: without Z it decodes as e = 0
    let mut e = (ent >> 8) & 0xFF;
    if ent & (E_ESC | E_INVALID) != 0 {
        if ent & E_INVALID != 0 {
            return Err(corrupt("exponent below 1"));
        }
        e = ((v >> len) & ((1u64 << T::EBITS) - 1)) as u32;
        len += T::EBITS;
    }
    // ZERO under Z, branch-free: no extra bits, no plane byte, element 0 (the plane
    // read at `pp` stays in bounds: the caller's `pp + remaining <= planes`)
    let is0 = (pl.z & (ent & E_ZERO != 0)) as u32;
    let keep = is0.wrapping_sub(1); // all ones unless ZERO under Z
    let xb = if T::XBITS != 0 {
        let xb = ((v >> len) & 7) as u32;
        len += T::XBITS & keep;
        xb
    } else {
        0
    };
    let q = *pp;
    let l1 = if T::W == 4 && !pl.lo1.is_empty() {
        *pl.lo1.get_unchecked(q)
    } else {
        0
    };
    let l0 = if T::W == 4 && !pl.lo0.is_empty() {
        *pl.lo0.get_unchecked(q)
    } else {
        0
    };
    let x = T::build(e, *pl.p1.get_unchecked(q), xb, l1, l0) & keep;
    *pp = q + (1 - is0 as usize);
    *bit += len as u64;
    Ok(x)
}

/// Decodes one element of `lane` into `tmp`.
#[inline(always)]
fn dec_step<T: V2>(
    lane: &mut Lane,
    stream: &[u8],
    pl: &Planes,
    tmp: &mut [u8],
) -> Result<(), CodecError> {
    let v = load64(stream, (lane.bit >> 3) as usize) >> (lane.bit & 7);
    let ent = pl.a_lut[(v & (TABLE as u64 - 1)) as usize];
    let mut len = ent & 31;
    let x;
    if ent & (E_ESC | E_ZERO | E_INVALID) == 0 || !(pl.z && ent & E_ZERO != 0) {
        let e = if ent & (E_ESC | E_ZERO | E_INVALID) == 0 {
            (ent >> 8) & 0xFF
        } else if ent & E_ESC != 0 {
            let e = ((v >> len) & ((1u64 << T::EBITS) - 1)) as u32;
            len += T::EBITS;
            e
        } else if ent & E_ZERO != 0 {
            0
        } else {
            return Err(corrupt("exponent below 1"));
        };
        let xb = if T::XBITS != 0 {
            let xb = ((v >> len) & 7) as u32;
            len += T::XBITS;
            xb
        } else {
            0
        };
        let pp = lane.pp;
        if pp >= lane.pend {
            return Err(corrupt("plane overrun"));
        }
        let l1 = if T::W == 4 && !pl.lo1.is_empty() {
            pl.lo1[pp]
        } else {
            0
        };
        let l0 = if T::W == 4 && !pl.lo0.is_empty() {
            pl.lo0[pp]
        } else {
            0
        };
        x = T::build(e, pl.p1[pp], xb, l1, l0);
        lane.pp = pp + 1;
    } else {
        x = 0;
    }
    lane.bit += len as u64;
    if lane.bit > lane.end {
        return Err(corrupt("sub-segment overruns its length"));
    }
    T::store(tmp, lane.out, x);
    lane.out += 1;
    Ok(())
}

fn decode_coded<T: V2, S: TableSource>(
    b: &[u8],
    out: &mut [u8],
    tables: &mut S,
    col: Option<(&ColTab, usize)>,
) -> Result<(), CodecError> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("bmi2")
            && std::is_x86_feature_detected!("popcnt")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { decode_coded_avx2::<T, S>(b, out, tables, col) };
        }
    }
    decode_coded_body::<T, S, false>(b, out, tables, col)
}

/// # Safety
/// The CPU must support AVX2, BMI2 and POPCNT (the Z key masks' counts).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
unsafe fn decode_coded_avx2<T: V2, S: TableSource>(
    b: &[u8],
    out: &mut [u8],
    tables: &mut S,
    col: Option<(&ColTab, usize)>,
) -> Result<(), CodecError> {
    decode_coded_body::<T, S, true>(b, out, tables, col)
}

/// [`key_group`] as a call of its own (once per group): its buffers, which all live
/// in one [`DecScratch`], arrive as distinct `&mut` parameters, so that the compiler
/// knows that the joins' stores into `tmp` touch neither the keys nor the spread
/// planes and vectorises them (inlined into the block decoder, it did not).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn key_group_call<T: V2, const V: bool>(
    set: &crate::decode::Tables,
    stream: &[u8],
    pl: &Planes,
    lanes: &[Lane; LANES],
    g: usize,
    ss: usize,
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; LANES],
    ex: &mut [[u8; 1024 + 8]; 3],
    col: Option<(&ColTab, usize)>,
    tmp: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if V {
        // SAFETY: V is set only in functions compiled for AVX2, BMI2 and POPCNT,
        // called after the CPU was checked (`decode_coded`).
        return unsafe { key_group_avx2::<T>(set, stream, pl, lanes, g, ss, keys, ex, col, tmp) };
    }
    key_group_portable::<T>(set, stream, pl, lanes, g, ss, keys, ex, col, tmp)
}

/// # Safety
/// The CPU must support AVX2, BMI2 and POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,popcnt")]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn key_group_avx2<T: V2>(
    set: &crate::decode::Tables,
    stream: &[u8],
    pl: &Planes,
    lanes: &[Lane; LANES],
    g: usize,
    ss: usize,
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; LANES],
    ex: &mut [[u8; 1024 + 8]; 3],
    col: Option<(&ColTab, usize)>,
    tmp: &mut [u8],
) -> bool {
    key_group::<T, true>(set, stream, pl, lanes, g, ss, keys, ex, col, tmp)
}

#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn key_group_portable<T: V2>(
    set: &crate::decode::Tables,
    stream: &[u8],
    pl: &Planes,
    lanes: &[Lane; LANES],
    g: usize,
    ss: usize,
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; LANES],
    ex: &mut [[u8; 1024 + 8]; 3],
    col: Option<(&ColTab, usize)>,
    tmp: &mut [u8],
) -> bool {
    key_group::<T, false>(set, stream, pl, lanes, g, ss, keys, ex, col, tmp)
}

/// Decodes a group's sub-segments (`lanes`, `n[q]` elements each) through version
/// 1's multi-symbol key tables and joins keys and planes into `tmp`. Returns false,
/// having checked nothing it could not prove, when anything is off (a sub-segment
/// that does not end at its length, a ZERO count that differs, an invalid symbol,
/// an escaped `e = 0` under Z): the caller then decodes the group exactly.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn key_group<T: V2, const V: bool>(
    set: &crate::decode::Tables,
    stream: &[u8],
    pl: &Planes,
    lanes: &[Lane; LANES],
    g: usize,
    ss: usize,
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; LANES],
    ex: &mut [[u8; 1024 + 8]; 3],
    col: Option<(&ColTab, usize)>,
    tmp: &mut [u8],
) -> bool {
    let mut kl = [DLane {
        base: 0,
        bp: 0,
        kp: 0,
        bad: 0,
    }; LANES];
    for (k, l) in kl.iter_mut().zip(lanes.iter()).take(g) {
        k.base = (l.bit >> 3) as usize;
        k.bp = l.bit & 7;
    }
    if g == LANES && lanes.iter().all(|l| l.n == ss) {
        // no lane can load past the stream (at most 20 bits a key): see
        // `dec_segments4_unchecked`
        if lanes
            .iter()
            .all(|l| (l.bit >> 3) as usize + (20 * ss).div_ceil(8) + 8 <= stream.len())
        {
            // SAFETY: every lane starts at bit `l.bit & 7` of byte `l.bit >> 3`
            // (`kl`) and decodes `ss` keys; the stream holds the bound just checked.
            unsafe { dec_segments4_unchecked::<T>(set, stream, keys, &mut kl, ss) };
        } else {
            dec_segments4::<T>(set, stream, keys, &mut kl, ss);
        }
    } else {
        for q in 0..g {
            lane_finish::<T>(set, stream, &mut keys[q], lanes[q].n, &mut kl[q]);
        }
    }
    // bf16 and fp32 under Z: spread and join in one pass, which also checks the
    // plane lengths (`avx512::join_z_*`, `avx2_z::join_z_*`)
    let z512 = pl.z && V && crate::avx512::z_paths(T::MODE);
    let z_fused = z512 || (pl.z && V && crate::avx2_z::z_paths(T::MODE));
    let mut zm = [[0u8; SEG_ELEMS / 8]; LANES];
    for q in 0..g {
        let (k, l) = (&kl[q], &lanes[q]);
        if k.bad != 0 || 8 * k.base as u64 + k.bp != l.end {
            return false;
        }
        if pl.z && !z_fused {
            // one bit per key, set for a non-ZERO key, 8 keys a byte (the spread's
            // masks), and their count; 32 keys at a time (`l.n <= SEG_ELEMS`, itself a
            // multiple of 32: whole words stay inside the keys and the masks)
            let mut kept = 0usize;
            for c in 0..l.n.div_ceil(32) {
                let kw: &[u8; 32] = keys[q][32 * c..32 * c + 32].try_into().unwrap();
                let mut b = nonzero_mask32::<V>(kw);
                if 32 * c + 32 > l.n {
                    b &= (1u32 << (l.n - 32 * c)) - 1;
                }
                zm[q][4 * c..4 * c + 4].copy_from_slice(&b.to_le_bytes());
                kept += b.count_ones() as usize;
            }
            if kept != l.pend - l.pp {
                return false;
            }
        }
    }
    let w = T::W;
    for q in 0..g {
        let l = &lanes[q];
        let (n, pp, pe) = (l.n, l.pp, l.pend);
        let o = &mut tmp[q * ss * w..(q * ss + n) * w];
        if let Some((ct, c0)) = col {
            // COL: un-rotated keys join to un-rotated elements (bf16, fp32 only: the
            // key is the exponent field)
            debug_assert!(T::XBITS == 0);
            crate::coltab::unrotate_keys(&mut keys[q][..n], c0 + q * ss, ct);
        }
        let ks = &keys[q][..n];
        fn lo(v: &[u8], pp: usize, pe: usize) -> &[u8] {
            if v.is_empty() {
                v
            } else {
                &v[pp..pe]
            }
        }
        let (p1, lo1, lo0) = (&pl.p1[pp..pe], lo(pl.lo1, pp, pe), lo(pl.lo0, pp, pe));
        if !pl.z {
            T::join_v2(ks, p1, lo1, lo0, o);
        } else if z_fused {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `z_fused`: V (the CPU has AVX2, BMI2 and POPCNT), and `z512`:
            // it has the AVX-512 features (`avx512::enabled`).
            let exact = unsafe {
                use crate::{avx2_z, avx512};
                match (T::W == 2, z512) {
                    (true, true) => avx512::join_z_bf16(ks, p1, o),
                    (true, false) => avx2_z::join_z_bf16(ks, p1, o),
                    (false, true) => avx512::join_z_fp32(ks, p1, lo1, lo0, o),
                    (false, false) => avx2_z::join_z_fp32(ks, p1, lo1, lo0, o),
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            let exact = false;
            if !exact {
                return false;
            }
        } else {
            // ZERO keys (0: an escaped e = 0 was refused above) take no plane byte:
            // spread the planes to one byte per element, 0 under a ZERO (whose
            // element, key 0 and plane bytes 0, joins to 0), 8 elements at a time
            let np = if T::W == 4 { 3 } else { 1 };
            let src = [p1, lo1, lo0];
            let mut j = 0;
            for (c, &m) in zm[q].iter().enumerate().take(n.div_ceil(8)) {
                let m = m as usize;
                for (e, sp) in ex.iter_mut().zip(src.iter()).take(np) {
                    let v = shuffle8::<V>(load64(sp, j), &EXPAND[m]);
                    e[8 * c..8 * c + 8].copy_from_slice(&v.to_le_bytes());
                }
                j += m.count_ones() as usize;
            }
            let [e1, el1, el0] = &*ex;
            let (e1, el1, el0) = (&e1[..], &el1[..], &el0[..]);
            let lo = |e: &'_ [u8], v: &[u8]| if v.is_empty() { 0 } else { e.len().min(n) };
            T::join_v2(ks, &e1[..n], &el1[..lo(el1, lo1)], &el0[..lo(el0, lo0)], o);
        }
    }
    true
}

/// Bit `t` set iff byte `t` of `k` is not 0. `V`: the caller is compiled for AVX2.
#[inline(always)]
fn nonzero_mask32<const V: bool>(k: &[u8; 32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if V {
        use std::arch::x86_64::*;
        // SAFETY: V is set only in functions compiled for AVX2, called after the CPU
        // was checked; the unaligned load reads the 32 bytes of `k`.
        return unsafe {
            let v = _mm256_loadu_si256(k.as_ptr() as *const __m256i);
            !(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_setzero_si256())) as u32)
        };
    }
    let mut m = 0u32;
    for (i, c) in k.chunks_exact(8).enumerate() {
        m |= nonzero_bytes(u64::from_le_bytes(c.try_into().unwrap())) << (8 * i);
    }
    m
}

/// Bit `t` set iff byte `t` of `v` is not 0.
#[inline(always)]
fn nonzero_bytes(v: u64) -> u32 {
    const L7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    // high bit of each byte: set iff the byte is not 0
    let hi = (((v & L7) + L7) | v) & !L7;
    // gather the 8 high bits into the top byte
    ((hi >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
}

/// `V`: compiled for AVX2 (see [`shuffle8`]).
#[inline(always)]
fn decode_coded_body<T: V2, S: TableSource, const V: bool>(
    b: &[u8],
    out: &mut [u8],
    tables: &mut S,
    col: Option<(&ColTab, usize)>,
) -> Result<(), CodecError> {
    let w = T::W;
    let l = out.len();
    let mut cur = Cur { b, p: 1 };
    let flags = cur.u8()?;
    if flags & (F_BYTECODE | 0x80) != 0 {
        return Err(corrupt("unsupported block flags"));
    }
    let colb = match (flags & F_COL != 0, col) {
        (false, _) => None,
        (true, Some(c)) => Some(c),
        (true, None) => return Err(corrupt("COL block in a frame without a column table")),
    };
    if w != 4 && flags & (F_NO_LO0 | F_NO_LO1) != 0 {
        return Err(corrupt("omitted low planes outside fp32"));
    }
    let z = flags & F_Z != 0;
    let k = cur.u8()? as usize;
    let a = cur.u8()? as u32;
    let b4 = cur.u8()?;
    let iw = cur.u8()? as u32;
    let base = cur.u16()? as u32;
    if a < 1 || a > T::EMAX {
        return Err(corrupt("anchor out of range"));
    }
    let phi = (b4 & 3) as usize;
    let ssl = ((b4 >> 4) & 3) as u32;
    if b4 & 0xCC != 0 || ssl == 3 || phi >= w {
        return Err(corrupt("bad phase or sub-segment size"));
    }
    let ss = 256usize << ssl;
    if iw > 16 {
        return Err(corrupt("index width out of range"));
    }
    let (zw, zbase) = if z {
        let zw = cur.u8()? as u32;
        let zb = cur.u16()? as u32;
        if zw > 16 {
            return Err(corrupt("zero index width out of range"));
        }
        (zw, zb)
    } else {
        (0, 0)
    };
    let lens: [u8; NSYM] = if flags & F_EXPLICIT != 0 {
        if k != 0 {
            return Err(corrupt("explicit code with nonzero k"));
        }
        let t = cur.take(13)?;
        let mut lens = [0u8; NSYM];
        for s in 0..NSYM {
            lens[s] = (t[s / 2] >> (4 * (s % 2))) & 15;
            if lens[s] as u32 > MAXLEN {
                return Err(corrupt("explicit code length > 12"));
            }
        }
        if kraft(&lens) != 1 << MAXLEN {
            return Err(corrupt("explicit code is not a complete prefix code"));
        }
        lens
    } else {
        if k >= NCODES {
            return Err(corrupt("code index out of range"));
        }
        CODE_LENGTHS[k]
    };
    // version 1's key tables (fp16 under Z: ZERO without extra bits, key 0), and the
    // block scratch
    let mbits = if flags & F_EXPLICIT != 0 {
        crate::decode::MBITS_EXPLICIT
    } else {
        crate::decode::MBITS_STATIC
    };
    let (set, sc) = tables.tables_scratch::<T>(&lens, a, z, mbits);
    let DecScratch {
        keys,
        tmp,
        ex,
        seg,
        elided,
    } = sc;
    if l < phi {
        return Err(corrupt("block shorter than its phase"));
    }
    let m = (l - phi) / w;
    let t = (l - phi) % w;
    let gbytes = m * w;
    let nl = gbytes.div_ceil(LINE);
    // elided lines as a bitmap (cleared where this block reads it)
    let mut n_elided_bytes = 0usize;
    let lines = flags & F_LINES != 0;
    if lines {
        elided[..nl.div_ceil(64)].fill(0);
        let line_bytes = |j: usize| LINE.min(gbytes - j * LINE);
        match cur.u8()? {
            0 => {
                let bm = cur.take(nl.div_ceil(8))?;
                for j in 0..nl.div_ceil(8) * 8 {
                    if bm[j / 8] >> (j % 8) & 1 != 0 {
                        if j >= nl {
                            return Err(corrupt("line bitmap bit beyond the block"));
                        }
                        elided[j / 64] |= 1 << (j % 64);
                        n_elided_bytes += line_bytes(j);
                    }
                }
            }
            1 => {
                let count = cur.u16()? as usize;
                let mut prev_end = 0usize;
                for r in 0..count {
                    let first = cur.u16()? as usize;
                    let len = cur.u16()? as usize;
                    if len == 0 || (r > 0 && first <= prev_end) || first + len > nl {
                        return Err(corrupt("bad zero-line run"));
                    }
                    for j in first..first + len {
                        elided[j / 64] |= 1 << (j % 64);
                        n_elided_bytes += line_bytes(j);
                    }
                    prev_end = first + len;
                }
            }
            _ => return Err(corrupt("unknown zero-line list form")),
        }
        if n_elided_bytes == 0 {
            return Err(corrupt("empty zero-line list"));
        }
    }
    let k_elems = (gbytes - n_elided_bytes) / w;
    let ns = k_elems.div_ceil(ss);
    let head = cur.take(phi)?;
    // the index and the zero index sit between the stream and the tail (FORMAT.md §V2.3)
    let ixb = (ns * iw as usize).div_ceil(8) + if z { (ns * zw as usize).div_ceil(8) } else { 0 };
    let ix_at = b
        .len()
        .checked_sub(t + ixb)
        .filter(|&q| q >= cur.p)
        .ok_or(corrupt("coded block shorter than its layout"))?;
    let mut icur = Cur {
        b: &b[..ix_at + ixb],
        p: ix_at,
    };
    // per sub-segment: bits and ZERO count; blocks up to 64 KiB (at most 128
    // sub-segments) in the scratch, larger ones clear the 16 KiB a 1 MiB block's
    // index needs
    let mut big;
    let (seg_bits, seg_zeros): (&mut [u32], &mut [u32]) = if ns <= SMALL_NS {
        let [b, zc] = seg;
        if !z {
            // read below as the ZERO counts of a block without Z
            zc[..ns].fill(0);
        }
        (b, zc)
    } else {
        big = [[0u32; MAX_NS]; 2];
        let [b, z] = &mut big;
        (b, z)
    };
    read_packed(&mut icur, ns, iw, base, seg_bits)?;
    if z {
        read_packed(&mut icur, ns, zw, zbase, seg_zeros)?;
    }
    let mut total_bits = 0u64;
    let mut zsum = 0usize;
    for j in 0..ns {
        let n_j = ss.min(k_elems - j * ss);
        if seg_zeros[j] as usize > n_j {
            return Err(corrupt("zero count exceeds sub-segment"));
        }
        zsum += seg_zeros[j] as usize;
        total_bits += seg_bits[j] as u64;
    }
    let p_elems = k_elems - zsum;
    let p1 = cur.take(p_elems)?;
    let lo1 = if w == 4 && flags & F_NO_LO1 == 0 {
        cur.take(p_elems)?
    } else {
        &[][..]
    };
    let lo0 = if w == 4 && flags & F_NO_LO0 == 0 {
        cur.take(p_elems)?
    } else {
        &[][..]
    };
    let stream_bytes = total_bits.div_ceil(8);
    if stream_bytes > b.len() as u64 {
        return Err(corrupt("coded block shorter than its layout"));
    }
    let stream = cur.take(stream_bytes as usize)?;
    let tail = &b[b.len() - t..];
    if cur.p != ix_at {
        return Err(corrupt("coded block length mismatch"));
    }
    if total_bits % 8 != 0 && stream[stream.len() - 1] >> (total_bits % 8) != 0 {
        return Err(corrupt("nonzero stream padding"));
    }
    // the exact path's decode table, built when a group needs it
    let build_lut = || {
        let words = crate::codes::canonical_words(&lens);
        let mut lut = [E_INVALID; TABLE];
        for s in 0..NSYM {
            let len = lens[s] as u32;
            if len == 0 {
                continue;
            }
            let v = (if s == ZERO {
                E_ZERO
            } else if s == ESC {
                E_ESC
            } else if (s as u32) < a && (s as u32) < ND as u32 {
                (a - s as u32) << 8
            } else {
                E_INVALID
            }) | len;
            let wd = words[s] as usize;
            for hi in 0..(1usize << (MAXLEN - len)) {
                lut[wd | (hi << len)] = v;
            }
        }
        lut
    };
    let mut lut_store: Option<[u32; TABLE]> = None;
    let set = Some(set);
    copy_ascending(&mut out[..phi], head);
    let planes_k = Planes {
        p1,
        lo1,
        lo0,
        z,
        a_lut: &NO_LUT,
    };
    // Sub-segments are decoded LANES at a time (independent bit chains), into `tmp`,
    // then written out in ascending order (kept lines and elided zero lines); the
    // key path writes a group without lines straight to `out`, in ascending order.
    let mut gl = 0usize; // next grid line to write (LINES)
    let grid_out = &mut out[phi..phi + gbytes];
    let mut seg_bit0 = 0u64; // first bit of the group's first sub-segment
    let mut seg_p0 = 0usize; // first plane element of the group
    let mut j = 0;
    while j < ns {
        let g = LANES.min(ns - j);
        let i0 = j * ss;
        let n_group = (g * ss).min(k_elems - i0);
        let mut lanes = [Lane::default(); LANES];
        let mut bit = seg_bit0;
        let mut pe = seg_p0;
        for (q, lane) in lanes.iter_mut().enumerate().take(g) {
            let n_q = ss.min(k_elems - i0 - q * ss);
            lane.bit = bit;
            lane.end = bit + seg_bits[j + q] as u64;
            lane.pp = pe;
            lane.pend = pe + n_q - seg_zeros[j + q] as usize;
            lane.out = q * ss;
            lane.n = n_q;
            bit = lane.end;
            pe = lane.pend;
        }
        // COL: elements are un-rotated in the group buffer before they are written,
        // except on the key path of bf16 and fp32 without lines (their keys are the
        // exponent fields: un-rotated before the join, which writes `out`)
        let key_col = match colb {
            Some((ct, bs)) if T::XBITS == 0 && !lines => {
                Some((ct, crate::coltab::grid_col0::<T>(bs, phi) + i0))
            }
            _ => None,
        };
        let direct = !lines && (colb.is_none() || key_col.is_some());
        let done = match set {
            Some(set) => {
                let dst = if direct {
                    &mut grid_out[i0 * w..(i0 + n_group) * w]
                } else {
                    &mut tmp[..]
                };
                key_group_call::<T, V>(
                    set, stream, &planes_k, &lanes, g, ss, keys, ex, key_col, dst,
                )
            }
            None => false,
        };
        let planes = Planes {
            a_lut: if done {
                &NO_LUT
            } else {
                lut_store.get_or_insert_with(build_lut)
            },
            ..planes_k
        };
        let full = g == LANES && lanes[LANES - 1].n == ss;
        // Fast path: even a corrupt stream cannot make these lanes read past the
        // stream (at most 20 bits per element) or the planes (at most n elements);
        // overruns into a neighbour's bits are caught by the end checks below.
        let fast = full
            && lanes.iter().all(|l| {
                (l.bit >> 3) as usize + (l.n * 20).div_ceil(8) + 8 <= stream.len()
                    && l.pp + l.n <= p_elems
            });
        if done {
        } else if fast {
            let tmp = &mut tmp[..];
            // four independent chains in registers
            let (mut b0, mut b1, mut b2, mut b3) =
                (lanes[0].bit, lanes[1].bit, lanes[2].bit, lanes[3].bit);
            let (mut q0, mut q1, mut q2, mut q3) =
                (lanes[0].pp, lanes[1].pp, lanes[2].pp, lanes[3].pp);
            for i in 0..ss {
                // SAFETY: the bounds just checked (see `fast_elem`).
                let x0 = unsafe { fast_elem::<T>(&mut b0, &mut q0, stream, &planes) }?;
                let x1 = unsafe { fast_elem::<T>(&mut b1, &mut q1, stream, &planes) }?;
                let x2 = unsafe { fast_elem::<T>(&mut b2, &mut q2, stream, &planes) }?;
                let x3 = unsafe { fast_elem::<T>(&mut b3, &mut q3, stream, &planes) }?;
                T::store(tmp, i, x0);
                T::store(tmp, ss + i, x1);
                T::store(tmp, 2 * ss + i, x2);
                T::store(tmp, 3 * ss + i, x3);
            }
            for (l, (b, q)) in lanes
                .iter_mut()
                .zip([(b0, q0), (b1, q1), (b2, q2), (b3, q3)])
            {
                l.bit = b;
                l.pp = q;
            }
        } else if full {
            let tmp = &mut tmp[..];
            for _ in 0..ss {
                for lane in lanes.iter_mut() {
                    dec_step::<T>(lane, stream, &planes, tmp)?;
                }
            }
        } else {
            let tmp = &mut tmp[..];
            for lane in lanes.iter_mut().take(g) {
                for _ in 0..lane.n {
                    dec_step::<T>(lane, stream, &planes, tmp)?;
                }
            }
        }
        for lane in lanes.iter().take(g).filter(|_| !done) {
            if lane.bit != lane.end {
                return Err(corrupt("sub-segment does not end at its length"));
            }
            if lane.pp != lane.pend {
                return Err(corrupt("zero count mismatch"));
            }
        }
        seg_bit0 = bit;
        seg_p0 = pe;
        if done && direct {
            j += g;
            continue;
        }
        let bytes = &mut tmp[..n_group * w];
        let col0 = colb.map(|(ct, bs)| (ct, crate::coltab::grid_col0::<T>(bs, phi)));
        if !lines {
            let dst = &mut grid_out[i0 * w..i0 * w + bytes.len()];
            match col0 {
                Some((ct, c0)) => crate::coltab::unrotate_copy::<T, V>(dst, bytes, c0 + i0, ct),
                None => copy_ascending(dst, bytes),
            }
        } else {
            let mut q = 0;
            while q < bytes.len() {
                while gl < nl && elided[gl / 64] >> (gl % 64) & 1 != 0 {
                    let lb = LINE.min(gbytes - gl * LINE);
                    fill_ascending(&mut grid_out[gl * LINE..gl * LINE + lb], 0);
                    gl += 1;
                }
                if gl >= nl {
                    return Err(corrupt("kept elements beyond the grid"));
                }
                let lb = LINE.min(gbytes - gl * LINE);
                if q + lb > bytes.len() {
                    return Err(corrupt("kept line split across groups"));
                }
                let (dst, src) = (
                    &mut grid_out[gl * LINE..gl * LINE + lb],
                    &mut bytes[q..q + lb],
                );
                match col0 {
                    Some((ct, c0)) => {
                        crate::coltab::unrotate_copy::<T, V>(dst, src, c0 + gl * LINE / w, ct)
                    }
                    None => copy_ascending(dst, src),
                }
                q += lb;
                gl += 1;
            }
        }
        j += g;
    }
    if lines {
        while gl < nl {
            let lb = LINE.min(gbytes - gl * LINE);
            fill_ascending(&mut grid_out[gl * LINE..gl * LINE + lb], 0);
            gl += 1;
        }
    }
    copy_ascending(&mut out[phi + gbytes..], tail);
    Ok(())
}

// ---------------------------------------------------------------------------------
// Detection

/// Frame type detection over (type, phase) (FORMAT.md §V2.6 "Detection").
pub fn detect_v2(src: &[u8]) -> Dtype {
    detect_v2_phase(src).0
}

/// [`detect_v2`] and, for a float type, the phase of its winning candidate (the
/// fast encoder's first carried phase, FORMAT.md §V2.11).
pub(crate) fn detect_v2_phase(src: &[u8]) -> (Dtype, Option<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { detect_v2_avx2(src) };
        }
    }
    detect_v2_body(src)
}

/// # Safety
/// The CPU must support AVX2 and POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn detect_v2_avx2(src: &[u8]) -> (Dtype, Option<usize>) {
    detect_v2_body(src)
}

/// Detection's histograms, kept in four interleaved copies (element `i` of a run
/// goes to copy `i mod 4`) and summed by [`GroupHists::finish`]: a group's fields
/// mostly fall in a few bins, and one histogram would chain each increment on the
/// store of the one before. Each 16-bit word at φ is counted once, by its bits
/// 7..16 (`x >> 7`: the sign and bf16's exponent field), which hold every
/// candidate's field: bf16's (the low 8), fp16's (bits 10..15, its top five) and
/// fp32's (bf16's of its high half); and the word's high byte (`x >> 8`), so that
/// the fp8 candidates' byte histogram ([`GroupHists::finish`]) needs no pass of its
/// own: the words at φ = 0 hold the odd bytes of a group, those at φ = 1 the even
/// ones but byte 0 (`byte0`).
pub(crate) struct GroupHists {
    /// `x >> 7` of the words: `[copy][φ][parity]` (u16 counts: at most 64 groups
    /// of 32 words)
    pub(crate) hb: [[[[u16; 512]; 2]; 2]; 4],
    /// bf16 field of each group's element 0 at φ (fp32 at φ + 2 does not hold it)
    pub(crate) first: [[u16; 256]; 2],
    /// byte 0 of each group
    pub(crate) byte0: [u16; 256],
}

impl GroupHists {
    pub(crate) fn new() -> GroupHists {
        GroupHists {
            hb: [[[[0; 512]; 2]; 2]; 4],
            first: [[0; 256]; 2],
            byte0: [0; 256],
        }
    }

    /// One group's words at φ into the histograms: `eb[i]` is word `i`'s `x >> 7`
    /// (words `0 .. (64 − φ) / 2`; at φ = 1 word 31 is not one).
    #[inline(always)]
    pub(crate) fn add_words(&mut self, phi: usize, eb: &[u16; 32]) {
        for i in 0..16 {
            self.hb[i & 3][phi][0][eb[2 * i] as usize & 511] += 1;
        }
        for i in 0..(64 - phi) / 4 {
            self.hb[i & 3][phi][1][eb[2 * i + 1] as usize & 511] += 1;
        }
        self.first[phi][eb[0] as usize & 0xFF] += 1;
    }

    /// The candidates' histograms into `st`: bf16 at φ from both parities; fp16 at
    /// φ, the same words, from bf16's by its field's top five bits; and fp32, whose
    /// exponent field is the bf16 one of its high half: fp32 φ (φ + 2) is bf16 φ's
    /// odd (even, but the first) elements. Returns the histogram of the groups'
    /// bytes (fp8's candidates, FORMAT.md §V2.10 "Detection"): a byte `b` is the
    /// high byte of the words with `x >> 7` equal to `2b` or `2b + 1`.
    #[inline(always)]
    pub(crate) fn finish(&self, st: &mut [Stats; 8]) -> [u64; 256] {
        // the four copies summed, per (φ, parity): straight loops (vectorised)
        let mut sum = [[[0u32; 512]; 2]; 2];
        for (phi, sp) in sum.iter_mut().enumerate() {
            for (par, s) in sp.iter_mut().enumerate() {
                for c in &self.hb {
                    for (a, &x) in s.iter_mut().zip(c[phi][par].iter()) {
                        *a += x as u32;
                    }
                }
            }
        }
        let mut hw = [0u32; 512];
        for s in sum.iter().flatten() {
            for (a, &x) in hw.iter_mut().zip(s.iter()) {
                *a += x;
            }
        }
        for (phi, sp) in sum.iter().enumerate() {
            let (ev, od) = (&sp[0], &sp[1]);
            for e in 0..256 {
                let (ev, od) = (ev[e] + ev[256 + e], od[e] + od[256 + e]);
                st[phi].hc[e] = ev + od;
                st[4 + phi].hc[e] = od;
                st[6 + phi].hc[e] = ev - self.first[phi][e] as u32;
            }
            let (b, f) = st.split_at_mut(2);
            for (e5, c) in f[phi].hc[..32].iter_mut().enumerate() {
                *c = b[phi].hc[8 * e5..8 * e5 + 8].iter().sum();
            }
        }
        let mut h = [0u64; 256];
        for (b, x) in h.iter_mut().enumerate() {
            *x = (hw[2 * b] + hw[2 * b + 1] + self.byte0[b] as u32) as u64;
        }
        h
    }
}

/// One detection group's counts at φ into the candidates' `st` (bf16 and fp16 at φ,
/// fp32 at φ and φ + 2), from `zm`, its zero words as a bit mask (bit `i`: word `i`
/// at φ is 0; at φ = 1 word 31, not a word, counts as one).
#[inline(always)]
pub(crate) fn group_counts(phi: usize, zm: u32, st: &mut [Stats; 8]) {
    let n = (64 - phi) / 2;
    let nz16 = (zm.count_ones() - (32 - n) as u32) as u64;
    for c in [phi, 2 + phi] {
        st[c].nzero += nz16;
        st[c].count += n as u64;
    }
    // fp32 at φ: words (2i, 2i + 1), i < m0: zero where both words are; at φ + 2:
    // words (2i + 1, 2i + 2), i < m1. Pairs end by word 31 (φ = 0, first) or 30
    let both = zm & (zm >> 1);
    for (q, c, m) in [
        (0u32, 4 + phi, (64 - phi) / 4),
        (1, 6 + phi, (62 - phi) / 4),
    ] {
        // bits q, q + 2, …, q + 2(m − 1)
        let span = 2 * m as u32 - 1;
        let lim = (0x5555_5555u32 << q) & (u32::MAX >> (31 - (q + span - 1)));
        st[c].nzero += (both & lim).count_ones() as u64;
        st[c].count += m as u64;
    }
}

/// One detection group's statistics for the 8 (type, phase) candidates (FORMAT.md
/// §V2.6 "Detection"), from one read of its 16-bit words at phases 0 and 1: the
/// exponent fields go to `h` (the candidates' histograms once [`GroupHists::finish`]
/// adds them up), every candidate's `nzero`, `lo_or`, `count` straight to `st`.
/// Equals [`Stats::add`] per candidate (a test checks). `sub[φ]`: fp16 subnormals
/// (`e = 0`, `x & 0x7FFF != 0`) at φ, for V2.10's FP16N candidate. The AVX-512 pass
/// (`avx512::detect_groups`) gives the same statistics (a test checks).
#[inline(always)]
fn group_stats(s: &[u8], st: &mut [Stats; 8], h: &mut GroupHists, sub: &mut [u64; 2]) {
    h.byte0[s[0] as usize] += 1;
    for phi in 0..2 {
        // 16-bit words at bytes phi + 2i: 32 at φ = 0, 31 at φ = 1 (word 31 is 0);
        // copied as bytes, then every per-word field computed over all 32 words in
        // straight loops (vectorised), and only the histograms indexed per word
        let n = (64 - phi) / 2;
        let mut bytes = [0u8; 64];
        bytes[..2 * n].copy_from_slice(&s[phi..phi + 2 * n]);
        let mut wd = [0u16; 32];
        for (w, b) in wd.iter_mut().zip(bytes.chunks_exact(2)) {
            *w = u16::from_le_bytes([b[0], b[1]]);
        }
        let mut eb = [0u16; 32];
        let mut nsub = 0u32;
        for i in 0..32 {
            let x = wd[i];
            eb[i] = x >> 7;
            // (word 31 at φ = 1 is 0: not a subnormal)
            nsub += (x & 0x7C00 == 0 && x & 0x7FFF != 0) as u32;
        }
        sub[phi] += nsub as u64;
        h.add_words(phi, &eb);
        let mut zm = 0u32;
        for (i, &x) in wd.iter().enumerate() {
            zm |= ((x == 0) as u32) << i;
        }
        group_counts(phi, zm, st);
        // the OR of the even and of the odd words (bf16 and fp16 at φ: their OR)
        let mut or_eo = 0u32;
        for c in bytes.chunks_exact(4) {
            or_eo |= u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        let or16 = (or_eo & 0xFFFF) | (or_eo >> 16);
        // fp32 at φ + 2: the words at bytes 2 + 4i as u32, i < m1 = 15
        let mut or_oe2 = 0u32;
        for c in bytes[2..62].chunks_exact(4) {
            or_oe2 |= u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        // fp32 at φ: the words at bytes 4i, i < m0 (all 16 at φ = 0: `or_eo`)
        let m0 = (64 - phi) / 4;
        let mut or_eo0 = 0u32;
        for c in bytes[..4 * m0].chunks_exact(4) {
            or_eo0 |= u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        for (c, or) in [
            (phi, or16),
            (2 + phi, or16),
            (4 + phi, or_eo0),
            (6 + phi, or_oe2),
        ] {
            st[c].lo_or |= or;
        }
    }
}

/// Whether the 64 bytes of a detection group are all equal ([`all_equal`] for one
/// group, in eight 8-byte words: no call).
#[inline(always)]
pub(crate) fn group_equal(s: &[u8]) -> bool {
    let v = u64::from_ne_bytes([s[0]; 8]);
    let s: &[u8; 64] = s.try_into().expect("a group is 64 bytes");
    s.chunks_exact(8).fold(0u64, |d, c| {
        d | (u64::from_ne_bytes(c.try_into().unwrap()) ^ v)
    }) == 0
}

/// The best of detection's float candidates (FORMAT.md §V2.6 "Detection"), their
/// statistics `st` (bf16 φ 0, 1; fp16 φ 0, 1; fp32 φ 0, 1, 2, 3): its (value, bytes
/// covered, type) and phase.
#[inline(always)]
fn best_float(st: &[Stats; 8]) -> ((u64, u64, Dtype), usize) {
    // per candidate: type, bytes covered and the lower bound of its value
    // (candidates: bf16 φ 0, 1; fp16 φ 0, 1; fp32 φ 0, 1, 2, 3)
    let cand: [(Dtype, u64, u64); 8] = std::array::from_fn(|c| {
        let stc = &st[c];
        match c {
            0 | 1 => (Dtype::Bf16, 2 * stc.count, static_lb::<Bf16>(stc)),
            2 | 3 => (Dtype::Fp16, 2 * stc.count, static_lb::<Fp16>(stc)),
            _ => (Dtype::Fp32, 4 * stc.count, static_lb::<Fp32>(stc)),
        }
    });
    // The best is the first candidate (in the order above) of the least value /
    // bytes. Evaluated in the order of their lower bounds (as value / bytes), so
    // that the best is found early: a candidate whose bound is above the best's
    // value, or equal to it with a later index, cannot replace it (not evaluated).
    let below = |v: u64, b: u64, c: usize, best: &(u64, u64, usize)| {
        let (l, r) = (
            (v as u128) * (best.1 as u128),
            (best.0 as u128) * (b as u128),
        );
        l < r || (l == r && c < best.2)
    };
    let mut order: [usize; 8] = std::array::from_fn(|c| c);
    order.sort_by(|&x, &y| {
        let (l, r) = (
            (cand[x].2 as u128) * (cand[y].1 as u128),
            (cand[y].2 as u128) * (cand[x].1 as u128),
        );
        l.cmp(&r).then(x.cmp(&y))
    });
    // (value, bytes, candidate)
    let mut bc: Option<(u64, u64, usize)> = None;
    for c in order {
        let (dt, bytes, lb) = cand[c];
        if bc.is_some_and(|b| !below(lb, bytes, c, &b)) {
            continue;
        }
        let value = match dt {
            Dtype::Bf16 => choose::<Bf16>(&st[c], false).value,
            Dtype::Fp16 => choose::<Fp16>(&st[c], false).value,
            _ => choose::<Fp32>(&st[c], false).value,
        };
        if bc.is_none_or(|b| below(value, bytes, c, &b)) {
            bc = Some((value, bytes, c));
        }
    }
    let (value, bytes, c) = bc.expect("eight candidates");
    ((value, bytes, cand[c].0), [0, 1, 0, 1, 0, 1, 2, 3][c])
}

/// Which form of detection's pass over its groups runs: the portable one, or (the
/// same statistics) `avx2_detect::detect_groups` or `avx512::detect_groups`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum GroupPass {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl GroupPass {
    /// The fastest this CPU has (AVX-512 where [`crate::avx512::enabled`]).
    #[inline]
    fn best() -> GroupPass {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::avx512::enabled() {
                return GroupPass::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt") {
                return GroupPass::Avx2;
            }
        }
        GroupPass::Portable
    }
}

/// Detection's pass over its `g` groups of 64 bytes (FORMAT.md §V2.6
/// "Detection"): [`group_stats`] of each group that is not all one byte; returns
/// how many were. By the form `pass` (which the CPU must have; the AVX2 and AVX-512
/// forms give the same statistics).
#[inline(always)]
fn detect_groups(
    pass: GroupPass,
    src: &[u8],
    g: usize,
    st: &mut [Stats; 8],
    h: &mut GroupHists,
    sub: &mut [u64; 2],
) -> u64 {
    let units = src.len() / 64;
    match pass {
        // SAFETY: `best` chose it, or a test checked: the CPU has the features.
        #[cfg(target_arch = "x86_64")]
        GroupPass::Avx512 => return unsafe { crate::avx512::detect_groups(src, g, st, h, sub) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        GroupPass::Avx2 => return unsafe { crate::avx2_detect::detect_groups(src, g, st, h, sub) },
        GroupPass::Portable => {}
    }
    let mut used = 0u64;
    for j in 0..g {
        let off = 64 * (j * units / g);
        let s = &src[off..off + 64];
        if group_equal(s) {
            continue;
        }
        used += 1;
        group_stats(s, st, h, sub);
    }
    used
}

#[inline(always)]
fn detect_v2_body(src: &[u8]) -> (Dtype, Option<usize>) {
    let n = src.len();
    if n < MIN_CODED_INPUT {
        return (Dtype::Raw, None);
    }
    let g = (n / 1024).clamp(1, 64);
    // statistics per (type, phase): bf16 0..2, fp16 2..4, fp32 4..8
    let mut st: [Stats; 8] = Default::default();
    let mut h = GroupHists::new();
    let mut sub = [0u64; 2];
    let used = detect_groups(GroupPass::best(), src, g, &mut st, &mut h, &mut sub);
    if used == 0 {
        return (Dtype::Raw, None);
    }
    let hbytes = h.finish(&mut st);
    let (best, best_phi) = best_float(&st);
    let float = best.2;
    // fp8 byte codes and FP16N (FORMAT.md §V2.10)
    let best = crate::v2_byte::detect_more(src, best, &st, sub, &hbytes, used, g as u64 - used);
    // raw unless the estimate saves more than 1/32 of the sampled bits
    if best.0 * 32 >= 31 * 8 * SAMPLE_STRIDE as u64 * best.1 {
        (Dtype::Raw, None)
    } else {
        (best.2, (best.2 == float).then_some(best_phi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte shuffles: compacting then spreading by a mask gives back the kept
    /// bytes and zeros elsewhere, and the `pshufb` path equals the portable one.
    #[test]
    fn shuffles_compact_and_spread() {
        let v = 0x8877_6655_4433_2211u64;
        for m in 0..256usize {
            let c = shuffle8::<false>(v, &COMPACT[m]);
            let e = shuffle8::<false>(c, &EXPAND[m]);
            let mut want = 0u64;
            for i in 0..8 {
                if m >> i & 1 != 0 {
                    want |= v & (0xFF << (8 * i));
                }
            }
            assert_eq!(e, want, "mask {m:#x}");
            let n = m.count_ones();
            let keep = if n == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * n)) - 1
            };
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                assert_eq!(shuffle8::<true>(v, &COMPACT[m]) & keep, c & keep);
                assert_eq!(shuffle8::<true>(c, &EXPAND[m]), e);
            }
        }
    }

    /// `coltab::sample_fused` gives `Stats::sample`'s statistics and
    /// `sample_hist_rotated`'s histogram (no elided lines) of the same grid,
    /// every type, several periods, lengths and column offsets.
    #[test]
    fn sample_fused_matches_the_two_passes() {
        fn check<T: V2>(b: &[u8], ct: &ColTab) {
            for m in [b.len() / T::W, b.len() / T::W - 1, 53, 52, 1] {
                for col0 in [0usize, 5, 1234, 99_999] {
                    let (got, hr) = crate::coltab::sample_fused::<T>(b, m, col0, ct);
                    let want = Stats::sample::<T>(b, m);
                    assert_eq!(got.hc, want.hc, "m {m}");
                    assert_eq!(
                        (got.nzero, got.count, got.lo_or),
                        (want.nzero, want.count, want.lo_or),
                        "m {m}"
                    );
                    let want_r = crate::coltab::sample_hist_rotated::<T>(b, m, None, col0, ct);
                    assert_eq!(hr, want_r, "m {m} col0 {col0}");
                    // and both equal the rule itself: sample i·13 in column
                    // (col0 + 13·i) mod P, its field rotated by that column's offset
                    let mut naive = [0u32; 256];
                    for i in (0..m).step_by(crate::encode::SAMPLE_STRIDE) {
                        let e = T::exp(T::load(b, i));
                        let c = ct.off[(col0 + i) % ct.p];
                        naive[crate::coltab::rot::<false>(e, c, T::EMAX) as usize] += 1;
                    }
                    assert_eq!(hr, naive, "m {m} col0 {col0} P {}", ct.p);
                }
            }
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let b: Vec<u8> = (0..40000)
            .map(|i| match (i / 300) % 3 {
                0 => 0,
                1 => (rnd() % 3) as u8,
                _ => rnd() as u8,
            })
            .collect();
        for p in [16usize, 17, 40, 53, 1536, 8192] {
            let mut ct = ColTab {
                p,
                off: [0; crate::coltab::PMAX],
            };
            for j in 0..p {
                ct.off[j] = (rnd() % 16) as i8 - 8;
            }
            check::<Bf16>(&b, &ct);
            check::<Fp16>(&b, &ct);
            check::<Fp32>(&b, &ct);
        }
    }

    /// `Stats::sample` equals `Stats::add` over the elements `0, 13, 26, … < m`
    /// (histogram, zeros, count; `lo_or` as `choose` reads it), every type, with
    /// zeros, subnormals and every remainder length.
    /// fp32's one-pass check sample of the other phases equals `sample_sparse` at
    /// each, for every carried phase and length remainder.
    #[test]
    fn fp32_phases_sample_matches_sample_sparse() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut b = vec![0u8; 20_000];
        for (i, v) in b.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // zeros now and then (nzero), all bytes otherwise
            *v = if i % 7 < 3 { 0 } else { x as u8 };
        }
        for len in [
            20_000,
            19_999,
            19_998,
            19_997,
            4 * 104 * 3 + 5,
            4 * 104 + 7,
            8,
            7,
        ] {
            let blk = &b[..len];
            for pp in 0..4 {
                let got = Stats::sample_sparse_fp32_phases(blk, pp, CHECK_STRIDE);
                for phi in (0..4).filter(|&p| p != pp && p < len) {
                    let want = Stats::sample_sparse::<crate::elem::Fp32>(
                        &blk[phi..],
                        (len - phi) / 4,
                        CHECK_STRIDE,
                    );
                    let g = &got[phi];
                    assert_eq!(g.hc, want.hc, "len {len} pp {pp} phi {phi}");
                    assert_eq!(
                        (g.nzero, g.count, g.lo_or),
                        (want.nzero, want.count, want.lo_or),
                        "len {len} pp {pp} phi {phi}"
                    );
                }
            }
        }
    }

    #[test]
    fn sample_stats_match_add() {
        fn check<T: V2>(b: &[u8]) {
            for m in [b.len() / T::W, b.len() / T::W - 1, 53, 52, 1] {
                let mut want = Stats::default();
                for i in (0..m).step_by(SAMPLE_STRIDE) {
                    want.add::<T>(&b[i * T::W..], 1);
                }
                // both sampling loops: zeros counted in the loop, and counted after
                // (`sample` takes either by the thread's last sample)
                for (how, got) in [
                    ("sample", Stats::sample::<T>(b, m)),
                    ("counting", Stats::sample_counting::<T>(b, m)),
                    (
                        "hist",
                        Stats::sample_hist::<T>(b, m).count_zeros::<T>(b, m, SAMPLE_STRIDE),
                    ),
                ] {
                    assert_eq!(got.hc, want.hc, "{how} m {m}");
                    let got_nc = (got.nzero, got.count);
                    assert_eq!(got_nc, (want.nzero, want.count), "{how} m {m}");
                    // 16-bit samples leave `lo_or` 0 (only fp32's `choose` reads it)
                    let want_or = if T::W == 4 { want.lo_or } else { 0 };
                    assert_eq!(got.lo_or, want_or, "{how} m {m}");
                }
                // without the zeros read, `nzero` is the histogram's e = 0 count
                assert_eq!(
                    Stats::sample_hist::<T>(b, m).nzero,
                    want.hc[0] as u64,
                    "m {m}"
                );
            }
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let b: Vec<u8> = (0..40000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // runs of zero bytes, small values (subnormals), random bytes
                match (i / 300) % 3 {
                    0 => 0,
                    1 => (x % 3) as u8,
                    _ => x as u8,
                }
            })
            .collect();
        check::<Bf16>(&b);
        check::<Fp16>(&b);
        check::<Fp32>(&b);
    }

    /// The AVX2 zero-line test equals the portable one: all-zero lines and lines
    /// with one set bit at every byte.
    #[test]
    fn zero_line_vector_matches_portable() {
        let mut line = [0u8; LINE];
        assert!(zero_line::<false>(&line));
        for i in 0..LINE {
            for b in [0x01u8, 0x80] {
                line[i] = b;
                assert!(!zero_line::<false>(&line));
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx2") {
                    assert!(!zero_line::<true>(&line));
                }
                line[i] = 0;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            assert!(zero_line::<true>(&line));
        }
    }

    /// `static_lb` never exceeds the static choice's value (it prunes phases and
    /// detection candidates only where they cannot win): every type and phase of
    /// Gaussian-like, sparse, misaligned and random data.
    #[test]
    fn static_lower_bound_holds() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..300 {
            let n = 4096 + (rnd() % 4096) as usize;
            let b: Vec<u8> = (0..n)
                .map(|i| match case % 4 {
                    0 => rnd() as u8,
                    1 if i % 2 == 1 => 0x3C + (rnd() % 3) as u8,
                    2 if (i / 64) % 3 == 0 => 0,
                    3 => (rnd() % 5) as u8,
                    _ => rnd() as u8,
                })
                .collect();
            for phi in 0..4 {
                let g = &b[phi..];
                let st = Stats::sample::<Bf16>(g, g.len() / 2);
                assert!(static_lb::<Bf16>(&st) <= choose_static::<Bf16>(&st).best.value);
                let st = Stats::sample::<Fp16>(g, g.len() / 2);
                assert!(static_lb::<Fp16>(&st) <= choose_static::<Fp16>(&st).best.value);
                let st = Stats::sample::<Fp32>(g, g.len() / 4);
                assert!(static_lb::<Fp32>(&st) <= choose_static::<Fp32>(&st).best.value);
            }
        }
    }

    /// The rule's Huffman as written (FORMAT.md §V2.6): a list of live nodes sorted
    /// by (weight, number), the two smallest removed, their parent inserted.
    fn explicit_lengths_ref(cnt: &[u64; NSYM]) -> [u8; NSYM] {
        let mut weight = [0u64; 2 * NSYM];
        let mut parent = [usize::MAX; 2 * NSYM];
        let mut live: Vec<usize> = (0..NSYM).collect();
        for s in 0..NSYM {
            weight[s] = 16 * cnt[s] + 1;
        }
        let mut next = NSYM;
        for _ in 0..NSYM - 1 {
            live.sort_by_key(|&n| (weight[n], n));
            let (a, b) = (live[0], live[1]);
            live.drain(..2);
            weight[next] = weight[a] + weight[b];
            parent[a] = next;
            parent[b] = next;
            live.push(next);
            next += 1;
        }
        let mut depth = [0u32; 2 * NSYM];
        for n in (0..next - 1).rev() {
            depth[n] = depth[parent[n]] + 1;
        }
        let mut lens = [0u32; NSYM];
        lens.copy_from_slice(&depth[..NSYM]);
        if lens.iter().any(|&l| l > MAXLEN) {
            for l in lens.iter_mut() {
                *l = (*l).min(MAXLEN);
            }
            let mut k: u32 = lens.iter().map(|&l| 1u32 << (MAXLEN - l)).sum();
            while k > 1 << MAXLEN {
                let s = (0..NSYM)
                    .filter(|&s| lens[s] < MAXLEN)
                    .max_by_key(|&s| (lens[s], std::cmp::Reverse(weight[s]), s))
                    .unwrap();
                lens[s] += 1;
                k -= 1 << (MAXLEN - lens[s]);
            }
            while k < 1 << MAXLEN {
                let s = (0..NSYM)
                    .max_by_key(|&s| (lens[s], weight[s], std::cmp::Reverse(s)))
                    .unwrap();
                k += 1 << (MAXLEN - lens[s]);
                lens[s] -= 1;
            }
        }
        lens.map(|l| l as u8)
    }

    /// The two-queue Huffman gives the rule's lengths: random, sparse, skewed and
    /// tied counts (ties between leaves and merged nodes included).
    #[test]
    fn explicit_lengths_match_the_rule() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..20000 {
            let mut cnt = [0u64; NSYM];
            for c in cnt.iter_mut() {
                let r = rnd();
                *c = match case % 5 {
                    0 => r % 4,
                    1 => r % 3000,
                    2 => (1u64 << (r % 17)) & !1,
                    3 => {
                        if r % 3 == 0 {
                            0
                        } else {
                            r % 65536
                        }
                    }
                    _ => [0, 1, 2, 4, 8][(r % 5) as usize],
                };
            }
            assert_eq!(
                explicit_lengths(&cnt),
                explicit_lengths_ref(&cnt),
                "{cnt:?}"
            );
        }
    }

    /// Detection test sources: 1 to 70 groups of floats of each type at odd offsets,
    /// sparse and random bytes, constant groups.
    fn detect_sources() -> Vec<Vec<u8>> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..600usize)
            .map(|case| {
                let n = 256 + (rnd() % (70 * 1024)) as usize;
                let kind = case % 6;
                (0..n)
                    .map(|i| {
                        let r = rnd();
                        match kind {
                            0 => r as u8,
                            // bf16-like, half zero words, at an odd start
                            1 => {
                                if (i / 2 + case) % 2 == 0 {
                                    0
                                } else if (i + case) % 2 == 1 {
                                    0x3C | (r as u8 & 3)
                                } else {
                                    r as u8
                                }
                            }
                            // fp16 subnormals and zeros
                            2 => {
                                if (i + case) % 2 == 1 {
                                    (r % 3) as u8
                                } else {
                                    r as u8
                                }
                            }
                            // constant runs of 64 and more bytes between fp32-like bytes
                            3 => {
                                if (i / 256) % 3 == 0 {
                                    7
                                } else if (i + case) % 4 == 3 {
                                    0x3E | (r as u8 & 1)
                                } else {
                                    r as u8
                                }
                            }
                            // fp32 holding bf16 at φ = 1 (bytes 1, 2 mod 4 zero) but for
                            // bytes 61, 62 of a group, the head of an element no phase-1
                            // element of the group holds
                            5 => {
                                if i % 4 == 0 || i % 4 == 3 || (i % 64 >= 61 && r % 2 == 0) {
                                    r as u8
                                } else {
                                    0
                                }
                            }
                            _ => {
                                if r % 7 == 0 {
                                    r as u8
                                } else {
                                    0
                                }
                            }
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Detection's AVX2 and AVX-512 passes (`avx2_detect::detect_groups`,
    /// `avx512::detect_groups`) give the portable pass's statistics, histograms and
    /// group count (each where the CPU has it).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn detect_groups_vector_passes_match() {
        let mut passes = vec![];
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("popcnt") {
            passes.push(GroupPass::Avx2);
        }
        if crate::avx512::set_enabled(true) {
            passes.push(GroupPass::Avx512);
        } else {
            eprintln!("AVX-512 pass skipped: this CPU has no AVX-512 (F, BW, VL, VBMI, VBMI2)");
        }
        if passes.is_empty() {
            eprintln!("skipped: this CPU has neither AVX2 nor AVX-512");
        }
        for (case, src) in detect_sources().iter().enumerate() {
            let g = (src.len() / 1024).clamp(1, 64);
            let run = |pass: GroupPass| {
                let mut st: [Stats; 8] = Default::default();
                let mut h = GroupHists::new();
                let mut sub = [0u64; 2];
                let used = detect_groups(pass, src, g, &mut st, &mut h, &mut sub);
                (st, h, sub, used)
            };
            let a = run(GroupPass::Portable);
            for &pass in &passes {
                let b = run(pass);
                assert_eq!(
                    (a.2, a.3),
                    (b.2, b.3),
                    "{pass:?} case {case}: subnormals, groups"
                );
                assert!(
                    a.1.hb == b.1.hb && a.1.first == b.1.first && a.1.byte0 == b.1.byte0,
                    "{pass:?} case {case}: histograms"
                );
                for c in 0..8 {
                    assert_eq!(
                        (a.0[c].nzero, a.0[c].count, a.0[c].lo_or),
                        (b.0[c].nzero, b.0[c].count, b.0[c].lo_or),
                        "{pass:?} case {case} candidate {c}"
                    );
                }
            }
        }
    }

    /// The float candidates taken in the order of their lower bounds give the rule's
    /// best: the first (in candidate order) of the least value / bytes.
    #[test]
    fn best_float_matches_the_rule() {
        for (case, src) in detect_sources().iter().enumerate() {
            let g = (src.len() / 1024).clamp(1, 64);
            let mut st: [Stats; 8] = Default::default();
            let mut h = GroupHists::new();
            let mut sub = [0u64; 2];
            if detect_groups(GroupPass::best(), src, g, &mut st, &mut h, &mut sub) == 0 {
                continue;
            }
            h.finish(&mut st);
            // and with one candidate's statistics copied to another of its type
            // (ties: the first wins)
            let (a, b) = [(0, 1), (2, 3), (4, 6), (5, 7), (4, 5), (7, 4)][case % 6];
            for st in [st, {
                let mut t = st;
                t[b] = t[a];
                t
            }] {
                let mut want = (u64::MAX, 1u64, Dtype::Raw, 0usize);
                for (c, stc) in st.iter().enumerate() {
                    let (dt, bytes, value) = match c {
                        0 | 1 => (Dtype::Bf16, 2 * stc.count, choose::<Bf16>(stc, false).value),
                        2 | 3 => (Dtype::Fp16, 2 * stc.count, choose::<Fp16>(stc, false).value),
                        _ => (Dtype::Fp32, 4 * stc.count, choose::<Fp32>(stc, false).value),
                    };
                    if want.0 == u64::MAX
                        || (value as u128) * (want.1 as u128) < (want.0 as u128) * (bytes as u128)
                    {
                        want = (value, bytes, dt, [0, 1, 0, 1, 0, 1, 2, 3][c]);
                    }
                }
                let (b, phi) = best_float(&st);
                assert_eq!((b.0, b.1, b.2, phi), want, "case {case}");
            }
        }
    }

    /// Detection's shared-read statistics equal [`Stats::add`] per candidate, on
    /// floats of each type at every offset, zeros, constant runs and random bytes.
    #[test]
    fn group_stats_match_add() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..3000 {
            let mut g = [0u8; 64];
            for (i, b) in g.iter_mut().enumerate() {
                let r = rnd();
                *b = match case % 6 {
                    0 => r as u8,
                    1 => {
                        if r % 3 == 0 {
                            0
                        } else {
                            r as u8
                        }
                    }
                    // bf16-like: exponent bytes near 0x3C..0x3F at odd offsets
                    2 => {
                        if (i + case / 6) % 2 == 1 {
                            0x3C | (r as u8 & 3)
                        } else {
                            r as u8
                        }
                    }
                    // fp32-like at a random offset
                    3 => {
                        if (i + case / 6) % 4 == 3 {
                            0x3E | (r as u8 & 1)
                        } else if (i + case / 6) % 4 == 0 {
                            0
                        } else {
                            r as u8
                        }
                    }
                    4 => {
                        if r % 5 == 0 {
                            r as u8
                        } else {
                            0
                        }
                    }
                    _ => {
                        if (i / 8) % 2 == 0 {
                            0
                        } else {
                            (r % 4) as u8 * 0x40
                        }
                    }
                };
            }
            let mut st: [Stats; 8] = Default::default();
            let mut h = GroupHists::new();
            // two groups, as detection adds them up
            let mut sub = [0u64; 2];
            group_stats(&g, &mut st, &mut h, &mut sub);
            let mut g2 = g;
            g2.rotate_left(case % 7);
            group_stats(&g2, &mut st, &mut h, &mut sub);
            // fp16 subnormals at each phase, counted directly
            let mut want_sub = [0u64; 2];
            for s in [&g[..], &g2[..]] {
                for (phi, ws) in want_sub.iter_mut().enumerate() {
                    for c in s[phi..].chunks_exact(2) {
                        let x = u16::from_le_bytes([c[0], c[1]]);
                        *ws += (x & 0x7C00 == 0 && x & 0x7FFF != 0) as u64;
                    }
                }
            }
            assert_eq!(sub, want_sub, "case {case} subnormals");
            let hbytes = h.finish(&mut st);
            let mut want: [Stats; 8] = Default::default();
            for s in [&g[..], &g2[..]] {
                for phi in 0..2 {
                    want[phi].add::<Bf16>(&s[phi..], (64 - phi) / 2);
                    want[2 + phi].add::<Fp16>(&s[phi..], (64 - phi) / 2);
                }
                for phi in 0..4 {
                    want[4 + phi].add::<Fp32>(&s[phi..], (64 - phi) / 4);
                }
            }
            for c in 0..8 {
                assert_eq!(st[c].hc, want[c].hc, "case {case} candidate {c}");
                assert_eq!(
                    (st[c].nzero, st[c].count, st[c].lo_or),
                    (want[c].nzero, want[c].count, want[c].lo_or),
                    "case {case} candidate {c}"
                );
            }
            // the fp8 candidates' byte histogram, from the same pass
            let mut want_bytes = [0u64; 256];
            for &b in g.iter().chain(g2.iter()) {
                want_bytes[b as usize] += 1;
            }
            assert_eq!(hbytes, want_bytes, "case {case} bytes");
        }
    }

    /// Detection's phase (the fast encoder's first carried phase, FORMAT.md §V2.11)
    /// is where the floats start: bf16 after 0 or 1 bytes of prefix, fp32 after 0..=3.
    #[test]
    fn detection_phase_is_the_floats_offset() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut gauss = move || {
            // a sum of four uniforms: near-Gaussian, σ about 0.03
            (0..4)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                })
                .sum::<f64>()
                * 0.05
        };
        let n = 1 << 16;
        let f32s: Vec<f32> = (0..n).map(|_| gauss() as f32).collect();
        let bf16: Vec<u8> = f32s
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let fp32: Vec<u8> = f32s
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect();
        for (data, dt, w) in [(&bf16, Dtype::Bf16, 2), (&fp32, Dtype::Fp32, 4)] {
            for k in 0..w {
                let mut v = vec![0x5Au8; k];
                v.extend_from_slice(data);
                v.truncate(1 << 17);
                assert_eq!(detect_v2_phase(&v), (dt, Some(k)), "{dt:?} after {k} bytes");
            }
        }
    }

    /// `nonzero_bytes` marks exactly the nonzero bytes.
    #[test]
    fn nonzero_bytes_marks_bytes() {
        let mut x = 0x1234_5678_9ABC_DEF1u64;
        for i in 0..100_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // bytes 0 with probability 1/2, and 0x80 / 0x01 / 0xFF edge values
            let mut v = 0u64;
            for b in 0..8 {
                let r = (x >> (8 * b)) as u8;
                let byte = match (r ^ i as u8) % 6 {
                    0 | 1 | 2 => 0,
                    3 => [0x80, 0x01, 0xFF, 0x7F][(r >> 4) as usize % 4],
                    _ => r,
                };
                v |= (byte as u64) << (8 * b);
            }
            let want = (0..8).fold(0u32, |m, b| m | (((v >> (8 * b)) as u8 != 0) as u32) << b);
            assert_eq!(nonzero_bytes(v), want, "{v:#x}");
        }
    }
}
