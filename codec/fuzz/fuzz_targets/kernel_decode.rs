//! Differential: the GPU kernels' decoder (kernels/nzc_codec.cuh, built for the
//! host from kernels/host/harness.cpp by build.rs, sequential executor) against
//! the CPU decoder, on arbitrary bytes. Both must accept or both reject, and
//! when they accept, write the same bytes. The first two bytes pick the
//! destination size, as in `decode`. The C++ is not built with a sanitizer here
//! (libFuzzer's ASan is LLVM's, g++'s is GCC's); tests/kernels_host.rs runs the
//! same decoder under g++'s ASan on corrupted frames.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nccl_zip_codec::decompress;

extern "C" {
    fn nzc_host_decode(
        frame: *const u8,
        len: u64,
        dst: *mut u8,
        cap: u64,
        out_len: *mut u64,
    ) -> u32;
}

fuzz_target!(|data: &[u8]| {
    let (cap, frame) = match data {
        [a, b, rest @ ..] => ((((*a as usize) << 8) | *b as usize) * 32, rest),
        _ => (0, data),
    };
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
        // The kernels speak format 1 only (issue 19): a v2 frame the CPU accepts is
        // not a disagreement.
        Ok(_) if frame.get(4) == Some(&2) => {}
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
});
