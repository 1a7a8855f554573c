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

/// Rounds `x` to the nearest fp8 value (ties to even code), saturating at the largest
/// finite value, sign kept (a negative value that rounds to zero gives -0), as a cast
/// with saturation does in FP8 training. `e4m3`: 4 exponent bits, bias 7, no
/// infinities (0x7F is NaN), max 448; otherwise e5m2: bias 15, max 57344.
pub fn to_fp8(x: f64, e4m3: bool) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    let (mbits, bias, top) = if e4m3 {
        (3, 7, 0x7Eu8)
    } else {
        (2, 15, 0x7Bu8)
    };
    let val = |c: u8| -> f64 {
        let e = (c >> mbits) as i32;
        let m = (c & ((1 << mbits) - 1)) as f64 / (1 << mbits) as f64;
        if e == 0 {
            m * 2f64.powi(1 - bias)
        } else {
            (1.0 + m) * 2f64.powi(e - bias)
        }
    };
    // Codes 0..=top are monotonic in value: binary search the last code <= a.
    let (mut lo, mut hi) = (0u8, top);
    if a >= val(top) {
        return sign | top;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if val(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (dl, dh) = (a - val(lo), val(hi) - a);
    let c = if dl < dh || (dl == dh && lo & 1 == 0) {
        lo
    } else {
        hi
    };
    sign | c
}

/// fp8 bytes of `vals` scaled per tensor so that the largest magnitude maps to the
/// format's largest finite value (amax scaling, as FP8 training recipes do).
pub fn fp8_scaled(vals: &[f64], e4m3: bool) -> Vec<u8> {
    let amax = vals.iter().fold(0f64, |m, v| m.max(v.abs()));
    let max = if e4m3 { 448.0 } else { 57344.0 };
    let scale = if amax > 0.0 { max / amax } else { 1.0 };
    vals.iter().map(|v| to_fp8(v * scale, e4m3)).collect()
}

/// Values of a little-endian fp32 file's bytes.
pub fn f32_values(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
        .collect()
}

/// bf16 bytes (round to nearest even) of `vals`.
pub fn bf16_bytes(vals: impl Iterator<Item = f64>) -> Vec<u8> {
    encode(Ty::Bf16, vals)
}

/// Embedding-table gradient, bf16, rows of `width` values: each row is zero with
/// probability `zero_frac` (a token not in the batch); a touched row is Gaussian with a
/// per-row scale drawn log-uniformly over 2^-4..2^0 times 1e-3 (token frequency).
pub fn embedding_grad(nbytes: usize, width: usize, zero_frac: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let rows = nbytes / 2 / width;
    let mut vals = Vec::with_capacity(rows * width);
    for _ in 0..rows {
        if r.unit() <= zero_frac {
            vals.extend(std::iter::repeat_n(0.0, width));
        } else {
            let s = 1e-3 * 2f64.powf(-4.0 * r.unit());
            vals.extend((0..width).map(|_| r.gauss() * s));
        }
    }
    bf16_bytes(vals.into_iter())
}

/// MoE dispatch buffer, bf16: `experts` blocks of `capacity` rows of `width` values;
/// expert e fills its first rows with tokens (hidden states: Gaussian with a per-channel
/// scale) and leaves the rest of its capacity zero. Fill fractions are drawn uniformly
/// over `mean_fill ± 0.25`, clamped to [0, 1].
pub fn moe_dispatch(
    experts: usize,
    capacity: usize,
    width: usize,
    mean_fill: f64,
    seed: u64,
) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let chan: Vec<f64> = (0..width).map(|_| (0.5 * r.gauss()).exp()).collect();
    let mut vals = Vec::with_capacity(experts * capacity * width);
    for _ in 0..experts {
        let fill = (mean_fill + 0.5 * (r.unit() - 0.5)).clamp(0.0, 1.0);
        let filled = (fill * capacity as f64).round() as usize;
        for row in 0..capacity {
            if row < filled {
                vals.extend(chan.iter().map(|s| r.gauss() * s));
            } else {
                vals.extend(std::iter::repeat_n(0.0, width));
            }
        }
    }
    bf16_bytes(vals.into_iter())
}

/// fp32 bytes holding bf16 values (low 16 bits zero), from bf16 bytes.
pub fn bf16_in_fp32(bf16: &[u8]) -> Vec<u8> {
    bf16.chunks_exact(2)
        .flat_map(|c| [0, 0, c[0], c[1]])
        .collect()
}

/// Activation-like rows of `width` channels: N(0, s_j^2) with a per-channel scale
/// `s_j = sigma * 2^u_j`, `u_j` uniform in -5..=5 (a channel's exponent is predicted
/// by its column, docs/FORMAT.md §V2.9).
pub fn channels(ty: Ty, nbytes: usize, width: usize, sigma: f64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let scales: Vec<f64> = (0..width)
        .map(|_| sigma * 2f64.powi((r.next_u64() % 11) as i32 - 5))
        .collect();
    encode(
        ty,
        (0..nbytes / ty.width()).map(move |i| r.gauss() * scales[i % width]),
    )
}
