//! The decoder on arbitrary bytes: must return Ok or Err, never panic or touch
//! memory out of bounds. The first two bytes pick the destination size, so
//! `DstTooSmall` and exact-size paths are both exercised. A frame produced by
//! mutating valid seeds (see scripts/fuzz_codec.sh) reaches the block decoders.
//! A `Decoder` that lives across inputs (its cached tables from earlier ones) must
//! answer exactly as `decompress` does.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nccl_zip_codec::{decompress, frame_info, Decoder};
use std::cell::RefCell;

thread_local! {
    static DECODER: RefCell<Decoder> = RefCell::new(Decoder::new());
}

fuzz_target!(|data: &[u8]| {
    let (cap, frame) = match data {
        [a, b, rest @ ..] => ((((*a as usize) << 8) | *b as usize) * 32, rest),
        _ => (0, data),
    };
    let _ = frame_info(frame);
    let mut out = vec![0u8; cap];
    let mut out2 = vec![0u8; cap];
    let r = decompress(frame, &mut out);
    let r2 = DECODER.with(|d| d.borrow_mut().decompress(frame, &mut out2));
    assert_eq!(r, r2);
    if let Ok(n) = r {
        assert!(out[..n] == out2[..n]);
        assert!(n <= cap);
        if let Ok(info) = frame_info(frame) {
            assert_eq!(info.raw_len, n as u64);
            assert_eq!(info.frame_len, frame.len() as u64);
        }
    }
});
