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

/// Both ends of a comm that has moved bulk data have every data stream.
fn assert_all_streams(s: &SendComm, r: &RecvComm) {
    let n = nstreams();
    assert_eq!(s.streams_up(), n, "{}", s.stats().summary());
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
    let mixed = vec![pattern(5, 100), bf16_gaussian(6, 2 << 20, 0.02), pattern(7, 10)];
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
    let (sq, rq): (&nccl_net_zip::proto::slots::Slot, &nccl_net_zip::proto::slots::Slot) =
        unsafe { (&*sq, &*rq) };
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
    let (a, b) = (Handle::decode(&handle).unwrap(), Handle::decode(&handle2).unwrap());
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
    data_of_nobody.write_all(&hello(a.secret, 0).encode()).unwrap();
    let _silent = TcpStream::connect(a.addr).unwrap();
    // The rejected ones are closed by the listener.
    for (what, sock) in [
        ("garbage", &mut garbage),
        ("wrong secret", &mut wrong),
        ("closed listen comm", &mut closed),
        ("data stream of no comm", &mut data_of_nobody),
    ] {
        use std::io::Read;
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
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
