//! The process's buffer budget (issue 20, `crate::budget`) on the TCP path: with
//! `NCCL_ZIP_BUFFER_MB=0` no stream may take compression staging, so even with
//! `NCCL_ZIP_COMPRESS=on` every chunk goes raw, bit-exact, and the refusals are
//! counted; nothing waits.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{mixed_messages, pair, transfer_and_check};

#[test]
fn a_spent_budget_sends_raw_and_delivers_everything() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "on");
    std::env::set_var("NCCL_ZIP_BUFFER_MB", "0");
    let (s, r) = pair();
    let msgs = mixed_messages(&[0usize, 4097, 65536, 524288 + 3, 1 << 20, 4 << 20]);
    transfer_and_check(&s, &r, &msgs, 4 << 20);
    let (ss, rs) = (s.stats(), r.stats());
    assert_eq!(
        rs.chunks_compressed.load(Relaxed),
        0,
        "compressed without budget: {}",
        rs.summary()
    );
    assert!(
        ss.budget_refusals.load(Relaxed) > 0,
        "no refusal counted: {}",
        ss.summary()
    );
    assert_eq!(rs.wire_bytes.load(Relaxed), rs.raw_bytes.load(Relaxed));
    assert_eq!(nccl_net_zip::budget::BUFFERS.used(), 0);
}
