//! A peer that closes part-way: each stream delivers its chunks in message order, so
//! once every stream that has not ended holds the header of a later message than a
//! pending receive, that receive can never complete and must fail, even though not
//! every stream has ended. Messages that did arrive before the close must still be
//! delivered, whole.

mod inproc_util;

use std::time::Duration;

use inproc_util::{post, raw_peer, send_raw, wait};
use nccl_net_zip::error::Error;
use nccl_net_zip::proto::slots::Slot;

fn setup() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "off");
}

/// `rq` fails (at most 10 s later) with a remote error, never completes.
fn assert_remote_failure(rq: &Slot) {
    let err = wait(rq).expect_err("a receive completed with bytes that never came");
    assert!(
        matches!(err, Error::Remote(_)),
        "want a remote error, got {err}"
    );
}

#[test]
fn peer_that_closes_with_a_later_message_on_a_data_stream_fails_the_receive() {
    setup();
    let (r, mut socks) = raw_peer();
    let mut b = vec![0u8; 64];
    let rq = post(&r, &mut b);
    // Message 1 arrives on data stream 0, whose thread now holds its header until a
    // receive for it is posted; message 0 was to come on data stream 1.
    send_raw(&mut socks[0], 1, &[1, 2, 3, 4]);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rq.test().unwrap(), None);
    drop(socks); // the peer dies, cleanly closing every stream
    assert_remote_failure(rq);
}

#[test]
fn stall_is_found_while_the_inline_stream_also_waits() {
    setup();
    let (r, mut socks) = raw_peer();
    let mut b = vec![0u8; 64];
    let rq = post(&r, &mut b);
    send_raw(&mut socks[0], 1, &[1; 8]);
    send_raw(&mut socks[2], 2, &[2; 8]); // the inline stream
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rq.test().unwrap(), None, "message 0 is still to come");
    // Only data stream 1 ends. The other two are open but hold later messages.
    let s1 = socks.remove(1);
    drop(s1);
    assert_remote_failure(rq);
    drop(socks);
}

#[test]
fn messages_that_arrived_before_the_close_are_delivered() {
    setup();
    let (r, mut socks) = raw_peer();
    let m: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 100 + i as usize]).collect();
    let mut bufs = vec![vec![0u8; 256]; 4];
    let rq0 = post(&r, &mut bufs[0]);
    // Message 1 waits on stream 0 and message 2 on the inline stream before message
    // 0 (stream 1) is done; then the peer closes everything.
    send_raw(&mut socks[0], 1, &m[1]);
    send_raw(&mut socks[2], 2, &m[2]);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(rq0.test().unwrap(), None);
    send_raw(&mut socks[1], 0, &m[0]);
    drop(socks);
    assert_eq!(wait(rq0).unwrap(), m[0].len());
    let (b0, rest) = bufs.split_at_mut(1);
    assert_eq!(&b0[0][..m[0].len()], &m[0][..]);
    // Wait for every stream to see the close before the later receives are posted.
    std::thread::sleep(Duration::from_millis(100));
    let rq1 = post(&r, &mut rest[0]);
    assert_eq!(wait(rq1).unwrap(), m[1].len());
    let rq2 = post(&r, &mut rest[1]);
    assert_eq!(wait(rq2).unwrap(), m[2].len());
    assert_eq!(&rest[0][..m[1].len()], &m[1][..]);
    assert_eq!(&rest[1][..m[2].len()], &m[2][..]);
    // Nothing more can come: the next receive fails, at once or on test.
    let err = match r.irecv(rest[2].as_mut_ptr(), 256, None) {
        Err(e) => e,
        Ok(Some(rq3)) => wait(rq3).expect_err("a receive completed after the peer closed"),
        Ok(None) => panic!("no free slot"),
    };
    assert!(
        matches!(err, Error::Remote(_)),
        "want a remote error, got {err}"
    );
}
