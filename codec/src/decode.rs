//! The decoder. Total: for any input it returns the original bytes or an error,
//! never reads or writes out of bounds, never allocates, and writes `dst` in
//! ascending address order.

use crate::codes::{CODE_LENGTHS, ESC, MAXLEN, ND, NSYM, ZERO};
use crate::elem::{Bf16, Elem, Fp16, Fp32};
use crate::format::*;
use crate::{CodecError, Dtype, FrameInfo};

const GROUP: usize = 4 * SEG_ELEMS;
const TABLE: usize = 1 << MAXLEN;
/// Decode-table entry flag: a distance symbol that lands outside 1..=EMAX.
const INVALID: u32 = 1 << 17;
/// Decode-table entry flag (version 2 under `Z`): an escape whose exponent field is
/// 0 is not a ZERO key; [`dec_one`] reports it as [`INVALID`] so that the caller
/// decodes the sub-segment exactly.
const ZESC: u32 = 1 << 18;
/// Decode-table entry flag (version 2, fp16 under `Z`): ZERO, which has no extra
/// bits there (no plane byte, the element 0); its key is 0.
const NOX: u32 = 1 << 19;

/// Extra bits after the entry `t`'s code and escape payload: fp16's 3 unless
/// [`NOX`].
#[inline(always)]
fn xbits<T: Elem>(t: u32) -> u32 {
    T::XBITS & ((t & NOX) >> 19).wrapping_sub(1)
}

/// Reads the header and block table of a frame (no decoding).
///
/// Needs the header and, for block frames, the block table; the blocks themselves
/// need not be present (a receiver can call it on a prefix).
pub fn frame_info(src: &[u8]) -> Result<FrameInfo, CodecError> {
    let h = Header::parse(src)?;
    let stored = h.flags & FLAG_STORED != 0;
    let checksum = (h.flags & FLAG_CHECKSUM != 0).then_some(h.crc);
    let (blocks, frame_len) = if stored {
        (0, (HEADER_LEN as u64).saturating_add(h.raw_len))
    } else {
        let nb = block_count(&h);
        let (_, t0) = crate::coltab::frame_table(&h, src)?;
        let table = table_slice(src, t0, nb)?;
        let sum: u64 = table
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)
            .sum();
        (nb, t0 as u64 + 4 * nb + sum)
    };
    Ok(FrameInfo {
        raw_len: h.raw_len,
        frame_len,
        dtype: Dtype::from_u8(h.dtype),
        blocks,
        block_size: 1 << h.block_log2,
        stored,
        checksum,
    })
}

fn block_count(h: &Header) -> u64 {
    h.raw_len.div_ceil(1u64 << h.block_log2)
}

/// The block table (at `t0`: after the header and the column table), bounds-checked
/// against `src`.
pub(crate) fn table_slice(src: &[u8], t0: usize, nb: u64) -> Result<&[u8], CodecError> {
    let end = nb
        .checked_mul(4)
        .and_then(|t| t.checked_add(t0 as u64))
        .ok_or(CodecError::Corrupt("block table length overflows"))?;
    if end > src.len() as u64 {
        return Err(CodecError::Truncated);
    }
    Ok(&src[t0..end as usize])
}

/// Decompresses one whole frame `src` into `dst` and returns the uncompressed length.
///
/// Errors (never panics) when the frame is malformed, truncated, followed by extra
/// bytes, fails its checksum, or is longer than `dst`. Writes `dst[..len]` in
/// ascending address order; on error, a prefix of `dst` may have been written.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
    decompress_with(
        src,
        dst,
        &mut FrameTables {
            t: Tables::new(),
            scratch: None,
        },
    )
}

fn decompress_with<S: TableSource>(
    src: &[u8],
    dst: &mut [u8],
    tables: &mut S,
) -> Result<usize, CodecError> {
    let (h, n) = parse_for_decode(src, dst.len())?;
    if h.flags & FLAG_STORED != 0 {
        let end = HEADER_LEN as u64 + h.raw_len;
        if (src.len() as u64) < end {
            return Err(CodecError::Truncated);
        }
        if (src.len() as u64) > end {
            return Err(CodecError::TrailingBytes {
                frame_len: end,
                src_len: src.len(),
            });
        }
        copy_ascending(&mut dst[..n], &src[HEADER_LEN..]);
    } else {
        let b = 1usize << h.block_log2;
        let nb = block_count(&h);
        let (ct, t0) = crate::coltab::frame_table(&h, src)?;
        let table = table_slice(src, t0, nb)?;
        let mut pos = table.len() + t0;
        for (i, c) in table.chunks_exact(4).enumerate() {
            let size = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
            let end = pos.checked_add(size).ok_or(CodecError::Truncated)?;
            if end > src.len() {
                return Err(CodecError::Truncated);
            }
            let o = i * b;
            let l = b.min(n - o);
            let col = ct.as_ref().map(|c| (c, o));
            decode_block_any(h.version, src, pos, size, &mut dst[o..o + l], tables, col)?;
            pos = end;
        }
        if pos != src.len() {
            return Err(CodecError::TrailingBytes {
                frame_len: pos as u64,
                src_len: src.len(),
            });
        }
    }
    verify(&h, &dst[..n])?;
    Ok(n)
}

pub(crate) fn parse_for_decode(src: &[u8], dst_len: usize) -> Result<(Header, usize), CodecError> {
    let h = Header::parse(src)?;
    if h.raw_len > dst_len as u64 {
        return Err(CodecError::DstTooSmall {
            needed: h.raw_len,
            available: dst_len,
        });
    }
    Ok((h, h.raw_len as usize))
}

pub(crate) fn verify(h: &Header, out: &[u8]) -> Result<(), CodecError> {
    if h.flags & FLAG_CHECKSUM != 0 {
        let actual = crc32c::crc32c(out);
        if actual != h.crc {
            return Err(CodecError::ChecksumMismatch {
                expected: h.crc,
                actual,
            });
        }
    }
    Ok(())
}

/// Copies with ascending 16-byte stores. A compiler fence per chunk keeps LLVM from
/// turning the loop into `memcpy`, which may store a buffer's tail before its head.
pub(crate) fn copy_ascending(dst: &mut [u8], src: &[u8]) {
    use std::sync::atomic::{compiler_fence, Ordering};
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (dc, sc) in (&mut d).zip(&mut s) {
        let v: [u8; 16] = sc.try_into().unwrap();
        dc.copy_from_slice(&v);
        compiler_fence(Ordering::Release);
    }
    for (x, y) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *x = *y;
    }
}

/// Decode tables of one (mode, k, anchor) choice.
pub(crate) struct Tables {
    key: Option<TableKey>,
    single: [u32; TABLE],
    /// Multi-symbol table: up to [`MULTI`] keys per entry (first in the low byte).
    multi: [u32; TABLE],
    /// Per multi entry: bits used (bits 0..4) and key count (bits 4..8); count 0
    /// means "decode one element the slow way" (escape, invalid, or too long).
    meta: [u8; TABLE],
    /// `multi` and `meta` cover the next `mbits` stream bits (entries below
    /// `1 << mbits`): this mask.
    mmask: u64,
}

impl Tables {
    /// 36 KiB, on the caller's stack: [`decompress`] does not allocate.
    pub(crate) fn new() -> Tables {
        Tables {
            key: None,
            single: [0; TABLE],
            multi: [0; TABLE],
            meta: [0; TABLE],
            mmask: 0,
        }
    }

    fn build<T: Elem>(&mut self, key: TableKey) {
        let (_, zesc, a, lens, mbits) = key;
        let words = crate::codes::canonical_words(&lens);
        dec_table::<T>(&lens, &words, a as u32, zesc, &mut self.single);
        multi_table::<T>(
            &lens,
            &words,
            &self.single,
            &mut self.multi,
            &mut self.meta,
            mbits as u32,
        );
        self.mmask = (1 << mbits) - 1;
        self.key = Some(key);
    }
}

/// What a set of decode tables depends on: mode, [`ZESC`] (version 2 under `Z`),
/// anchor, code lengths (version 1: a static code's) and the multi-symbol window.
type TableKey = (u8, bool, u8, [u8; NSYM], u8);

fn table_key<T: Elem>(lens: &[u8; NSYM], a: u32, zesc: bool, mbits: u32) -> TableKey {
    (T::MODE, zesc, a as u8, *lens, mbits as u8)
}

/// Multi-symbol window of version 1's static codes (and version 2's): the longest
/// code. Version 2's explicit codes, a new table for nearly every block, use
/// [`MBITS_EXPLICIT`]: a quarter of the entries to build; their rare long codes
/// (Huffman) take the one-element path.
pub(crate) const MBITS_STATIC: u32 = MAXLEN;
pub(crate) const MBITS_EXPLICIT: u32 = 10;

/// Where a coded block's decode tables come from.
pub(crate) trait TableSource {
    /// The tables of the code `lens` (a complete prefix code) at anchor `a`;
    /// `zesc`: version 2 under `Z` (see [`ZESC`]); `mbits`: the multi-symbol window,
    /// 1..=12 bits.
    fn tables<T: Elem>(&mut self, lens: &[u8; NSYM], a: u32, zesc: bool, mbits: u32) -> &Tables;
    /// [`TableSource::tables`] and the version 2 decoder's per-block scratch (kept
    /// across blocks: a block clears only the parts it reads before writing).
    fn tables_scratch<T: Elem>(
        &mut self,
        lens: &[u8; NSYM],
        a: u32,
        zesc: bool,
        mbits: u32,
    ) -> (&Tables, &mut crate::v2::DecScratch);
}

/// [`decompress`]'s source: one set of tables and one scratch for the frame, on the
/// caller's stack (the scratch made at the first version 2 coded block).
struct FrameTables {
    t: Tables,
    scratch: Option<crate::v2::DecScratch>,
}

impl TableSource for FrameTables {
    fn tables<T: Elem>(&mut self, lens: &[u8; NSYM], a: u32, zesc: bool, mbits: u32) -> &Tables {
        self.t.tables_for::<T>(lens, a, zesc, mbits)
    }
    fn tables_scratch<T: Elem>(
        &mut self,
        lens: &[u8; NSYM],
        a: u32,
        zesc: bool,
        mbits: u32,
    ) -> (&Tables, &mut crate::v2::DecScratch) {
        (
            self.t.tables_for::<T>(lens, a, zesc, mbits),
            self.scratch.get_or_insert_with(crate::v2::DecScratch::new),
        )
    }
}

impl Tables {
    /// This one set for (mode, code, anchor), rebuilt whenever that changes from the
    /// previous block.
    fn tables_for<T: Elem>(
        &mut self,
        lens: &[u8; NSYM],
        a: u32,
        zesc: bool,
        mbits: u32,
    ) -> &Tables {
        let key = table_key::<T>(lens, a, zesc, mbits);
        if self.key != Some(key) {
            self.build::<T>(key);
        }
        self
    }
}

/// A decoder that keeps the decode tables of its [`Decoder::SETS`] most recently used
/// (dtype, code, anchor) choices across frames.
///
/// Building a choice's tables costs about as much as decoding a fifth of a 64 KiB
/// block. Consecutive blocks of one tensor often alternate between a few near-equal
/// choices, and a frame of 256 KiB (the plugin's default chunk) holds only 4 blocks,
/// so [`decompress`], which starts every frame with no tables and keeps one set,
/// rebuilds for about a third of the blocks of real tensors. A receiver that
/// decodes frame after frame keeps one `Decoder` instead. It holds at most
/// [`Decoder::SETS`] × 36 KiB of tables and 26 KiB of version 2 block scratch (kept,
/// not cleared per block), allocated on first use and never sized by a frame.
#[derive(Default)]
pub struct Decoder {
    /// Most recently used first.
    sets: Vec<Box<Tables>>,
    /// Version 2's block scratch, allocated with the first table set.
    scratch: Option<Box<crate::v2::DecScratch>>,
}

impl Decoder {
    /// Table sets kept.
    pub const SETS: usize = 4;

    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// [`decompress`] with this decoder's tables: same results and errors.
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        decompress_with(src, dst, self)
    }

    /// Bytes of table (and scratch) memory held now.
    pub fn held_bytes(&self) -> usize {
        self.sets.len() * std::mem::size_of::<Tables>()
            + self.scratch.as_ref().map_or(0, |_| SCRATCH_BYTES)
    }

    /// Bytes of table (and scratch) memory a decoder holds at most.
    pub const MAX_HELD_BYTES: usize = Decoder::SETS * std::mem::size_of::<Tables>() + SCRATCH_BYTES;

    /// Finds or builds the set of `key`, moves it to the front.
    fn set_to_front<T: Elem>(&mut self, lens: &[u8; NSYM], a: u32, zesc: bool, mbits: u32) {
        let key = table_key::<T>(lens, a, zesc, mbits);
        let i = match self.sets.iter().position(|s| s.key == Some(key)) {
            Some(i) => i,
            None => {
                if self.sets.len() < Decoder::SETS {
                    self.sets.push(Box::new(Tables::new()));
                }
                if self.scratch.is_none() {
                    self.scratch = Some(Box::new(crate::v2::DecScratch::new()));
                }
                // The new set, or the least recently used one.
                let i = self.sets.len() - 1;
                self.sets[i].build::<T>(key);
                i
            }
        };
        self.sets[..=i].rotate_right(1);
    }
}

/// Bytes of [`crate::v2::DecScratch`].
const SCRATCH_BYTES: usize = std::mem::size_of::<crate::v2::DecScratch>();

impl TableSource for Decoder {
    fn tables<T: Elem>(&mut self, lens: &[u8; NSYM], a: u32, zesc: bool, mbits: u32) -> &Tables {
        self.set_to_front::<T>(lens, a, zesc, mbits);
        &self.sets[0]
    }
    fn tables_scratch<T: Elem>(
        &mut self,
        lens: &[u8; NSYM],
        a: u32,
        zesc: bool,
        mbits: u32,
    ) -> (&Tables, &mut crate::v2::DecScratch) {
        self.set_to_front::<T>(lens, a, zesc, mbits);
        let scratch = self
            .scratch
            .get_or_insert_with(|| Box::new(crate::v2::DecScratch::new()));
        (&self.sets[0], scratch)
    }
}

/// `memset` with ascending 16-byte stores (see [`copy_ascending`]).
pub(crate) fn fill_ascending(dst: &mut [u8], v: u8) {
    use std::sync::atomic::{compiler_fence, Ordering};
    let pat = [v; 16];
    let mut d = dst.chunks_exact_mut(16);
    for c in &mut d {
        c.copy_from_slice(&pat);
        compiler_fence(Ordering::Release);
    }
    for x in d.into_remainder() {
        *x = v;
    }
}

/// [`decode_block`] for a frame of `version` (1 or 2).
pub(crate) fn decode_block_any<S: TableSource>(
    version: u8,
    src: &[u8],
    start: usize,
    size: usize,
    out: &mut [u8],
    tables: &mut S,
    col: Option<(&crate::coltab::ColTab, usize)>,
) -> Result<(), CodecError> {
    if version == VERSION_2 {
        crate::v2::decode_block_v2(src, start, size, out, tables, col)
    } else {
        decode_block(src, start, size, out, tables)
    }
}

/// Decodes block at `src[start..start + size]` into `out` (its `L` bytes).
pub(crate) fn decode_block<S: TableSource>(
    src: &[u8],
    start: usize,
    size: usize,
    out: &mut [u8],
    tables: &mut S,
) -> Result<(), CodecError> {
    if size == 0 {
        return Err(CodecError::Corrupt("empty block"));
    }
    let l = out.len();
    match src[start] {
        MODE_RAW => {
            if size != 1 + l {
                return Err(CodecError::Corrupt("raw block length mismatch"));
            }
            copy_ascending(out, &src[start + 1..start + size]);
            Ok(())
        }
        MODE_FILL => {
            if size != 2 {
                return Err(CodecError::Corrupt("fill block length mismatch"));
            }
            fill_ascending(out, src[start + 1]);
            Ok(())
        }
        MODE_BF16 => decode_coded::<Bf16, S>(src, start, size, out, tables),
        MODE_FP16 => decode_coded::<Fp16, S>(src, start, size, out, tables),
        MODE_FP32 => decode_coded::<Fp32, S>(src, start, size, out, tables),
        _ => Err(CodecError::Corrupt("unknown block mode")),
    }
}

/// Decode table for code `lens` (canonical `words`) and anchor `a`: indexed by the
/// next 12 stream bits. Entry: bits 0..8 exponent (0 for ESC), 8..12 code length,
/// 12..17 length with the escape payload, bit 17 INVALID, bit 18 ZESC (`zesc`, on the
/// escape), bit 19 NOX (`zesc` and fp16, on ZERO), bits 24..32 mask of the escape
/// payload.
fn dec_table<T: Elem>(
    lens: &[u8; NSYM],
    words: &[u16; NSYM],
    a: u32,
    zesc: bool,
    t: &mut [u32; TABLE],
) {
    let ent = |s: usize| {
        let lc = lens[s] as u32;
        if s < ND {
            let d = s as u32;
            if d < a {
                (a - d) | (lc << 8) | (lc << 12)
            } else {
                INVALID | (lc << 8) | (lc << 12)
            }
        } else if s == ZERO {
            (lc << 8) | (lc << 12) | if zesc && T::XBITS > 0 { NOX } else { 0 }
        } else {
            debug_assert_eq!(s, ESC);
            (lc << 8)
                | ((lc + T::EBITS) << 12)
                | (((1u32 << T::EBITS) - 1) << 24)
                | if zesc { ZESC } else { 0 }
        }
    };
    // Built by doubling: before level `lc`, `t[..1 << (lc - 1)]` is the table of the
    // codes up to `lc - 1` bits over (lc - 1)-bit windows (INVALID where none is a
    // prefix: unused symbols of explicit codes decode nowhere). Its copy above it
    // is the same over lc-bit windows; the codes of exactly `lc` bits then take
    // their own slots (prefix-free: no shorter code holds them). About 4096 entry
    // copies in all, not one store per entry per symbol.
    t[0] = INVALID;
    for lc in 1..=MAXLEN {
        let h = 1usize << (lc - 1);
        t.copy_within(0..h, h);
        for s in 0..NSYM {
            if lens[s] as u32 == lc {
                t[words[s] as usize] = ent(s);
            }
        }
    }
}

/// Keys one multi-symbol lookup decodes at most.
const MULTI: usize = 4;

/// Bit `i` of `j` at bit `11 - i` (12-bit reversal, see [`multi_table`]).
static REV12: [u16; TABLE] = {
    let mut r = [0u16; TABLE];
    let mut j = 0;
    while j < TABLE {
        let mut i = 0;
        while i < MAXLEN {
            r[j] |= (((j >> i) & 1) << (MAXLEN - 1 - i)) as u16;
            i += 1;
        }
        j += 1;
    }
    r
};

/// Multi-symbol tables: for the next `mbits` stream bits, up to [`MULTI`] whole
/// elements (keys in `m`, bits used and count in `meta`, see [`Tables`]), the greedy
/// decode of the window.
///
/// Built by window width, by first element: the greedy decode of a `w`-bit window
/// whose first element (code word, and fp16's extra bits: `len` bits in all) is `p`
/// is that element followed by the greedy decode of the `(w - len)`-bit window `r`
/// above it, cut to [`MULTI`] elements. So the table of width `w` is made, one first
/// element at a time, from the table of width `w - len`, widths 1 to `mbits` in
/// turn; windows whose first element does not fit (longer than `w`, an escape, an
/// invalid symbol, or no code word) stay empty. The tables are kept with their
/// windows' bits reversed: window `p | r << len` of width `w` then sits at
/// `rev(p) << (w - len) | rev(r)`, so each first element's part is the whole table
/// of width `w - len`, mapped entry by entry into one run (a loop the compiler
/// vectorises); the last width is then read out in its natural order. About 2
/// entries made per table entry, no per-entry search for the elements that fit.
fn multi_table<T: Elem>(
    lens: &[u8; NSYM],
    words: &[u16; NSYM],
    single: &[u32; TABLE],
    m: &mut [u32; TABLE],
    meta: &mut [u8; TABLE],
    mbits: u32,
) {
    // the first elements that can start a multi entry: (pattern, bits, key)
    let mut first = [(0u32, 0u32, 0u32); NSYM << 3];
    let mut nf = 0;
    for s in 0..NSYM {
        if lens[s] == 0 {
            continue;
        }
        // the symbol's entry (every window that starts with its code word holds it)
        let t = single[words[s] as usize];
        if t & INVALID != 0 || (t >> 24) != 0 {
            continue;
        }
        let xb = xbits::<T>(t);
        let lc = (t >> 12) & 0x1F;
        for x in 0..1u32 << xb {
            let key = if T::XBITS > 0 {
                T::make_key(t & 0xFF, x)
            } else {
                t & 0xFF
            };
            first[nf] = (words[s] as u32 | (x << lc), lc + xb, key & 0xFF);
            nf += 1;
        }
    }
    let first = &first[..nf];
    // One element before a narrower window's keys `rk` and ends `re` (bits used
    // after each element, one byte each, 0 past the last: every element takes at
    // least one bit, and all ends are below 128): the rest's ends move by `len`, its
    // empty bytes stay 0; shifting by a byte drops a fifth element.
    #[inline(always)]
    fn join(len: u32, key: u32, rk: u32, re: u32) -> (u32, u32) {
        let nz = ((re + 0x7F7F_7F7F) & 0x8080_8080) >> 7;
        // 0xFF in each byte of `re` that holds an end (`nz` times 255, mod 2^32:
        // `(nz << 8) - nz` drops the top byte's carry and underflows when the
        // rest holds four elements)
        let used = nz.wrapping_mul(0xFF);
        (
            key | (rk << 8),
            len | (((re + len * 0x0101_0101) & used) << 8),
        )
    }
    // Widths 0..=mbits, bit-reversed: width w at `(1 << w) - 1`. Width 0 is the
    // empty window.
    let (mut small, mut big);
    let (keys, ends): (&mut [u32], &mut [u32]) = if mbits <= MBITS_EXPLICIT {
        small = [[0u32; 2 << MBITS_EXPLICIT]; 2];
        let [k, e] = &mut small;
        (k, e)
    } else {
        big = [[0u32; 2 * TABLE]; 2];
        let [k, e] = &mut big;
        (k, e)
    };
    for w in 1..=mbits {
        let at = (1usize << w) - 1;
        let (klo, khi) = keys.split_at_mut(at);
        let (elo, ehi) = ends.split_at_mut(at);
        for &(p, len, key) in first.iter().filter(|f| f.1 <= w) {
            let rw = w - len;
            let (from, n) = ((1usize << rw) - 1, 1usize << rw);
            let to = ((REV12[p as usize] >> (MAXLEN - len)) as usize) << rw;
            let src = klo[from..from + n].iter().zip(&elo[from..from + n]);
            let dst = khi[to..to + n].iter_mut().zip(&mut ehi[to..to + n]);
            for ((dk, de), (&rk, &re)) in dst.zip(src) {
                (*dk, *de) = join(len, key, rk, re);
            }
        }
    }
    // width mbits in its natural order (empty windows: keys and ends 0, meta 0)
    let nw = 1usize << mbits;
    let at = nw - 1;
    let sh = MAXLEN - mbits;
    let (kw, ew) = (&keys[at..at + nw], &ends[at..at + nw]);
    for (idx, (mk, mm)) in m.iter_mut().zip(meta.iter_mut()).enumerate().take(nw) {
        // `& (nw - 1)`: no bounds check (the reversal of an `mbits`-bit index)
        let j = (REV12[idx] >> sh) as usize & (nw - 1);
        let (k, e) = (kw[j], ew[j]);
        // elements: the nonzero bytes of `e` (ends below 128), c of them; bits used:
        // the last, byte c - 1 (byte 3 when c = 0: e = 0)
        let c = ((((e + 0x7F7F_7F7F) & 0x8080_8080) >> 7).wrapping_mul(0x0101_0101)) >> 24;
        *mk = k;
        *mm = ((e >> (8 * (c.wrapping_sub(1) & 3))) & 0xFF | (c << 4)) as u8;
    }
}
const _: () = assert!(MULTI == 4);

/// Decoding state of one segment: next bit, next key, and the invalid flag.
#[derive(Clone, Copy)]
pub(crate) struct Lane {
    /// byte of `src` the lane's bit positions count from
    pub(crate) base: usize,
    pub(crate) bp: u64,
    pub(crate) kp: usize,
    pub(crate) bad: u32,
}

/// Slack after a segment's keys: a table entry is stored as 4 bytes.
pub(crate) const KEY_SLACK: usize = 20;
/// Keys one [`lane_step_in`] decodes at most.
const STEP_KEYS: usize = 4 * MULTI;
const _: () = assert!(KEY_SLACK >= STEP_KEYS);

/// One refill and up to 4 multi-symbol lookups (at most [`STEP_KEYS`] keys, 48
/// stream bits). Callers keep `lane.kp + STEP_KEYS <= SEG_ELEMS`; memory safety
/// holds regardless (`kp` is clamped). `U`: the stream loads are not bounds-checked.
///
/// # Safety
/// With `U`, `src` holds 8 bytes at every byte the lane loads from: see
/// [`dec_segments4_unchecked`].
#[inline(always)]
unsafe fn lane_step_in<T: Elem, const U: bool>(
    t: &Tables,
    src: &[u8],
    keys: &mut [u8; SEG_ELEMS + KEY_SLACK],
    l: &mut Lane,
) {
    let mut buf = load64_in::<U>(src, l.base + (l.bp >> 3) as usize) >> (l.bp & 7);
    let mut kp = l.kp.min(SEG_ELEMS);
    for _ in 0..4 {
        let idx = (buf & t.mmask & (TABLE as u64 - 1)) as usize;
        let info = t.meta[idx] as u32;
        let cnt = (info >> 4) as usize;
        if cnt == 0 {
            let buf = load64_in::<U>(src, l.base + (l.bp >> 3) as usize) >> (l.bp & 7);
            let (k, n, b) = dec_one::<T>(&t.single, buf);
            keys[kp] = k;
            kp += 1;
            l.bp += n as u64;
            l.bad |= b;
            break;
        }
        // SAFETY: kp <= SEG_ELEMS on entry and grows by at most MULTI per lookup,
        // so kp + 4 <= SEG_ELEMS + STEP_KEYS <= keys.len() whatever the input.
        unsafe {
            keys.as_mut_ptr()
                .add(kp)
                .cast::<[u8; 4]>()
                .write_unaligned(t.multi[idx].to_le_bytes())
        };
        kp += cnt;
        let n = info & 0xF;
        buf >>= n;
        l.bp += n as u64;
    }
    l.kp = kp;
}

/// Finishes a lane: multi-symbol steps while [`STEP_KEYS`] keys fit, then one key
/// at a time.
#[inline(always)]
pub(crate) fn lane_finish<T: Elem>(
    t: &Tables,
    src: &[u8],
    keys: &mut [u8; SEG_ELEMS + KEY_SLACK],
    n: usize,
    l: &mut Lane,
) {
    // SAFETY: U = false: every load is bounds-checked.
    unsafe { lane_finish_in::<T, false>(t, src, keys, n, l) }
}

/// [`lane_finish`]; `U`: as in [`lane_step_in`].
///
/// # Safety
/// As [`lane_step_in`].
#[inline(always)]
unsafe fn lane_finish_in<T: Elem, const U: bool>(
    t: &Tables,
    src: &[u8],
    keys: &mut [u8; SEG_ELEMS + KEY_SLACK],
    n: usize,
    l: &mut Lane,
) {
    while l.kp + STEP_KEYS <= n {
        lane_step_in::<T, U>(t, src, keys, l);
    }
    // one refill and one multi-symbol lookup while its keys fit (greedy, so the same
    // keys as one at a time), then one key at a time
    while l.kp + MULTI <= n {
        let buf = load64_in::<U>(src, l.base + (l.bp >> 3) as usize) >> (l.bp & 7);
        let idx = (buf & t.mmask & (TABLE as u64 - 1)) as usize;
        let info = t.meta[idx] as u32;
        let cnt = (info >> 4) as usize;
        let kp = l.kp.min(SEG_ELEMS);
        if cnt == 0 {
            let (k, b, f) = dec_one::<T>(&t.single, buf);
            keys[kp] = k;
            l.kp = kp + 1;
            l.bp += b as u64;
            l.bad |= f;
        } else {
            // SAFETY: kp <= SEG_ELEMS, so kp + 4 <= keys.len() whatever the input.
            unsafe {
                keys.as_mut_ptr()
                    .add(kp)
                    .cast::<[u8; 4]>()
                    .write_unaligned(t.multi[idx].to_le_bytes())
            };
            l.kp = kp + cnt;
            l.bp += (info & 0xF) as u64;
        }
    }
    while l.kp < n {
        let buf = load64_in::<U>(src, l.base + (l.bp >> 3) as usize) >> (l.bp & 7);
        let (k, b, f) = dec_one::<T>(&t.single, buf);
        keys[l.kp.min(SEG_ELEMS)] = k;
        l.kp += 1;
        l.bp += b as u64;
        l.bad |= f;
    }
}

/// Decodes 4 segments of `n <= SEG_ELEMS` elements each interleaved (4 independent
/// dependency chains).
#[inline(always)]
pub(crate) fn dec_segments4<T: Elem>(
    t: &Tables,
    src: &[u8],
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; 4],
    lanes: &mut [Lane; 4],
    n: usize,
) {
    // SAFETY: U = false: every load is bounds-checked.
    unsafe { dec_segments4_in::<T, false>(t, src, keys, lanes, n) }
}

/// [`dec_segments4`] without bounds checks on the stream loads.
///
/// # Safety
/// For every lane, `src` holds `l.base + (l.bp / 8 + (20 * n).div_ceil(8)) + 8`
/// bytes or more (its state on entry). Why that is enough: every key a lane decodes
/// takes at most 20 stream bits (a 12-bit code and an 8-bit escape payload, or fp16's
/// 5-bit payload and 3 extra bits; a multi-symbol lookup takes at most 12 bits for
/// at least one key), a lane decodes at most `n` keys (steps run while `kp +
/// STEP_KEYS <= n`, single lookups while `kp + MULTI <= n`, single keys while
/// `kp < n`), and it loads 8 bytes at the byte of its next key's first bit: at most
/// `l.bp / 8 + (7 + 20 * (n - 1)) / 8` bytes past `l.base`, below the bound whatever
/// the stream holds.
#[inline(always)]
pub(crate) unsafe fn dec_segments4_unchecked<T: Elem>(
    t: &Tables,
    src: &[u8],
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; 4],
    lanes: &mut [Lane; 4],
    n: usize,
) {
    dec_segments4_in::<T, true>(t, src, keys, lanes, n)
}

#[inline(always)]
unsafe fn dec_segments4_in<T: Elem, const U: bool>(
    t: &Tables,
    src: &[u8],
    keys: &mut [[u8; SEG_ELEMS + KEY_SLACK]; 4],
    lanes: &mut [Lane; 4],
    n: usize,
) {
    let [k0, k1, k2, k3] = keys;
    let [l0, l1, l2, l3] = lanes;
    while l0.kp.max(l1.kp).max(l2.kp.max(l3.kp)) + STEP_KEYS <= n {
        lane_step_in::<T, U>(t, src, k0, l0);
        lane_step_in::<T, U>(t, src, k1, l1);
        lane_step_in::<T, U>(t, src, k2, l2);
        lane_step_in::<T, U>(t, src, k3, l3);
    }
    lane_finish_in::<T, U>(t, src, k0, n, l0);
    lane_finish_in::<T, U>(t, src, k1, n, l1);
    lane_finish_in::<T, U>(t, src, k2, n, l2);
    lane_finish_in::<T, U>(t, src, k3, n, l3);
}

/// [`load64`], or with `U` an unchecked load.
///
/// # Safety
/// With `U`, `p + 8 <= src.len()`.
#[inline(always)]
unsafe fn load64_in<const U: bool>(src: &[u8], p: usize) -> u64 {
    if U {
        debug_assert!(p + 8 <= src.len());
        u64::from_le_bytes(*(src.as_ptr().add(p) as *const [u8; 8]))
    } else {
        load64(src, p)
    }
}

/// Little-endian 64-bit load at byte `p` of `src`, zero-filled past its end.
#[inline(always)]
fn load64(src: &[u8], p: usize) -> u64 {
    match src.get(p..p + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().unwrap()),
        None => {
            let mut v = [0u8; 8];
            if p < src.len() {
                let r = &src[p..];
                v[..r.len()].copy_from_slice(r);
            }
            u64::from_le_bytes(v)
        }
    }
}

/// Decodes one element from `buf` (at least 20 valid bits): (key, bits used, invalid flag).
#[inline(always)]
fn dec_one<T: Elem>(lut: &[u32; TABLE], buf: u64) -> (u8, u32, u32) {
    let t = lut[(buf & (TABLE as u64 - 1)) as usize];
    let lc = (t >> 8) & 0xF;
    let e = (t & 0xFF) | ((buf >> lc) as u32 & (t >> 24));
    let mut len = (t >> 12) & 0x1F;
    let key = if T::XBITS > 0 {
        let xb = xbits::<T>(t);
        let x = (buf >> len) as u32 & ((1 << xb) - 1);
        len += xb;
        T::make_key(e, x)
    } else {
        e
    };
    let zbad = ((t >> 1) & INVALID) * (e == 0) as u32;
    (key as u8, len, (t & INVALID) | zbad)
}

fn decode_coded<T: Elem, S: TableSource>(
    src: &[u8],
    start: usize,
    size: usize,
    out: &mut [u8],
    tables: &mut S,
) -> Result<(), CodecError> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("bmi2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { decode_coded_avx2::<T, S>(src, start, size, out, tables) };
        }
    }
    decode_coded_body::<T, S>(src, start, size, out, tables)
}

/// # Safety
/// The CPU must support AVX2 and BMI2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2")]
unsafe fn decode_coded_avx2<T: Elem, S: TableSource>(
    src: &[u8],
    start: usize,
    size: usize,
    out: &mut [u8],
    tables: &mut S,
) -> Result<(), CodecError> {
    decode_coded_body::<T, S>(src, start, size, out, tables)
}

#[inline(always)]
fn decode_coded_body<T: Elem, S: TableSource>(
    src: &[u8],
    start: usize,
    size: usize,
    out: &mut [u8],
    tables: &mut S,
) -> Result<(), CodecError> {
    let blk = &src[start..start + size];
    let l = out.len();
    let m = l / T::W;
    let t = l - m * T::W;
    let nseg = m.div_ceil(SEG_ELEMS);
    let off1 = BLOCK_HEADER_LEN + 2 * nseg;
    let off2 = off1 + m;
    let streams = off2 + T::P2 * m;
    if m == 0 || streams > size {
        return Err(CodecError::Corrupt("coded block too short"));
    }
    let k = blk[1] as usize;
    let a = blk[2] as u32;
    if k >= CODE_LENGTHS.len() || a == 0 || a > T::EMAX || blk[3] != 0 {
        return Err(CodecError::Corrupt("bad coded block header"));
    }
    let seg_len = |j: usize| u16::from_le_bytes([blk[4 + 2 * j], blk[5 + 2 * j]]) as usize;
    let total: usize = (0..nseg).map(seg_len).sum();
    if streams + total + t != size {
        return Err(CodecError::Corrupt("coded block length mismatch"));
    }
    let set = tables.tables::<T>(&CODE_LENGTHS[k], a, false, MBITS_STATIC);
    let mut keys = [[0u8; SEG_ELEMS + KEY_SLACK]; 4];
    let mut sp = start + streams; // absolute position of the next segment
    let mut seg = 0usize;
    let mut g0 = 0usize;
    while g0 < m {
        let g1 = (g0 + GROUP).min(m);
        let nsg = (g1 - g0).div_ceil(SEG_ELEMS);
        let mut lanes = [Lane {
            base: 0,
            bp: 0,
            kp: 0,
            bad: 0,
        }; 4];
        let mut lens = [0usize; 4];
        for i in 0..nsg {
            lanes[i].base = sp;
            lens[i] = seg_len(seg + i);
            sp += lens[i];
        }
        if g1 - g0 == GROUP {
            dec_segments4::<T>(set, src, &mut keys, &mut lanes, SEG_ELEMS);
        } else {
            for i in 0..nsg {
                let n = (g1 - g0 - i * SEG_ELEMS).min(SEG_ELEMS);
                lane_finish::<T>(set, src, &mut keys[i], n, &mut lanes[i]);
            }
        }
        let bad = lanes.iter().fold(0, |b, l| b | l.bad);
        if bad != 0 {
            return Err(CodecError::Corrupt("exponent out of range"));
        }
        for i in 0..nsg {
            let bp = lanes[i].bp;
            if bp.div_ceil(8) != lens[i] as u64 {
                return Err(CodecError::Corrupt("segment length mismatch"));
            }
            // The padding after the last code is zero (docs/FORMAT.md): a flip
            // there must not pass as a valid frame.
            if bp % 8 != 0 && src[lanes[i].base + (bp / 8) as usize] >> (bp % 8) != 0 {
                return Err(CodecError::Corrupt("nonzero segment padding"));
            }
        }
        for i in 0..nsg {
            let s0 = g0 + i * SEG_ELEMS;
            let s1 = (s0 + SEG_ELEMS).min(g1);
            let p2: &[u8] = if T::P2 > 0 {
                &blk[off2 + T::P2 * s0..off2 + T::P2 * s1]
            } else {
                &[]
            };
            T::join(
                &keys[i][..s1 - s0],
                &blk[off1 + s0..off1 + s1],
                p2,
                &mut out[s0 * T::W..s1 * T::W],
            );
        }
        seg += nsg;
        g0 = g1;
    }
    out[m * T::W..].copy_from_slice(&blk[size - t..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element-by-element greedy decode that [`multi_table`] builds by width.
    fn multi_greedy<T: Elem>(single: &[u32; TABLE], idx: usize, mbits: u32) -> (u32, u8) {
        let (mut used, mut keys, mut cnt) = (0u32, 0u32, 0u32);
        while (cnt as usize) < MULTI {
            let t = single[(idx >> used) & (TABLE - 1)];
            // fp16 under Z: ZERO has no extra bits
            let xb = if t & NOX != 0 { 0 } else { T::XBITS };
            let len = ((t >> 12) & 0x1F) + xb;
            if t & INVALID != 0 || (t >> 24) != 0 || used + len > mbits {
                break;
            }
            let x = ((idx as u32) >> (used + len - xb)) & ((1 << xb) - 1);
            let key = if T::XBITS > 0 {
                T::make_key(t & 0xFF, x)
            } else {
                t & 0xFF
            };
            keys |= (key & 0xFF) << (8 * cnt);
            used += len;
            cnt += 1;
        }
        (keys, (used | (cnt << 4)) as u8)
    }

    /// [`dec_table`] by its definition: every code word's slots, one by one.
    fn dec_table_ref<T: Elem>(
        lens: &[u8; NSYM],
        words: &[u16; NSYM],
        a: u32,
        zesc: bool,
        t: &mut [u32; TABLE],
    ) {
        t.fill(INVALID);
        for s in 0..NSYM {
            let lc = lens[s] as u32;
            if lc == 0 {
                continue;
            }
            let ent = if s < ND {
                let d = s as u32;
                if d < a {
                    (a - d) | (lc << 8) | (lc << 12)
                } else {
                    INVALID | (lc << 8) | (lc << 12)
                }
            } else if s == ZERO {
                (lc << 8) | (lc << 12) | if zesc && T::XBITS > 0 { NOX } else { 0 }
            } else {
                (lc << 8)
                    | ((lc + T::EBITS) << 12)
                    | (((1u32 << T::EBITS) - 1) << 24)
                    | if zesc { ZESC } else { 0 }
            };
            let w = words[s] as usize;
            for hi in 0..(1usize << (MAXLEN - lc)) {
                t[w | (hi << lc)] = ent;
            }
        }
    }

    fn check<T: Elem>(lens: &[u8; NSYM], a: u32, zesc: bool) {
        let words = crate::codes::canonical_words(lens);
        let mut single = [0u32; TABLE];
        dec_table::<T>(lens, &words, a, zesc, &mut single);
        let mut want = [0u32; TABLE];
        dec_table_ref::<T>(lens, &words, a, zesc, &mut want);
        assert!(single == want, "dec_table differs from its definition");
        for mbits in [MBITS_EXPLICIT, MBITS_STATIC] {
            let mut m = [0u32; TABLE];
            let mut meta = [0u8; TABLE];
            multi_table::<T>(lens, &words, &single, &mut m, &mut meta, mbits);
            for idx in 0..1 << mbits {
                let want = multi_greedy::<T>(&single, idx, mbits);
                assert_eq!((m[idx], meta[idx]), want, "idx {idx} mbits {mbits}");
            }
        }
    }

    /// A [`Decoder`] keeps the tables of an explicit code (version 2: its lengths are
    /// in the block) and finds them again when a later block carries the same
    /// lengths: compared whole, no rebuild. Another anchor or window is another set.
    #[test]
    fn decoder_reuses_tables_of_equal_lengths() {
        let mut l1 = [0u8; NSYM];
        for (i, l) in l1.iter_mut().enumerate().take(12) {
            *l = (i + 1) as u8;
        }
        l1[12] = 12;
        let mut l2 = [4u8; NSYM];
        l2[..20].fill(5);
        let mut d = Decoder::new();
        let set = |d: &mut Decoder, l: &[u8; NSYM], a: u32| {
            d.tables::<Bf16>(l, a, false, MBITS_EXPLICIT) as *const Tables
        };
        let p1 = set(&mut d, &l1, 20);
        let p2 = set(&mut d, &l2, 20);
        assert_ne!(p1, p2);
        // same lengths (a fresh copy: compared by value), same anchor: the same set
        let l1b = l1;
        assert_eq!(set(&mut d, &l1b, 20), p1);
        assert_eq!(set(&mut d, &l2, 20), p2);
        assert_eq!(
            d.held_bytes(),
            2 * std::mem::size_of::<Tables>() + SCRATCH_BYTES
        );
        // one length differs: a new set (lengths are compared whole, not hashed)
        let mut l3 = l1;
        l3.swap(0, 1);
        assert_ne!(set(&mut d, &l3, 20), p1);
        assert_eq!(
            d.held_bytes(),
            3 * std::mem::size_of::<Tables>() + SCRATCH_BYTES
        );
        // the tables found are those of the code asked for
        let t = d.tables::<Bf16>(&l1, 20, false, MBITS_EXPLICIT);
        let words = crate::codes::canonical_words(&l1);
        let mut want = [0u32; TABLE];
        dec_table::<Bf16>(&l1, &words, 20, false, &mut want);
        assert!(t.single == want);
    }

    /// The multi-symbol tables equal the greedy decode of every 12-bit window, for
    /// every static code at several anchors and for explicit-like codes (lengths
    /// 1..=12, some unused).
    #[test]
    fn multi_table_matches_greedy() {
        for (k, lens) in CODE_LENGTHS.iter().enumerate() {
            for a in [1, 3, 20, 24, 31, 127, 255] {
                check::<Bf16>(lens, a, false);
                check::<Fp32>(lens, a, k % 2 == 0);
                if a <= Fp16::EMAX {
                    check::<Fp16>(lens, a, false);
                    check::<Fp16>(lens, a, true);
                }
            }
        }
        // a skewed complete code: 1, 2, ..., 11, 12, 12 for symbols in turn, the
        // rest unused; and a flat one (every symbol 12 bits is not complete: 5 bits
        // for 6 symbols and 4 bits for the rest)
        let mut skew = [0u8; NSYM];
        for (i, l) in skew.iter_mut().enumerate().take(12) {
            *l = (i + 1) as u8;
        }
        skew[12] = 12;
        let mut flat = [4u8; NSYM];
        flat[..20].fill(5);
        // and an incomplete one (slots no code word reaches stay INVALID)
        let mut holes = [0u8; NSYM];
        holes[0] = 2;
        holes[3] = 3;
        holes[ESC] = 5;
        holes[ZERO] = 12;
        for lens in [skew, flat, holes] {
            for a in [1, 12, 30] {
                check::<Bf16>(&lens, a, true);
                check::<Fp16>(&lens, a, false);
                check::<Fp16>(&lens, a, true);
            }
        }
    }
}
