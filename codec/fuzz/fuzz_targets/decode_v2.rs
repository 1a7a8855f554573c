//! Format version 2 (docs/FORMAT.md §V2): the input's tail is compressed as a v2
//! frame (first byte: dtype hint and block size), which must round-trip; then the
//! next 8 bytes flip up to 4 bits of the frame (positions from the bytes) and the
//! sequential, table-keeping and parallel decoders must agree, never panic, and
//! with a checksum never return other bytes with Ok. Reaches the v2 block decoder's
//! deep paths (zero lines, Z, sub-segment index, planes) far more often than
//! mutating raw bytes does.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nccl_zip_codec::*;

fuzz_target!(|data: &[u8]| {
    let (sel, flips, src) = match data {
        [s, f0, f1, f2, f3, f4, f5, f6, f7, rest @ ..] => {
            (*s, [*f0, *f1, *f2, *f3, *f4, *f5, *f6, *f7], rest)
        }
        _ => return,
    };
    let dtype = [
        DtypeHint::Auto,
        DtypeHint::Bf16,
        DtypeHint::Fp16,
        DtypeHint::Fp32,
    ][(sel & 3) as usize];
    let opts = EncodeOptions {
        dtype,
        checksum: sel & 4 != 0,
        block_log2: 12 + ((sel >> 3) & 3),
        format: 2,
        // bit 5: the fast encoder (FORMAT.md §V2.11)
        effort: if sel & 0x20 != 0 { Effort::Fast } else { Effort::Full },
    };
    let mut frame = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut frame, &opts).unwrap();
    frame.truncate(n);
    let mut out = vec![0u8; src.len()];
    assert_eq!(decompress(&frame, &mut out).unwrap(), src.len());
    assert!(out == src, "v2 round trip");
    if n == 0 {
        return;
    }
    for k in 0..4 {
        let pos = ((flips[2 * k] as usize) << 8 | flips[2 * k + 1] as usize) % (8 * n);
        if k > 0 && flips[2 * k] == 0 {
            break;
        }
        frame[pos / 8] ^= 1 << (pos % 8);
    }
    let r = decompress(&frame, &mut out);
    let mut out2 = vec![0u8; src.len()];
    let r2 = Decoder::new().decompress(&frame, &mut out2);
    assert_eq!(r, r2);
    let mut out3 = vec![0u8; src.len()];
    let r3 = decompress_parallel(&frame, &mut out3, 2);
    assert_eq!(r.is_ok(), r3.is_ok());
    if let Ok(m) = r {
        assert!(out[..m] == out2[..m] && out[..m] == out3[..m]);
        if opts.checksum {
            assert!(
                out[..m] == src[..],
                "checksummed frame decoded to other bytes"
            );
        }
    }
});
