//! Blocking writers (issue 20, `transport::tcp::workers`): a send stream whose
//! socket fills with bulk bytes left is lent to a blocking writer, whose sends
//! wait at most the socket's send timeout. A receiver that stops taking bytes
//! must not keep a writer or the comm: the send stays pending, closing the comm
//! with it in flight returns at once, and the writers then carry the next comm's
//! traffic. One test in its own binary: it reads the process-wide `HELD`.

mod inproc_util;

use std::time::{Duration, Instant};

use inproc_util::{pair, pattern, transfer_and_check};
use nccl_net_zip::proto::slots::Slot;
use nccl_net_zip::stats::HELD;

#[test]
fn a_receiver_that_takes_nothing_holds_no_writer_and_close_is_prompt() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "off");
    let (s, r) = pair();
    // 64 MiB and no receive posted: the receiver reads the first chunk's header
    // and holds the rest back, so the sender's sockets fill with bulk bytes left.
    let big = pattern(9, 64 << 20);
    let sq: *const Slot = s.isend(big.as_ptr(), big.len(), None).unwrap().unwrap();
    // SAFETY: the slot is in the send comm's ring, alive until `s` is dropped.
    let sq = unsafe { &*sq };
    let t0 = Instant::now();
    while HELD.io_writers.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no stream was lent to a blocking writer: {}",
            HELD.summary()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Long enough for lent sends to time out and for the streams to back off.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        sq.test().unwrap(),
        None,
        "a 64 MiB send completed with no receive posted"
    );
    let t = Instant::now();
    drop(s);
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "closing a send comm whose streams were lent took {took:?}"
    );
    drop(r);

    // The writers carry the next comm's bulk traffic.
    let (s, r) = pair();
    let msgs: Vec<Vec<u8>> = (0..4).map(|i| pattern(i, 16 << 20)).collect();
    transfer_and_check(&s, &r, &msgs, 16 << 20);
    println!("close with lent streams: {took:?}; {}", HELD.summary());
}
