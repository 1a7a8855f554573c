//! Round trips: seeded sweeps over sizes × content × options × alignment, and proptest.
mod common;
use common::{Rng, *};
use nccl_zip_codec::*;
use proptest::prelude::*;

const SIZES: &[usize] = &[
    0, 1, 2, 3, 4, 5, 17, 63, 64, 65, 127, 128, 129, 255, 1000, 2047, 2048, 2049, 4095, 4096, 4097,
    8083, 12345, 65535, 65536, 65537, 131071, 300001,
];

fn contents(n: usize, seed: u64) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("bf16", gaussian(Ty::Bf16, n + 4, 0.02, seed)[..n].to_vec()),
        ("fp16", gaussian(Ty::Fp16, n + 4, 0.5, seed)[..n].to_vec()),
        ("fp32", gaussian(Ty::Fp32, n + 4, 1e-3, seed)[..n].to_vec()),
        ("grad32", gradient_like(Ty::Fp32, n + 4, seed)[..n].to_vec()),
        ("relu16", relu_like(Ty::Bf16, n + 4, seed)[..n].to_vec()),
        ("lap16", laplace(Ty::Fp16, n + 4, 1e-4, seed)[..n].to_vec()),
        ("random", Rng::new(seed).bytes(n)),
        ("zeros", vec![0u8; n]),
        ("ints", int_counters(n, seed)),
        ("ll", ll_lines(n + 16, seed)[..n].to_vec()),
    ]
}

thread_local! {
    static DECODER: std::cell::RefCell<Decoder> = std::cell::RefCell::new(Decoder::new());
}

/// Compresses and decompresses, checking every API invariant; returns the stats.
fn check(src: &[u8], opts: &EncodeOptions) -> FrameStats {
    let n = src.len();
    let mut frame = vec![0xAAu8; max_compressed_size(n) + 7];
    let st = compress_with_stats(src, &mut frame, opts).unwrap();
    assert!(
        st.frame_len <= n + 24,
        "frame {} > n + 24 for n = {n}",
        st.frame_len
    );
    assert_eq!(
        compress(src, &mut frame[..max_compressed_size(n)], opts).unwrap(),
        st.frame_len
    );
    let f = &frame[..st.frame_len];
    let info = frame_info(f).unwrap();
    assert_eq!(info.raw_len, n as u64);
    assert_eq!(info.frame_len, st.frame_len as u64);
    assert_eq!(info.stored, st.stored);
    assert_eq!(info.checksum.is_some(), opts.checksum);
    assert_eq!(
        info.blocks,
        if st.stored {
            0
        } else {
            (st.blocks_coded + st.blocks_raw + st.blocks_fill) as u64
        }
    );
    // exact-size and oversized destination
    let mut out = vec![0x55u8; n + 3];
    assert_eq!(decompress(f, &mut out).unwrap(), n);
    assert!(out[..n] == *src, "round trip differs (n = {n}, {opts:?})");
    assert_eq!(&out[n..], &[0x55; 3]);
    // A Decoder that lives across every frame this thread checks (its cached
    // tables come from earlier frames of other types, codes and anchors).
    let mut out = vec![0x55u8; n + 3];
    assert_eq!(
        DECODER.with(|d| d.borrow_mut().decompress(f, &mut out)),
        Ok(n)
    );
    assert!(
        out[..n] == *src,
        "Decoder round trip differs (n = {n}, {opts:?})"
    );
    assert_eq!(&out[n..], &[0x55; 3]);
    if n > 0 {
        let mut small = vec![0u8; n - 1];
        assert!(matches!(
            decompress(f, &mut small),
            Err(CodecError::DstTooSmall { .. })
        ));
    }
    st
}

#[test]
fn sweep_sizes_contents_options() {
    for (si, &n) in SIZES.iter().enumerate() {
        for (name, data) in contents(n, si as u64 + 1) {
            for dtype in [
                DtypeHint::Auto,
                DtypeHint::Bf16,
                DtypeHint::Fp16,
                DtypeHint::Fp32,
                DtypeHint::Raw,
            ] {
                for (block_log2, checksum) in [(16, false), (12, true), (20, false)] {
                    let opts = EncodeOptions {
                        effort: Effort::Full,
                        dtype,
                        checksum,
                        block_log2,
                        format: 1,
                    };
                    let st = check(&data, &opts);
                    if dtype == DtypeHint::Raw || n < 64 {
                        assert!(
                            st.stored,
                            "{name} n={n}: raw hint or tiny input must be stored"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn misaligned_inputs_and_outputs() {
    let base = gaussian(Ty::Bf16, 70_000, 0.1, 9);
    for off in 0..8 {
        let src = &base[off..off + 66_001];
        let mut frame = vec![0u8; max_compressed_size(src.len()) + 8];
        let n = compress(src, &mut frame[off..], &EncodeOptions::default()).unwrap();
        let mut out = vec![0u8; src.len() + 8];
        let got = decompress(&frame[off..off + n], &mut out[off..]).unwrap();
        assert_eq!(&out[off..off + got], src);
    }
}

#[test]
fn detection_picks_the_right_type() {
    for (ty, want) in [
        (Ty::Bf16, Dtype::Bf16),
        (Ty::Fp16, Dtype::Fp16),
        (Ty::Fp32, Dtype::Fp32),
    ] {
        for sigma in [1e-3, 1e-2, 0.1, 1.0] {
            let d = gaussian(ty, 1 << 18, sigma, 4);
            let st = check(&d, &EncodeOptions::default());
            assert_eq!(st.dtype, Some(want), "{} sigma {sigma}", ty.name());
            assert!(!st.stored);
        }
    }
    let d = Rng::new(5).bytes(1 << 18);
    let st = check(&d, &EncodeOptions::default());
    assert!(st.stored, "random bytes should be stored, got {st:?}");
    assert_eq!(st.dtype, Some(Dtype::Raw));
    // Integers and LL lines may be coded when that pays (lossless either way), never expanded.
    for (name, d) in [
        ("ints", int_counters(1 << 18, 77)),
        ("ll", ll_lines(1 << 18, 78)),
    ] {
        let st = check(&d, &EncodeOptions::default());
        assert!(st.frame_len <= d.len() + 24, "{name}: {st:?}");
    }
    // All-constant input: raw dtype, but FILL blocks.
    let st = check(&vec![0u8; 1 << 18], &EncodeOptions::default());
    assert_eq!(
        (st.dtype, st.stored, st.blocks_fill),
        (Some(Dtype::Raw), false, 4)
    );
}

#[test]
fn ratios_on_gaussian_meet_goals() {
    for (ty, goal) in [(Ty::Bf16, 1.47), (Ty::Fp16, 1.15), (Ty::Fp32, 1.18)] {
        for sigma in [1e-3, 1e-2, 0.1, 1.0] {
            let d = gaussian(ty, 1 << 20, sigma, 11);
            let st = check(&d, &EncodeOptions::default());
            let r = d.len() as f64 / st.frame_len as f64;
            assert!(
                r >= goal,
                "{} sigma {sigma}: ratio {r:.4} < {goal}",
                ty.name()
            );
        }
    }
    let d = Rng::new(12).bytes(1 << 20);
    let st = check(&d, &EncodeOptions::default());
    assert!(d.len() as f64 / st.frame_len as f64 >= 0.998);
}

#[test]
fn fill_blocks_and_stats() {
    let mut d = gaussian(Ty::Bf16, 4 << 16, 0.1, 3);
    d[65536..131072].fill(0);
    d[196608..262144].fill(0xFF);
    let st = check(&d, &EncodeOptions::default());
    assert_eq!((st.blocks_coded, st.blocks_fill, st.blocks_raw), (2, 2, 0));
}

/// One Decoder over frames whose blocks use more (dtype, code, anchor) choices than it
/// keeps, in orders that hit, miss and evict: every frame decodes exactly, and the
/// decoder never holds more than its bound.
#[test]
fn decoder_cache_hits_misses_and_evictions() {
    let mut frames = Vec::new();
    let mut choices = std::collections::BTreeSet::new();
    for (i, (ty, sigma)) in [
        (Ty::Bf16, 1e-3),
        (Ty::Bf16, 0.5),
        (Ty::Bf16, 30.0),
        (Ty::Fp16, 1e-3),
        (Ty::Fp16, 0.5),
        (Ty::Fp32, 1e-3),
        (Ty::Fp32, 30.0),
    ]
    .into_iter()
    .enumerate()
    {
        let src = gaussian(ty, 3 << 16, sigma, 40 + i as u64);
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &EncodeOptions::default()).unwrap();
        f.truncate(n);
        // Each coded block's (mode, k, anchor) from its header (FORMAT.md §2, §4).
        let nb = frame_info(&f).unwrap().blocks as usize;
        let mut pos = 24 + 4 * nb;
        for b in 0..nb {
            let at = 24 + 4 * b;
            let size = u32::from_le_bytes(f[at..at + 4].try_into().unwrap()) as usize;
            choices.insert((f[pos], f[pos + 1], f[pos + 2]));
            pos += size;
        }
        frames.push((src, f));
    }
    assert!(
        choices.len() > Decoder::SETS,
        "want more choices than the decoder keeps: {choices:?}"
    );
    let mut dec = Decoder::new();
    let mut rng = Rng::new(3);
    let order: Vec<usize> = (0..frames.len())
        .chain((0..frames.len()).rev())
        .chain((0..200).map(|_| (rng.next_u64() % frames.len() as u64) as usize))
        .collect();
    for i in order {
        let (src, f) = &frames[i];
        let mut out = vec![0u8; src.len()];
        assert_eq!(dec.decompress(f, &mut out), Ok(src.len()));
        assert!(out == *src, "frame {i} differs");
        assert!(dec.held_bytes() <= Decoder::MAX_HELD_BYTES);
    }
    assert_eq!(dec.held_bytes(), Decoder::MAX_HELD_BYTES);
}

#[test]
fn parallel_matches_single_thread() {
    for (name, d) in contents(3_000_001, 21) {
        for threads in [1, 2, 3, 8] {
            let opts = EncodeOptions {
                checksum: true,
                ..EncodeOptions::default()
            };
            let mut a = vec![0u8; max_compressed_size(d.len())];
            let mut b = vec![0u8; max_compressed_size(d.len())];
            let na = compress(&d, &mut a, &opts).unwrap();
            let nb = compress_parallel(&d, &mut b, &opts, threads).unwrap();
            assert!(
                a[..na] == b[..nb],
                "{name}: parallel frame differs ({threads} threads)"
            );
            let mut out = vec![0u8; d.len()];
            assert_eq!(
                decompress_parallel(&b[..nb], &mut out, threads).unwrap(),
                d.len()
            );
            assert!(out == d);
        }
    }
}

fn hint() -> impl Strategy<Value = DtypeHint> {
    prop_oneof![
        Just(DtypeHint::Auto),
        Just(DtypeHint::Bf16),
        Just(DtypeHint::Fp16),
        Just(DtypeHint::Fp32),
        Just(DtypeHint::Raw),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn prop_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..20_000),
                            dtype in hint(), checksum in any::<bool>(), bl in 12u8..=20) {
        check(&data, &EncodeOptions { effort: Effort::Full, dtype, checksum, block_log2: bl, format: 1 });
    }

    #[test]
    fn prop_float_like(n in 0usize..150_000, sigma_exp in -20i32..10, seed in any::<u64>(),
                       ty in prop_oneof![Just(Ty::Bf16), Just(Ty::Fp16), Just(Ty::Fp32)],
                       off in 0usize..4, zero_pct in 0u64..100, dtype in hint(), bl in 12u8..=17) {
        let mut r = Rng::new(seed);
        let sigma = 2f64.powi(sigma_exp);
        let vals: Vec<f64> = (0..n / ty.width() + 2)
            .map(|_| if r.next_u64() % 100 < zero_pct { 0.0 } else { r.gauss() * sigma })
            .collect();
        let bytes = encode(ty, vals.into_iter());
        let end = (off + n).min(bytes.len());
        let src = &bytes[off.min(end)..end];
        check(src, &EncodeOptions { effort: Effort::Full, dtype, checksum: seed % 2 == 0, block_log2: bl, format: 1 });
    }

    #[test]
    fn prop_decoder_total_on_garbage(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let mut out = vec![0u8; 1 << 16];
        let _ = decompress(&data, &mut out);
        let _ = frame_info(&data);
    }
}

/// Values whose exponents straddle the anchor by more than a code covers, so that
/// escapes (above and far below the anchor, and wrapping) and zeros mix in one step.
fn escape_heavy(ty: Ty, n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    encode(
        ty,
        (0..n / ty.width() + 1).map(move |_| match r.next_u64() % 8 {
            0 => 0.0,
            1 => r.gauss() * 1e30,
            2 => r.gauss() * 1e-30,
            3 => r.gauss() * 1e-6,
            _ => r.gauss(),
        }),
    )[..n]
        .to_vec()
}

#[test]
fn vector_encoder_matches_scalar() {
    for (i, &n) in SIZES.iter().enumerate() {
        let mut sets = contents(n, 50 + i as u64);
        for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
            sets.push(("esc", escape_heavy(ty, n, 60 + i as u64)));
            // A tiny anchor (the sample sees only tiny values) and unsampled huge
            // values: A - e wraps around in 8 bits.
            let mut r = Rng::new(70 + i as u64);
            let tiny = if ty == Ty::Fp16 { 1e-5 } else { 1e-36 };
            let vals = (0..n / ty.width() + 1).map(move |j| {
                if j % 13 != 0 && j % 97 == 5 {
                    r.gauss() * 1e4
                } else {
                    r.gauss() * tiny
                }
            });
            sets.push(("wrap", encode(ty, vals)[..n].to_vec()));
        }
        for (_, src) in &sets {
            for dtype in [
                DtypeHint::Auto,
                DtypeHint::Bf16,
                DtypeHint::Fp16,
                DtypeHint::Fp32,
            ] {
                for block_log2 in [12, 16] {
                    let opts = EncodeOptions {
                        effort: Effort::Full,
                        dtype,
                        checksum: false,
                        block_log2,
                        format: 1,
                    };
                    same_as_scalar(src, &opts);
                }
            }
        }
    }
}

/// Exponents spread over the whole reach of the codes (no escapes), alone and mixed
/// with narrow runs: the vector packer's 16- and 8-value chunks overflow 56 bits and
/// it falls back to smaller chunks, in every combination.
#[test]
fn vector_encoder_matches_scalar_on_long_codes() {
    for (i, &n) in [4096usize, 65536, 300_000].iter().enumerate() {
        for ty in [Ty::Bf16, Ty::Fp32] {
            for spread in [24u64, 12, 6] {
                let mut r = Rng::new(90 + i as u64 + spread);
                let vals = (0..n / ty.width() + 1).map(move |j| {
                    let wide = match (j / 16) % 4 {
                        0 => true,
                        1 => false,
                        _ => r.next_u64() % 3 == 0,
                    };
                    if j % 13 == 0 {
                        1.5
                    } else if wide && r.next_u64() % 29 == 0 {
                        0.0
                    } else if wide {
                        let u = (r.next_u64() % spread) as i32;
                        (1.0 + r.gauss().abs().min(0.9)) * 2f64.powi(-u)
                    } else {
                        r.gauss() * 0.3
                    }
                });
                let src = encode(ty, vals)[..n].to_vec();
                for block_log2 in [12, 16] {
                    let opts = EncodeOptions {
                        effort: Effort::Full,
                        dtype: DtypeHint::Auto,
                        checksum: false,
                        block_log2,
                        format: 1,
                    };
                    same_as_scalar(&src, &opts);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn prop_vector_encoder_matches_scalar(data in proptest::collection::vec(any::<u8>(), 0..40_000),
                                          hint in 0usize..3) {
        let dtype = [DtypeHint::Bf16, DtypeHint::Fp16, DtypeHint::Fp32][hint];
        same_as_scalar(&data, &EncodeOptions { effort: Effort::Full, dtype, checksum: false, block_log2: 12, format: 1 });
    }
}
