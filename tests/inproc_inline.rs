//! The inline stream (`transport::tcp::inline`): small raw messages written by
//! `isend` and read by `test` on NCCL's thread. Here "small" is raised to 2 MiB so
//! that eight messages in flight are far more than the sockets buffer: writes stop
//! part-way, headers arrive before their receive is posted, payloads arrive in
//! pieces, and every one of those states must resume on a later call.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{pair, pattern, transfer_and_check};
use nccl_net_zip::proto::slots::Slot;

const INLINE_MAX: usize = 2 << 20;

fn setup() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "off");
    std::env::set_var("NCCL_ZIP_CHUNK_SIZE", "4M");
    std::env::set_var("NCCL_ZIP_INLINE_MAX", INLINE_MAX.to_string());
}

#[test]
fn inline_messages_beyond_the_socket_buffers_resume_and_arrive_whole() {
    setup();
    let (s, r) = pair();
    // Eight messages of up to 2 MiB (16 MiB in all), sent before any receive is
    // posted: the socket must refuse part of them.
    let sizes = [
        INLINE_MAX,
        INLINE_MAX - 1,
        0,
        1,
        INLINE_MAX,
        4097,
        INLINE_MAX - 7,
        INLINE_MAX,
    ];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(7 + i as u64, n))
        .collect();
    let inline0 = s.stats().chunks_inline.load(Relaxed);
    let sends: Vec<*const Slot> = msgs
        .iter()
        .map(|m| s.isend(m.as_ptr(), m.len(), None).unwrap().expect("slot") as *const Slot)
        .collect();
    // SAFETY: slots live in the comm's ring, which outlives this test body.
    let sends: Vec<&Slot> = sends.iter().map(|p| unsafe { &**p }).collect();
    let mut sent = vec![None; sends.len()];
    for (i, q) in sends.iter().enumerate() {
        sent[i] = q.test().unwrap();
    }
    assert!(
        sent.iter().any(Option::is_none),
        "16 MiB with no reader must not all fit in the socket buffers"
    );
    // All receives posted at once (the first post already reads the first message
    // and then a header whose receive is not posted yet), then tested in order
    // while the sends are tested too: the reader catches up with the writer and
    // must stop, and resume, in the middle of a payload.
    let mut bufs: Vec<Vec<u8>> = sizes
        .iter()
        .map(|_| vec![0xEEu8; INLINE_MAX + 16])
        .collect();
    let recvs: Vec<&Slot> = bufs
        .iter_mut()
        .map(|b| {
            let q = r
                .irecv(b.as_mut_ptr(), b.len(), None)
                .unwrap()
                .expect("slot");
            // SAFETY: as for the sends.
            unsafe { &*(q as *const Slot) }
        })
        .collect();
    let t0 = std::time::Instant::now();
    for (i, rq) in recvs.iter().enumerate() {
        let got = loop {
            // The sender's progress runs only when it is called: as NCCL does,
            // keep testing the pending sends while waiting for the receive.
            for (k, q) in sends.iter().enumerate() {
                if sent[k].is_none() {
                    sent[k] = q.test().unwrap();
                }
            }
            if let Some(n) = rq.test().unwrap() {
                break n;
            }
            assert!(t0.elapsed().as_secs() < 60, "receive {i} stuck");
        };
        let b = &bufs[i];
        assert_eq!(got, sizes[i], "message {i}: reported size");
        assert!(b[..got] == msgs[i][..], "message {i} differs");
        assert!(
            b[got..].iter().all(|&x| x == 0xEE),
            "message {i} wrote past its end"
        );
    }
    for (k, q) in sends.iter().enumerate() {
        while sent[k].is_none() {
            sent[k] = q.test().unwrap();
            assert!(t0.elapsed().as_secs() < 60, "send {k} stuck");
        }
        assert_eq!(sent[k], Some(sizes[k]));
    }
    assert_eq!(
        s.stats().chunks_inline.load(Relaxed) - inline0,
        sizes.len() as u64,
        "every message was within NCCL_ZIP_INLINE_MAX and raw: all go inline"
    );
    assert_eq!(
        r.stats().chunks_inline.load(Relaxed),
        s.stats().chunks_inline.load(Relaxed)
    );
}

#[test]
fn inline_and_threaded_messages_interleave_bit_exact() {
    setup();
    let (s, r) = pair();
    // Around the inline limit: at most INLINE_MAX inline, above it the I/O threads
    // (several chunks over several streams), in every order.
    let sizes = [
        0usize,
        INLINE_MAX + 1,
        5,
        3 << 20,
        INLINE_MAX,
        65536,
        4 << 20,
        1,
        INLINE_MAX - 1,
        (3 << 20) + 3,
        777,
    ];
    let msgs: Vec<Vec<u8>> = (0..3)
        .flat_map(|round| {
            sizes
                .iter()
                .enumerate()
                .map(move |(i, &n)| pattern(1000 * round + i as u64, n))
        })
        .collect();
    let (si, ri) = (
        s.stats().chunks_inline.load(Relaxed),
        r.stats().chunks_inline.load(Relaxed),
    );
    transfer_and_check(&s, &r, &msgs, 4 << 20);
    let want = msgs.iter().filter(|m| m.len() <= INLINE_MAX).count() as u64;
    assert_eq!(s.stats().chunks_inline.load(Relaxed) - si, want);
    assert_eq!(r.stats().chunks_inline.load(Relaxed) - ri, want);
}
