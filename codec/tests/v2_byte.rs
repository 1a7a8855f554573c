//! Format version 2's symbol-code blocks (docs/FORMAT.md §V2.10): fp8 byte codes
//! (modes 5, 6) with their SHIFT and LAG transforms, and FP16N (mode 7). Round trips
//! over every byte value, −0, NaN and Inf patterns, odd sizes and phases; the modes
//! and transforms engage where they should; detection; corrupt frames.
mod common;
use common::{Rng, *};
use nccl_zip_codec::*;
use proptest::prelude::*;

fn v2(dtype: DtypeHint, checksum: bool, block_log2: u8) -> EncodeOptions {
    EncodeOptions {
        effort: Effort::Full,
        dtype,
        checksum,
        block_log2,
        format: 2,
    }
}

/// Compresses as v2, checks the decoder entry points give the input back, and
/// returns the frame.
fn check(src: &[u8], opts: &EncodeOptions) -> Vec<u8> {
    let n = src.len();
    let mut frame = vec![0xAAu8; max_compressed_size(n)];
    let st = compress_with_stats(src, &mut frame, opts).unwrap();
    frame.truncate(st.frame_len);
    let mut out = vec![0x55u8; n];
    assert_eq!(decompress(&frame, &mut out).unwrap(), n);
    assert!(out == src, "round trip differs (n = {n}, {opts:?})");
    let mut out2 = vec![0x33u8; n];
    Decoder::new().decompress(&frame, &mut out2).unwrap();
    assert!(out2 == src);
    let mut out3 = vec![0x11u8; n];
    decompress_parallel(&frame, &mut out3, 3).unwrap();
    assert!(out3 == src);
    assert_eq!(same_as_scalar(src, opts), frame, "scalar encoder differs");
    frame
}

/// (mode, flags) of every block of a block frame.
fn block_modes(f: &[u8]) -> Vec<(u8, u8)> {
    let info = frame_info(f).unwrap();
    if info.stored {
        return vec![];
    }
    let nb = info.blocks as usize;
    let mut pos = 24 + 4 * nb;
    let mut v = Vec::new();
    for i in 0..nb {
        let size = u32::from_le_bytes(f[24 + 4 * i..28 + 4 * i].try_into().unwrap()) as usize;
        v.push((f[pos], if size > 1 { f[pos + 1] } else { 0 }));
        pos += size;
    }
    v
}

fn fp8_gauss(n: usize, e4m3: bool, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let v: Vec<f64> = (0..n).map(|_| r.gauss()).collect();
    fp8_scaled(&v, e4m3)
}

/// fp8 with sprinkled −0 (0x80), NaN (e4m3 0x7F/0xFF; e5m2 0x7D..0x7F), Inf (e5m2 0x7C/0xFC).
fn fp8_specials(n: usize, e4m3: bool, seed: u64) -> Vec<u8> {
    let mut b = fp8_gauss(n, e4m3, seed);
    let mut r = Rng::new(seed ^ 0xF8);
    let pats: &[u8] = if e4m3 {
        &[0x00, 0x80, 0x7F, 0xFF, 0x7E, 0xFE, 0x01, 0x81]
    } else {
        &[0x00, 0x80, 0x7C, 0xFC, 0x7D, 0x7E, 0xFF, 0x01]
    };
    for x in b.iter_mut() {
        if r.next_u64() % 7 == 0 {
            *x = pats[(r.next_u64() % pats.len() as u64) as usize];
        }
    }
    b
}

/// fp16 gradients without loss scaling: mostly subnormal, with ±0, NaN, Inf.
fn fp16_subnormal(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut b = encode(Ty::Fp16, (0..n / 2).map(|_| r.laplace() * 3e-6));
    let pats: [u16; 8] = [
        0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFFFF, 0x0001, 0x83FF,
    ];
    for c in b.chunks_exact_mut(2) {
        if r.next_u64() % 9 == 0 {
            let p = pats[(r.next_u64() % 8) as usize];
            c.copy_from_slice(&p.to_le_bytes());
        }
    }
    b
}

const SIZES: &[usize] = &[
    0, 1, 63, 64, 65, 127, 129, 1000, 2047, 2049, 4097, 8083, 12345, 65537, 131071,
];

#[test]
fn fp8_round_trips_every_byte_value() {
    // every byte value, in order, shuffled, and as a skewed histogram
    let all: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let mut r = Rng::new(3);
    let shuffled: Vec<u8> = (0..70_000).map(|_| r.next_u64() as u8).collect();
    let skew: Vec<u8> = (0..70_000)
        .map(|_| (r.next_u64() % 256) as u8 & (r.next_u64() as u8 | 0xF0))
        .collect();
    for hint in [DtypeHint::Fp8E4m3, DtypeHint::Fp8E5m2] {
        for src in [&all, &shuffled, &skew] {
            for bl in [12, 16] {
                check(src, &v2(hint, true, bl));
            }
        }
    }
    // a skewed histogram over all 256 values codes (mode 5/6), not RAW
    let f = check(&skew, &v2(DtypeHint::Fp8E5m2, false, 16));
    assert!(
        block_modes(&f).iter().all(|&(m, _)| m == 6),
        "{:?}",
        block_modes(&f)
    );
}

#[test]
fn fp8_sizes_and_specials() {
    for &n in SIZES {
        for e4m3 in [true, false] {
            let src = fp8_specials(n, e4m3, n as u64);
            let hint = if e4m3 {
                DtypeHint::Fp8E4m3
            } else {
                DtypeHint::Fp8E5m2
            };
            for opts in [v2(hint, n % 2 == 0, 12), v2(DtypeHint::Auto, true, 16)] {
                check(&src, &opts);
            }
        }
    }
}

#[test]
fn fp8_transforms_engage() {
    // gaussian: no transform
    let g = fp8_gauss(1 << 17, true, 1);
    let f = check(&g, &v2(DtypeHint::Auto, false, 16));
    assert_eq!(f[6], 4, "detected e4m3");
    assert!(
        block_modes(&f).iter().all(|&m| m == (5, 0)),
        "{:?}",
        block_modes(&f)
    );
    // rows with their own scale (2^-4 .. 2^4): SHIFT
    let mut r = Rng::new(2);
    let vals: Vec<f64> = (0..1 << 17)
        .map(|i| r.gauss() * 2f64.powi(((i / 512) % 9) as i32 - 4))
        .collect();
    let s = fp8_scaled(&vals, false);
    let f = check(&s, &v2(DtypeHint::Fp8E5m2, false, 16));
    assert!(
        block_modes(&f).iter().all(|&m| m == (6, 1)),
        "{:?}",
        block_modes(&f)
    );
    // rows of 768 elements that mostly repeat the row above: LAG
    let row: Vec<f64> = (0..768).map(|_| r.gauss()).collect();
    let vals: Vec<f64> = (0..1 << 17)
        .map(|i| {
            let v = row[i % 768];
            if r.next_u64() % 10 == 0 {
                v * 1.5
            } else {
                v
            }
        })
        .collect();
    let a = fp8_scaled(&vals, true);
    let f = check(&a, &v2(DtypeHint::Auto, false, 16));
    assert!(
        block_modes(&f).iter().all(|&m| m == (5, 2)),
        "{:?}",
        block_modes(&f)
    );
    assert!(
        f.len() * 3 < a.len(),
        "LAG ratio {}",
        a.len() as f64 / f.len() as f64
    );
}

#[test]
fn fp16_subnormals_code_as_fp16n() {
    for &n in SIZES {
        for off in 0..2 {
            let b = fp16_subnormal(n + 2, n as u64);
            let src = &b[off..(off + n).min(b.len())];
            check(src, &v2(DtypeHint::Fp16, n % 2 == 1, 12));
            check(src, &v2(DtypeHint::Auto, false, 16));
        }
    }
    let b = fp16_subnormal(1 << 17, 9);
    for off in 0..2 {
        let f = check(&b[off..], &v2(DtypeHint::Auto, false, 16));
        assert_eq!(f[6], 2, "detected fp16");
        assert!(
            block_modes(&f).iter().all(|&(m, _)| m == 7),
            "{:?}",
            block_modes(&f)
        );
    }
    // every fp16 pattern round-trips through FP16N
    let all: Vec<u8> = (0..=u16::MAX)
        .flat_map(|x| (x & 0x83FF).to_le_bytes())
        .collect();
    let all2: Vec<u8> = (0..=u16::MAX).flat_map(|x| x.to_le_bytes()).collect();
    let f = check(&all, &v2(DtypeHint::Fp16, true, 16));
    assert!(block_modes(&f).iter().any(|&(m, _)| m == 7));
    check(&all2, &v2(DtypeHint::Fp16, true, 16));
    // ordinary fp16 keeps mode 3
    let g = gaussian(Ty::Fp16, 1 << 16, 0.5, 1);
    let f = check(&g, &v2(DtypeHint::Auto, false, 16));
    assert!(block_modes(&f).iter().all(|&(m, _)| m == 3));
}

#[test]
fn fp8_detection_survives_prefix_and_misalignment() {
    for e4m3 in [true, false] {
        let g = fp8_gauss(1 << 18, e4m3, 5);
        assert_eq!(detect_v2(&g), Dtype::Fp8E4m3);
        for off in [1, 3, 64, 100] {
            let mut p = int_counters(off, 7);
            p.extend_from_slice(&g);
            assert_eq!(detect_v2(&p), Dtype::Fp8E4m3, "prefix {off}");
        }
    }
    // floats, ints and random bytes are not fp8
    for (ty, want) in [
        (Ty::Bf16, Dtype::Bf16),
        (Ty::Fp16, Dtype::Fp16),
        (Ty::Fp32, Dtype::Fp32),
    ] {
        for sigma in [0.01, 1.0] {
            assert_eq!(detect_v2(&gaussian(ty, 1 << 18, sigma, 3)), want);
        }
        assert_eq!(detect_v2(&gradient_like(ty, 1 << 18, 3)), want);
    }
    assert_eq!(detect_v2(&Rng::new(1).bytes(1 << 18)), Dtype::Raw);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]
    #[test]
    fn prop_fp8_bytes(data in proptest::collection::vec(any::<u8>(), 0..20_000),
                      hint in 0usize..3, checksum in any::<bool>(), bl in 12u8..=17) {
        let dtype = [DtypeHint::Auto, DtypeHint::Fp8E4m3, DtypeHint::Fp8E5m2][hint];
        check(&data, &v2(dtype, checksum, bl));
    }

    #[test]
    fn prop_fp8_structured(seed in any::<u64>(), n in 0usize..140_000, row in 1usize..3000,
                           rep in 0u64..10, e4m3 in any::<bool>(), bl in 12u8..=16) {
        // rows that repeat with probability rep/10, with row-wise scales
        let mut r = Rng::new(seed);
        let base: Vec<f64> = (0..row).map(|_| r.gauss()).collect();
        let vals: Vec<f64> = (0..n).map(|i| {
            let v = base[i % row] * 2f64.powi(((i / row) % 5) as i32);
            if r.next_u64() % 10 < rep { v } else { r.gauss() }
        }).collect();
        let mut b = fp8_scaled(&vals, e4m3);
        for x in b.iter_mut() { if r.next_u64() % 50 == 0 { *x = r.next_u64() as u8; } }
        let hint = if seed % 2 == 0 { DtypeHint::Auto } else if e4m3 { DtypeHint::Fp8E4m3 } else { DtypeHint::Fp8E5m2 };
        check(&b, &v2(hint, seed % 3 == 0, bl));
    }

    #[test]
    fn prop_fp16n(seed in any::<u64>(), n in 0usize..70_000, off in 0usize..2, hint in 0usize..2) {
        let b = fp16_subnormal(n + 2, seed);
        let src = &b[off.min(b.len())..(off + n).min(b.len())];
        check(src, &v2([DtypeHint::Auto, DtypeHint::Fp16][hint], seed % 2 == 0, 12 + (seed % 5) as u8));
    }

    #[test]
    fn prop_corrupt_never_panics(seed in any::<u64>(), flips in 1usize..4, cut in any::<bool>(), which in 0usize..3) {
        let (src, opts) = corrupt_sample(which, seed);
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &opts).unwrap();
        f.truncate(n);
        let mut r = Rng::new(seed);
        for _ in 0..flips {
            let i = (r.next_u64() % n as u64) as usize;
            f[i] ^= 1 << (r.next_u64() % 8);
        }
        if cut { let c = (r.next_u64() % n as u64) as usize; f.truncate(c); }
        let mut out = vec![0u8; src.len()];
        let _ = decompress(&f, &mut out);
        let _ = decompress_parallel(&f, &mut out, 2);
    }
}

/// Frames with each new mode and transform: plain fp8, SHIFT, LAG, FP16N.
fn corrupt_sample(which: usize, seed: u64) -> (Vec<u8>, EncodeOptions) {
    let mut r = Rng::new(seed);
    match which {
        0 => (
            fp8_specials(9000, true, seed),
            v2(DtypeHint::Auto, seed % 2 == 0, 12),
        ),
        1 => {
            let row: Vec<f64> = (0..384).map(|_| r.gauss()).collect();
            let vals: Vec<f64> = (0..9000)
                .map(|i| row[i % 384] * 2f64.powi(((i / 128) % 7) as i32))
                .collect();
            (fp8_scaled(&vals, false), v2(DtypeHint::Fp8E5m2, true, 12))
        }
        _ => (fp16_subnormal(9001, seed), v2(DtypeHint::Fp16, true, 12)),
    }
}

#[test]
fn corrupt_frames_are_errors() {
    for which in 0..3 {
        let (src, opts) = corrupt_sample(which, 11);
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &opts).unwrap();
        f.truncate(n);
        let modes = block_modes(&f);
        assert!(
            modes.iter().any(|&(m, _)| (5..=7).contains(&m)),
            "{which}: {modes:?}"
        );
        let mut out = vec![0u8; src.len()];
        for c in 0..n {
            assert!(
                decompress(&f[..c], &mut out).is_err(),
                "{which}: prefix {c}/{n} decoded"
            );
        }
        let mut g = f.clone();
        g.push(0);
        assert!(
            decompress(&g, &mut out).is_err(),
            "{which}: trailing byte accepted"
        );
        let mut silent = 0;
        for i in 0..n {
            for bit in 0..8 {
                f[i] ^= 1 << bit;
                if let Ok(m) = decompress(&f, &mut out) {
                    if out[..m] != src[..] {
                        silent += 1;
                        assert!(
                            !opts.checksum,
                            "{which}: flip {i}.{bit} wrong bytes with a checksum"
                        );
                    }
                }
                f[i] ^= 1 << bit;
            }
        }
        eprintln!(
            "sample {which}: {silent} of {} flips decode to other bytes",
            8 * n
        );
    }
}

/// Targeted corruptions of the first block's fields each give a `Corrupt` error.
#[test]
fn field_corruptions_name_the_field() {
    let nb_off = |f: &[u8]| 24 + 4 * frame_info(f).unwrap().blocks as usize;
    let enc = |src: &[u8], opts: &EncodeOptions| {
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(src, &mut f, opts).unwrap();
        f.truncate(n);
        f
    };
    let (src, opts) = corrupt_sample(0, 1);
    let f = enc(&src, &v2(DtypeHint::Fp8E4m3, false, 12));
    let b = nb_off(&f);
    assert_eq!(f[b], 5);
    let mut out = vec![0u8; src.len()];
    let bad = |g: &[u8], out: &mut [u8]| matches!(decompress(g, out), Err(CodecError::Corrupt(_)));
    let mut g = f.clone();
    g[b + 1] = 3; // transform 3
    assert!(bad(&g, &mut out));
    let mut g = f.clone();
    g[b + 2] = 1; // phase 1 with W = 1
    assert!(bad(&g, &mut out));
    let mut g = f.clone();
    g[b + 3] = 17; // index width
    assert!(bad(&g, &mut out));
    let mut g = f.clone();
    g[b + 6] = 0xFF; // lengths 15: over 12
    assert!(bad(&g, &mut out));
    let mut g = f.clone();
    g[b + 6] = if g[b + 6] & 15 == 1 {
        (g[b + 6] & 0xF0) | 2
    } else {
        (g[b + 6] & 0xF0) | 1
    }; // Kraft
    assert!(bad(&g, &mut out));
    let mut g = f.clone();
    g[b] = 8; // unknown mode
    assert!(bad(&g, &mut out));
    // LAG distance 0 and >= m
    let row: Vec<f64> = (0..512).map(|i| (i as f64 * 0.37).sin()).collect();
    let vals: Vec<f64> = (0..8192).map(|i| row[i % 512]).collect();
    let a = fp8_scaled(&vals, true);
    let f = enc(&a, &v2(DtypeHint::Fp8E4m3, false, 12));
    let b = nb_off(&f);
    assert_eq!((f[b], f[b + 1]), (5, 2), "LAG block");
    let mut out = vec![0u8; a.len()];
    for p in [0u16, 4096, 65535] {
        let mut g = f.clone();
        g[b + 6 + 128..b + 6 + 130].copy_from_slice(&p.to_le_bytes());
        assert!(bad(&g, &mut out), "lag {p}");
    }
    // FP16N with flags, and a v1 frame may not hold mode 5..7
    let (src, opts2) = corrupt_sample(2, 1);
    let f = enc(&src, &opts2);
    let b = nb_off(&f);
    assert_eq!(f[b], 7);
    let mut out = vec![0u8; src.len()];
    let mut g = f.clone();
    g[b + 1] = 1;
    assert!(bad(&g, &mut out));
    let _ = opts;
}
