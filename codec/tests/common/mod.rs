//! Seeded test-data generators shared by the tests, the benchmark and the vector
//! generator. Deterministic across platforms: splitmix64 + Box–Muller.
#![allow(dead_code)]

use half::{bf16, f16};
use nccl_zip_codec::{compress, compress_scalar, max_compressed_size, EncodeOptions};

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    pub fn gauss(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    pub fn laplace(&mut self) -> f64 {
        let u = self.unit() - 0.5;
        -u.signum() * (1.0 - 2.0 * u.abs()).max(1e-300).ln()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Bf16,
    Fp16,
    Fp32,
}

impl Ty {
    pub fn width(self) -> usize {
        match self {
            Ty::Fp32 => 4,
            _ => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Ty::Bf16 => "bf16",
            Ty::Fp16 => "fp16",
            Ty::Fp32 => "fp32",
        }
    }
}

/// Encodes f64 values as little-endian bytes of `ty`.
pub fn encode(ty: Ty, vals: impl Iterator<Item = f64>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        match ty {
            Ty::Bf16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            Ty::Fp16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            Ty::Fp32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        }
    }
    out
}

/// `nbytes` bytes (rounded down to whole elements) of N(0, sigma^2) values.
pub fn gaussian(ty: Ty, nbytes: usize, sigma: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    encode(ty, (0..nbytes / ty.width()).map(move |_| r.gauss() * sigma))
}

pub fn laplace(ty: Ty, nbytes: usize, scale: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    encode(
        ty,
        (0..nbytes / ty.width()).map(move |_| r.laplace() * scale),
    )
}

/// Gradient-like: Gaussian with a per-64-value scale drawn log-uniformly over 2^-6..2^0,
/// and 10% exact zeros.
pub fn gradient_like(ty: Ty, nbytes: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut scale = 1.0;
    encode(
        ty,
        (0..nbytes / ty.width()).map(move |i| {
            if i % 64 == 0 {
                scale = 1e-3 * (2f64).powf(-6.0 * r.unit());
            }
            if r.next_u64() % 10 == 0 {
                0.0
            } else {
                r.gauss() * scale
            }
        }),
    )
}

/// ReLU-like activations: half zeros.
pub fn relu_like(ty: Ty, nbytes: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    encode(
        ty,
        (0..nbytes / ty.width()).map(move |_| r.gauss().max(0.0)),
    )
}

/// NCCL LL lines: data4 flag4 data4 flag4, data = bf16 pairs, flag = step counter.
pub fn ll_lines(nbytes: usize, seed: u64) -> Vec<u8> {
    let data = gaussian(Ty::Bf16, nbytes, 0.02, seed);
    let mut out = Vec::with_capacity(nbytes);
    for (i, c) in data.chunks(4).enumerate() {
        if i % 2 == 0 {
            out.extend_from_slice(c);
        } else {
            out.extend_from_slice(&7u32.to_le_bytes()[..c.len()]);
        }
    }
    out
}

/// Little-endian u32 counters (integers).
pub fn int_counters(nbytes: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(nbytes + 4);
    let mut v = seed as u32;
    while out.len() < nbytes {
        out.extend_from_slice(&v.to_le_bytes());
        v = v.wrapping_add(3);
    }
    out.truncate(nbytes);
    out
}

/// Compresses `src` with the vector and the scalar encoder, asserts the frames are
/// byte-identical, and returns the frame.
pub fn same_as_scalar(src: &[u8], opts: &EncodeOptions) -> Vec<u8> {
    let mut a = vec![0u8; max_compressed_size(src.len())];
    let mut b = vec![0u8; max_compressed_size(src.len())];
    let na = compress(src, &mut a, opts).unwrap();
    let nb = compress_scalar(src, &mut b, opts).unwrap();
    assert!(
        na == nb && a[..na] == b[..nb],
        "vector and scalar encoders differ (n = {}, {opts:?})",
        src.len()
    );
    a.truncate(na);
    a
}
