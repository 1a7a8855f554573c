//! Per-element-type split/join between input bytes and the coded-block pieces
//! (FORMAT.md §4): a `key` byte per element that the exponent code covers, plane1
//! (one raw byte per element) and, for fp32, plane2 (the low 16 bits).

use crate::format::{MODE_BF16, MODE_FP16, MODE_FP32};

pub(crate) trait Elem {
    /// Element width in bytes.
    const W: usize;
    const MODE: u8;
    /// Bits of the exponent field (the raw payload of an escape).
    const EBITS: u32;
    /// Largest exponent field.
    const EMAX: u32;
    /// Raw bits per element outside the exponent (used by cost estimates).
    const RAWBITS: u64;
    /// fp16 carries 3 raw bits per element in the stream.
    const XBITS: u32;
    /// Bytes of plane2 per element.
    const P2: usize;

    /// Exponent field of element `i` of `b`.
    fn exp_at(b: &[u8], i: usize) -> u32;
    /// Splits `src` (whole elements) into keys, plane1 and plane2.
    fn split(src: &[u8], keys: &mut [u8], p1: &mut [u8], p2: &mut [u8]);
    /// Inverse of `split`, writing `out` in ascending order.
    fn join(keys: &[u8], p1: &[u8], p2: &[u8], out: &mut [u8]);
    /// Exponent field and stream extra bits (value, XBITS wide) of a key.
    fn key_parts(key: u32) -> (u32, u32);
    /// Key from an exponent field and the extra bits.
    fn make_key(e: u32, x: u32) -> u32;
}

pub(crate) struct Bf16;
pub(crate) struct Fp16;
pub(crate) struct Fp32;

#[inline(always)]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

impl Elem for Bf16 {
    const W: usize = 2;
    const MODE: u8 = MODE_BF16;
    const EBITS: u32 = 8;
    const EMAX: u32 = 255;
    const RAWBITS: u64 = 8;
    const XBITS: u32 = 0;
    const P2: usize = 0;

    #[inline(always)]
    fn exp_at(b: &[u8], i: usize) -> u32 {
        ((u16_at(b, i) >> 7) & 0xFF) as u32
    }

    #[inline(always)]
    fn split(src: &[u8], keys: &mut [u8], p1: &mut [u8], _p2: &mut [u8]) {
        for ((x, k), p) in src.chunks_exact(2).zip(keys.iter_mut()).zip(p1.iter_mut()) {
            let x = u16::from_le_bytes([x[0], x[1]]);
            *k = (x >> 7) as u8;
            *p = ((x >> 8) as u8 & 0x80) | (x as u8 & 0x7F);
        }
    }

    #[inline(always)]
    fn join(keys: &[u8], p1: &[u8], _p2: &[u8], out: &mut [u8]) {
        for ((o, &k), &p) in out.chunks_exact_mut(2).zip(keys.iter()).zip(p1.iter()) {
            let x = (((p & 0x80) as u16) << 8) | ((k as u16) << 7) | (p & 0x7F) as u16;
            o.copy_from_slice(&x.to_le_bytes());
        }
    }

    #[inline(always)]
    fn key_parts(key: u32) -> (u32, u32) {
        (key, 0)
    }

    #[inline(always)]
    fn make_key(e: u32, _x: u32) -> u32 {
        e
    }
}

impl Elem for Fp16 {
    const W: usize = 2;
    const MODE: u8 = MODE_FP16;
    const EBITS: u32 = 5;
    const EMAX: u32 = 31;
    const RAWBITS: u64 = 11;
    const XBITS: u32 = 3;
    const P2: usize = 0;

    #[inline(always)]
    fn exp_at(b: &[u8], i: usize) -> u32 {
        ((u16_at(b, i) >> 10) & 0x1F) as u32
    }

    /// key = high byte (sign, exponent, top 2 mantissa bits); plane1 = low byte.
    #[inline(always)]
    fn split(src: &[u8], keys: &mut [u8], p1: &mut [u8], _p2: &mut [u8]) {
        for ((x, k), p) in src.chunks_exact(2).zip(keys.iter_mut()).zip(p1.iter_mut()) {
            *p = x[0];
            *k = x[1];
        }
    }

    #[inline(always)]
    fn join(keys: &[u8], p1: &[u8], _p2: &[u8], out: &mut [u8]) {
        for ((o, &k), &p) in out.chunks_exact_mut(2).zip(keys.iter()).zip(p1.iter()) {
            o[0] = p;
            o[1] = k;
        }
    }

    #[inline(always)]
    fn key_parts(key: u32) -> (u32, u32) {
        ((key >> 2) & 0x1F, ((key >> 7) << 2) | (key & 3))
    }

    #[inline(always)]
    fn make_key(e: u32, x: u32) -> u32 {
        ((x >> 2) << 7) | (e << 2) | (x & 3)
    }
}

impl Elem for Fp32 {
    const W: usize = 4;
    const MODE: u8 = MODE_FP32;
    const EBITS: u32 = 8;
    const EMAX: u32 = 255;
    const RAWBITS: u64 = 24;
    const XBITS: u32 = 0;
    const P2: usize = 2;

    #[inline(always)]
    fn exp_at(b: &[u8], i: usize) -> u32 {
        (u32_at(b, i) >> 23) & 0xFF
    }

    #[inline(always)]
    fn split(src: &[u8], keys: &mut [u8], p1: &mut [u8], p2: &mut [u8]) {
        for (((x, k), p), q) in src
            .chunks_exact(4)
            .zip(keys.iter_mut())
            .zip(p1.iter_mut())
            .zip(p2.chunks_exact_mut(2))
        {
            let x = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            *k = (x >> 23) as u8;
            *p = ((x >> 24) as u8 & 0x80) | ((x >> 16) as u8 & 0x7F);
            q.copy_from_slice(&(x as u16).to_le_bytes());
        }
    }

    #[inline(always)]
    fn join(keys: &[u8], p1: &[u8], p2: &[u8], out: &mut [u8]) {
        for (((o, &k), &p), q) in out
            .chunks_exact_mut(4)
            .zip(keys.iter())
            .zip(p1.iter())
            .zip(p2.chunks_exact(2))
        {
            let hi = (((p & 0x80) as u32) << 8) | ((k as u32) << 7) | (p & 0x7F) as u32;
            let x = (hi << 16) | u16::from_le_bytes([q[0], q[1]]) as u32;
            o.copy_from_slice(&x.to_le_bytes());
        }
    }

    #[inline(always)]
    fn key_parts(key: u32) -> (u32, u32) {
        (key, 0)
    }

    #[inline(always)]
    fn make_key(e: u32, _x: u32) -> u32 {
        e
    }
}
