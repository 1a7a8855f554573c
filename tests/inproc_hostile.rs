//! A hostile or broken peer on the TCP data path, made by hand: whatever it sends,
//! a pending receive never hangs, never panics, and is never reported complete
//! with bytes that did not come. Each case ends with the receive's `test()`
//! failing with a remote error (`ncclRemoteError`), except a message larger than
//! the posted buffer, which docs/PROTOCOL.md §3 makes an invalid usage naming both
//! sizes. The peer keeps every stream open unless the case is about closing, so a
//! failure comes from the rule it breaks, not from the close.
//!
//! Most cases feed the streams' receive machines (`transport::tcp::stream`)
//! directly, through `stream_util::Rx`: no sockets, no threads, no deadline; the
//! receive must have failed as soon as the bytes are in. A few (`e2e_*`) run the
//! same rules through a real receive comm over loopback sockets (I/O threads, and
//! the inline stream read by `test`), where a panic in an I/O thread would surface
//! as an internal error, so the exact error variant checked also proves there was
//! none.
//!
//! The receiver decodes compressed chunks whatever its own setting (on the
//! chunk's flag alone), which the positive controls show (the real comm runs
//! with NCCL_ZIP_COMPRESS=off).

mod inproc_util;
mod stream_util;

use std::io::Write;
use std::net::Shutdown;

use inproc_util::{bf16_gaussian, hdr, post, raw_peer, wait};
use nccl_net_zip::error::Error;
use nccl_net_zip::proto::wire::{ChunkHeader, FLAG_COMPRESSED};
use nccl_zip_codec::{compress, frame_info, max_compressed_size, EncodeOptions};
use stream_util::{test, Rx, INLINE, MAX_CHUNK};

fn setup() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "off");
}

/// The peer writes chunk header `h` and `payload` on stream `st`.
fn send(rx: &mut Rx, st: usize, h: ChunkHeader, payload: &[u8]) {
    rx.feed(st, &h.encode());
    rx.feed(st, payload);
}

/// Message `seq`, `payload` whole, as one raw chunk on stream `st`.
fn send_raw(rx: &mut Rx, st: usize, seq: u64, payload: &[u8]) {
    let n = payload.len();
    send(rx, st, hdr(0, seq, n, 0, n, n), payload);
}

/// Message `seq` of `total` bytes: the chunk at `offset`, compressed as `frame`
/// (which decodes to `raw_len` bytes if it is valid), on stream `st`.
fn send_frame(
    rx: &mut Rx,
    st: usize,
    seq: u64,
    total: usize,
    offset: usize,
    raw_len: usize,
    frame: &[u8],
) {
    let h = hdr(FLAG_COMPRESSED, seq, total, offset, raw_len, frame.len());
    send(rx, st, h, frame);
}

/// A valid frame of `src` that is really coded (a block frame, smaller than `src`).
fn frame_of(src: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut f, &EncodeOptions::default()).unwrap();
    f.truncate(n);
    let info = frame_info(&f).unwrap();
    assert!(
        !info.stored && n < src.len(),
        "want a coded frame: {info:?}"
    );
    f
}

/// Posts one receive of `cap` bytes, lets `peer` write on the streams (data 0,
/// data 1, inline) of a receiver fed directly, and returns how the receive ended:
/// it must have failed once the peer's bytes are in, with nothing written into
/// the buffer past what a chunk admitted for it could.
fn hostile(cap: usize, peer: impl FnOnce(&mut Rx)) -> Error {
    let mut rx = Rx::default();
    let mut buf = vec![0xEEu8; cap];
    let rq = rx.post_buf(&mut buf);
    peer(&mut rx);
    match test(rq) {
        None => panic!("the receive is still pending after the peer's last byte"),
        Some(Ok(n)) => panic!("a receive completed with {n} bytes that never came"),
        Some(Err(e)) => e,
    }
}

/// `err` is a remote error whose message contains `why`.
fn assert_remote(err: &Error, why: &str, case: &str) {
    assert!(
        matches!(err, Error::Remote(m) if m.contains(why)),
        "{case}: want a remote error about {why:?}, got {err:?}"
    );
}

#[test]
fn control_a_valid_compressed_message_is_delivered_bit_exact() {
    // 192 KiB in two compressed chunks on the two data streams, the second first.
    let msg = bf16_gaussian(7, 192 << 10, 0.02);
    let (a, b) = msg.split_at(128 << 10);
    let mut rx = Rx::default();
    let mut buf = vec![0xEEu8; 256 << 10];
    let rq = rx.post_buf(&mut buf);
    send_frame(&mut rx, 1, 0, msg.len(), a.len(), b.len(), &frame_of(b));
    assert!(test(rq).is_none(), "half a message is not a message");
    send_frame(&mut rx, 0, 0, msg.len(), 0, a.len(), &frame_of(a));
    assert_eq!(
        test(rq).unwrap().unwrap(),
        msg.len(),
        "test() reports the true size"
    );
    assert!(buf[..msg.len()] == msg[..], "the message differs");
    assert!(
        buf[msg.len()..].iter().all(|&x| x == 0xEE),
        "wrote past its end"
    );
    let n = rx
        .stats
        .chunks_compressed
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(n, 2);
}

#[test]
fn control_a_header_fed_byte_by_byte_waits_for_its_receive() {
    // Bytes arrive one at a time, before the receive is posted: the stream holds
    // them back (a socket would), and delivers once the receive is there.
    let msg: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    let mut wire = hdr(0, 0, msg.len(), 0, msg.len(), msg.len())
        .encode()
        .to_vec();
    wire.extend_from_slice(&msg);
    let mut rx = Rx::default();
    for b in &wire {
        rx.feed(0, std::slice::from_ref(b));
    }
    assert_eq!(rx.queued(0), msg.len(), "the payload waits for its receive");
    let mut buf = vec![0xEEu8; 8192];
    let rq = rx.post_buf(&mut buf);
    assert_eq!(test(rq).unwrap().unwrap(), msg.len());
    assert_eq!(&buf[..msg.len()], &msg[..]);
    assert!(rx.error().is_none());
}

#[test]
fn case01_corrupt_compressed_frames_fail_the_receive() {
    let msg = bf16_gaussian(1, 128 << 10, 0.02);
    let good = frame_of(&msg);
    let nb = frame_info(&good).unwrap().blocks as usize;
    assert_eq!(nb, 2, "two 64 KiB blocks");
    let table = 24;
    let block0 = table + 4 * nb;
    assert_eq!(
        good[block0],
        nccl_zip_codec::format::MODE_BF16,
        "block 0 is coded"
    );
    let seg_len = block0 + 4; // u16 per segment after the block's 4-byte header
    let add_u32 = |f: &mut Vec<u8>, at: usize, d: i32| {
        let v = u32::from_le_bytes(f[at..at + 4].try_into().unwrap());
        f[at..at + 4].copy_from_slice(&v.wrapping_add_signed(d).to_le_bytes());
    };
    let add_u16 = |f: &mut Vec<u8>, at: usize, d: i16| {
        let v = u16::from_le_bytes(f[at..at + 2].try_into().unwrap());
        f[at..at + 2].copy_from_slice(&v.wrapping_add_signed(d).to_le_bytes());
    };
    // (what, frame, the chunk's raw_len)
    let mut cases: Vec<(&str, Vec<u8>, usize)> = Vec::new();
    let mut f = good.clone();
    f[0] ^= 0xFF;
    cases.push(("bad magic", f, msg.len()));
    let mut f = good.clone();
    f[20] ^= 0x01;
    cases.push(("bad header CRC", f, msg.len()));
    let mut f = good.clone();
    f[9] ^= 0x01; // raw_len in the header, CRC left as it was
    cases.push(("header raw_len changed", f, msg.len()));
    let mut f = good.clone();
    add_u32(&mut f, table, 1);
    cases.push(("block table entry + 1", f, msg.len()));
    let mut f = good.clone();
    add_u32(&mut f, table, 1);
    add_u32(&mut f, table + 4, -1); // the frame length still adds up
    cases.push(("block table entries moved by 1", f, msg.len()));
    let mut f = good.clone();
    add_u16(&mut f, seg_len, 1);
    add_u16(&mut f, seg_len + 2, -1); // the block length still adds up
    cases.push(("segment lengths moved by 1", f, msg.len()));
    let mut f = good.clone();
    add_u16(&mut f, seg_len, -1);
    cases.push(("segment length - 1", f, msg.len()));
    let mut f = good.clone();
    f.truncate(good.len() - 100);
    cases.push(("truncated, wire_len says so", f, msg.len()));
    let mut f = good.clone();
    f.truncate(10);
    cases.push(("truncated inside the header", f, msg.len()));
    // Valid frames of another length than the chunk's raw_len.
    cases.push((
        "frame longer than the chunk",
        good.clone(),
        msg.len() - 4096,
    ));
    cases.push((
        "frame shorter than the chunk",
        frame_of(&msg[..msg.len() - 4096]),
        msg.len(),
    ));
    for (what, frame, raw_len) in cases {
        let err = hostile(256 << 10, |s| {
            send_frame(s, 0, 0, raw_len, 0, raw_len, &frame);
        });
        assert_remote(&err, "corrupt compressed chunk", what);
    }
}

#[test]
fn case02_chunk_past_the_end_of_its_message() {
    let err = hostile(4096, |s| {
        send(s, 0, hdr(0, 0, 100, 64, 64, 64), &[7; 64]);
    });
    assert_remote(
        &err,
        "chunk past the end of its message",
        "offset + raw_len > size",
    );
}

#[test]
fn case03_compressed_chunk_larger_than_the_bound() {
    let bound = max_compressed_size(MAX_CHUNK);
    let err = hostile(MAX_CHUNK, |s| {
        // The header alone must be refused: nothing of the payload is sent.
        send(
            s,
            0,
            hdr(FLAG_COMPRESSED, 0, MAX_CHUNK, 0, MAX_CHUNK, bound + 1),
            &[],
        );
    });
    assert_remote(
        &err,
        "compressed chunk larger than any we send",
        "wire_len > bound",
    );
}

#[test]
fn case04_raw_chunk_whose_wire_length_differs() {
    for (what, wire_len) in [("wire_len > raw_len", 65), ("wire_len < raw_len", 63)] {
        let err = hostile(4096, |s| {
            send(s, 0, hdr(0, 0, 64, 0, 64, wire_len), &vec![1; wire_len]);
        });
        assert_remote(&err, "raw chunk whose wire length differs", what);
    }
}

#[test]
fn case05_chunks_of_one_message_state_different_sizes() {
    let err = hostile(4096, |s| {
        send(s, 0, hdr(0, 0, 200, 0, 100, 100), &[1; 100]);
        send(s, 1, hdr(0, 0, 150, 100, 50, 50), &[2; 50]);
    });
    assert_remote(&err, "message size 150 after 200", "two totals");
}

#[test]
fn case06_a_sequence_number_already_completed() {
    let mut rx = Rx::default();
    let m0: Vec<u8> = (0..100u8).collect();
    let mut b0 = vec![0xEEu8; 256];
    let mut b1 = vec![0xEEu8; 256];
    let rq0 = rx.post_buf(&mut b0);
    send_raw(&mut rx, 0, 0, &m0);
    assert_eq!(test(rq0).unwrap().unwrap(), m0.len());
    assert_eq!(&b0[..m0.len()], &m0[..]);
    let rq1 = rx.post_buf(&mut b1);
    send_raw(&mut rx, 1, 0, &[9; 100]); // message 0 again
    let err = test(rq1)
        .expect("the receive is still pending")
        .expect_err("a receive completed with a replayed message");
    assert_remote(
        &err,
        "chunk for message 0, which is not expected",
        "replayed seq",
    );
    assert!(
        b1.iter().all(|&x| x == 0xEE),
        "the replay landed in receive 1"
    );
    assert_eq!(&b0[..m0.len()], &m0[..], "the replay overwrote receive 0");
}

#[test]
fn case07_chunk_header_with_bad_magic() {
    let err = hostile(4096, |s| {
        let mut h = hdr(0, 0, 64, 0, 64, 64).encode();
        h[0] ^= 0xFF;
        s.feed(0, &h);
        s.feed(0, &[3; 64]);
    });
    assert_remote(&err, "bad chunk magic", "bad magic");
}

#[test]
fn case08_peer_closes_part_way_through_a_chunk() {
    // Half a raw payload on a data stream, then that stream (only) is closed.
    let err = hostile(4096, |s| {
        s.feed(0, &hdr(0, 0, 1000, 0, 1000, 1000).encode());
        s.feed(0, &[5; 500]);
        s.shutdown(0);
    });
    assert_remote(
        &err,
        "closed the connection mid-message",
        "half a raw payload",
    );
    // Half a compressed frame.
    let frame = frame_of(&bf16_gaussian(3, 64 << 10, 0.02));
    let err = hostile(64 << 10, |s| {
        let h = hdr(FLAG_COMPRESSED, 0, 64 << 10, 0, 64 << 10, frame.len());
        s.feed(1, &h.encode());
        s.feed(1, &frame[..frame.len() / 2]);
        s.shutdown(1);
    });
    assert_remote(&err, "closed the connection mid-message", "half a frame");
    // Half a chunk header.
    let err = hostile(4096, |s| {
        s.feed(0, &hdr(0, 0, 64, 0, 64, 64).encode()[..16]);
        s.shutdown(0);
    });
    assert_remote(&err, "closed the connection mid-message", "half a header");
    // Half an inline message.
    let err = hostile(4096, |s| {
        s.feed(INLINE, &hdr(0, 0, 1000, 0, 1000, 1000).encode());
        s.feed(INLINE, &[5; 500]);
        s.shutdown(INLINE);
    });
    assert_remote(
        &err,
        "closed the connection mid-message",
        "half an inline payload",
    );
}

#[test]
fn case09_inline_stream_gets_what_only_data_streams_carry() {
    let msg = bf16_gaussian(9, 64 << 10, 0.02);
    let frame = frame_of(&msg);
    let err = hostile(64 << 10, |s| {
        send_frame(s, INLINE, 0, msg.len(), 0, msg.len(), &frame);
    });
    assert_remote(&err, "is not one raw chunk", "compressed inline chunk");
    let err = hostile(4096, |s| {
        // One raw chunk of a 200-byte message, but not the whole of it.
        send(s, INLINE, hdr(0, 0, 200, 0, 100, 100), &[1; 100]);
    });
    assert_remote(&err, "is not one raw chunk", "partial inline chunk");
    let err = hostile(2 * MAX_CHUNK, |s| {
        // Refused on its header: the payload never needs to come.
        let n = MAX_CHUNK + 1;
        send(s, INLINE, hdr(0, 0, n, 0, n, n), &[]);
    });
    assert_remote(
        &err,
        "larger than the sender's chunk size",
        "inline chunk > max_chunk",
    );
}

#[test]
fn case10_message_larger_than_the_posted_receive() {
    // PROTOCOL.md §3: ncclInvalidUsage, and the error names both sizes.
    for (what, stream) in [("data stream", 0), ("inline stream", INLINE)] {
        let err = hostile(64, |s| send_raw(s, stream, 0, &[4; 100]));
        assert!(
            matches!(&err, Error::InvalidUsage(m) if m.contains("100 bytes") && m.contains("only 64 bytes")),
            "{what}: want an invalid usage naming 100 and 64 bytes, got {err:?}"
        );
    }
}

// The chunks of a message must tile it (PROTOCOL.md §3). A receive counts placed
// bytes, so before `Slot::claim` a repeated chunk completed it with bytes that
// never came, and chunks that overlap past its size left it pending for ever.

#[test]
fn case11_a_repeated_chunk_does_not_complete_the_message() {
    let err = hostile(8192, |s| {
        // 8 KiB in two 4 KiB chunks, but the first comes twice and the second never.
        send(s, 0, hdr(0, 0, 8192, 0, 4096, 4096), &[1; 4096]);
        send(s, 1, hdr(0, 0, 8192, 0, 4096, 4096), &[2; 4096]);
    });
    assert_remote(&err, "do not tile it", "repeated chunk");
    // The same with compressed chunks: the second frame repeats the first offset.
    let msg = bf16_gaussian(11, 128 << 10, 0.02);
    let (a, b) = msg.split_at(64 << 10);
    let err = hostile(128 << 10, |s| {
        send_frame(s, 0, 0, msg.len(), 0, a.len(), &frame_of(a));
        send_frame(s, 1, 0, msg.len(), 0, b.len(), &frame_of(b));
    });
    assert_remote(&err, "do not tile it", "repeated compressed chunk");
}

#[test]
fn case12_overlapping_chunks_fail_the_receive() {
    // Overlapping by 2 KiB: together more bytes than the message.
    let err = hostile(8192, |s| {
        send(s, 0, hdr(0, 0, 8192, 0, 6144, 6144), &[1; 6144]);
        send(s, 1, hdr(0, 0, 8192, 4096, 4096, 4096), &[2; 4096]);
    });
    assert_remote(&err, "add up to", "overlap past the size");
    // Overlapping by 2 KiB and leaving a 2 KiB hole: the sizes add up.
    let err = hostile(8192, |s| {
        send(s, 0, hdr(0, 0, 8192, 0, 6144, 6144), &[1; 6144]);
        send(s, 1, hdr(0, 0, 8192, 4096, 2048, 2048), &[2; 2048]);
    });
    assert_remote(&err, "do not tile it", "overlap with a hole");
    // A data-stream chunk, then the whole message on the inline stream.
    let err = hostile(8192, |s| {
        send(s, 0, hdr(0, 0, 8192, 0, 4096, 4096), &[1; 4096]);
        send_raw(s, INLINE, 0, &[2; 8192]);
    });
    assert_remote(&err, "add up to", "data chunk and inline message");
}

// The same rules through a real receive comm (sockets, I/O threads, the inline
// stream read by `test`): the error must come within 10 s, and be the same.

/// Connects a hand-made peer, posts one receive of `cap` bytes, lets `peer` write
/// on the sockets (data 0, data 1, inline), and returns how the receive ended.
fn hostile_e2e(cap: usize, peer: impl FnOnce(&mut [std::net::TcpStream])) -> Error {
    setup();
    let (r, mut socks) = raw_peer();
    let mut buf = vec![0xEEu8; cap];
    let rq = post(&r, &mut buf);
    peer(&mut socks);
    let err = wait(rq).expect_err("a receive completed with bytes that never came");
    drop(socks);
    err
}

#[test]
fn e2e_control_a_valid_compressed_message_is_delivered_bit_exact() {
    setup();
    let (r, mut socks) = raw_peer();
    let msg = bf16_gaussian(7, 192 << 10, 0.02);
    let (a, b) = msg.split_at(128 << 10);
    let mut buf = vec![0xEEu8; 256 << 10];
    let rq = post(&r, &mut buf);
    let fb = frame_of(b);
    let hb = hdr(FLAG_COMPRESSED, 0, msg.len(), a.len(), b.len(), fb.len());
    inproc_util::send(&mut socks[1], hb, &fb);
    let fa = frame_of(a);
    let ha = hdr(FLAG_COMPRESSED, 0, msg.len(), 0, a.len(), fa.len());
    inproc_util::send(&mut socks[0], ha, &fa);
    assert_eq!(wait(rq).unwrap(), msg.len());
    assert!(buf[..msg.len()] == msg[..], "the message differs");
    assert!(buf[msg.len()..].iter().all(|&x| x == 0xEE));
}

#[test]
fn e2e_peer_closes_part_way_through_a_chunk() {
    for st in [0, INLINE] {
        let err = hostile_e2e(4096, |s| {
            s[st]
                .write_all(&hdr(0, 0, 1000, 0, 1000, 1000).encode())
                .unwrap();
            s[st].write_all(&[5; 500]).unwrap();
            s[st].shutdown(Shutdown::Write).unwrap();
        });
        assert_remote(&err, "closed the connection mid-message", "half a payload");
    }
}

#[test]
fn e2e_corrupt_frame_fails_the_receive() {
    let msg = bf16_gaussian(1, 128 << 10, 0.02);
    let mut f = frame_of(&msg);
    f[20] ^= 0x01; // the header CRC
    let err = hostile_e2e(256 << 10, |s| {
        let h = hdr(FLAG_COMPRESSED, 0, msg.len(), 0, msg.len(), f.len());
        inproc_util::send(&mut s[1], h, &f);
    });
    assert_remote(&err, "corrupt compressed chunk", "bad header CRC");
}

#[test]
fn e2e_message_larger_than_the_posted_receive() {
    for (what, stream) in [("data stream", 0), ("inline stream", INLINE)] {
        let err = hostile_e2e(64, |s| inproc_util::send_raw(&mut s[stream], 0, &[4; 100]));
        assert!(
            matches!(&err, Error::InvalidUsage(m) if m.contains("100 bytes") && m.contains("only 64 bytes")),
            "{what}: want an invalid usage naming 100 and 64 bytes, got {err:?}"
        );
    }
}
