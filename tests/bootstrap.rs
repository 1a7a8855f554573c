//! The shared bootstrap (`proto::bootstrap`, issue 20 item 4) against hostile
//! peers, driven deterministically: fake connections (bytes that "arrive" when
//! the test says so) and a fake clock (an `Instant` the test moves). No socket,
//! no thread, no sleep. Both transports' hello records go through it: TCP's
//! `NZHI` hello and IB's `NZIQ` record.

use std::time::{Duration, Instant};

use nccl_net_zip::error::Error;
use nccl_net_zip::proto::bootstrap::{Dialer, Framing, Gate, Io, Outcome, Step, MAX_HALF_OPEN};
use nccl_net_zip::proto::wire::{Hello, HelloFraming, PeerInfo, HELLO_SIZE, PROTOCOL_VERSION};
use nccl_net_zip::transport::ib::comm::{Boot, BootFraming, BOOT_HEADER, BOOT_QP};
use nccl_net_zip::transport::ib::fabric::QpInfo;
use nccl_net_zip::transport::ib::proto::Endpoint;

const TIMEOUT: Duration = Duration::from_secs(1);
const SECRET: u64 = 0x5EC12E7;

/// A connection as the gate sees it: `input` is everything the peer will
/// send, of which `arrived` bytes have arrived; `room`: bytes the socket
/// takes per write (0: none, it blocks).
#[derive(Debug, Default)]
struct Fake {
    id: usize,
    input: Vec<u8>,
    arrived: usize,
    read: usize,
    closed: bool,
    room: usize,
    written: Vec<u8>,
}

impl Fake {
    fn new(id: usize, input: Vec<u8>) -> Fake {
        Fake {
            id,
            arrived: input.len(),
            input,
            room: usize::MAX,
            ..Fake::default()
        }
    }

    /// Nothing has arrived yet; bytes come with [`Fake::arrive`].
    fn trickle(id: usize, input: Vec<u8>) -> Fake {
        Fake {
            arrived: 0,
            ..Fake::new(id, input)
        }
    }
}

fn read(c: &mut Fake, buf: &mut [u8]) -> Io {
    let n = buf.len().min(c.arrived - c.read);
    if n == 0 {
        return if c.closed && c.arrived == c.input.len() {
            Io::Closed
        } else {
            Io::Blocked
        };
    }
    buf[..n].copy_from_slice(&c.input[c.read..c.read + n]);
    c.read += n;
    Io::Moved(n)
}

fn write(c: &mut Fake, buf: &[u8]) -> Io {
    let n = buf.len().min(c.room);
    if n == 0 {
        return Io::Blocked;
    }
    c.written.extend_from_slice(&buf[..n]);
    Io::Moved(n)
}

fn poll(g: &mut Gate<Fake>, now: Instant, f: &dyn Framing) -> Vec<Outcome<Fake>> {
    g.poll(now, f, read, write)
}

fn hello() -> Hello {
    Hello {
        secret: SECRET,
        conn_id: 9,
        stream: 1,
        nstreams: 3,
        max_chunk: 1 << 18,
    }
}

fn boot() -> Boot {
    Boot {
        secret: SECRET,
        endpoint: Endpoint {
            addr: 0x1000,
            rkey: 7,
        },
        qps: (0..2)
            .map(|i| QpInfo {
                qpn: 100 + i,
                lid: 3,
                mtu: 5,
                gid: [i as u8; 16],
            })
            .collect(),
        format: 2,
    }
}

/// The one outcome of a poll, which must be a dropped connection: its id and why.
fn dropped(out: Vec<Outcome<Fake>>) -> (usize, Error) {
    assert_eq!(out.len(), 1, "{out:?}");
    match out.into_iter().next().unwrap() {
        Outcome::Dropped(c, e) => (c.id, e),
        o => panic!("expected a drop, got {o:?}"),
    }
}

/// The one outcome of a poll, which must be a whole hello: the connection and the record.
fn hello_of(out: Vec<Outcome<Fake>>) -> (Fake, Vec<u8>, Instant) {
    assert_eq!(out.len(), 1, "{out:?}");
    match out.into_iter().next().unwrap() {
        Outcome::Hello {
            conn,
            record,
            since,
        } => (conn, record, since),
        o => panic!("expected a hello, got {o:?}"),
    }
}

#[test]
fn at_most_256_half_open_and_the_oldest_goes_first() {
    let t0 = Instant::now();
    let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
    assert_eq!(MAX_HALF_OPEN, 256);
    for i in 0..256 {
        let now = t0 + Duration::from_millis(i as u64);
        assert!(g
            .admit(Fake::trickle(i, vec![]), &HelloFraming, now)
            .is_none());
    }
    assert_eq!(g.len(), 256);
    assert!(poll(&mut g, t0 + Duration::from_millis(300), &HelloFraming).is_empty());
    // Two more: the two oldest go, in order, with the reason.
    for (k, want) in [(256, 0), (257, 1)] {
        let o = g.admit(
            Fake::trickle(k, vec![]),
            &HelloFraming,
            t0 + Duration::from_millis(400),
        );
        let (id, e) = dropped(o.into_iter().collect());
        assert_eq!(id, want);
        assert!(e.to_string().contains("more than 256 half-open"), "{e}");
    }
    assert_eq!(g.len(), 256);
    // A peer whose hello is whole leaves room without evicting anyone.
    let mut h = g;
    let o = h.admit(
        Fake::new(300, hello().encode().to_vec()),
        &HelloFraming,
        t0 + Duration::from_millis(500),
    );
    assert_eq!(dropped(o.into_iter().collect()).0, 2);
    let (c, _, _) = hello_of(poll(&mut h, t0 + Duration::from_millis(500), &HelloFraming));
    assert_eq!((c.id, h.len()), (300, 255));
    assert_eq!(h.drain().len(), 255);
    assert!(h.is_empty());
}

#[test]
fn a_silent_peer_is_dropped_when_the_handshake_time_is_up() {
    for f in [&HelloFraming as &dyn Framing, &BootFraming] {
        let t0 = Instant::now();
        let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
        assert!(g.admit(Fake::trickle(1, vec![]), f, t0).is_none());
        assert!(
            poll(&mut g, t0 + TIMEOUT, f).is_empty(),
            "not before the deadline"
        );
        let (id, e) = dropped(poll(&mut g, t0 + TIMEOUT + Duration::from_millis(1), f));
        assert_eq!(id, 1);
        assert!(
            matches!(e, Error::Remote(_)) && e.to_string().contains("no handshake within"),
            "{e}"
        );
        assert!(g.is_empty());
    }
}

#[test]
fn wrong_magic_is_dropped_at_the_prefix_without_reading_on() {
    let mut junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    junk.resize(200, b'x');
    for f in [&HelloFraming as &dyn Framing, &BootFraming] {
        let t0 = Instant::now();
        let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
        g.admit(Fake::new(1, junk.clone()), f, t0);
        let out = poll(&mut g, t0, f);
        assert_eq!(out.len(), 1);
        let Outcome::Dropped(c, e) = out.into_iter().next().unwrap() else {
            panic!("junk must be dropped")
        };
        assert!(e.to_string().contains("not an nccl-net-zip"), "{e}");
        assert_eq!(c.read, f.prefix_len(), "read the prefix only");
    }
}

/// The record's own checks, on what the gate hands over: a wrong secret is a
/// stranger (Remote: dropped with a WARN); a peer that knows the secret but
/// speaks another version is told apart (InvalidUsage naming both versions:
/// its `accept` fails).
#[test]
fn wrong_version_or_secret_in_a_whole_hello() {
    let t0 = Instant::now();
    // TCP.
    let mut v9 = hello().encode().to_vec();
    v9[4..6].copy_from_slice(&9u16.to_le_bytes());
    let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
    g.admit(Fake::new(1, v9), &HelloFraming, t0);
    let (_, rec, _) = hello_of(poll(&mut g, t0, &HelloFraming));
    let e = Hello::decode_info(&rec, SECRET).unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(
        e.to_string().contains("v9") && e.to_string().contains(&format!("v{PROTOCOL_VERSION}")),
        "{e}"
    );
    assert!(matches!(
        Hello::decode_info(&rec, SECRET + 1),
        Err(Error::Remote(_))
    ));
    // IB.
    let mut v7 = boot().encode();
    v7[4..6].copy_from_slice(&7u16.to_le_bytes());
    g.admit(Fake::new(2, v7), &BootFraming, t0);
    let (_, rec, _) = hello_of(poll(&mut g, t0, &BootFraming));
    let e = Boot::decode(&rec, SECRET).unwrap_err();
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(
        e.to_string().contains("v7") && e.to_string().contains("v1"),
        "{e}"
    );
    let e = Boot::decode(&rec, SECRET + 1).unwrap_err();
    assert!(
        matches!(e, Error::Remote(_)) && e.to_string().contains("secret"),
        "{e}"
    );
}

/// One byte at a time: a peer that finishes within the handshake time is
/// taken; one that keeps sending a byte now and then but not the whole hello
/// in time is dropped (the deadline counts from admission, not from its last
/// byte).
#[test]
fn slowloris_one_byte_at_a_time() {
    let rec = hello().encode().to_vec();
    for (gap_ms, taken) in [(10u64, true), (50, false)] {
        let t0 = Instant::now();
        let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
        g.admit(Fake::trickle(1, rec.clone()), &HelloFraming, t0);
        let mut now = t0;
        let mut result = None;
        for k in 1..=rec.len() {
            now += Duration::from_millis(gap_ms);
            // One more byte arrives (through the gate's own connection).
            let mut out = g.poll(
                now,
                &HelloFraming,
                |c, b| {
                    c.arrived = k.min(c.input.len());
                    read(c, b)
                },
                write,
            );
            if let Some(o) = out.pop() {
                result = Some((k, o));
                break;
            }
        }
        match (taken, result) {
            (true, Some((k, Outcome::Hello { record, .. }))) => {
                assert_eq!(k, HELLO_SIZE);
                assert_eq!(Hello::decode(&record, SECRET).unwrap(), hello());
            }
            (false, Some((k, Outcome::Dropped(c, e)))) => {
                assert!(e.to_string().contains("no handshake within"), "{e}");
                assert!(
                    k < HELLO_SIZE && c.read == k,
                    "dropped mid-hello, at byte {k}"
                );
                assert!(now - t0 > TIMEOUT && now - t0 <= TIMEOUT + Duration::from_millis(gap_ms));
            }
            (_, r) => panic!("gap {gap_ms} ms: {r:?}"),
        }
    }
}

/// A hello of a later version, longer than ours, with fields this version does
/// not know: read to its stated length and not a byte further (what follows is
/// the connection's), its extra fields ignored. Both records.
#[test]
fn a_longer_hello_is_read_to_its_length_and_its_unknown_tail_ignored() {
    let t0 = Instant::now();
    let after = b"NZCK...the first chunk".to_vec();
    // TCP: length 64, 16 unknown bytes.
    let mut long = hello().encode().to_vec();
    long.extend_from_slice(&[0xEE; 16]);
    long[10..12].copy_from_slice(&64u16.to_le_bytes());
    let mut input = long.clone();
    input.extend_from_slice(&after);
    let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
    g.admit(Fake::new(1, input), &HelloFraming, t0);
    let (c, rec, _) = hello_of(poll(&mut g, t0, &HelloFraming));
    assert_eq!((rec.len(), c.read), (64, 64), "not one byte past the hello");
    let (h, info) = Hello::decode_info(&rec, SECRET).unwrap();
    assert_eq!((h, info), (hello(), PeerInfo::ours()));
    // IB: a record that says it is 48 bytes longer than its QPs need.
    let mut b = boot().encode();
    let len = b.len() + 48;
    b[30..32].copy_from_slice(&(len as u16).to_le_bytes());
    b.resize(len, 0xAB);
    let mut input = b.clone();
    input.extend_from_slice(&after);
    g.admit(Fake::new(2, input), &BootFraming, t0);
    let (c, rec, _) = hello_of(poll(&mut g, t0, &BootFraming));
    assert_eq!((rec.len(), c.read), (len, len));
    assert_eq!(Boot::decode(&rec, SECRET).unwrap(), boot());
    // An older IB peer's record says no length (0): 32 + 32 per QP.
    let mut old = boot().encode();
    old[30..32].fill(0);
    assert_eq!(Boot::length(&old).unwrap(), BOOT_HEADER + 2 * BOOT_QP);
    assert_eq!(Boot::decode(&old, SECRET).unwrap(), boot());
    // A length shorter than the QPs need, or beyond the most we read: refused.
    for bad in [BOOT_HEADER + BOOT_QP, 4000] {
        let mut b = boot().encode();
        b[30..32].copy_from_slice(&(bad as u16).to_le_bytes());
        assert!(Boot::length(&b).is_err(), "{bad}");
    }
}

/// A reply (IB answers with its record) is written as the socket takes it,
/// under the same deadline: a connector that never reads it is dropped.
#[test]
fn a_reply_is_written_in_pieces_and_bounded_by_the_same_deadline() {
    let t0 = Instant::now();
    let reply = boot().encode();
    for (room, done) in [(5usize, true), (0, false)] {
        let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
        g.admit(Fake::new(1, boot().encode()), &BootFraming, t0);
        let (mut c, rec, since) =
            hello_of(poll(&mut g, t0 + Duration::from_millis(900), &BootFraming));
        assert_eq!(Boot::decode(&rec, SECRET).unwrap(), boot());
        c.room = room;
        g.reply(c, reply.clone(), since);
        let out = poll(&mut g, t0 + Duration::from_millis(950), &BootFraming);
        if done {
            let [Outcome::Replied(c)] = &out[..] else {
                panic!("{out:?}")
            };
            assert_eq!(c.written, reply);
        } else {
            assert!(out.is_empty(), "still in time");
            let (_, e) = dropped(poll(
                &mut g,
                t0 + TIMEOUT + Duration::from_millis(1),
                &BootFraming,
            ));
            assert!(e.to_string().contains("no handshake within"), "{e}");
        }
    }
}

/// A peer that closes mid-hello is dropped at once.
#[test]
fn a_peer_that_closes_mid_hello_is_dropped() {
    let t0 = Instant::now();
    let mut g = Gate::new(TIMEOUT, MAX_HALF_OPEN);
    let mut c = Fake::new(1, hello().encode()[..20].to_vec());
    c.closed = true;
    g.admit(c, &HelloFraming, t0);
    let (_, e) = dropped(poll(&mut g, t0, &HelloFraming));
    assert!(e.to_string().contains("closed before completing"), "{e}");
}

/// The connector: a connect that never completes stays resumable however
/// long it takes (NCCL retries `connect` without a limit; no deadline of ours),
/// then resumes where it stopped, one byte at a time both ways.
#[test]
fn a_connect_that_never_completes_stays_resumable() {
    let ours = boot().encode();
    let theirs = {
        let mut b = boot();
        b.endpoint.addr = 0x2000;
        b.encode()
    };
    let mut d = Dialer::new(ours.clone(), Some(Box::new(BootFraming)));
    for _ in 0..100_000 {
        assert!(matches!(d.want(), Step::Connect));
    }
    d.connected();
    let mut sent = Vec::new();
    let mut fed = 0;
    loop {
        match d.want() {
            Step::Connect => panic!("connected already"),
            Step::Write(b) => {
                sent.push(b[0]);
                d.wrote(1);
            }
            Step::Read(b) => {
                assert!(b.len() <= theirs.len() - fed, "never asks past the reply");
                b[0] = theirs[fed];
                fed += 1;
                d.read(1).unwrap();
            }
            Step::Done => break,
        }
    }
    assert_eq!(sent, ours);
    assert_eq!(d.reply(), &theirs[..]);
    assert_eq!(
        Boot::decode(d.reply(), SECRET).unwrap().endpoint.addr,
        0x2000
    );
    // A listener that closes before its reply fails the connect.
    let mut d = Dialer::new(ours.clone(), Some(Box::new(BootFraming)));
    d.connected();
    d.wrote(ours.len());
    let e = d.read(0).unwrap_err();
    assert!(
        e.to_string()
            .contains("closed the connection before replying"),
        "{e}"
    );
    // A reply with the wrong magic fails it at its prefix.
    let mut d = Dialer::new(ours.clone(), Some(Box::new(BootFraming)));
    d.connected();
    d.wrote(ours.len());
    let Step::Read(b) = d.want() else { panic!() };
    b.fill(0x41);
    let n = b.len();
    assert!(d.read(n).is_err());
    // TCP expects no reply: done once the hello is out.
    let mut d = Dialer::new(hello().encode().to_vec(), None);
    d.connected();
    d.wrote(HELLO_SIZE);
    assert!(d.done() && d.reply().is_empty());
}
