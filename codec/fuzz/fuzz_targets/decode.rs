//! The decoder on arbitrary bytes: must return Ok or Err, never panic or touch
//! memory out of bounds. The first two bytes pick the destination size, so
//! `DstTooSmall` and exact-size paths are both exercised. A frame produced by
//! mutating valid seeds (see scripts/fuzz_codec.sh) reaches the block decoders.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nccl_zip_codec::{decompress, frame_info};

fuzz_target!(|data: &[u8]| {
    let (cap, frame) = match data {
        [a, b, rest @ ..] => ((((*a as usize) << 8) | *b as usize) * 32, rest),
        _ => (0, data),
    };
    let _ = frame_info(frame);
    let mut out = vec![0u8; cap];
    if let Ok(n) = decompress(frame, &mut out) {
        assert!(n <= cap);
        if let Ok(info) = frame_info(frame) {
            assert_eq!(info.raw_len, n as u64);
            assert_eq!(info.frame_len, frame.len() as u64);
        }
    }
});
