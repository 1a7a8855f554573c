//! Format version 2's symbol-code blocks (docs/FORMAT.md §V2.10): fp8 byte codes
//! (modes 5 E4M3 and 6 E5M2: every byte is one symbol of a per-block code over the
//! 256 byte values) and FP16N (mode 7: fp16 whose subnormals are coded by the bit
//! length of their mantissa, as if it were an exponent). Both are one canonical prefix
//! code of at most 12 bits per block, built from the whole block's histogram, with
//! raw bits after each symbol (FP16N) and a sub-segment bit-length index as the other
//! coded blocks of version 2. Every encoder decision is an integer function of the
//! block's bytes.

use crate::decode::copy_ascending;
use crate::format::*;
use crate::v2::{bits_for, load64, LANES};
use crate::{CodecError, Dtype};

pub const MODE_E4M3: u8 = 5;
pub const MODE_E5M2: u8 = 6;
pub const MODE_FP16N: u8 = 7;

const MAXLEN: u32 = 12;
const TABLE: usize = 1 << MAXLEN;
/// Bytes before the code lengths: mode, flags, grid, iw, base (u16).
const FIXED: usize = 6;
/// Symbols of FP16N: 0 = ±0, 1..=10 = subnormal with that mantissa bit length,
/// 11..=41 = exponent field + 10.
pub const F16N_SYMS: usize = 42;
/// Largest sub-segment count of a block (1 MiB blocks): fp8 2^20 / 2048, FP16N 2^20 / 2 / 512.
const MAX_NS: usize = 1024;
/// Largest sub-segment in bytes (fp8: 2048 x 1, FP16N: 512 x 2).
const MAX_SEG_BYTES: usize = 2048;

/// A symbol-code mode: how an element splits into a symbol and raw bits.
trait SymMode {
    const MODE_W: usize;
    const NSYM: usize;
    const SS_LOG2: u32;
    fn load(b: &[u8], i: usize) -> u32;
    fn store(b: &mut [u8], i: usize, x: u32);
    /// (symbol, raw field, raw bit count)
    fn split(x: u32) -> (usize, u32, u32);
    fn rawbits(s: usize) -> u32;
    fn join(s: usize, raw: u32) -> u32;
}

/// fp8 (E4M3, E5M2): the byte is the symbol, no raw bits.
struct Byte;
impl SymMode for Byte {
    const MODE_W: usize = 1;
    const NSYM: usize = 256;
    const SS_LOG2: u32 = 11;
    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u32 {
        b[i] as u32
    }
    #[inline(always)]
    fn store(b: &mut [u8], i: usize, x: u32) {
        b[i] = x as u8;
    }
    #[inline(always)]
    fn split(x: u32) -> (usize, u32, u32) {
        (x as usize, 0, 0)
    }
    #[inline(always)]
    fn rawbits(_s: usize) -> u32 {
        0
    }
    #[inline(always)]
    fn join(s: usize, _raw: u32) -> u32 {
        s as u32
    }
}

/// FP16N: fp16 `x = s<<15 | e<<10 | m` with the symbol `v` and raw field (§V2.10).
struct F16n;
impl SymMode for F16n {
    const MODE_W: usize = 2;
    const NSYM: usize = F16N_SYMS;
    const SS_LOG2: u32 = 9;
    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u32 {
        u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32
    }
    #[inline(always)]
    fn store(b: &mut [u8], i: usize, x: u32) {
        b[2 * i..2 * i + 2].copy_from_slice(&(x as u16).to_le_bytes());
    }
    /// Normal (`e != 0`): symbol `e + 10`, raw `m | s << 10` (11 bits); zero:
    /// symbol 0, raw `s` (1 bit); subnormal: `v` = bit length of `m`, symbol `v`,
    /// raw `m` without its top bit, then `s` (`v` bits). Branch-free: `nb` mantissa
    /// bits (10, 0 or `v − 1`) and the sign above them.
    #[inline(always)]
    fn split(x: u32) -> (usize, u32, u32) {
        let s = x >> 15;
        let e = (x >> 10) & 31;
        let m = x & 1023;
        let v = 32 - m.leading_zeros();
        // selected by mask, not by a branch: normal and subnormal elements mix
        // without a pattern in fp16 gradients (a branch mispredicted every other
        // element cost more than the rest of the split)
        let normal = 0u32.wrapping_sub((e != 0) as u32);
        let sym = (e + 10) & normal | v & !normal;
        let nb = 10 & normal | v.saturating_sub(1) & !normal;
        (sym as usize, (m & ((1 << nb) - 1)) | s << nb, nb + 1)
    }
    /// 1 (±0), `s` (subnormal), 11 (normal): `s` clamped to 1..=11.
    #[inline(always)]
    fn rawbits(s: usize) -> u32 {
        (s as u32).clamp(1, 11)
    }
    /// The inverse of `split`, without a branch on the symbol (decoded elements mix
    /// normal and subnormal symbols without a pattern): the raw field holds `nb =
    /// rawbits(s) - 1` mantissa bits and the sign above them; a subnormal adds its
    /// implied leading one, a normal number its exponent field `s - 10`.
    #[inline(always)]
    fn join(s: usize, raw: u32) -> u32 {
        let s = s as u32;
        let nb = s.clamp(1, 11) - 1;
        let normal = 0u32.wrapping_sub((s >= 11) as u32);
        let sub = 0u32.wrapping_sub((s.wrapping_sub(1) < 10) as u32);
        (raw >> nb) << 15
            | (s.wrapping_sub(10) << 10) & normal
            | (1 << nb) & sub
            | raw & ((1 << nb) - 1)
    }
}

fn corrupt(why: &'static str) -> CodecError {
    CodecError::Corrupt(why)
}

// ---------------------------------------------------------------------------------
// Code lengths

/// Length-limited Huffman code lengths over symbols `0..n` (FORMAT.md §V2.10 "Code"):
/// the used symbols (count > 0; if only one, also the next symbol mod n with weight 0)
/// are merged two smallest (weight, node number) first, new nodes numbered from n up
/// placed after every node of their weight; depths over 12 are limited as in §V2.6.
/// Unused symbols get 0.
pub(crate) fn code_lengths(cnt: &[u64; 256], n: usize) -> [u8; 256] {
    let mut weight = [0u64; 512];
    let mut parent = [usize::MAX; 512];
    let mut live = [0usize; 256];
    let mut nlive = 0;
    for s in 0..n {
        weight[s] = cnt[s];
        if cnt[s] > 0 {
            live[nlive] = s;
            nlive += 1;
        }
    }
    if nlive == 0 {
        live[0] = 0;
        nlive = 1;
    }
    if nlive == 1 {
        live[1] = (live[0] + 1) % n;
        nlive = 2;
    }
    let used = nlive;
    let mut is_used = [false; 256];
    for &s in &live[..used] {
        is_used[s] = true;
    }
    // by (weight, symbol): one u64 key each (counts are far below 2^56), unique
    let mut key = [0u64; 256];
    for (k, &s) in key.iter_mut().zip(&live[..nlive]) {
        debug_assert!(weight[s] < 1 << 56);
        *k = weight[s] << 8 | s as u64;
    }
    key[..nlive].sort_unstable();
    for (l, &k) in live.iter_mut().zip(&key[..nlive]) {
        *l = (k & 0xFF) as usize;
    }
    // Two queues, the sorted leaves and the parents in creation order (their weights
    // never decrease), a leaf first on equal weight: the same merges as keeping one
    // list sorted by (weight, number) with each parent placed after every node of
    // weight <= its own, in linear time.
    let (mut li, mut qi, mut next) = (0usize, n, n);
    for _ in 0..used - 1 {
        let mut two = [0usize; 2];
        for t in two.iter_mut() {
            if li < used && (qi >= next || weight[live[li]] <= weight[qi]) {
                *t = live[li];
                li += 1;
            } else {
                *t = qi;
                qi += 1;
            }
        }
        weight[next] = weight[two[0]] + weight[two[1]];
        parent[two[0]] = next;
        parent[two[1]] = next;
        next += 1;
    }
    let root = next - 1;
    let mut depth = [0u32; 512];
    for x in (n..root).rev() {
        depth[x] = depth[parent[x]] + 1;
    }
    let mut lens = [0u32; 256];
    for s in 0..n {
        if is_used[s] {
            lens[s] = depth[parent[s]] + 1;
        }
    }
    if lens[..n].iter().any(|&l| l > MAXLEN) {
        for l in lens[..n].iter_mut() {
            *l = (*l).min(MAXLEN);
        }
        let mut k: u32 = (0..n)
            .filter(|&s| is_used[s])
            .map(|s| 1u32 << (MAXLEN - lens[s]))
            .sum();
        // lengthen the longest code shorter than 12 (ties: smaller weight, then
        // larger symbol) while the Kraft sum is over: the chosen code stays the
        // longest below 12 until it reaches 12, and the others keep their order, so
        // one sort by (length desc, weight, symbol desc) gives every choice
        let mut order = [0usize; 256];
        let mut no = 0;
        for s in 0..n {
            if is_used[s] && lens[s] < MAXLEN {
                order[no] = s;
                no += 1;
            }
        }
        order[..no].sort_unstable_by_key(|&s| {
            (std::cmp::Reverse(lens[s]), weight[s], std::cmp::Reverse(s))
        });
        let mut oi = 0;
        while k > 1 << MAXLEN {
            let best = order[oi];
            lens[best] += 1;
            k -= 1 << (MAXLEN - lens[best]);
            if lens[best] == MAXLEN {
                oi += 1;
            }
        }
        while k < 1 << MAXLEN {
            // shorten the longest code (ties: larger weight, then smaller symbol)
            let mut best = usize::MAX;
            for s in 0..n {
                if !is_used[s] {
                    continue;
                }
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
    let mut out = [0u8; 256];
    for s in 0..n {
        out[s] = lens[s] as u8;
    }
    out
}

/// Canonical code words (DEFLATE order), bit-reversed for LSB-first writing.
fn canonical(lens: &[u8; 256], n: usize) -> [u16; 256] {
    let mut count = [0u32; 16];
    for &l in &lens[..n] {
        count[l as usize] += 1;
    }
    count[0] = 0;
    let mut next = [0u32; 16];
    let mut code = 0u32;
    for l in 1..=MAXLEN as usize {
        code = (code + count[l - 1]) << 1;
        next[l] = code;
    }
    let mut rev = [0u16; 256];
    for s in 0..n {
        let l = lens[s] as u32;
        if l != 0 {
            let c = next[l as usize];
            next[l as usize] += 1;
            rev[s] = (c.reverse_bits() >> (32 - l)) as u16;
        }
    }
    rev
}

// ---------------------------------------------------------------------------------
// Encoder

/// [`f16n_phase`]'s first test: the phase whose 1/13 sample has more subnormals
/// (ties: 0), if they are more than half of that sample.
fn f16n_sub_phase(blk: &[u8]) -> Option<usize> {
    // both phases in one pass (phase 1's element i is bytes 2i + 1, 2i + 2, beside
    // phase 0's), stopped once neither phase can reach more than half
    let st = crate::encode::SAMPLE_STRIDE;
    let m = [blk.len() / 2, (blk.len() - 1) / 2];
    let count = [m[0].div_ceil(st) as u64, m[1].div_ceil(st) as u64];
    let is_sub = |x: u32| (x & 0x7C00 == 0 && x & 0x7FFF != 0) as u64;
    let mut sub = [0u64; 2];
    let mut i = 0;
    let mut k = 0u32;
    while i < m[1] {
        let x0 = u16::from_le_bytes([blk[2 * i], blk[2 * i + 1]]) as u32;
        let x1 = u16::from_le_bytes([blk[2 * i + 1], blk[2 * i + 2]]) as u32;
        sub[0] += is_sub(x0);
        sub[1] += is_sub(x1);
        i += st;
        k += 1;
        if k.is_multiple_of(256) {
            // samples left: at most (m[0] - i) / st + 1 in either phase
            let left = ((m[0].saturating_sub(i)) / st + 1) as u64;
            if (0..2).all(|p| 2 * (sub[p] + left) <= count[p]) {
                return None;
            }
        }
    }
    if i < m[0] {
        sub[0] += is_sub(F16n::load(blk, i));
    }
    // phase 0 unless phase 1 has more
    let best = if sub[1] > sub[0] {
        (sub[1], count[1], 1)
    } else {
        (sub[0], count[0], 0)
    };
    let (sub, count, phi) = best;
    (2 * sub > count).then_some(phi)
}

/// FP16N's phase for an fp16 block, or None when the block codes as FP16 (§V2.10
/// "FP16N block encoding"): on the 1/13 sample of each phase, the number of
/// subnormals (`e = 0`, `x & 0x7FFF != 0`); the phase with more (ties: 0) if they are
/// more than half of its sample and FP16N's estimate on that sample is below FP16's
/// (`choose(stats, true)`, V2.6, the smaller of its two phases).
pub(crate) fn f16n_phase(blk: &[u8]) -> Option<usize> {
    if blk.len() < 2 * MIN_CODED_ELEMS + 1 {
        return None;
    }
    let phi = f16n_sub_phase(blk)?;
    // the two estimates on the same sample, in V2.6's units (13 x sample bits + side bits)
    let g = &blk[phi..];
    let m = g.len() / 2;
    let mut h = [0u64; 256];
    let mut raw = 0u64;
    let mut i = 0;
    while i < m {
        let (v, _, rb) = F16n::split(F16n::load(g, i));
        h[v] += 1;
        raw += rb as u64;
        i += crate::encode::SAMPLE_STRIDE;
    }
    let fp16n = crate::encode::SAMPLE_STRIDE as u64 * (coded_bits(&h, F16N_SYMS) + raw)
        + 8 * F16N_SYMS.div_ceil(2) as u64;
    // FP16 at its best phase (as V2.7 step 3 would pick it)
    let fp16 = (0..2)
        .map(|q| {
            let mq = (blk.len() - q) / 2;
            let st = crate::v2::Stats::sample::<crate::elem::Fp16>(&blk[q..], mq);
            crate::v2::choose::<crate::elem::Fp16>(&st, true).value
        })
        .min()
        .unwrap();
    (fp16n < fp16).then_some(phi)
}

/// Encodes an fp8 block (mode 5 or 6 by the frame's type) into `out`; None when the
/// coded block would not fit in `out` (the caller then writes RAW). The transform
/// (none, SHIFT or LAG, §V2.10 "Transforms") is the one whose coded block is smallest.
pub(crate) fn encode_fp8(dtype: Dtype, blk: &[u8], out: &mut [u8]) -> Option<usize> {
    let mode = if dtype == Dtype::Fp8E5m2 {
        MODE_E5M2
    } else {
        MODE_E4M3
    };
    let m = blk.len();
    if m < MIN_CODED_ELEMS {
        return None;
    }
    FP8_SCRATCH.with(|sc| {
        let sc = &mut *sc.borrow_mut();
        let (shift_syms, lag_syms, nib) = (&mut sc.shift, &mut sc.lag, &mut sc.nib);
        // candidates: (bytes, flags, symbols, side bytes)
        let h0 = histogram(blk);
        let c0 = coded_bits(&h0, 256);
        let mut best = (c0.div_ceil(8), 0u8);
        // SHIFT
        let nlines = m.div_ceil(SHIFT_LINE);
        let mut refs = [0u8; MAX_LINES];
        for (l, r) in refs.iter_mut().enumerate().take(nlines) {
            let line = &blk[l * SHIFT_LINE..((l + 1) * SHIFT_LINE).min(m)];
            let sum: u32 = line.iter().map(|&x| (x & 0x7F) as u32).sum();
            *r = (sum / (4 * line.len() as u32)) as u8;
        }
        let mut sorted = [0u8; MAX_LINES];
        sorted[..nlines].copy_from_slice(&refs[..nlines]);
        sorted[..nlines].sort_unstable();
        let centre = sorted[nlines / 2];
        nib.clear();
        nib.resize(nlines.div_ceil(2), 0);
        // every element is written below: no clearing
        shift_syms.resize(m, 0);
        for l in 0..nlines {
            let n = (refs[l] as i32 - centre as i32 + 8).clamp(0, 15) as u8;
            nib[l / 2] |= n << (4 * (l & 1));
            let k = shift_of(centre, n);
            let (a, b) = (l * SHIFT_LINE, ((l + 1) * SHIFT_LINE).min(m));
            for (y, &x) in shift_syms[a..b].iter_mut().zip(&blk[a..b]) {
                *y = (x & 0x80) | (x.wrapping_sub(k) & 0x7F);
            }
        }
        let hs = histogram(shift_syms);
        let cs = coded_bits(&hs, 256).div_ceil(8) + 1 + nib.len() as u64;
        if cs < best.0 {
            best = (cs, T_SHIFT);
        }
        // LAG
        let lag = choose_lag(blk);
        let mut hl = None;
        if let Some(p) = lag {
            lag_syms.resize(m, 0);
            lag_syms[..p].copy_from_slice(&blk[..p]);
            for (o, (&x, &y)) in lag_syms[p..]
                .iter_mut()
                .zip(blk[p..].iter().zip(&blk[..m - p]))
            {
                *o = lag_sym(x, y);
            }
            hl = Some(histogram(lag_syms));
            let cl = coded_bits(hl.as_ref().unwrap(), 256).div_ceil(8) + 2;
            if cl < best.0 {
                best = (cl, T_LAG);
            }
        }
        match best.1 {
            0 => write_sym::<Byte>(mode, 0, &[], blk, blk, out, Some(&h0)),
            T_SHIFT => {
                let mut side = [0u8; 1 + MAX_LINES / 2];
                side[0] = centre;
                side[1..1 + nib.len()].copy_from_slice(nib);
                write_sym::<Byte>(
                    mode,
                    T_SHIFT,
                    &side[..1 + nib.len()],
                    shift_syms,
                    blk,
                    out,
                    Some(&hs),
                )
            }
            _ => {
                let p = lag.unwrap() as u16;
                write_sym::<Byte>(
                    mode,
                    T_LAG,
                    &p.to_le_bytes(),
                    lag_syms,
                    blk,
                    out,
                    hl.as_ref(),
                )
            }
        }
    })
}

/// Block flag values (byte 1, bits 0-1) of fp8 blocks: the symbol transform.
pub const T_SHIFT: u8 = 1;
pub const T_LAG: u8 = 2;
/// Elements per SHIFT line.
pub const SHIFT_LINE: usize = 128;
const MAX_LINES: usize = (1 << MAX_BLOCK_LOG2) / SHIFT_LINE;
/// LAG candidates: `LAG_UNIT * k`, k = 1..=LAG_MAXK; the search samples every
/// `LAG_STRIDE`-th element.
pub const LAG_UNIT: usize = 128;
pub const LAG_MAXK: usize = 64;
pub const LAG_STRIDE: usize = 65;

#[derive(Default)]
struct Fp8Scratch {
    shift: Vec<u8>,
    lag: Vec<u8>,
    nib: Vec<u8>,
}

thread_local! {
    static FP8_SCRATCH: std::cell::RefCell<Fp8Scratch> = std::cell::RefCell::new(Fp8Scratch::default());
}

/// SHIFT's magnitude offset of a line: `4 * (centre + n - 8)` mod 128.
#[inline(always)]
fn shift_of(centre: u8, n: u8) -> u8 {
    ((4 * (centre as i32 + n as i32 - 8)) & 0x7F) as u8
}

/// LAG's symbol of `x` given `y`, the element `P` before it.
#[inline(always)]
fn lag_sym(x: u8, y: u8) -> u8 {
    ((x ^ y) & 0x80) | (x.wrapping_sub(y) & 0x7F)
}

/// The LAG distance for an fp8 block, or None (§V2.10 "Transforms").
fn choose_lag(blk: &[u8]) -> Option<usize> {
    let m = blk.len();
    let kmax = LAG_MAXK.min(m / 2 / LAG_UNIT);
    if kmax == 0 {
        return None;
    }
    let start = kmax * LAG_UNIT;
    // the sampled elements and, per candidate, the elements P before them, as
    // arrays (the cost loop then vectorises)
    const MAXS: usize = (1 << MAX_BLOCK_LOG2) / LAG_STRIDE + 1;
    let mut xs = [0u8; MAXS];
    let mut ys = [0u8; MAXS];
    let mut ns = 0;
    let mut i = start;
    while i < m {
        xs[ns] = blk[i];
        ns += 1;
        i += LAG_STRIDE;
    }
    let mut best = (u64::MAX, 0usize);
    for k in 1..=kmax {
        let p = k * LAG_UNIT;
        for (j, y) in ys[..ns].iter_mut().enumerate() {
            *y = blk[start + j * LAG_STRIDE - p];
        }
        // at most 16133 terms of at most 24: fits u32
        let cost: u32 = xs[..ns]
            .iter()
            .zip(&ys[..ns])
            .map(|(&x, &y)| {
                let (a, b) = (x & 0x7F, y & 0x7F);
                (a.abs_diff(b).min(16) + 8 * ((x ^ y) >> 7)) as u32
            })
            .sum();
        let cost = cost as u64;
        if cost < best.0 {
            best = (cost, p);
        }
    }
    Some(best.1)
}

fn histogram(b: &[u8]) -> [u64; 256] {
    // four histograms side by side (no store-to-load chains on repeated bytes)
    let mut h = [[0u32; 256]; 4];
    let mut c4 = b.chunks_exact(4);
    for c in &mut c4 {
        h[0][c[0] as usize] += 1;
        h[1][c[1] as usize] += 1;
        h[2][c[2] as usize] += 1;
        h[3][c[3] as usize] += 1;
    }
    for &x in c4.remainder() {
        h[0][x as usize] += 1;
    }
    let mut cnt = [0u64; 256];
    for s in 0..256 {
        cnt[s] = (h[0][s] + h[1][s] + h[2][s] + h[3][s]) as u64;
    }
    cnt
}

/// Code bits of a histogram under its own code lengths.
fn coded_bits(h: &[u64; 256], n: usize) -> u64 {
    let lens = code_lengths(h, n);
    (0..n).map(|s| h[s] * lens[s] as u64).sum()
}

/// Encodes an fp16 block as FP16N at phase `phi`.
pub(crate) fn encode_f16n(blk: &[u8], phi: usize, out: &mut [u8]) -> Option<usize> {
    encode_sym::<F16n>(MODE_FP16N, phi, blk, out)
}

fn encode_sym<T: SymMode>(mode: u8, phi: usize, blk: &[u8], out: &mut [u8]) -> Option<usize> {
    let l = blk.len();
    let w = T::MODE_W;
    if l < phi + w * MIN_CODED_ELEMS {
        return None;
    }
    let grid = &blk[phi..];
    write_sym::<T>(mode, 0, &[], grid, blk, out, None)
}

/// Writes a symbol-code block: `flags`, side bytes (after the code lengths), the
/// elements of `syms` (fp8: the transformed bytes; FP16N: the grid), head and
/// tail from `blk`.
fn write_sym<T: SymMode>(
    mode: u8,
    flags: u8,
    side: &[u8],
    syms: &[u8],
    blk: &[u8],
    out: &mut [u8],
    hist: Option<&[u64; 256]>,
) -> Option<usize> {
    let l = blk.len();
    let w = T::MODE_W;
    // FP16N passes the grid `blk[phi..]`, fp8 a transformed copy of the block
    let phi = l - syms.len();
    let m = (l - phi) / w;
    let grid = &syms[..m * w];
    let mut cnt = [0u64; 256];
    // FP16N: each element's symbol and raw field, split once (the three passes
    // below read them)
    let mut sr = SPLIT.with(|c| std::mem::take(&mut *c.borrow_mut()));
    if let Some(h) = hist {
        cnt = *h;
    } else if w == 1 {
        cnt = histogram(grid);
    } else {
        f16n_split(grid, m, 1 << T::SS_LOG2, &mut sr, &mut cnt);
    }
    let r = write_sym_body::<T>(mode, flags, side, syms, blk, out, &cnt, &sr);
    SPLIT.with(|c| *c.borrow_mut() = sr);
    r
}

/// FP16N's elements split once (the histogram, the sub-segments' bit counts and
/// the stream read them): per element its symbol and raw field, and per
/// sub-segment its symbol histogram.
#[derive(Default)]
struct Split {
    syms: Vec<u8>,
    raws: Vec<u16>,
    seg_hist: Vec<[u16; 64]>,
}

thread_local! {
    /// [`write_sym`]'s FP16N split
    static SPLIT: std::cell::RefCell<Split> = std::cell::RefCell::new(Split::default());
}

/// Splits the `m` fp16 elements of `grid` (F16n::split) into `sr`, with the
/// histogram of each `ss`-element sub-segment and of all of them (`cnt`).
fn f16n_split(grid: &[u8], m: usize, ss: usize, sr: &mut Split, cnt: &mut [u64; 256]) {
    let grid = &grid[..2 * m];
    sr.syms.resize(m, 0);
    sr.raws.resize(m, 0);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2; the lengths are those the function asserts.
        done = unsafe { f16n_split_avx2(grid, &mut sr.syms, &mut sr.raws) };
    }
    for i in done..m {
        let (sym, raw, _) = F16n::split(F16n::load(grid, i));
        sr.syms[i] = sym as u8;
        sr.raws[i] = raw as u16;
    }
    let ns = m.div_ceil(ss);
    sr.seg_hist.resize(ns, [0; 64]);
    let mut tot = [0u64; 64];
    for (j, sh) in sr.seg_hist.iter_mut().enumerate() {
        // four histograms side by side: neighbours often share a symbol, and one
        // counter would chain each increment on the store before it
        let mut h = [[0u16; 64]; 4];
        let seg = &sr.syms[j * ss..((j + 1) * ss).min(m)];
        let mut c4 = seg.chunks_exact(4);
        for c in &mut c4 {
            h[0][c[0] as usize & 63] += 1;
            h[1][c[1] as usize & 63] += 1;
            h[2][c[2] as usize & 63] += 1;
            h[3][c[3] as usize & 63] += 1;
        }
        for &x in c4.remainder() {
            h[0][x as usize & 63] += 1;
        }
        for s in 0..F16N_SYMS {
            sh[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
            tot[s] += sh[s] as u64;
        }
    }
    cnt[..64].copy_from_slice(&tot);
}

/// [`F16n::split`] eight elements at a time: the mantissa's bit length from the
/// exponent of its conversion to f32, the selections by mask. Returns how many
/// elements it split (a multiple of 8; the caller splits the rest).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn f16n_split_avx2(grid: &[u8], syms: &mut [u8], raws: &mut [u16]) -> usize {
    use std::arch::x86_64::*;
    let m = syms.len();
    assert!(raws.len() == m && grid.len() >= 2 * m);
    let c = _mm256_set1_epi32;
    let (zero, one) = (_mm256_setzero_si256(), c(1));
    let mut i = 0;
    while i + 8 <= m {
        // every load and store is inside the slices: i + 8 <= m (asserted lengths)
        let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(grid.as_ptr().add(2 * i) as *const __m128i));
        let e = _mm256_and_si256(_mm256_srli_epi32(x, 10), c(31));
        let mm = _mm256_and_si256(x, c(1023));
        let sg = _mm256_srli_epi32(x, 15);
        // bit length of the mantissa: its f32's exponent - 126 (0 for 0)
        let fe = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(mm)), 23);
        let v = _mm256_max_epi32(_mm256_sub_epi32(fe, c(126)), zero);
        let normal = _mm256_cmpgt_epi32(e, zero);
        let sym = _mm256_blendv_epi8(v, _mm256_add_epi32(e, c(10)), normal);
        let nb = _mm256_blendv_epi8(
            _mm256_max_epi32(_mm256_sub_epi32(v, one), zero),
            c(10),
            normal,
        );
        let mask = _mm256_sub_epi32(_mm256_sllv_epi32(one, nb), one);
        let raw = _mm256_or_si256(_mm256_and_si256(mm, mask), _mm256_sllv_epi32(sg, nb));
        // packus per 128-bit lane (raw0-3 sym0-3 | raw4-7 sym4-7), then in order
        let r16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(raw, sym), 0xD8);
        _mm_storeu_si128(
            raws.as_mut_ptr().add(i) as *mut __m128i,
            _mm256_castsi256_si128(r16),
        );
        let s16 = _mm256_extracti128_si256(r16, 1);
        _mm_storel_epi64(
            syms.as_mut_ptr().add(i) as *mut __m128i,
            _mm_packus_epi16(s16, s16),
        );
        i += 8;
    }
    i
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn write_sym_body<T: SymMode>(
    mode: u8,
    flags: u8,
    side: &[u8],
    syms: &[u8],
    blk: &[u8],
    out: &mut [u8],
    cnt: &[u64; 256],
    sr: &Split,
) -> Option<usize> {
    let l = blk.len();
    let w = T::MODE_W;
    let phi = l - syms.len();
    let m = (l - phi) / w;
    let t = (l - phi) % w;
    let grid = &syms[..m * w];
    let lens = code_lengths(cnt, T::NSYM);
    let codes = canonical(&lens, T::NSYM);
    // bits per element by symbol
    let mut cost = [0u32; 256];
    for s in 0..T::NSYM {
        cost[s] = lens[s] as u32 + T::rawbits(s);
    }
    let ss = 1usize << T::SS_LOG2;
    let ns = m.div_ceil(ss);
    let mut seg = [0u32; MAX_NS];
    for (j, sb) in seg.iter_mut().enumerate().take(ns) {
        let (a, b) = (j * ss, ((j + 1) * ss).min(m));
        let mut bits = 0u32;
        if w == 1 {
            for &x in &grid[a..b] {
                bits += cost[x as usize];
            }
        } else {
            for (s, &n) in sr.seg_hist[j].iter().enumerate().take(T::NSYM) {
                bits += cost[s] * n as u32;
            }
        }
        *sb = bits;
    }
    let base = seg[..ns].iter().copied().min().unwrap_or(0);
    let iw = bits_for(seg[..ns].iter().copied().max().unwrap_or(0) - base);
    let total_bits: u64 = seg[..ns].iter().map(|&b| b as u64).sum();
    let tbl = T::NSYM.div_ceil(2);
    let idx_bytes = (ns * iw as usize).div_ceil(8);
    let stream_bytes = total_bits.div_ceil(8) as usize;
    let size = FIXED + tbl + side.len() + phi + idx_bytes + stream_bytes + t;
    if size > out.len() {
        return None;
    }
    out[0] = mode;
    out[1] = flags;
    out[2] = phi as u8;
    out[3] = iw as u8;
    out[4..6].copy_from_slice(&(base as u16).to_le_bytes());
    let mut p = FIXED;
    for j in 0..tbl {
        let lo = lens[2 * j];
        let hi = if 2 * j + 1 < T::NSYM {
            lens[2 * j + 1]
        } else {
            0
        };
        out[p + j] = lo | hi << 4;
    }
    p += tbl;
    out[p..p + side.len()].copy_from_slice(side);
    p += side.len();
    out[p..p + phi].copy_from_slice(&blk[..phi]);
    p += phi;
    // index
    {
        let q = crate::v2::put_packed(&mut out[p..], seg[..ns].iter().map(|&b| b - base), iw);
        debug_assert_eq!(q, idx_bytes);
        p += q;
    }
    // stream
    {
        let st = &mut out[p..p + stream_bytes];
        let mut bw = BitWriter::new(st);
        if w == 1 {
            // code | length << 16 per byte; two symbols (<= 24 bits) per flush
            let mut cl = [0u32; 256];
            for s in 0..256 {
                cl[s] = codes[s] as u32 | (lens[s] as u32) << 16;
            }
            let mut pairs = grid.chunks_exact(2);
            for pr in &mut pairs {
                let (a, b) = (cl[pr[0] as usize], cl[pr[1] as usize]);
                let word = (a & 0xFFFF) as u64 | ((b & 0xFFFF) as u64) << (a >> 16);
                bw.put(word, (a >> 16) + (b >> 16));
            }
            for &x in pairs.remainder() {
                let a = cl[x as usize];
                bw.put((a & 0xFFFF) as u64, a >> 16);
            }
        } else {
            // per symbol: its code word, its length and its length with the raw
            // bits (<= 12 + 11): one word of at most 23 bits per element
            // code | length << 16 | (length + raw bits) << 24 per symbol
            let mut ent = [0u32; 64];
            for s in 0..T::NSYM {
                ent[s] = codes[s] as u32 | (lens[s] as u32) << 16 | (cost[s] << 24);
            }
            let put = |bw: &mut BitWriter, s: u8, raw: u16| {
                let e = ent[s as usize & 63];
                bw.put(
                    (e & 0xFFFF) as u64 | (raw as u64) << ((e >> 16) & 0xFF),
                    e >> 24,
                );
            };
            let (syms, raws) = (&sr.syms[..m], &sr.raws[..m]);
            for (sc, rc) in syms.chunks(64).zip(raws.chunks(64)) {
                if bw.room(sc.len()) {
                    for (&s, &raw) in sc.iter().zip(rc) {
                        let e = ent[s as usize & 63];
                        // SAFETY: room() for this chunk, and each word below 32 bits
                        unsafe {
                            bw.put_unchecked(
                                (e & 0xFFFF) as u64 | (raw as u64) << ((e >> 16) & 0xFF),
                                e >> 24,
                            )
                        };
                    }
                } else {
                    for (&s, &raw) in sc.iter().zip(rc) {
                        put(&mut bw, s, raw);
                    }
                }
            }
        }
        let q = bw.finish();
        debug_assert_eq!(q, stream_bytes);
        p += stream_bytes;
    }
    out[p..p + t].copy_from_slice(&blk[l - t..]);
    p += t;
    debug_assert_eq!(p, size);
    Some(size)
}

/// LSB-first bit writer over a stream of known length (FORMAT.md §4's bit order),
/// for words of at most 32 bits. Pending bits stay below 32 between calls; while
/// four bytes of room are left, each call stores the low 32 bits unconditionally
/// and advances by 4 bytes only when they are full (no branch on the data: a
/// flush every two or three elements is not predictable); the last bytes go
/// through the careful path.
struct BitWriter<'a> {
    st: &'a mut [u8],
    acc: u64,
    nacc: u32,
    q: usize,
}

impl<'a> BitWriter<'a> {
    fn new(st: &'a mut [u8]) -> Self {
        BitWriter {
            st,
            acc: 0,
            nacc: 0,
            q: 0,
        }
    }

    /// Whether `k` more words fit the fast path: each stores 4 bytes at `q` and
    /// advances `q` by at most 4.
    #[inline(always)]
    fn room(&self, k: usize) -> bool {
        self.q + 4 * k + 4 <= self.st.len()
    }

    /// [`BitWriter::put`] without the room check.
    ///
    /// # Safety
    /// `q + 4 <= st.len()`: `room(k)` held and fewer than `k` words were put since.
    #[inline(always)]
    unsafe fn put_unchecked(&mut self, word: u64, n: u32) {
        debug_assert!(n <= 32 && word >> n == 0 && self.nacc < 32);
        debug_assert!(self.q + 4 <= self.st.len());
        self.acc |= word << self.nacc;
        self.nacc += n;
        (self.st.as_mut_ptr().add(self.q) as *mut [u8; 4])
            .write_unaligned((self.acc as u32).to_le_bytes());
        let full = self.nacc >> 5; // 0 or 1: nacc < 32 + 32
        self.q += 4 * full as usize;
        self.acc >>= 32 * full;
        self.nacc &= 31;
    }

    /// Appends the low `n` bits of `word` (`n` ≤ 32, the bits above `n` zero).
    #[inline(always)]
    fn put(&mut self, word: u64, n: u32) {
        if self.room(0) {
            // SAFETY: room(0) is q + 4 <= st.len()
            unsafe { self.put_unchecked(word, n) };
            return;
        }
        debug_assert!(n <= 32 && word >> n == 0 && self.nacc < 32);
        self.acc |= word << self.nacc;
        self.nacc += n;
        if self.nacc >= 32 {
            self.st[self.q..self.q + 4].copy_from_slice(&(self.acc as u32).to_le_bytes());
            self.q += 4;
            self.acc >>= 32;
            self.nacc -= 32;
        }
    }

    /// Writes the pending bits (the last byte zero-padded); the bytes written.
    fn finish(mut self) -> usize {
        while self.nacc > 0 {
            self.st[self.q] = self.acc as u8;
            self.q += 1;
            self.acc >>= 8;
            self.nacc = self.nacc.saturating_sub(8);
        }
        self.q
    }
}

// ---------------------------------------------------------------------------------
// Decoder

/// Decodes a block of mode 5, 6 or 7 (`b` is the whole block) into `out`.
pub(crate) fn decode_block(b: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
    match b[0] {
        MODE_E4M3 | MODE_E5M2 => decode_sym::<Byte>(b, out),
        MODE_FP16N => decode_sym::<F16n>(b, out),
        _ => Err(corrupt("unknown block mode")),
    }
}

/// Decodes one element at bit `*p` of `st` and advances `*p`.
#[inline(always)]
fn dec_one<T: SymMode>(st: &[u8], table: &[u16; TABLE], p: &mut u64) -> u32 {
    let v = load64(st, (*p >> 3) as usize) >> (*p & 7);
    dec_word::<T>(v, table, p)
}

/// One element from `v`, the stream's bits from `*p` on (LSB first).
#[inline(always)]
fn dec_word<T: SymMode>(v: u64, table: &[u16; TABLE], p: &mut u64) -> u32 {
    let te = table[(v & (TABLE as u64 - 1)) as usize];
    let s = (te & 0xFF) as usize;
    let ln = (te >> 8) as u32;
    let rb = T::rawbits(s);
    let raw = ((v >> ln) & ((1u64 << rb) - 1)) as u32;
    *p += (ln + rb) as u64;
    T::join(s, raw)
}

/// Most bits one element takes: a 12-bit code and FP16N's 11 raw bits.
const MAX_ELEM_BITS: usize = 23;

/// [`dec_one`] without the bounds check of the 8-byte load.
///
/// # Safety
/// `st` holds at least 8 bytes from byte `*p >> 3` on.
#[inline(always)]
unsafe fn dec_one_fast<T: SymMode>(st: &[u8], table: &[u16; TABLE], p: &mut u64) -> u32 {
    let q = (*p >> 3) as usize;
    let v = u64::from_le_bytes(*(st.as_ptr().add(q) as *const [u8; 8])) >> (*p & 7);
    dec_word::<T>(v, table, p)
}

/// Reads `n` packed `w`-bit index entries (zero padding) and returns their sum.
fn index_sum(bytes: &[u8], n: usize, w: u32, base: u32) -> Result<u64, CodecError> {
    let (mut acc, mut nacc, mut q, mut sum) = (0u64, 0u32, 0usize, 0u64);
    for _ in 0..n {
        while nacc < w {
            acc |= (bytes[q] as u64) << nacc;
            q += 1;
            nacc += 8;
        }
        let v = if w == 0 { 0 } else { acc & ((1u64 << w) - 1) };
        acc >>= w;
        nacc -= w;
        sum += base as u64 + v;
    }
    if acc != 0 {
        return Err(corrupt("nonzero index padding"));
    }
    Ok(sum)
}

fn decode_sym<T: SymMode>(b: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
    let l = out.len();
    let w = T::MODE_W;
    let tbl = T::NSYM.div_ceil(2);
    if b.len() < FIXED + tbl {
        return Err(corrupt("coded block shorter than its layout"));
    }
    // fp8: bits 0-1 the transform (0, SHIFT, LAG); FP16N: no flags
    let transform = b[1];
    if (T::MODE_W == 1 && transform > T_LAG) || (T::MODE_W != 1 && transform != 0) {
        return Err(corrupt("unknown block flags"));
    }
    let phi = (b[2] & 3) as usize;
    if b[2] & !3 != 0 || phi >= w {
        return Err(corrupt("bad block grid byte"));
    }
    let iw = b[3] as u32;
    if iw > 16 {
        return Err(corrupt("index width out of range"));
    }
    let base = u16::from_le_bytes([b[4], b[5]]) as u32;
    if l < phi + w * MIN_CODED_ELEMS {
        return Err(corrupt("coded block with too few elements"));
    }
    let m = (l - phi) / w;
    let t = (l - phi) % w;
    // code lengths and the decode table: entry = symbol | length << 8
    let mut lens = [0u8; 256];
    for s in 0..T::NSYM {
        let v = b[FIXED + s / 2] >> (4 * (s & 1)) & 15;
        if v as u32 > MAXLEN {
            return Err(corrupt("code length over 12"));
        }
        lens[s] = v;
    }
    if T::NSYM % 2 == 1 && b[FIXED + tbl - 1] >> 4 != 0 {
        return Err(corrupt("nonzero code length padding"));
    }
    let kraft: u32 = lens[..T::NSYM]
        .iter()
        .filter(|&&l| l != 0)
        .map(|&l| 1u32 << (MAXLEN - l as u32))
        .sum();
    if kraft != 1 << MAXLEN {
        return Err(corrupt("code lengths are not a complete prefix code"));
    }
    let codes = canonical(&lens, T::NSYM);
    let mut table = [0u16; TABLE];
    for s in 0..T::NSYM {
        let ln = lens[s] as usize;
        if ln == 0 {
            continue;
        }
        let e = s as u16 | (ln as u16) << 8;
        let mut f = codes[s] as usize;
        while f < TABLE {
            table[f] = e;
            f += 1 << ln;
        }
    }
    // layout
    let ss = 1usize << T::SS_LOG2;
    let ns = m.div_ceil(ss);
    let mut p = FIXED + tbl;
    let take = |p: &mut usize, n: usize| -> Result<std::ops::Range<usize>, CodecError> {
        let end = p.checked_add(n).ok_or(CodecError::Truncated)?;
        if end > b.len() {
            return Err(corrupt("coded block shorter than its layout"));
        }
        let r = *p..end;
        *p = end;
        Ok(r)
    };
    // side bytes: SHIFT centre and line nibbles, LAG distance
    let nlines = m.div_ceil(SHIFT_LINE);
    let (mut centre, mut lag) = (0u8, 0usize);
    let mut nib = 0..0;
    if transform == T_SHIFT {
        centre = b[take(&mut p, 1)?][0];
        if centre > 31 {
            return Err(corrupt("shift centre out of range"));
        }
        nib = take(&mut p, nlines.div_ceil(2))?;
        if nlines % 2 == 1 && b[nib.end - 1] >> 4 != 0 {
            return Err(corrupt("nonzero shift nibble padding"));
        }
    } else if transform == T_LAG {
        let r = take(&mut p, 2)?;
        lag = u16::from_le_bytes([b[r.start], b[r.start + 1]]) as usize;
        if lag == 0 || lag >= m {
            return Err(corrupt("lag distance out of range"));
        }
    }
    let nib = &b[nib];
    let head = take(&mut p, phi)?;
    let idx = take(&mut p, (ns * iw as usize).div_ceil(8))?;
    let total_bits = index_sum(&b[idx.clone()], ns, iw, base)?;
    let sbytes = usize::try_from(total_bits.div_ceil(8)).map_err(|_| CodecError::Truncated)?;
    let stream = take(&mut p, sbytes)?;
    let tail = take(&mut p, t)?;
    if p != b.len() {
        return Err(corrupt("coded block length mismatch"));
    }
    let st = &b[stream];
    if total_bits % 8 != 0 && st[st.len() - 1] >> (total_bits % 8) != 0 {
        return Err(corrupt("nonzero stream padding"));
    }
    copy_ascending(&mut out[..phi], &b[head]);
    // sub-segment bit offsets
    let idxb = &b[idx];
    let mut starts = [0u64; MAX_NS + 1];
    {
        let (mut acc, mut nacc, mut q) = (0u64, 0u32, 0usize);
        for j in 0..ns {
            while nacc < iw {
                acc |= (idxb[q] as u64) << nacc;
                q += 1;
                nacc += 8;
            }
            let len = base as u64 + if iw == 0 { 0 } else { acc & ((1u64 << iw) - 1) };
            acc >>= iw;
            nacc -= iw;
            starts[j + 1] = starts[j] + len;
        }
    }
    // LANES sub-segments decoded side by side into a buffer (independent bit
    // positions: their loads and table lookups overlap), then written in order
    let mut buf = [0u8; LANES * MAX_SEG_BYTES];
    let grid = &mut out[phi..phi + m * w];
    let mut j0 = 0;
    while j0 < ns {
        let nl = LANES.min(ns - j0);
        let mut pos = [0u64; LANES];
        pos[..nl].copy_from_slice(&starts[j0..j0 + nl]);
        let a0 = j0 * ss;
        let e0 = ((j0 + nl) * ss).min(m);
        // all lanes but the last have ss elements; lockstep over the shortest
        let nmin = if nl == LANES {
            e0 - a0 - (nl - 1) * ss
        } else {
            0
        };
        let nmin = nmin.min(ss);
        // Fast path: a lane moves at most MAX_ELEM_BITS per element, so over the
        // `nmin` lockstep elements, corrupt stream or not, every 8-byte load
        // stays inside `st` (byte `p >> 3` grows by at most
        // ceil(MAX_ELEM_BITS * nmin / 8) from the lane's start)
        let fast = pos
            .iter()
            .all(|&q| (q >> 3) as usize + (MAX_ELEM_BITS * nmin).div_ceil(8) + 8 <= st.len());
        if fast {
            for k in 0..nmin {
                for (ln_i, p) in pos.iter_mut().enumerate() {
                    // SAFETY: the bound just checked (see `fast`).
                    let x = unsafe { dec_one_fast::<T>(st, &table, p) };
                    T::store(&mut buf, ln_i * ss + k, x);
                }
            }
        } else {
            for k in 0..nmin {
                for (ln_i, p) in pos.iter_mut().enumerate() {
                    let x = dec_one::<T>(st, &table, p);
                    T::store(&mut buf, ln_i * ss + k, x);
                }
            }
        }
        for (ln_i, p) in pos.iter_mut().enumerate().take(nl) {
            let n = (((j0 + ln_i + 1) * ss).min(m)) - (j0 + ln_i) * ss;
            for k in nmin..n {
                let x = dec_one::<T>(st, &table, p);
                T::store(&mut buf, ln_i * ss + k, x);
            }
            if *p != starts[j0 + ln_i + 1] {
                return Err(corrupt("sub-segment length mismatch"));
            }
        }
        let n = e0 - a0;
        let bufn = &mut buf[..n * w];
        if transform == T_SHIFT {
            // one shift per line (the group's first element is a multiple of
            // `ss`, itself a multiple of SHIFT_LINE; a shorter last line is
            // the block's)
            debug_assert_eq!(a0 % SHIFT_LINE, 0);
            for (c, line) in bufn.chunks_mut(SHIFT_LINE).enumerate() {
                let l = a0 / SHIFT_LINE + c;
                let sh = shift_of(centre, nib[l / 2] >> (4 * (l & 1)) & 15);
                for x in line.iter_mut() {
                    *x = (*x & 0x80) | (x.wrapping_add(sh) & 0x7F);
                }
            }
        } else if transform == T_LAG {
            // element i (= a0 + k) from the element `lag` back: elements below
            // `lag` are verbatim; for k < lag the one back is in the output
            // already (an earlier group), else in this group at k - lag, final
            // by then: done in runs of at most `lag` elements, each reading
            // only the finished ones before it
            let undo = |x: &mut u8, y: u8| *x = ((*x ^ y) & 0x80) | (x.wrapping_add(y) & 0x7F);
            let k0 = lag.saturating_sub(a0).min(n);
            let ka = lag.min(n).max(k0);
            for (x, &y) in bufn[k0..ka]
                .iter_mut()
                .zip(&grid[a0 + k0 - lag..a0 + ka - lag])
            {
                undo(x, y);
            }
            let mut k = ka;
            while k < n {
                let r = lag.min(n - k);
                let (done, rest) = bufn.split_at_mut(k);
                for (x, &y) in rest[..r].iter_mut().zip(&done[k - lag..k - lag + r]) {
                    undo(x, y);
                }
                k += r;
            }
        }
        copy_ascending(&mut grid[a0 * w..e0 * w], bufn);
        j0 += nl;
    }
    copy_ascending(&mut out[l - t..], &b[tail]);
    Ok(())
}

// ---------------------------------------------------------------------------------
// Detection

/// Counts of detection's byte histogram: at most 64 groups of 64 bytes.
const HB_MAX: usize = 64 * 64;

/// `h·log2(h)` for `h` in `0..=HB_MAX` (0 for 0), built once.
fn hlog2h() -> &'static [f64; HB_MAX + 1] {
    static T: std::sync::OnceLock<Box<[f64; HB_MAX + 1]>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([0f64; HB_MAX + 1]);
        for (h, x) in t.iter_mut().enumerate().skip(1) {
            *x = h as f64 * (h as f64).log2();
        }
        t
    })
}

/// The candidates of §V2.10 "Detection", after version 2's float candidates: `best`
/// is (value, bytes, type) of the cheapest float candidate; `sub[φ]` the fp16
/// subnormals at φ in the groups, `hb` the histogram of their bytes, `used` and
/// `skipped` how many groups were and were not all one byte (all counted by the
/// float candidates' pass); returns the new best.
pub(crate) fn detect_more(
    src: &[u8],
    best: (u64, u64, Dtype),
    fst: &[crate::v2::Stats; 8],
    sub: [u64; 2],
    hb: &[u64; 256],
    used: u64,
    skipped: u64,
) -> (u64, u64, Dtype) {
    let n = src.len();
    let g = (n / 1024).clamp(1, 64);
    let units = n / 64;
    let mut hv = [[0u64; 256]; 2];
    let mut raw = [0u64; 2];
    let bytes = 64 * used;
    // fp16 elements at φ per group: floor((64 − φ) / 2)
    let count = [bytes / 2, bytes / 64 * 31];
    let mut best = best;
    if bytes == 0 {
        return best;
    }
    // FP16N's symbol histogram and raw bits, only at a phase of mostly subnormals
    // (the only one where they are read): the same groups again
    for phi in (0..2).filter(|&phi| 2 * sub[phi] > count[phi]) {
        for j in 0..g {
            let off = 64 * (j * units / g);
            let s = &src[off..off + 64];
            if crate::v2::group_equal(s) {
                continue;
            }
            for i in 0..(64 - phi) / 2 {
                let (v, _, rb) = F16n::split(F16n::load(&s[phi..], i));
                hv[phi][v] += 1;
                raw[phi] += rb as u64;
            }
        }
    }
    let stride = crate::encode::SAMPLE_STRIDE as u64;
    // Shortcut (same decisions): FP16N needs a phase of mostly subnormals; fp8 (not
    // raw) needs `16·v / (15·bytes)` below `bar`'s ratio, at most `best`'s. Every
    // prefix code costs at least the histogram's entropy (Kraft), so a lower bound
    // of `v` at or above that settles it without the codes or `bar`.
    let to_raw = best.0 * 32 >= 31 * 8 * stride * best.1;
    // fp8's lower bound, computed once when first asked
    let mut vlb: Option<u64> = None;
    let mut v_lb = || {
        *vlb.get_or_insert_with(|| {
            // Σ h·log2(tot / h) = tot·log2(tot) − Σ h·log2(h), with h·log2(h) from a
            // table (counts are at most 64 groups × 64 bytes); the rounding (about
            // 1e-11 here) stays far below the margin taken next
            let tot: u64 = hb.iter().sum();
            let t = hlog2h();
            let ent: f64 = t[tot as usize] - hb.iter().map(|&h| t[h as usize]).sum::<f64>();
            // below the exact entropy by far more than the sum's rounding
            let lb = (ent * (1.0 - 1e-9)).floor().max(0.0) as u64;
            stride * (lb + 64 * skipped) + 8 * 128
        })
    };
    if !to_raw
        && (0..2).all(|phi| 2 * sub[phi] <= count[phi])
        && (16 * v_lb()) as u128 * best.1 as u128 >= 15 * best.0 as u128 * bytes as u128
    {
        return best;
    }
    // Shortcut (same decisions): either new candidate must also beat `best`. FP16N's
    // value is at least its raw bits plus 1 bit per symbol (every length is >= 1),
    // fp8's at least `v_lb`: when neither bound beats `best`, the explicit float
    // choices of `bar` below are not needed.
    let beats = |v: u64, by: u64| (v as u128) * (best.1 as u128) < (best.0 as u128) * (by as u128);
    let f16n_may = (0..2).any(|phi| {
        2 * sub[phi] > count[phi]
            && beats(
                stride * (count[phi] + raw[phi]) + 8 * (F16N_SYMS as u64 / 2),
                2 * count[phi],
            )
    });
    if !f16n_may && !beats(v_lb(), bytes) {
        return best;
    }
    // what the new candidates must beat: the float candidates with explicit codes
    // (V2.6 choose(stats, true): exponent patterns the static codes escape, such as
    // NaN and subnormal sprinkles, cost them little), as (value, bytes)
    let mut bar = best;
    for (c, stc) in fst.iter().enumerate() {
        let (v, w) = match c {
            0 | 1 => (crate::v2::choose::<crate::elem::Bf16>(stc, true).value, 2),
            2 | 3 => (crate::v2::choose::<crate::elem::Fp16>(stc, true).value, 2),
            _ => (crate::v2::choose::<crate::elem::Fp32>(stc, true).value, 4),
        };
        // elements per group at this candidate's phase (V2.6): floor((64 - phi) / W)
        let phi = match c {
            0 | 1 => c,
            2 | 3 => c - 2,
            _ => c - 4,
        } as u64;
        let by = (bytes / 64) * ((64 - phi) / w) * w;
        if (v as u128) * (bar.1 as u128) < (bar.0 as u128) * (by as u128) {
            bar = (v, by, bar.2);
        }
    }
    // lengths from weights count + 1: a small sample cannot fit a code to itself
    let cost = |h: &[u64; 256], n: usize| -> u64 {
        let mut w = [0u64; 256];
        for s in 0..n {
            w[s] = h[s] + 1;
        }
        let lens = code_lengths(&w, n);
        (0..n).map(|s| h[s] * lens[s] as u64).sum()
    };
    let better = |v: u64, by: u64, b: &(u64, u64, Dtype)| {
        (v as u128) * (b.1 as u128) < (b.0 as u128) * (by as u128)
    };
    for phi in 0..2 {
        if 2 * sub[phi] > count[phi] {
            let v = stride * (cost(&hv[phi], F16N_SYMS) + raw[phi]) + 8 * (F16N_SYMS as u64 / 2);
            if better(v, 2 * count[phi], &bar) && better(v, 2 * count[phi], &best) {
                best = (v, 2 * count[phi], Dtype::Fp16);
            }
        }
    }
    // fp8: more than 1/16 below every other candidate
    // a skipped (all-equal) group costs a byte code at least 1 bit per byte, and
    // the float modes' zero lines nothing
    let v = stride * (cost(hb, 256) + 64 * skipped) + 8 * 128;
    // (or, when the others would leave the frame raw, at all)
    let raw = best.0 * 32 >= 31 * 8 * stride * best.1;
    if (raw || better(16 * v, 15 * bytes, &bar)) && better(v, bytes, &best) {
        best = (v, bytes, Dtype::Fp8E4m3);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table form of the byte entropy (`detect_more`'s fp8 bound) equals
    /// `Σ h·log2(tot/h)` to far better than its 1e-9 margin.
    #[test]
    fn table_entropy_matches_direct() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for case in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut hb = [0u64; 256];
            // 1..=64 groups of 64 bytes, spread over 1..=256 byte values
            let (groups, vals) = (1 + (x % 64) as usize, 1 + (case % 256) as usize);
            let mut y = x;
            for _ in 0..groups * 64 {
                y ^= y << 13;
                y ^= y >> 7;
                y ^= y << 17;
                // skewed: low values more often
                hb[((y % vals as u64) * (y >> 32 & 255) / 256) as usize] += 1;
            }
            let tot: u64 = hb.iter().sum();
            let direct: f64 = hb
                .iter()
                .filter(|&&h| h != 0)
                .map(|&h| h as f64 * (tot as f64 / h as f64).log2())
                .sum();
            let t = hlog2h();
            let table = t[tot as usize] - hb.iter().map(|&h| t[h as usize]).sum::<f64>();
            assert!(
                (table - direct).abs() <= 1e-9 * direct.max(1.0) * 1e-2,
                "{table} {direct}"
            );
        }
    }

    /// The branch-free FP16N split equals the rule as written (normal, zero,
    /// subnormal) for every 16-bit pattern, and `join` undoes it.
    /// `f16n_sub_phase` (both phases in one pass, stopped early) equals the rule
    /// taken phase by phase, around the one-half threshold and at every length
    /// parity.
    #[test]
    fn f16n_sub_phase_matches_the_rule() {
        fn reference(blk: &[u8]) -> Option<usize> {
            let mut best = (0u64, 0u64, 0usize);
            for phi in 0..2 {
                let m = (blk.len() - phi) / 2;
                let (mut sub, mut count) = (0u64, 0u64);
                for i in (0..m).step_by(crate::encode::SAMPLE_STRIDE) {
                    let x = F16n::load(&blk[phi..], i);
                    sub += (x & 0x7C00 == 0 && x & 0x7FFF != 0) as u64;
                    count += 1;
                }
                if phi == 0 || sub > best.0 {
                    best = (sub, count, phi);
                }
            }
            (2 * best.0 > best.1).then_some(best.2)
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut some = 0;
        for case in 0..600 {
            let n = 2 * MIN_CODED_ELEMS + 1 + case * 97 % 20000;
            // subnormals (e = 0, not ±0) at a rate around one half
            let rate = 40 + case % 21;
            let mut blk = vec![0u8; n];
            for c in blk.chunks_exact_mut(2) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v: u16 = if (x % 100) < rate as u64 {
                    (x >> 20) as u16 & 0x83FF | 1
                } else {
                    (x >> 20) as u16 | 0x0400
                };
                c.copy_from_slice(&v.to_le_bytes());
            }
            if case % 3 == 1 {
                blk.rotate_left(1);
            }
            let want = reference(&blk);
            some += want.is_some() as usize;
            assert_eq!(f16n_sub_phase(&blk), want, "case {case}, n {n}");
        }
        assert!(some > 100 && some < 500, "both outcomes reached: {some}");
    }

    #[test]
    fn f16n_split_matches_the_rule() {
        for x in 0..=0xFFFFu32 {
            let s = x >> 15;
            let e = (x >> 10) & 31;
            let m = x & 1023;
            let want = if e != 0 {
                (e as usize + 10, m | s << 10, 11)
            } else if m == 0 {
                (0, s, 1)
            } else {
                let v = 32 - m.leading_zeros();
                (v as usize, (m & ((1 << (v - 1)) - 1)) | s << (v - 1), v)
            };
            let got = F16n::split(x);
            assert_eq!(got, want, "{x:#06x}");
            assert_eq!(got.2, F16n::rawbits(got.0), "{x:#06x}");
            assert_eq!(F16n::join(got.0, got.1), x, "{x:#06x}");
        }
    }

    /// The block splitter (AVX2 where the CPU has it, eight at a time, scalar for
    /// the rest) against the scalar rule: every fp16 value, lengths that end off
    /// the vector width, and the sub-segment histograms against their elements.
    #[test]
    fn f16n_block_split_matches_the_scalar_split() {
        let all: Vec<u8> = (0..=0xFFFFu16).flat_map(|x| x.to_le_bytes()).collect();
        for m in [0usize, 1, 7, 8, 9, 515, 4097, 65536] {
            let mut sr = Split::default();
            let mut cnt = [0u64; 256];
            let ss = 512;
            f16n_split(&all, m, ss, &mut sr, &mut cnt);
            let mut want = [0u64; 256];
            for i in 0..m {
                let (sym, raw, _) = F16n::split(F16n::load(&all, i));
                assert_eq!(
                    (sr.syms[i] as usize, sr.raws[i] as u32),
                    (sym, raw),
                    "element {i}"
                );
                want[sym] += 1;
            }
            assert_eq!(cnt, want, "m = {m}");
            assert_eq!(sr.seg_hist.len(), m.div_ceil(ss));
            for (j, h) in sr.seg_hist.iter().enumerate() {
                let mut hw = [0u16; 64];
                for &x in &sr.syms[j * ss..((j + 1) * ss).min(m)] {
                    hw[x as usize] += 1;
                }
                assert_eq!(*h, hw, "m = {m}, sub-segment {j}");
            }
        }
    }
}
