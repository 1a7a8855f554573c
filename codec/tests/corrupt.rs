//! Corrupt input: truncation, bit flips, lying lengths. The decoder must return an
//! error (or, without a checksum, possibly other bytes) and never panic.
mod common;
use common::*;
use nccl_zip_codec::*;

fn frame_of(src: &[u8], opts: &EncodeOptions) -> Vec<u8> {
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut f, opts).unwrap();
    f.truncate(n);
    f
}

fn samples() -> Vec<(&'static str, Vec<u8>, EncodeOptions)> {
    let small = EncodeOptions {
        block_log2: 12,
        ..EncodeOptions::default()
    };
    let ck = EncodeOptions {
        checksum: true,
        block_log2: 12,
        ..EncodeOptions::default()
    };
    vec![
        ("bf16", gaussian(Ty::Bf16, 9000, 0.1, 1), small),
        ("fp16", gaussian(Ty::Fp16, 9000, 0.1, 2), ck),
        ("fp32", gaussian(Ty::Fp32, 9001, 0.1, 3), ck),
        ("bf16ck", gaussian(Ty::Bf16, 5000, 1e-3, 4), ck),
        ("random", Rng::new(5).bytes(3000), ck),
        (
            "mixed",
            [
                gaussian(Ty::Bf16, 4096, 0.1, 6),
                vec![0; 4096],
                Rng::new(6).bytes(100),
            ]
            .concat(),
            ck,
        ),
    ]
}

#[test]
fn every_truncation_is_an_error() {
    for (name, src, opts) in samples() {
        let f = frame_of(&src, &opts);
        let mut out = vec![0u8; src.len()];
        for cut in 0..f.len() {
            let r = decompress(&f[..cut], &mut out);
            assert!(
                r.is_err(),
                "{name}: prefix of {cut}/{} bytes decoded",
                f.len()
            );
        }
        // extra bytes are rejected too
        let mut longer = f.clone();
        longer.push(0);
        assert!(matches!(
            decompress(&longer, &mut out),
            Err(CodecError::TrailingBytes { .. })
        ));
    }
}

#[test]
fn every_bit_flip_is_caught_or_harmless() {
    for (name, src, opts) in samples() {
        let f = frame_of(&src, &opts);
        let mut out = vec![0u8; src.len() + 64];
        let mut out2 = vec![0u8; src.len() + 64];
        let mut dec = Decoder::new();
        let mut undetected = 0;
        for bit in 0..f.len() * 8 {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            // A Decoder that saw every earlier flipped frame answers the same.
            let r = dec.decompress(&g, &mut out2);
            let r0 = decompress(&g, &mut out);
            assert_eq!(r, r0, "{name}: bit {bit}: Decoder and decompress disagree");
            if let Ok(n) = r {
                assert!(out[..n] == out2[..n], "{name}: bit {bit}: outputs differ");
            }
            match r0 {
                Err(_) => {}
                // With a checksum every flip is an error: flips in coded data change
                // the output (the CRC catches it), and flips in a segment's zero
                // padding are rejected as such.
                Ok(_) if opts.checksum => {
                    panic!("{name}: flip of bit {bit} accepted despite CRC32C")
                }
                Ok(n) => {
                    if out[..n] != src[..] {
                        undetected += 1;
                        assert!(
                            !opts.checksum,
                            "{name}: flip of bit {bit} gave wrong data despite CRC32C"
                        );
                    }
                }
            }
        }
        if !opts.checksum {
            // Without a checksum, flips in raw sign/mantissa bytes go unnoticed; that is expected.
            assert!(
                undetected > 0,
                "{name}: expected some undetectable flips without a checksum"
            );
        }
    }
}

/// Rewrites a header field and fixes the header CRC so the lie gets past it.
fn patch_header(f: &mut [u8], at: usize, bytes: &[u8]) {
    f[at..at + bytes.len()].copy_from_slice(bytes);
    let c = crc32c::crc32c(&f[..20]);
    f[20..24].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn lying_lengths() {
    let src = gaussian(Ty::Bf16, 20_000, 0.1, 7);
    let f = frame_of(
        &src,
        &EncodeOptions {
            block_log2: 12,
            ..EncodeOptions::default()
        },
    );
    assert!(!frame_info(&f).unwrap().stored);
    let mut out = vec![0u8; 1 << 20];
    for lie in [
        0u64,
        1,
        19_999,
        20_001,
        4096 * 5,
        1 << 19,
        u64::MAX,
        u64::MAX / 2,
        1 << 40,
    ] {
        let mut g = f.clone();
        patch_header(&mut g, 8, &lie.to_le_bytes());
        assert!(decompress(&g, &mut out).is_err(), "raw_len {lie} accepted");
        let _ = frame_info(&g);
    }
    // a stored frame claiming more than it holds
    let rnd = Rng::new(1).bytes(1000);
    let s = frame_of(&rnd, &EncodeOptions::default());
    assert!(frame_info(&s).unwrap().stored);
    let mut g = s.clone();
    patch_header(&mut g, 8, &2000u64.to_le_bytes());
    assert!(matches!(
        decompress(&g, &mut out),
        Err(CodecError::Truncated)
    ));
    // block table entries that lie
    for i in 0..5 {
        for v in [0u32, 1, 2, u32::MAX, 100_000] {
            let mut g = f.clone();
            g[24 + 4 * i..28 + 4 * i].copy_from_slice(&v.to_le_bytes());
            assert!(
                decompress(&g, &mut out).is_err(),
                "table[{i}] = {v} accepted"
            );
        }
    }
    // segment lengths that lie (block 0 is coded: 4-byte header, then u16 lengths)
    let b0 = 24 + 4 * 5;
    assert_eq!(g_mode(&f, b0), 2);
    for j in 0..2 {
        for v in [0u16, 1, 700, u16::MAX] {
            let mut g = f.clone();
            g[b0 + 4 + 2 * j..b0 + 6 + 2 * j].copy_from_slice(&v.to_le_bytes());
            assert!(
                decompress(&g, &mut out).is_err(),
                "seg_len[{j}] = {v} accepted"
            );
        }
    }
    // bad header fields
    // version 3 does not exist (2 does since issue 19)
    for (at, v) in [(4usize, 3u8), (5, 4), (6, 9), (7, 11), (7, 21)] {
        let mut g = f.clone();
        patch_header(&mut g, at, &[v]);
        assert!(decompress(&g, &mut out).is_err());
        assert!(frame_info(&g).is_err());
    }
    assert!(matches!(
        decompress(b"NOPE and more bytes here.", &mut out),
        Err(CodecError::BadMagic)
    ));
    assert!(matches!(
        decompress(b"NZ", &mut out),
        Err(CodecError::Truncated)
    ));
}

fn g_mode(f: &[u8], at: usize) -> u8 {
    f[at]
}
