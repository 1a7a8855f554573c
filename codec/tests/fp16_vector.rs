//! The fp16 vector encoder (AVX2 packer on fp16 keys) writes exactly the scalar
//! reference's bytes: special values (NaN, Inf, subnormals, signed zeros), every
//! exponent and extra-bit pattern, long codes, odd sizes, unaligned input, and
//! blocks that end up RAW or barely fit. Also checks that the frames decode.
mod common;
use common::{Rng, *};
use nccl_zip_codec::*;
use proptest::prelude::*;

const SIZES: &[usize] = &[
    64, 127, 129, 2047, 2049, 4095, 4097, 8191, 12345, 65535, 65536, 65537, 131073, 300001,
];

/// Compresses with the vector and the scalar encoder; the frames must be equal and
/// decode to `src`.
fn same_and_decodes(src: &[u8], opts: &EncodeOptions) {
    let frame = same_as_scalar(src, opts);
    let mut out = vec![0u8; src.len()];
    let n = decompress(&frame, &mut out).unwrap();
    assert!(n == src.len() && out == src, "round trip failed");
}

fn fp16_opts(block_log2: u8) -> EncodeOptions {
    EncodeOptions {
        effort: Effort::Full,
        dtype: DtypeHint::Fp16,
        checksum: false,
        block_log2,
        format: 1,
    }
}

fn f16_bytes(words: impl Iterator<Item = u16>) -> Vec<u8> {
    words.flat_map(|w| w.to_le_bytes()).collect()
}

/// Gaussian values with some specials mixed in at rate `1 / every`.
fn with_specials(n: usize, sigma: f64, every: u64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let base = gaussian(Ty::Fp16, n + 2, sigma, seed ^ 0x55);
    let words = base
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]));
    let out: Vec<u16> = words
        .map(|w| {
            let u = r.next_u64();
            if u % every != 0 {
                return w;
            }
            let sign = ((u >> 8) as u16 & 1) << 15;
            let mant = (u >> 16) as u16 & 0x3FF;
            sign | match (u >> 32) % 6 {
                0 => 0x7C00,               // Inf
                1 => 0x7C00 | mant.max(1), // NaN (quiet or signalling)
                2 => mant,                 // subnormal or zero
                3 => 0,                    // zero
                4 => 0x0400 | mant,        // smallest normal exponent
                _ => 0x7800 | mant,        // largest finite exponent
            }
        })
        .collect();
    f16_bytes(out.into_iter())[..n].to_vec()
}

/// Values whose exponent fields are spread over `spread` binades below a sampled
/// anchor (long codes, no escapes), mixed with narrow runs, as in the bf16 test.
fn long_codes(n: usize, spread: u64, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let vals = (0..n / 2 + 1).map(move |j| {
        let wide = match (j / 8) % 4 {
            0 => true,
            1 => false,
            _ => r.next_u64() % 3 == 0,
        };
        let s = if r.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        if j % 13 == 0 {
            1.5
        } else if wide && r.next_u64() % 29 == 0 {
            0.0
        } else if wide {
            let u = (r.next_u64() % spread) as i32;
            s * (1.0 + r.gauss().abs().min(0.9)) * 2f64.powi(-u)
        } else {
            r.gauss() * 0.3
        }
    });
    encode(Ty::Fp16, vals)[..n].to_vec()
}

#[test]
fn fp16_specials_odd_sizes_unaligned() {
    for (i, &n) in SIZES.iter().enumerate() {
        let seed = 200 + i as u64;
        let mut sets = vec![
            gaussian(Ty::Fp16, n + 2, 0.02, seed)[..n].to_vec(),
            with_specials(n, 0.02, 50, seed),
            with_specials(n, 1.0, 7, seed + 1),
            with_specials(n, 1e-5, 3, seed + 2), // subnormal-heavy
            laplace(Ty::Fp16, n + 2, 1e-4, seed)[..n].to_vec(),
            Rng::new(seed).bytes(n), // every key, many escapes; often RAW
        ];
        // all 65536 fp16 words in order (every key in every position of a step)
        sets.push(f16_bytes((0..=n / 2).map(|j| (j as u16).wrapping_mul(40503)))[..n].to_vec());
        for src in &sets {
            for block_log2 in [12, 16] {
                same_and_decodes(src, &fp16_opts(block_log2));
            }
            // unaligned input (the vector split loads unaligned)
            for off in [1usize, 3] {
                let mut buf = vec![0u8; n + off];
                buf[off..].copy_from_slice(src);
                same_and_decodes(&buf[off..], &fp16_opts(16));
            }
        }
    }
}

#[test]
fn fp16_long_codes() {
    for (i, &n) in [4096usize, 65536, 300_001].iter().enumerate() {
        for spread in [24u64, 16, 12, 6] {
            let src = long_codes(n, spread, 300 + i as u64 + spread);
            for block_log2 in [12, 16, 20] {
                same_and_decodes(&src, &fp16_opts(block_log2));
                same_and_decodes(
                    &src,
                    &EncodeOptions {
                        dtype: DtypeHint::Auto,
                        ..fp16_opts(block_log2)
                    },
                );
            }
        }
    }
}

/// Blocks whose coded size lands near `1 + L`: full segments are then coded into a
/// scratch buffer (no room for the packer's overrun in the output) or the block
/// goes RAW.
#[test]
fn fp16_blocks_near_the_raw_limit() {
    for seed in 0..8u64 {
        // uniform mantissas and signs, exponents from a narrow-to-wide mix: coded
        // size close to the raw size
        let mut r = Rng::new(400 + seed);
        let words: Vec<u16> = (0..140_000)
            .map(|j| {
                let u = r.next_u64();
                let width = 2 + (j / 4096 + seed as usize) as u64 % 30;
                let e = 15u64.saturating_sub((u >> 20) % width).max(1);
                ((u as u16) & 0x83FF) | ((e as u16) << 10)
            })
            .collect();
        let src = f16_bytes(words.into_iter());
        for block_log2 in [12, 13, 16] {
            same_and_decodes(&src, &fp16_opts(block_log2));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn prop_fp16_vector_matches_scalar(
        n in 0usize..70_000,
        sigma_exp in -16i32..16,
        special_every in 1u64..200,
        seed in any::<u64>(),
        off in 0usize..4,
        block_log2 in 12u8..=16,
    ) {
        let src = with_specials(n, 2f64.powi(sigma_exp), special_every, seed);
        let mut buf = vec![0u8; n + off];
        buf[off..].copy_from_slice(&src);
        same_and_decodes(&buf[off..], &fp16_opts(block_log2));
    }
}
