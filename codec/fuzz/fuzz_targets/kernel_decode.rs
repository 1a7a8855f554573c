//! Differential: the GPU kernels' decoders (kernels/nzc_codec.cuh, built for the
//! host from kernels/host/harness.cpp by build.rs, sequential executor; the
//! frame's version byte picks nzc_decode's or nzc_decode_v2's body) against the
//! CPU decoder. Both must accept or both reject, and when they accept, write the
//! same bytes. Two modes, by the first byte:
//! * below 0x80: the input is a frame (arbitrary bytes); its first two bytes pick
//!   the destination size, as in `decode`;
//! * 0x80 and above (as `decode_v2`): the rest's tail is compressed as a v2 frame
//!   (the first byte picks dtype hint, the fp8 ones with bit 6, checksum and
//!   block size), then up to 4 bits of it are flipped (positions from the next 8
//!   bytes): reaches the v2 block decoder's deep paths (zero lines, Z, index,
//!   planes, explicit codes, column tables, fp8 and FP16N blocks), which random
//!   bytes almost never do (the header CRC).
//!
//! The C++ is not built with a sanitizer here (libFuzzer's ASan is LLVM's, g++'s
//! is GCC's); tests/kernels_host.rs runs the same decoders under g++'s ASan on
//! corrupted frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nccl_zip_codec::*;

extern "C" {
    fn nzc_host_decode(
        frame: *const u8,
        len: u64,
        dst: *mut u8,
        cap: u64,
        out_len: *mut u64,
    ) -> u32;
}

/// The CPU decoder and the kernels' on one frame, into `cap` bytes: same decision,
/// same bytes.
fn differential(frame: &[u8], cap: usize) {
    let mut cpu = vec![0u8; cap];
    let mut gpu = vec![0u8; cap.max(1)];
    let r = decompress(frame, &mut cpu);
    let mut n = 0u64;
    // SAFETY: frame and gpu are valid for the lengths given; the decoder writes
    // at most `cap` bytes of `gpu`.
    let st = unsafe {
        nzc_host_decode(
            frame.as_ptr(),
            frame.len() as u64,
            gpu.as_mut_ptr(),
            cap as u64,
            &mut n,
        )
    };
    assert_ne!(st, 0xFFFF_FFFF, "the kernels' job never finished");
    match r {
        Ok(len) => {
            assert_eq!(
                st, 0,
                "CPU accepted {len} bytes, the kernels said status {st}"
            );
            assert_eq!(n as usize, len);
            assert!(cpu[..len] == gpu[..len], "accepted with different bytes");
        }
        Err(e) => assert_ne!(st, 0, "CPU rejected ({e}), the kernels accepted {n} bytes"),
    }
}

fn mutated_v2(sel: u8, data: &[u8]) {
    let (flips, src) = match data {
        [f0, f1, f2, f3, f4, f5, f6, f7, rest @ ..] => {
            ([*f0, *f1, *f2, *f3, *f4, *f5, *f6, *f7], rest)
        }
        _ => return,
    };
    let opts = EncodeOptions {
        // bit 6: the fp8 hints (FORMAT.md §V2.10's byte-code blocks)
        dtype: if sel & 0x40 != 0 {
            [DtypeHint::Fp8E4m3, DtypeHint::Fp8E5m2][(sel & 1) as usize]
        } else {
            [
                DtypeHint::Auto,
                DtypeHint::Bf16,
                DtypeHint::Fp16,
                DtypeHint::Fp32,
            ][(sel & 3) as usize]
        },
        checksum: sel & 4 != 0,
        block_log2: 12 + ((sel >> 3) & 3),
        format: 2,
        // the fast encoder (FORMAT.md §V2.11) when the last flip byte is odd (every
        // bit of `sel` is taken; that byte only moves the fourth flip by one bit)
        effort: if flips[7] & 1 != 0 { Effort::Fast } else { Effort::Full },
    };
    let mut frame = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut frame, &opts).unwrap();
    frame.truncate(n);
    differential(&frame, src.len());
    for k in 0..4 {
        if k > 0 && flips[2 * k] == 0 {
            break;
        }
        let pos = ((flips[2 * k] as usize) << 8 | flips[2 * k + 1] as usize) % (8 * n);
        frame[pos / 8] ^= 1 << (pos % 8);
    }
    // bit 5: a destination one byte short
    let cap = if sel & 0x20 != 0 {
        src.len().saturating_sub(1)
    } else {
        src.len()
    };
    differential(&frame, cap);
}

fuzz_target!(|data: &[u8]| {
    match data {
        [sel, rest @ ..] if *sel >= 0x80 => mutated_v2(*sel, rest),
        [a, b, rest @ ..] => differential(rest, (((*a as usize) << 8) | *b as usize) * 32),
        _ => differential(data, 0),
    }
});
