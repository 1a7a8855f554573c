//! TCP data streams on demand (issue 20): a comm starts with its inline stream
//! alone; bulk traffic opens the data streams, which reach their receive comm
//! through the process's shared listener even after the listen comm is closed
//! (NCCL closes it right after accept), or wait for `accept` when they come
//! first; strangers on the shared port disturb nobody.

mod inproc_util;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use inproc_util::{bf16_gaussian, pattern, transfer_and_check};
use nccl_net_zip::plugin::{self, Plugin};
use nccl_net_zip::proto::wire::{Handle, Hello, HANDLE_SIZE};
use nccl_net_zip::transport::tcp::{ListenComm, RecvComm, SendComm};

fn plugin() -> &'static Plugin {
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    plugin::try_init().unwrap()
}

fn nstreams() -> usize {
    nccl_net_zip::config::Config::from_env().unwrap().nstreams
}

/// A listen comm and its handle.
fn listen() -> (ListenComm, [u8; HANDLE_SIZE]) {
    let mut handle = [0u8; HANDLE_SIZE];
    let l = plugin().listen(0, &mut handle).unwrap();
    (l, handle)
}

/// Connects to `handle` (retried as NCCL does) without accepting.
fn connect(handle: &mut [u8; HANDLE_SIZE]) -> SendComm {
    let t0 = Instant::now();
    loop {
        if let Some(s) = plugin().connect(0, handle).unwrap() {
            return s;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "connect stuck");
        std::thread::yield_now();
    }
}

fn accept(l: &mut ListenComm) -> RecvComm {
    let t0 = Instant::now();
    loop {
        if let Some(r) = plugin::accept(l).unwrap() {
            return r;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "accept stuck");
        std::thread::yield_now();
    }
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Both ends of a comm that has moved bulk data have every data stream (the
/// sender opened them for it; those still connecting when the message was done,
/// because one stream carried it all, come up soon after).
fn assert_all_streams(s: &SendComm, r: &RecvComm) {
    let n = nstreams();
    wait_until(
        &format!("sender has every stream up: {}", s.stats().summary()),
        || s.streams_up() == n,
    );
    wait_until("receiver attached every stream", || {
        r.stats().streams.load(Relaxed) == n as u64
    });
}

#[test]
fn a_light_comm_has_one_socket_and_bulk_traffic_opens_the_rest_after_close_listen() {
    let (mut l, mut handle) = listen();
    let s = connect(&mut handle);
    let r = accept(&mut l);
    drop(l); // as NCCL does right after accept: data streams come later anyway
             // Small messages the policy sends raw (below the codec's minimum) stay on
             // the inline stream: no data stream.
    let small: Vec<Vec<u8>> = (0..20).map(|i| pattern(i, 1 + 200 * i as usize)).collect();
    transfer_and_check(&s, &r, &small, 64 << 10);
    assert_eq!(s.streams_opened(), 0);
    assert_eq!(r.stats().streams.load(Relaxed), 0);
    // A small compressible message goes compressed on one data stream, opened
    // for it (a light comm stays within 2 sockets).
    let one = vec![bf16_gaussian(2, 48 << 10, 0.02)];
    transfer_and_check(&s, &r, &one, 64 << 10);
    assert!(s.streams_opened() <= 1);
    // Bulk traffic opens every data stream, and the receiver attaches them
    // through the shared listener, the listen comm being gone.
    let big = vec![bf16_gaussian(3, 4 << 20, 0.02), pattern(4, 3 << 20)];
    transfer_and_check(&s, &r, &big, 4 << 20);
    assert_all_streams(&s, &r);
    // And the comm goes on with both kinds.
    let mixed = vec![
        pattern(5, 100),
        bf16_gaussian(6, 2 << 20, 0.02),
        pattern(7, 10),
    ];
    transfer_and_check(&s, &r, &mixed, 4 << 20);
}

#[test]
fn data_streams_that_come_before_accept_wait_for_it() {
    let (mut l, mut handle) = listen();
    let s = connect(&mut handle);
    let big = bf16_gaussian(8, 4 << 20, 0.02);
    // Queued before the receiver accepted: the data streams reach the listener
    // first, and wait with their connection.
    let sq = s.isend(big.as_ptr(), big.len(), None).unwrap().unwrap() as *const _;
    std::thread::sleep(Duration::from_millis(50));
    let r = accept(&mut l);
    drop(l);
    let mut buf = vec![0u8; big.len()];
    let rq = r.irecv(buf.as_mut_ptr(), buf.len(), None).unwrap().unwrap() as *const _;
    // SAFETY: the slots live in the comms' rings, alive here.
    let (sq, rq): (
        &nccl_net_zip::proto::slots::Slot,
        &nccl_net_zip::proto::slots::Slot,
    ) = unsafe { (&*sq, &*rq) };
    let (mut sent, mut got) = (None, None);
    let t0 = Instant::now();
    while sent.is_none() || got.is_none() {
        if sent.is_none() {
            sent = sq.test().unwrap();
        }
        if got.is_none() {
            got = rq.test().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "transfer stuck");
        std::thread::yield_now();
    }
    assert_eq!(got, Some(big.len()));
    assert!(buf == big);
    assert_all_streams(&s, &r);
}

#[test]
fn listen_comms_share_one_port_and_strangers_there_disturb_no_comm() {
    let (mut l, mut handle) = listen();
    let (l2, handle2) = listen();
    let (a, b) = (
        Handle::decode(&handle).unwrap(),
        Handle::decode(&handle2).unwrap(),
    );
    assert_eq!(a.addr, b.addr, "one listener per device address");
    assert_ne!(a.secret, b.secret);
    drop(l2);
    let s = connect(&mut handle);
    let r = accept(&mut l);
    drop(l);
    transfer_and_check(&s, &r, &[pattern(1, 5000)], 64 << 10);

    // Strangers on the shared port: garbage, a hello with a wrong secret, a
    // hello with the secret of a closed listen comm, and a silent one (left
    // open). Each is dropped with a WARN.
    let mut garbage = TcpStream::connect(a.addr).unwrap();
    garbage.write_all(&[0x41; 300]).unwrap();
    let hello = |secret: u64, stream: u16| Hello {
        secret,
        conn_id: 77,
        stream,
        nstreams: 5,
        max_chunk: 1 << 20,
    };
    let mut wrong = TcpStream::connect(a.addr).unwrap();
    wrong.write_all(&hello(a.secret ^ 1, 4).encode()).unwrap();
    let mut closed = TcpStream::connect(a.addr).unwrap();
    closed.write_all(&hello(b.secret, 4).encode()).unwrap();
    let mut data_of_nobody = TcpStream::connect(a.addr).unwrap();
    data_of_nobody
        .write_all(&hello(a.secret, 0).encode())
        .unwrap();
    let _silent = TcpStream::connect(a.addr).unwrap();
    // The rejected ones are closed by the listener.
    for (what, sock) in [
        ("garbage", &mut garbage),
        ("wrong secret", &mut wrong),
        ("closed listen comm", &mut closed),
        ("data stream of no comm", &mut data_of_nobody),
    ] {
        use std::io::Read;
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut b = [0u8; 1];
        let n = sock.read(&mut b).unwrap_or(0);
        assert_eq!(n, 0, "{what}: the listener answered instead of closing");
    }

    // The live comm is undisturbed, and its data streams still come through the
    // same port after the strangers.
    let big = vec![bf16_gaussian(9, 4 << 20, 0.02), pattern(10, 100)];
    transfer_and_check(&s, &r, &big, 4 << 20);
    assert_all_streams(&s, &r);
    assert!(s.stats().summary().contains("streams"));
}

/// A hand-made sender: the inline stream of connection `conn_id` (3 streams:
/// data streams 0 and 1, then the inline stream 2), and the receive comm.
fn hand_made(conn_id: u64) -> (RecvComm, TcpStream, Handle) {
    let (mut l, handle) = listen();
    let h = Handle::decode(&handle).unwrap();
    let mut inline = TcpStream::connect(h.addr).unwrap();
    inline
        .write_all(&hello(h.secret, conn_id, 2).encode())
        .unwrap();
    let r = accept(&mut l);
    drop(l);
    (r, inline, h)
}

fn hello(secret: u64, conn_id: u64, stream: u16) -> Hello {
    Hello {
        secret,
        conn_id,
        stream,
        nstreams: 3,
        max_chunk: 1 << 20,
    }
}

/// Opens data stream `k` of a hand-made connection and waits for its ack.
fn open_data_stream(h: &Handle, conn_id: u64, k: u16) -> TcpStream {
    let mut s = TcpStream::connect(h.addr).unwrap();
    s.write_all(&hello(h.secret, conn_id, k).encode()).unwrap();
    inproc_util::wait_stream_ack(&s);
    s
}

/// A data stream not opened yet may still bring a pending message: a later
/// message on the inline stream does not fail it; once the sender closes its
/// inline stream, none can come any more and the pending receive fails.
#[test]
fn a_data_stream_not_opened_yet_may_still_bring_a_message() {
    use inproc_util::{post, send_raw, wait};
    let (r, mut inline, h) = hand_made(0xA1);
    let (m0, m1) = (pattern(20, 3000), pattern(21, 50));
    let (mut b0, mut b1) = (vec![0u8; 4096], vec![0u8; 4096]);
    let (q0, q1) = (post(&r, &mut b0), post(&r, &mut b1));
    send_raw(&mut inline, 1, &m1);
    std::thread::sleep(Duration::from_millis(100));
    assert!(matches!(q0.test(), Ok(None)), "message 0 may still come");
    // Message 0 comes on data stream 0, opened now.
    let mut d0 = open_data_stream(&h, 0xA1, 0);
    send_raw(&mut d0, 0, &m0);
    assert_eq!(wait(q0).unwrap(), m0.len());
    assert_eq!(wait(q1).unwrap(), m1.len());
    assert_eq!((&b0[..m0.len()], &b1[..m1.len()]), (&m0[..], &m1[..]));
    assert_eq!(r.stats().streams.load(Relaxed), 1);
    // A second hello for the same stream is refused; the comm goes on.
    let mut dup = TcpStream::connect(h.addr).unwrap();
    dup.write_all(&hello(h.secret, 0xA1, 0).encode()).unwrap();
    {
        use std::io::Read;
        dup.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(dup.read(&mut b).unwrap_or(0), 0, "duplicate stream closed");
    }
    let m2 = pattern(22, 777);
    let mut b2 = vec![0u8; 4096];
    let q2 = post(&r, &mut b2);
    send_raw(&mut inline, 2, &m2);
    assert_eq!(wait(q2).unwrap(), m2.len());

    // Another connection: message 1 on the inline stream, message 0 pending, then
    // the sender closes without opening a data stream: message 0 fails.
    let (r, mut inline, h) = hand_made(0xA2);
    let (mut b0, mut b1) = (vec![0u8; 4096], vec![0u8; 4096]);
    let (q0, q1) = (post(&r, &mut b0), post(&r, &mut b1));
    send_raw(&mut inline, 1, &m1);
    assert_eq!(wait(q1).unwrap(), m1.len());
    drop(inline);
    let e = wait(q0).unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
    // A data stream that comes now is refused.
    let mut late = TcpStream::connect(h.addr).unwrap();
    late.write_all(&hello(h.secret, 0xA2, 0).encode()).unwrap();
    use std::io::Read;
    late.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(late.read(&mut b).unwrap_or(0), 0, "late stream closed");
}
