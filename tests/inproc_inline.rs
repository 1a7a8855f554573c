//! The inline stream (`transport::tcp::inline`): small raw messages written by
//! `isend` and read by `test` on NCCL's thread. Here "small" is raised to 2 MiB so
//! that eight messages in flight are far more than the sockets buffer: writes stop
//! part-way, headers arrive before their receive is posted, payloads arrive in
//! pieces, and every one of those states must resume on a later call.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{pair, pattern, raw_peer, transfer_and_check};
use nccl_net_zip::proto::slots::Slot;

const INLINE_MAX: usize = 2 << 20;

fn setup() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "off");
    std::env::set_var("NCCL_ZIP_CHUNK_SIZE", "4M");
    std::env::set_var("NCCL_ZIP_INLINE_MAX", INLINE_MAX.to_string());
}

/// Tests the receives in order until each is done, testing the pending sends all
/// along (the sender's progress runs only when it is called, as under NCCL), then
/// the sends until all are done. Returns the received sizes; `sent` gets the sends'.
fn complete_in_order(sends: &[&Slot], sent: &mut [Option<usize>], recvs: &[&Slot]) -> Vec<usize> {
    let t0 = std::time::Instant::now();
    let test_sends = |sent: &mut [Option<usize>]| {
        for (k, q) in sends.iter().enumerate() {
            if sent[k].is_none() {
                sent[k] = q.test().unwrap();
            }
        }
    };
    let mut got = Vec::new();
    for (i, rq) in recvs.iter().enumerate() {
        got.push(loop {
            test_sends(sent);
            if let Some(n) = rq.test().unwrap() {
                break n;
            }
            assert!(t0.elapsed().as_secs() < 60, "receive {i} stuck");
        });
    }
    while sent.iter().any(Option::is_none) {
        test_sends(sent);
        assert!(t0.elapsed().as_secs() < 60, "sends stuck");
    }
    got
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
    let got = complete_in_order(&sends, &mut sent, &recvs);
    for (i, &n) in got.iter().enumerate() {
        let b = &bufs[i];
        assert_eq!(n, sizes[i], "message {i}: reported size");
        assert!(b[..n] == msgs[i][..], "message {i} differs");
        assert!(
            b[n..].iter().all(|&x| x == 0xEE),
            "message {i} wrote past its end"
        );
        assert_eq!(sent[i], Some(sizes[i]));
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
    // Around the inline limit: at most INLINE_MAX always inline; above a chunk
    // (4 MiB here) always the I/O threads (several chunks over several streams); in
    // between, whichever the inline stream's backlog chose; in every order.
    let sizes = [
        0usize,
        INLINE_MAX + 1,
        5,
        3 << 20,
        INLINE_MAX,
        65536,
        (4 << 20) + 5,
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
    transfer_and_check(&s, &r, &msgs, 5 << 20);
    let small = msgs.iter().filter(|m| m.len() <= INLINE_MAX).count() as u64;
    let sent = s.stats().chunks_inline.load(Relaxed) - si;
    assert!(
        (small..=msgs.len() as u64 - 3).contains(&sent),
        "{sent} inline messages: want all {small} small ones and none above a chunk"
    );
    assert_eq!(r.stats().chunks_inline.load(Relaxed) - ri, sent);
}

#[test]
fn larger_messages_go_inline_only_while_the_inline_stream_is_idle() {
    setup();
    let (s, r) = pair();
    let big = 3 << 20; // above INLINE_MAX, within a chunk
    let inline = || s.stats().chunks_inline.load(Relaxed);
    // Alone: nothing queued on the inline stream, so it goes there.
    let i0 = inline();
    transfer_and_check(&s, &r, &[pattern(1, big)], big);
    assert_eq!(inline() - i0, 1, "a lone message up to a chunk goes inline");
    // Behind 16 MiB of inline messages that no receive has taken yet, the inline
    // socket is backed up: the same size goes to the I/O threads.
    let mut msgs: Vec<Vec<u8>> = (0..8).map(|i| pattern(10 + i, INLINE_MAX)).collect();
    msgs.push(pattern(99, big));
    let i0 = inline();
    let sends: Vec<&Slot> = msgs
        .iter()
        .map(|m| {
            let q = s.isend(m.as_ptr(), m.len(), None).unwrap().expect("slot");
            // SAFETY: slots live in the comm's ring, which outlives this test body.
            unsafe { &*(q as *const Slot) }
        })
        .collect();
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|_| vec![0xEEu8; big]).collect();
    let recvs: Vec<&Slot> = bufs
        .iter_mut()
        .map(|b| {
            let q = r.irecv(b.as_mut_ptr(), big, None).unwrap().expect("slot");
            // SAFETY: as for the sends.
            unsafe { &*(q as *const Slot) }
        })
        .collect();
    let mut sent = vec![None; sends.len()];
    let got = complete_in_order(&sends, &mut sent, &recvs);
    for (i, &n) in got.iter().enumerate() {
        assert_eq!(n, msgs[i].len());
        assert!(bufs[i][..n] == msgs[i][..], "message {i} differs");
    }
    assert_eq!(inline() - i0, 8, "only the eight small ones went inline");
}

#[test]
fn empty_message_with_a_null_buffer_goes_inline() {
    setup();
    let (s, r) = pair();
    let sq = s.isend(std::ptr::null(), 0, None).unwrap().expect("slot") as *const Slot;
    let mut b = [0xEEu8; 4];
    let rq = r.irecv(b.as_mut_ptr(), 4, None).unwrap().expect("slot") as *const Slot;
    // SAFETY: slots live in the comms' rings.
    let (sq, rq) = unsafe { (&*sq, &*rq) };
    let t0 = std::time::Instant::now();
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        if sent.is_none() {
            sent = sq.test().unwrap();
        }
        if got.is_none() {
            got = rq.test().unwrap();
        }
        assert!(t0.elapsed().as_secs() < 10, "0-byte message stuck");
    }
    assert_eq!((sent, got), (Some(0), Some(0)));
    assert_eq!(b, [0xEE; 4]);
    assert_eq!(s.stats().chunks_inline.load(Relaxed), 1);
}

#[test]
fn peer_that_dies_with_a_later_message_on_the_inline_stream_fails_the_receive() {
    use nccl_net_zip::proto::wire::ChunkHeader;
    use std::io::Write;
    setup();
    let (r, mut socks) = raw_peer();
    let mut b = vec![0u8; 64];
    let rq = r.irecv(b.as_mut_ptr(), 64, None).unwrap().expect("slot") as *const Slot;
    // SAFETY: the slot lives in the comm's ring.
    let rq = unsafe { &*rq };
    // Message 1 arrives on the inline stream; message 0, which the posted receive
    // waits for, was to come on a data stream and never will.
    let hdr = ChunkHeader {
        flags: 0,
        seq: 1,
        total: 4,
        offset: 0,
        raw_len: 4,
        wire_len: 4,
    }
    .encode();
    socks[2].write_all(&hdr).unwrap();
    socks[2].write_all(&[1, 2, 3, 4]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(rq.test().unwrap(), None);
    drop(socks); // the peer dies, cleanly closing every stream
    let t0 = std::time::Instant::now();
    let err = loop {
        match rq.test() {
            Ok(None) => {}
            Ok(Some(n)) => panic!("a receive completed with {n} bytes that never came"),
            Err(e) => break e,
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "the receive hangs after its peer closed"
        );
        std::thread::yield_now();
    };
    assert!(
        matches!(err, nccl_net_zip::error::Error::Remote(_)),
        "want a remote error, got {err}"
    );
}

#[test]
fn inline_messages_land_in_device_memory() {
    use nccl_net_zip::gpu::{backend_for, Emulation};
    setup();
    let (s, r) = pair();
    let dev = backend_for(0, Emulation::Kernels).unwrap();
    let sizes = [1usize, 4096, 65536 + 3, INLINE_MAX, 0, 777];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(500 + i as u64, n))
        .collect();
    let (i0, d0) = (
        r.stats().chunks_inline.load(Relaxed),
        r.stats().chunks_device.load(Relaxed),
    );
    inproc_util::transfer_and_check_on(&s, &r, &msgs, INLINE_MAX, None, Some(dev));
    assert_eq!(
        r.stats().chunks_inline.load(Relaxed) - i0,
        sizes.len() as u64
    );
    let nonempty = sizes.iter().filter(|&&n| n > 0).count() as u64;
    assert_eq!(r.stats().chunks_device.load(Relaxed) - d0, nonempty);
}
