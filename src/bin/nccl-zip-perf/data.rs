//! The message schedule and its payloads, both pure functions of the options:
//! sender and receiver compute the same sizes, pointer offsets and bytes from
//! (seed, message key) without talking to each other.

use crate::cli::{DataKind, Opts};
use rand_distr::{Distribution, Normal};

/// One message of the schedule.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub size: usize,
    /// What the bytes and the buffer offset derive from. Unique per message in
    /// checking runs; in benchmarks `index % inflight`, so buffers can be filled
    /// once per size and no generation runs while the clock does.
    pub key: u64,
    /// Benchmark block (index into `--sizes`); 0 otherwise.
    pub block: usize,
    /// Benchmark: untimed warm-up message.
    pub warmup: bool,
}

pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A splitmix64 sequence: fast, and identical on both sides.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// So that `rand_distr` can draw from the same deterministic sequence on both sides.
impl rand::RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        Rng::next_u64(self)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        rand_core_fill(self, dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        rand_core_fill(self, dest);
        Ok(())
    }
}

fn rand_core_fill(r: &mut Rng, dest: &mut [u8]) {
    for c in dest.chunks_mut(8) {
        let b = r.next_u64().to_le_bytes();
        let n = c.len();
        c.copy_from_slice(&b[..n]);
    }
}

pub fn schedule(o: &Opts) -> Vec<Msg> {
    let mut v = Vec::new();
    if o.bench {
        let sizes = o.sizes.as_ref().expect("checked in cli");
        for (b, &size) in sizes.iter().enumerate() {
            for i in 0..o.warmup + o.count {
                v.push(Msg {
                    size,
                    key: (i % o.inflight) as u64,
                    block: b,
                    warmup: i < o.warmup,
                });
            }
        }
        return v;
    }
    let mut rng = Rng::new(o.seed ^ 0x5C4E_D01E);
    for i in 0..o.count {
        let size = if let Some(s) = &o.sizes {
            s[i % s.len()]
        } else {
            let (lo, hi) = o.size_range.unwrap_or((0, 1 << 20));
            match rng.next_u64() % 16 {
                0 => lo,
                1 => hi,
                _ => {
                    // Log-uniform: as many 10-byte as 1-MiB messages, any parity.
                    let (a, b) = (((lo + 1) as f64).ln(), ((hi + 1) as f64).ln());
                    let x = (a + (b - a) * rng.unit()).exp() - 1.0;
                    (x as usize).clamp(lo, hi)
                }
            }
        };
        v.push(Msg {
            size,
            key: i as u64,
            block: 0,
            warmup: false,
        });
    }
    v
}

/// Buffer offset of a message: 0..63 bytes, so the plugin sees unaligned pointers.
pub fn offset(seed: u64, key: u64) -> usize {
    (splitmix(seed ^ key.wrapping_mul(0xA076_1D64_78BD_642F) ^ 0x0FF5E7) % 64) as usize
}

/// Fills `out` with message `key`'s bytes.
pub fn fill(kind: DataKind, sigma: f64, seed: u64, key: u64, out: &mut [u8]) {
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ splitmix(key));
    match kind {
        DataKind::Zero => out.fill(0),
        DataKind::Random => {
            let mut words = out.chunks_exact_mut(8);
            for w in &mut words {
                w.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            let rest = words.into_remainder();
            let last = rng.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&last[..n]);
        }
        // Round to nearest even, as a framework's fp32 → bf16 cast does.
        DataKind::Bf16 => floats(out, 2, &mut rng, sigma, |x| {
            half::bf16::from_f32(x as f32).to_le_bytes().to_vec()
        }),
        DataKind::Fp16 => floats(out, 2, &mut rng, sigma, |x| {
            f32_to_f16(x as f32).to_le_bytes().to_vec()
        }),
        DataKind::Fp32 => floats(out, 4, &mut rng, sigma, |x| {
            (x as f32).to_le_bytes().to_vec()
        }),
        DataKind::File => unreachable!("file data is loaded by Payloads::new"),
    }
}

/// Gaussian values (`rand_distr::Normal`) encoded by `enc`; a partial last element is cut.
fn floats(out: &mut [u8], width: usize, rng: &mut Rng, sigma: f64, enc: impl Fn(f64) -> Vec<u8>) {
    let normal = Normal::new(0.0, sigma).expect("sigma is checked positive and finite in cli");
    for chunk in out.chunks_mut(width) {
        let b = enc(normal.sample(rng));
        let n = chunk.len();
        chunk.copy_from_slice(&b[..n]);
    }
}

/// IEEE binary16 with round-to-nearest-even, subnormals and infinities.
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Message payloads. Each message is a window of one seeded table of
/// `max message + 1 MiB` bytes, starting at a point derived from (seed, key):
/// generating or checking a message is then a memcpy or memcmp (fast even in
/// debug builds), and two messages differ unless their keys pick the same start,
/// so a chunk or message delivered to the wrong place shows. Float tables are
/// windowed at element boundaries so every value stays whole.
pub struct Payloads {
    table: Vec<u8>,
    width: usize,
    seed: u64,
}

impl Payloads {
    pub fn new(o: &Opts, max_size: usize) -> Payloads {
        let width = match o.data {
            DataKind::Bf16 | DataKind::Fp16 => 2,
            DataKind::Fp32 | DataKind::File => 4,
            _ => 1,
        };
        let mut table = vec![0u8; max_size + (1 << 20)];
        if o.data == DataKind::File {
            let path = o.data_file.as_ref().expect("set with DataKind::File");
            let bytes = std::fs::read(path).unwrap_or_else(|e| {
                eprintln!("nccl-zip-perf: cannot read {}: {e}", path.display());
                std::process::exit(2)
            });
            if bytes.len() < 4 {
                eprintln!("nccl-zip-perf: {} holds fewer than 4 bytes", path.display());
                std::process::exit(2)
            }
            // Tile whole 4-byte elements so every value stays intact.
            let unit = &bytes[..bytes.len() / 4 * 4];
            for (dst, src) in table.chunks_mut(unit.len()).zip(std::iter::repeat(unit)) {
                dst.copy_from_slice(&src[..dst.len()]);
            }
        } else {
            fill(o.data, o.sigma, o.seed, u64::MAX, &mut table);
        }
        Payloads {
            table,
            width,
            seed: o.seed,
        }
    }

    pub fn get(&self, m: &Msg) -> &[u8] {
        let room = (self.table.len() - m.size) / self.width;
        let start =
            (splitmix(self.seed ^ splitmix(m.key ^ 0x57A2)) as usize % (room + 1)) * self.width;
        &self.table[start..start + m.size]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_examples() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(1e6), 0x7c00);
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001); // smallest subnormal
        assert_eq!(f32_to_f16(6.103_515_6e-5), 0x0400); // smallest normal
        assert_eq!(f32_to_f16(0.0), 0);
    }

    #[test]
    fn payloads_are_deterministic_and_distinct() {
        let mut a = vec![0u8; 1001];
        let mut b = vec![0u8; 1001];
        fill(DataKind::Random, 0.02, 7, 3, &mut a);
        fill(DataKind::Random, 0.02, 7, 3, &mut b);
        assert_eq!(a, b);
        fill(DataKind::Random, 0.02, 7, 4, &mut b);
        assert_ne!(a, b);
        fill(DataKind::Bf16, 0.02, 7, 4, &mut b);
        // Gaussian bf16 with sigma 0.02: exponents cluster near 2^-6 (byte 0x3c).
        let hi: Vec<u8> = b.chunks_exact(2).map(|c| c[1] & 0x7f).collect();
        assert!(hi.iter().filter(|&&x| (0x3a..=0x3d).contains(&x)).count() > hi.len() / 2);
    }
}
