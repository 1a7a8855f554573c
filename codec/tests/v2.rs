//! Format version 2 (docs/FORMAT.md "Version 2"): round trips over sizes, alignments,
//! zeros, -0.0, NaN patterns and subnormals; corrupt frames; detection over
//! (type, phase); the sparse mechanisms actually engage.
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

/// `o` with the fast encoder (FORMAT.md §V2.11).
fn fast(o: EncodeOptions) -> EncodeOptions {
    EncodeOptions {
        effort: Effort::Fast,
        ..o
    }
}

/// The effort a property case runs under: Fast for one seed in three.
fn effort_of(seed: u64, o: EncodeOptions) -> EncodeOptions {
    if seed.is_multiple_of(3) {
        fast(o)
    } else {
        o
    }
}

thread_local! {
    /// A Decoder that lives across every frame this thread checks: its tables and
    /// its block scratch (kept, not cleared, between blocks) come from earlier frames
    /// of other types, sizes and block kinds (Z, LINES, COL).
    static DECODER: std::cell::RefCell<Decoder> = std::cell::RefCell::new(Decoder::new());
}

/// Compresses as v2 and checks every decoder entry point gives the input back.
fn check(src: &[u8], opts: &EncodeOptions) -> FrameStats {
    let n = src.len();
    let mut frame = vec![0xAAu8; max_compressed_size(n) + 5];
    let st = compress_with_stats(src, &mut frame, opts).unwrap();
    assert!(st.frame_len <= n + 24);
    let f = &frame[..st.frame_len];
    assert_eq!(f[4], 2, "version byte");
    let info = frame_info(f).unwrap();
    assert_eq!(info.raw_len, n as u64);
    assert_eq!(info.frame_len, st.frame_len as u64);
    let mut out = vec![0x55u8; n];
    assert_eq!(decompress(f, &mut out).unwrap(), n);
    assert!(out == src, "v2 round trip differs (n = {n}, {opts:?})");
    let mut out2 = vec![0x33u8; n];
    Decoder::new().decompress(f, &mut out2).unwrap();
    assert!(out2 == src);
    let mut out2 = vec![0x77u8; n];
    assert_eq!(
        DECODER.with(|d| d.borrow_mut().decompress(f, &mut out2)),
        Ok(n)
    );
    assert!(
        out2 == src,
        "shared Decoder round trip differs (n = {n}, {opts:?})"
    );
    let mut out3 = vec![0x11u8; n];
    decompress_parallel(f, &mut out3, 3).unwrap();
    assert!(out3 == src);
    let mut f2 = vec![0u8; max_compressed_size(n)];
    let n2 = compress_parallel(src, &mut f2, opts, 3).unwrap();
    assert_eq!(&f2[..n2], f, "parallel encoder differs");
    // the portable encoder (no AVX2 split, packer or shuffles) writes the same bytes
    assert_eq!(same_as_scalar(src, opts), f, "scalar encoder differs");
    st
}

fn specials(ty: Ty, n: usize, seed: u64) -> Vec<u8> {
    // gaussian with sprinkled +0.0, -0.0, NaNs with payloads, infinities, subnormals
    let mut b = gaussian(ty, n, 0.05, seed);
    let w = ty.width();
    let mut r = Rng::new(seed ^ 0x5EED);
    let pats: &[u32] = match w {
        2 => &[
            0x0000, 0x8000, 0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x0001, 0x8003, 0x7C01, 0xFE00, 0x03FF,
        ],
        _ => &[
            0,
            0x8000_0000,
            0x7FC0_0001,
            0xFFBF_FFFF,
            0x7F80_0000,
            0x0000_0001,
            0x8000_0100,
            0x007F_FFFF,
            0x7F80_0001,
        ],
    };
    for i in 0..b.len() / w {
        if r.next_u64() % 5 == 0 {
            let p = pats[(r.next_u64() % pats.len() as u64) as usize];
            b[i * w..i * w + w].copy_from_slice(&p.to_le_bytes()[..w]);
        }
    }
    b
}

const SIZES: &[usize] = &[
    0, 1, 2, 3, 17, 63, 64, 65, 127, 129, 1000, 2049, 4095, 4097, 8083, 12345, 65535, 65537,
    131071, 300001,
];

#[test]
fn sweep_sizes_contents_alignments() {
    for &n in SIZES {
        for seed in 0..2u64 {
            let contents: Vec<(&str, Vec<u8>)> = vec![
                ("bf16", gaussian(Ty::Bf16, n + 8, 0.02, seed)),
                ("fp16", gaussian(Ty::Fp16, n + 8, 0.5, seed)),
                ("fp32", gaussian(Ty::Fp32, n + 8, 1e-3, seed)),
                ("relu16", relu_like(Ty::Bf16, n + 8, seed)),
                ("relu32", relu_like(Ty::Fp32, n + 8, seed)),
                ("sp16", specials(Ty::Bf16, n + 8, seed)),
                ("sph", specials(Ty::Fp16, n + 8, seed)),
                ("sp32", specials(Ty::Fp32, n + 8, seed)),
                ("emb", embedding_grad(n + 8 + 4096, 256, 0.9, seed)),
                (
                    "b16in32",
                    bf16_in_fp32(&gaussian(Ty::Bf16, n / 2 + 8, 0.02, seed)),
                ),
                ("random", Rng::new(seed).bytes(n + 8)),
                ("zeros", vec![0u8; n + 8]),
                ("ints", int_counters(n + 8, seed)),
            ];
            for (_name, data) in contents {
                for off in [0usize, 1, 2, 3] {
                    let end = (off + n).min(data.len());
                    let src = &data[off.min(end)..end];
                    for dtype in [
                        DtypeHint::Auto,
                        DtypeHint::Bf16,
                        DtypeHint::Fp16,
                        DtypeHint::Fp32,
                    ] {
                        for bl in [12u8, 16] {
                            check(src, &v2(dtype, seed == 1, bl));
                        }
                        check(src, &fast(v2(dtype, seed == 0, 12 + 4 * seed as u8)));
                    }
                }
            }
        }
    }
}

/// Input over frame bytes of version 1 (defaults) and of `o`, whose frame every
/// decoder entry point checks.
fn v1_and(d: &[u8], o: &EncodeOptions) -> (f64, f64) {
    let mut f = vec![0u8; max_compressed_size(d.len())];
    let v1 = compress(d, &mut f, &EncodeOptions::default()).unwrap();
    let st = check(d, o);
    (
        d.len() as f64 / v1 as f64,
        d.len() as f64 / st.frame_len as f64,
    )
}

/// Zero lines, omitted fp32 planes and Z engage under `o` (`what`: its name in
/// messages), and dense bf16 codes no worse than v1 by more than the index.
fn sparse_mechanisms(o: &EncodeOptions, what: &str) {
    let n = 256 << 10;
    // zero rows
    let (r1, r2) = v1_and(&embedding_grad(n, 4096, 0.92, 21), o);
    assert!(r2 > 2.0 * r1, "zero lines: v1 {r1:.3} {what} {r2:.3}");
    // fp32 holding bf16: both low planes omitted
    let (r1, r2) = v1_and(&bf16_in_fp32(&gaussian(Ty::Bf16, n / 2, 0.02, 3)), o);
    assert!(r2 > 2.9, "fp32 holding bf16: v1 {r1:.3} {what} {r2:.3}");
    // scattered exact zeros (Z)
    let (r1, r2) = v1_and(&relu_like(Ty::Bf16, n, 8), o);
    assert!(r2 > 1.3 * r1, "relu: v1 {r1:.3} {what} {r2:.3}");
    // dense data no worse than v1 by more than the index
    let (r1, r2) = v1_and(&gaussian(Ty::Bf16, n, 0.01, 4), o);
    assert!(r2 >= r1 * 0.998, "dense bf16: v1 {r1:.4} {what} {r2:.4}");
}

#[test]
fn sparse_mechanisms_engage() {
    sparse_mechanisms(&v2(DtypeHint::Auto, false, 16), "v2");
}

/// The fast encoder (FORMAT.md §V2.11) keeps the sparse mechanisms (zero lines, Z,
/// omitted fp32 planes), writes no column table and no explicit code lengths, and
/// codes dense data no worse than version 1 by more than the index.
#[test]
fn fast_effort_keeps_the_sparse_mechanisms() {
    let n = 256 << 10;
    let o = fast(v2(DtypeHint::Auto, false, 16));
    sparse_mechanisms(&o, "fast");
    let frame = |d: &[u8], o: &EncodeOptions| {
        let mut f = vec![0u8; max_compressed_size(d.len())];
        let k = compress(d, &mut f, o).unwrap();
        f.truncate(k);
        f
    };
    for (ty, sigma) in [(Ty::Bf16, 0.01), (Ty::Fp16, 0.5), (Ty::Fp32, 1e-3)] {
        let (r1, r2) = v1_and(&gaussian(ty, n, sigma, 4), &o);
        assert!(
            r2 >= r1 * 0.998,
            "dense {}: v1 {r1:.4} fast {r2:.4}",
            ty.name()
        );
    }
    // channel data: Full writes a column table (header byte 5, bit 2), Fast none;
    // Fast's coded blocks (byte 0 >= 2) have no explicit lengths (byte 1, bit 3)
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        let d = channels(ty, n, 384, 0.02, 11);
        let full = frame(&d, &v2(DtypeHint::Auto, false, 16));
        let f = frame(&d, &o);
        assert_eq!(full[5] & 4, 4, "{ty:?}: Full has a table");
        assert_eq!(f[5] & 4, 0, "{ty:?}: Fast writes a table");
        check(&d, &o);
        let nb = n >> 16;
        let mut pos = 24 + 4 * nb;
        for i in 0..nb {
            let sz = u32::from_le_bytes(f[24 + 4 * i..28 + 4 * i].try_into().unwrap()) as usize;
            assert!(f[pos] >= 2, "{ty:?}: block {i} coded");
            assert_eq!(
                f[pos + 1] & (8 | 4),
                0,
                "{ty:?}: explicit lengths or COL in block {i}"
            );
            pos += sz;
        }
        assert_eq!(pos, f.len());
    }
}

/// Detection over (type, phase): a small non-float prefix, or a start misaligned by
/// 1..3 bytes, does not change the detected type of what follows.
#[test]
fn detection_survives_prefix_and_misalignment() {
    for (ty, dt) in [
        (Ty::Bf16, Dtype::Bf16),
        (Ty::Fp16, Dtype::Fp16),
        (Ty::Fp32, Dtype::Fp32),
    ] {
        let body = gaussian(ty, 256 << 10, 0.02, 9);
        assert_eq!(detect_v2(&body), dt);
        for off in 1..4 {
            assert_eq!(
                detect_v2(&body[off..]),
                dt,
                "{} misaligned by {off}",
                ty.name()
            );
        }
        for plen in [1usize, 3, 62, 64, 100, 511] {
            let mut d = int_counters(plen, 1);
            d.extend_from_slice(&body);
            assert_eq!(
                detect_v2(&d),
                dt,
                "{} after a {plen}-byte prefix",
                ty.name()
            );
            // and the frame codes nearly as well as the aligned body
            let aligned = check(&body, &v2(DtypeHint::Auto, false, 16)).frame_len;
            let pre = check(&d, &v2(DtypeHint::Auto, false, 16)).frame_len;
            assert!(
                (pre as f64) < aligned as f64 * 1.01 + plen as f64 + 64.0,
                "{} prefix {plen}: {pre} vs aligned {aligned}",
                ty.name()
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn prop_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..20_000),
                            hint in 0usize..4, checksum in any::<bool>(), bl in 12u8..=17) {
        let dtype = [DtypeHint::Auto, DtypeHint::Bf16, DtypeHint::Fp16, DtypeHint::Fp32][hint];
        check(&data, &v2(dtype, checksum, bl));
    }

    #[test]
    fn prop_floats_with_specials(seed in any::<u64>(), ty in 0usize..3, n in 0usize..70_000,
                                 off in 0usize..4, zero_rows in 0u32..100, hint in 0usize..4) {
        let ty = [Ty::Bf16, Ty::Fp16, Ty::Fp32][ty];
        let mut b = specials(ty, n + 4, seed);
        // zero some 64-byte-ish rows
        let mut r = Rng::new(seed);
        let row = 192;
        for c in b.chunks_mut(row) {
            if (r.next_u64() % 100) < zero_rows as u64 { c.fill(0); }
        }
        let src = &b[off.min(b.len())..(off + n).min(b.len())];
        let dtype = [DtypeHint::Auto, DtypeHint::Bf16, DtypeHint::Fp16, DtypeHint::Fp32][hint];
        check(src, &effort_of(seed, v2(dtype, seed % 2 == 0, 12 + (seed % 5) as u8)));
    }

    #[test]
    fn prop_channels(seed in any::<u64>(), ty in 0usize..3, n in 0usize..200_000,
                     width in 16usize..3000, off in 0usize..4, zero_lines in 0u32..40,
                     hint in 0usize..4, specials_too in any::<bool>()) {
        let ty = [Ty::Bf16, Ty::Fp16, Ty::Fp32][ty];
        let mut b = channels(ty, n + 4, width, 0.03, seed);
        let mut r = Rng::new(seed ^ 1);
        for c in b.chunks_mut(64) {
            if (r.next_u64() % 100) < zero_lines as u64 { c.fill(0); }
        }
        if specials_too {
            let sp = specials(ty, b.len(), seed);
            for (i, c) in b.chunks_mut(ty.width()).enumerate() {
                if i % 37 == 0 { c.copy_from_slice(&sp[i * ty.width()..(i + 1) * ty.width()]); }
            }
        }
        let src = &b[off.min(b.len())..(off + n).min(b.len())];
        let dtype = [DtypeHint::Auto, DtypeHint::Bf16, DtypeHint::Fp16, DtypeHint::Fp32][hint];
        check(src, &effort_of(seed, v2(dtype, seed % 2 == 0, 12 + (seed % 5) as u8)));
    }

    #[test]
    fn prop_corrupt_never_panics(seed in any::<u64>(), flips in 1usize..4, cut in any::<bool>()) {
        let src = specials(Ty::Bf16, 9000, seed);
        let mut src = src;
        for c in src.chunks_mut(640).step_by(3) { c.fill(0); }
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &effort_of(seed, v2(DtypeHint::Auto, seed % 2 == 0, 12))).unwrap();
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

fn corrupt_samples() -> Vec<(&'static str, Vec<u8>, EncodeOptions)> {
    vec![
        (
            "bf16",
            gaussian(Ty::Bf16, 9000, 0.1, 1),
            v2(DtypeHint::Auto, false, 12),
        ),
        (
            "fp16",
            specials(Ty::Fp16, 9000, 2),
            v2(DtypeHint::Auto, true, 12),
        ),
        (
            "fp32",
            specials(Ty::Fp32, 9001, 3),
            v2(DtypeHint::Auto, true, 12),
        ),
        (
            "emb",
            embedding_grad(20000, 256, 0.9, 4),
            v2(DtypeHint::Auto, true, 12),
        ),
        (
            "b16in32",
            bf16_in_fp32(&gaussian(Ty::Bf16, 5000, 0.02, 5)),
            v2(DtypeHint::Auto, true, 12),
        ),
        (
            "relu",
            relu_like(Ty::Bf16, 9000, 6),
            v2(DtypeHint::Auto, true, 12),
        ),
        (
            "coltab",
            channels(Ty::Bf16, 12_000, 96, 0.05, 7),
            v2(DtypeHint::Auto, true, 12),
        ),
    ]
}

#[test]
fn every_truncation_is_an_error() {
    for (name, src, opts) in corrupt_samples() {
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &opts).unwrap();
        f.truncate(n);
        let mut out = vec![0u8; src.len()];
        for c in 0..n {
            assert!(
                decompress(&f[..c], &mut out).is_err(),
                "{name}: prefix {c}/{n} decoded"
            );
        }
        f.push(0);
        assert!(
            decompress(&f, &mut out).is_err(),
            "{name}: trailing byte accepted"
        );
    }
}

/// Every single bit flip gives an error or (outside the header and without a
/// checksum) some output; with a checksum, never wrong bytes with Ok.
#[test]
fn every_bit_flip_is_caught_or_harmless() {
    for (name, src, opts) in corrupt_samples() {
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &opts).unwrap();
        f.truncate(n);
        let mut out = vec![0u8; src.len()];
        let mut out2 = vec![0u8; src.len()];
        // A Decoder that saw every earlier flipped frame (its tables and block
        // scratch) answers the same, with the same bytes.
        let mut dec = Decoder::new();
        let mut silent = 0;
        for i in 0..n {
            for bit in 0..8 {
                f[i] ^= 1 << bit;
                let r = decompress(&f, &mut out);
                let r2 = dec.decompress(&f, &mut out2);
                assert_eq!(
                    r, r2,
                    "{name}: flip {i}.{bit}: Decoder and decompress disagree"
                );
                if let Ok(m) = r {
                    assert!(
                        out[..m] == out2[..m],
                        "{name}: flip {i}.{bit}: outputs differ"
                    );
                }
                if let Ok(m) = r {
                    if out[..m] != src[..] {
                        silent += 1;
                        assert!(
                            !opts.checksum,
                            "{name}: flip {i}.{bit} gave wrong bytes with a checksum"
                        );
                    }
                }
                f[i] ^= 1 << bit;
            }
        }
        eprintln!("{name}: {silent} of {} flips decode to other bytes", 8 * n);
    }
}

#[test]
fn v1_frames_still_decode_and_v1_stays_default() {
    let src = gaussian(Ty::Bf16, 100_000, 0.02, 7);
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(&src, &mut f, &EncodeOptions::default()).unwrap();
    assert_eq!(f[4], 1);
    let mut out = vec![0u8; src.len()];
    decompress(&f[..n], &mut out).unwrap();
    assert_eq!(out, src);
    let bad = EncodeOptions {
        format: 3,
        ..EncodeOptions::default()
    };
    assert!(compress(&src, &mut f, &bad).is_err());
}

/// Channel-structured data gets a column table (header flag bit 2) and COL blocks
/// (block flag bit 2), and codes smaller than without one.
#[test]
fn column_table_engages() {
    for (ty, dt) in [
        (Ty::Bf16, DtypeHint::Bf16),
        (Ty::Fp16, DtypeHint::Fp16),
        (Ty::Fp32, DtypeHint::Fp32),
    ] {
        let src = channels(ty, 256 << 10, 384, 0.02, 11);
        let st = check(&src, &v2(dt, false, 16));
        let mut f = vec![0u8; max_compressed_size(src.len())];
        let n = compress(&src, &mut f, &v2(dt, false, 16)).unwrap();
        assert_eq!(f[5] & 4, 4, "{ty:?}: no COLTAB");
        assert_eq!(u16::from_le_bytes([f[24], f[25]]), 384, "{ty:?}: period");
        let t0 = 24 + 2 + 192;
        let nb = st.blocks_coded as usize + st.blocks_raw as usize + st.blocks_fill as usize;
        let mut pos = t0 + 4 * nb;
        let mut col = 0;
        for i in 0..nb {
            let sz = u32::from_le_bytes(f[t0 + 4 * i..t0 + 4 * i + 4].try_into().unwrap()) as usize;
            col += (f[pos] >= 2 && f[pos + 1] & 4 != 0) as usize;
            pos += sz;
        }
        assert_eq!(pos, n);
        assert_eq!(col, nb, "{ty:?}: every block uses the table");
        // the same values with the channels shuffled away (a column-free layout) code larger
        let mut r = Rng::new(3);
        let w = ty.width();
        let mut shuf = src.clone();
        for i in (1..shuf.len() / w).rev() {
            let j = (r.next_u64() % (i as u64 + 1)) as usize;
            for b in 0..w {
                shuf.swap(i * w + b, j * w + b);
            }
        }
        let ns = compress(&shuf, &mut f, &v2(dt, false, 16)).unwrap();
        assert_eq!(f[5] & 4, 0, "{ty:?}: a table on shuffled data");
        assert!(n * 40 < ns * 39, "{ty:?}: with table {n}, shuffled {ns}");
    }
}

/// Gaussian data without channels gets no table (and so no cost beyond the search).
#[test]
fn no_column_table_without_channels() {
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        let src = gaussian(ty, 256 << 10, 0.02, 12);
        let mut f = vec![0u8; max_compressed_size(src.len())];
        compress(&src, &mut f, &v2(DtypeHint::Auto, false, 16)).unwrap();
        assert_eq!(f[5] & 4, 0, "{ty:?}");
    }
}

/// Rewrites header bytes 0..20's CRC after an edit.
fn fix_header_crc(f: &mut [u8]) {
    let c = crc32c::crc32c(&f[..20]);
    f[20..24].copy_from_slice(&c.to_le_bytes());
}

/// A COLTAB frame with a bad period, a table of the wrong length, COL blocks without
/// COLTAB, COLTAB on a stored frame or in version 1, nonzero padding: all rejected.
#[test]
fn corrupt_column_tables() {
    let src = channels(Ty::Bf16, 100_000, 384, 0.05, 13);
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(&src, &mut f, &v2(DtypeHint::Auto, false, 16)).unwrap();
    f.truncate(n);
    assert_eq!(f[5] & 4, 4);
    let mut out = vec![0u8; src.len()];
    assert_eq!(decompress(&f, &mut out).unwrap(), src.len());
    assert!(out == src);
    let err = |g: &[u8]| {
        let mut o = vec![0u8; src.len()];
        let e1 = decompress(g, &mut o).is_err();
        let e2 = decompress_parallel(g, &mut o, 2).is_err();
        let e3 = frame_info(g).is_err() || e1;
        e1 && e2 && e3
    };
    // bad P: below 16, above 8192
    for p in [0u16, 15, 8193, 0xFFFF] {
        let mut g = f.clone();
        g[24..26].copy_from_slice(&p.to_le_bytes());
        assert!(err(&g), "P = {p} accepted");
    }
    // a table of the wrong length: P one column more or fewer (the block table moves)
    for p in [383u16, 385, 386, 382] {
        let mut g = f.clone();
        g[24..26].copy_from_slice(&p.to_le_bytes());
        assert!(err(&g), "P = {p} accepted");
    }
    // table bytes missing or extra
    let mut g = f.clone();
    g.remove(30);
    assert!(err(&g), "short table accepted");
    let mut g = f.clone();
    g.insert(30, 0);
    assert!(err(&g), "long table accepted");
    // COL blocks without COLTAB: drop the flag and the table
    let mut g = f.clone();
    g[5] &= !4;
    g.drain(24..24 + 2 + 192);
    fix_header_crc(&mut g);
    let mut o = vec![0u8; src.len()];
    assert_eq!(
        decompress(&g, &mut o),
        Err(CodecError::Corrupt(
            "COL block in a frame without a column table"
        ))
    );
    // COLTAB on a stored frame, and in version 1
    let mut g = f.clone();
    g[5] |= 2;
    fix_header_crc(&mut g);
    assert!(err(&g));
    let mut g = f.clone();
    g[4] = 1;
    fix_header_crc(&mut g);
    assert!(err(&g));
    // an odd P (the encoder searches multiples of 16; decoders take any P in
    // 16..=8192): a table inserted into a frame without COL blocks decodes, and its
    // padding nibble must be zero
    let src = gaussian(Ty::Bf16, 100_000, 0.05, 14);
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(&src, &mut f, &v2(DtypeHint::Bf16, false, 16)).unwrap();
    f.truncate(n);
    assert_eq!(f[5] & 4, 0);
    let mut tab = vec![17u8, 0];
    tab.extend((0..9).map(|i| if i == 8 { 0x07 } else { 0x9F }));
    f.splice(24..24, tab);
    f[5] |= 4;
    fix_header_crc(&mut f);
    let mut o = vec![0u8; src.len()];
    assert_eq!(decompress(&f, &mut o).unwrap(), src.len());
    assert!(o == src);
    f[26 + 8] |= 0x10;
    assert!(err(&f), "padding nibble accepted");
}

/// The carried phase (FORMAT.md §V2.7 step 3): a frame whose alignment changes after
/// block 0 (one byte inserted at 64 KiB) still codes its later blocks at the new
/// phase, as the full search would.
#[test]
fn carried_phase_follows_a_change_inside_the_frame() {
    for (ty, w) in [(Ty::Bf16, 2usize), (Ty::Fp32, 4)] {
        let body = gaussian(ty, 256 << 10, 0.02, 11);
        let mut d = body[..64 << 10].to_vec();
        d.push(0x5A);
        d.extend_from_slice(&body[64 << 10..]);
        let hint = if w == 2 {
            DtypeHint::Bf16
        } else {
            DtypeHint::Fp32
        };
        let opts = v2(hint, false, 16);
        check(&d, &opts);
        let mut f = vec![0u8; max_compressed_size(d.len())];
        let n = compress(&d, &mut f, &opts).unwrap();
        let f = &f[..n];
        assert_eq!(f[5] & 4, 0, "no column table expected");
        let nb = d.len().div_ceil(1 << 16);
        let mut pos = 24 + 4 * nb;
        for i in 0..nb {
            let size = u32::from_le_bytes(f[24 + 4 * i..28 + 4 * i].try_into().unwrap()) as usize;
            if i + 1 < nb {
                assert!((2..=4).contains(&f[pos]), "{} block {i} coded", ty.name());
                // block i >= 1 starts at 65536·i: its first whole element one byte in
                let want = if i == 0 { 0 } else { 1 };
                assert_eq!(
                    (f[pos + 4] & 0x0F) as usize,
                    want,
                    "{} block {i}",
                    ty.name()
                );
            }
            pos += size;
        }
    }
}
