//! The process's buffer budget (issue 20, `crate::budget`) on the TCP receive
//! side: a receiver's staging for a compressed chunk comes from the budget, for
//! that chunk only. When the budget is spent the stream stops before the
//! chunk's payload (its own socket holds the bytes back), the other streams go
//! on, and once budget comes back the chunk is delivered bit-exact; nothing is
//! lost, nothing waits on another comm. A chunk larger than the receivers'
//! reserve goes on outside the budget rather than wait.
//!
//! Its own binary: the tests hold the process-wide budget, which any other test
//! running beside them would see. They take a lock so as not to see each other.

mod inproc_util;
mod stream_util;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use inproc_util::{bf16_gaussian, hdr, mixed_messages, pair, transfer_and_check};
use nccl_net_zip::budget::{receiver_reserve, BUFFERS};
use nccl_net_zip::proto::wire::FLAG_COMPRESSED;
use nccl_zip_codec::{compress, max_compressed_size, EncodeOptions};
use stream_util::{test, Rx, MAX_CHUNK};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn frame_of(src: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut f, &EncodeOptions::default()).unwrap();
    f.truncate(n);
    assert!(n < src.len(), "want a coded frame");
    f
}

#[test]
fn a_spent_budget_holds_back_one_stream_and_loses_nothing() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cap: u64 = 64 << 20;
    // The test holds all of the budget but 1 KiB.
    let hold = BUFFERS.reserve(cap - BUFFERS.used() - 1024, cap).unwrap();
    let mut rx = Rx::with_budget(MAX_CHUNK, cap);

    // Message 0: one compressed chunk on data stream 0.
    let m0 = bf16_gaussian(3, 100_001, 0.02);
    let f0 = frame_of(&m0);
    assert!(f0.len() as u64 <= receiver_reserve(cap));
    // Message 1: raw, on data stream 1.
    let m1 = inproc_util::pattern(5, 4097);
    let mut b0 = vec![0xEEu8; m0.len()];
    let mut b1 = vec![0xEEu8; m1.len()];
    let r0 = rx.post_buf(&mut b0);
    let r1 = rx.post_buf(&mut b1);
    let n0 = m0.len();
    rx.feed(0, &hdr(FLAG_COMPRESSED, 0, n0, 0, n0, f0.len()).encode());
    rx.feed(0, &f0);
    assert!(test(r0).is_none(), "delivered without staging");
    // The header was taken, the payload waits in the "socket".
    assert_eq!(
        rx.queued(0),
        f0.len(),
        "the stream did not stop at the payload"
    );
    assert!(rx.stats.budget_refusals.load(Relaxed) > 0);
    // Another stream is not held back.
    let n1 = m1.len();
    rx.feed(1, &hdr(0, 1, n1, 0, n1, n1).encode());
    rx.feed(1, &m1);
    assert_eq!(test(r1).unwrap().unwrap(), n1);
    assert!(b1 == m1);
    // Budget comes back: the stream goes on.
    drop(hold);
    rx.pump();
    assert_eq!(test(r0).unwrap().unwrap(), n0);
    assert!(b0 == m0, "message 0 differs");
    assert_eq!(rx.stats.chunks_compressed.load(Relaxed), 1);
    // The staging went back with the chunk.
    assert_eq!(BUFFERS.used(), 0);
    assert_eq!(rx.stats.staging_bytes.load(Relaxed), 0);
    assert!(rx.error().is_none());
}

#[test]
fn a_chunk_larger_than_the_receivers_reserve_goes_on_outside_the_budget() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A budget of 64 KiB: its reserve (8 KiB) holds no real chunk.
    let cap: u64 = 64 << 10;
    let hold = BUFFERS.reserve(cap, cap).unwrap();
    let mut rx = Rx::with_budget(MAX_CHUNK, cap);
    let m = bf16_gaussian(9, 65_537, 0.02);
    let f = frame_of(&m);
    assert!(f.len() as u64 > receiver_reserve(cap));
    let mut b = vec![0xEEu8; m.len()];
    let r = rx.post_buf(&mut b);
    let n = m.len();
    rx.feed(0, &hdr(FLAG_COMPRESSED, 0, n, 0, n, f.len()).encode());
    rx.feed(0, &f);
    assert_eq!(
        test(r).unwrap().unwrap(),
        n,
        "waited on a budget it may never get"
    );
    assert!(b == m);
    drop(hold);
    assert_eq!(BUFFERS.used(), 0);
}

/// A small budget, shared by the senders and receivers of one process, with
/// compression forced: every message arrives bit-exact, and the budget is all
/// back at the end.
#[test]
fn a_small_budget_shared_by_both_sides_delivers_everything() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("NCCL_ZIP_COMPRESS", "on");
    std::env::set_var("NCCL_ZIP_BUFFER_MB", "2");
    let (s, r) = pair();
    let msgs: Vec<Vec<u8>> = [4097usize, 65536, 524288 + 3, 1 << 20, 4 << 20, 0, 1]
        .iter()
        .enumerate()
        .map(|(i, &n)| bf16_gaussian(i as u64, n, 0.02))
        .chain(mixed_messages(&[3 << 20, 777]))
        .collect();
    transfer_and_check(&s, &r, &msgs, 4 << 20);
    let rs = r.stats();
    assert!(
        rs.chunks_compressed.load(Relaxed) > 0,
        "nothing compressed: {}",
        rs.summary()
    );
    drop((s, r));
    assert_eq!(BUFFERS.used(), 0);
}
