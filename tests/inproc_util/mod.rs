//! Shared by the in-process test binaries (each binary has its own environment,
//! because the plugin reads its configuration once per process).
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_net_zip::error::Error;
use nccl_net_zip::gpu::Backend;
use nccl_net_zip::plugin;
use nccl_net_zip::proto::slots::Slot;
use nccl_net_zip::proto::wire::ChunkHeader;
use nccl_net_zip::proto::wire::HANDLE_SIZE;
use nccl_net_zip::transport::tcp::{RecvComm, SendComm};

pub fn pair() -> (SendComm, RecvComm) {
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let p = plugin::try_init().unwrap();
    let mut handle = [0u8; HANDLE_SIZE];
    let mut l = p.listen(0, &mut handle).unwrap();
    let (mut s, mut r) = (None, None);
    for _ in 0..100_000 {
        if s.is_none() {
            s = p.connect(0, &mut handle).unwrap();
        }
        if r.is_none() {
            r = plugin::accept(&mut l).unwrap();
        }
        match (s, r) {
            (Some(sc), Some(rc)) => return (sc, rc),
            (a, b) => (s, r) = (a, b),
        }
        std::thread::yield_now();
    }
    panic!("connect/accept did not finish");
}

/// A peer made by hand: the data streams and the inline stream of one connection.
pub fn raw_peer() -> (
    nccl_net_zip::transport::tcp::RecvComm,
    Vec<std::net::TcpStream>,
) {
    use nccl_net_zip::plugin;
    use nccl_net_zip::proto::wire::{Handle, Hello, HANDLE_SIZE};
    use std::io::Write;
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let p = plugin::try_init().unwrap();
    let mut handle = [0u8; HANDLE_SIZE];
    let mut l = p.listen(0, &mut handle).unwrap();
    let h = Handle::decode(&handle).unwrap();
    let n = 3u16; // two data streams, then the inline stream
    let conn_id: u64 = 0x5EED;
    let socks: Vec<std::net::TcpStream> = (0..n)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(h.addr).unwrap();
            let hello = Hello {
                secret: h.secret,
                conn_id,
                stream: i,
                nstreams: n,
                max_chunk: 1 << 20,
            };
            s.write_all(&hello.encode()).unwrap();
            s
        })
        .collect();
    let t0 = std::time::Instant::now();
    let r = loop {
        if let Some(r) = plugin::accept(&mut l).unwrap() {
            break r;
        }
        assert!(t0.elapsed().as_secs() < 10, "accept did not finish");
    };
    // As a real sender does: write on a data stream only once the receiver has
    // attached it (its one-byte acknowledgement).
    for s in &socks[..n as usize - 1] {
        wait_stream_ack(s);
    }
    (r, socks)
}

/// Reads the receiver's acknowledgement of a data stream (protocol v4).
pub fn wait_stream_ack(mut s: &std::net::TcpStream) {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).expect("data stream acknowledged");
    assert_eq!(b[0], nccl_net_zip::transport::tcp::STREAM_ACK);
    s.set_read_timeout(None).unwrap();
}

pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Deterministic Gaussian-ish bf16 values (sum of uniforms), `n` bytes.
pub fn bf16_gaussian(seed: u64, n: usize, sigma: f32) -> Vec<u8> {
    let u = pattern(seed, n * 2);
    let mut out = Vec::with_capacity(n + 1);
    for c in u.chunks(4) {
        let s: f32 = c.iter().map(|&b| b as f32 / 255.0 - 0.5).sum::<f32>() * 1.7 * sigma;
        out.extend_from_slice(&((s.to_bits() >> 16) as u16).to_le_bytes());
        if out.len() >= n {
            break;
        }
    }
    out.truncate(n);
    out
}

/// For each size: Gaussian bf16, a byte pattern, and zeros (seeded by position).
pub fn mixed_messages(sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut msgs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        msgs.push(bf16_gaussian(i as u64, n, 0.02));
        msgs.push(pattern(100 + i as u64, n));
        msgs.push(vec![0u8; n]);
    }
    msgs
}

/// Sends every message and receives it into a fresh buffer, 8 in flight, tests in
/// posting order, and checks bytes and reported sizes.
pub fn transfer_and_check(s: &SendComm, r: &RecvComm, msgs: &[Vec<u8>], cap: usize) {
    transfer_and_check_on(s, r, msgs, cap, None, None)
}

/// [`transfer_and_check`] with the send and receive buffers registered as device
/// memory of `sdev` / `rdev` (`None`: host memory).
pub fn transfer_and_check_on(
    s: &SendComm,
    r: &RecvComm,
    msgs: &[Vec<u8>],
    cap: usize,
    sdev: Option<Arc<dyn Backend>>,
    rdev: Option<Arc<dyn Backend>>,
) {
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|_| vec![0xEEu8; cap]).collect();
    for (w, window) in msgs.chunks(8).enumerate() {
        let mut reqs: Vec<(*const Slot, *const Slot)> = Vec::new();
        for (k, m) in window.iter().enumerate() {
            let rb = bufs[w * 8 + k].as_mut_ptr();
            let rq = r.irecv(rb, cap, rdev.clone()).unwrap().expect("slot") as *const Slot;
            let sq = s
                .isend(m.as_ptr(), m.len(), sdev.clone())
                .unwrap()
                .expect("slot") as *const Slot;
            reqs.push((sq, rq));
        }
        for (k, (sq, rq)) in reqs.iter().enumerate() {
            let i = w * 8 + k;
            let (sq, rq) = unsafe { (&**sq, &**rq) };
            let t0 = std::time::Instant::now();
            let sent = loop {
                if let Some(n) = sq.test().unwrap() {
                    break n;
                }
                assert!(t0.elapsed().as_secs() < 30, "send {i} stuck");
            };
            let got = loop {
                if let Some(n) = rq.test().unwrap() {
                    break n;
                }
                assert!(t0.elapsed().as_secs() < 30, "recv {i} stuck");
            };
            assert_eq!(sent, msgs[i].len());
            assert_eq!(got, msgs[i].len(), "test() must report the true size");
            assert!(
                bufs[i][..got] == msgs[i][..],
                "message {i} ({} bytes) differs",
                got
            );
            assert!(
                bufs[i][got..].iter().all(|&b| b == 0xEE),
                "message {i} wrote past its end"
            );
        }
    }
}

/// A chunk header.
pub fn hdr(
    flags: u16,
    seq: u64,
    total: usize,
    offset: usize,
    raw_len: usize,
    wire_len: usize,
) -> ChunkHeader {
    ChunkHeader {
        flags,
        seq,
        total: total as u32,
        offset: offset as u32,
        raw_len: raw_len as u32,
        wire_len: wire_len as u32,
    }
}

/// Writes a chunk header and `payload` on `sock`.
pub fn send(sock: &mut TcpStream, h: ChunkHeader, payload: &[u8]) {
    sock.write_all(&h.encode()).unwrap();
    sock.write_all(payload).unwrap();
}

/// Message `seq`, `payload` whole, as one raw chunk.
pub fn send_raw(sock: &mut TcpStream, seq: u64, payload: &[u8]) {
    let n = payload.len();
    send(sock, hdr(0, seq, n, 0, n, n), payload);
}

pub fn post<'a>(r: &'a RecvComm, buf: &mut [u8]) -> &'a Slot {
    r.irecv(buf.as_mut_ptr(), buf.len(), None)
        .unwrap()
        .expect("a free slot")
}

/// Tests `rq` until it is no longer pending (at most 10 s).
pub fn wait(rq: &Slot) -> Result<usize, Error> {
    let t0 = Instant::now();
    loop {
        match rq.test() {
            Ok(None) => {}
            Ok(Some(n)) => return Ok(n),
            Err(e) => return Err(e),
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the receive hangs");
        std::thread::yield_now();
    }
}
