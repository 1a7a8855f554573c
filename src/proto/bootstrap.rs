//! The connection bootstrap both transports share (issue 20 item 4), with no
//! I/O: no sockets, no threads, no clock. Time comes in as an argument; bytes
//! come in through the driver's read and write callbacks, outcomes go out as
//! values. The TCP listener and connector (`transport::tcp::{listen, connect}`)
//! and IB's bootstrap (`transport::ib::comm`) are thin drivers over it
//! (`transport::boot` has their socket calls); `tests/bootstrap.rs` drives it
//! with a fake clock and hostile peers.
//!
//! - **Records that can grow.** A hello (TCP's `NZHI`, IB's `NZIQ`) is a record
//!   whose first bytes say its whole length ([`Framing`]). A reader takes exactly
//!   that many bytes, never one more (what follows on the socket belongs to the
//!   connection), so a later version can append fields that this one skips.
//! - **The listener's half-open connections** ([`Gate`]): at most
//!   [`MAX_HALF_OPEN`] at once (a new one evicts the oldest), each with the
//!   handshake deadline counted from its admission, so a peer that sends one
//!   byte at a time (slowloris) is dropped like a silent one. A connection whose
//!   hello came may be held, under the same deadline, until a reply is written
//!   (IB answers with its own record; TCP has no reply).
//! - **The connector's resumable stages** ([`Dialer`]): connecting, writing the
//!   hello, and (IB) reading the reply, each step resumed where the last one
//!   stopped. No deadline: NCCL calls `connect` again until the peer accepts or
//!   the job aborts (see README, "Timeout rule").
//!
//! Checks that need the record's meaning (version, secret, stream range) are
//! the record's own (`wire::Hello::decode_info`, `ib::comm::Boot::decode`).

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Most half-open connections a listener keeps; a new one evicts the oldest.
pub const MAX_HALF_OPEN: usize = 256;

/// How a hello says its length: its first [`Framing::prefix_len`] bytes tell
/// the whole length, or that the connection is not a peer's (bad magic, a
/// length out of range).
pub trait Framing {
    /// Bytes that say the length (at most the shortest record).
    fn prefix_len(&self) -> usize;
    /// The whole record's length (at least [`Framing::prefix_len`]), from its prefix.
    fn total_len(&self, prefix: &[u8]) -> Result<usize>;
}

/// Reads one record as its bytes come, never past its end.
#[derive(Debug)]
pub struct RecordReader {
    buf: Vec<u8>,
    got: usize,
    sized: bool,
}

impl RecordReader {
    pub fn new(f: &dyn Framing) -> RecordReader {
        RecordReader {
            buf: vec![0; f.prefix_len()],
            got: 0,
            sized: false,
        }
    }

    /// Where the next bytes go: at most what the record still lacks.
    pub fn space(&mut self) -> &mut [u8] {
        &mut self.buf[self.got..]
    }

    /// `n` bytes were put at the start of [`RecordReader::space`]. True once the
    /// whole record is in ([`RecordReader::record`]).
    pub fn filled(&mut self, n: usize, f: &dyn Framing) -> Result<bool> {
        self.got += n;
        debug_assert!(self.got <= self.buf.len());
        if self.got < self.buf.len() {
            return Ok(false);
        }
        if !self.sized {
            let len = f.total_len(&self.buf)?;
            if len < self.buf.len() {
                return Err(Error::Internal(format!(
                    "a record of {len} bytes, shorter than its {}-byte prefix",
                    self.buf.len()
                )));
            }
            self.sized = true;
            self.buf.resize(len, 0);
        }
        Ok(self.got == self.buf.len())
    }

    /// The record, once [`RecordReader::filled`] said it is whole.
    pub fn record(&self) -> &[u8] {
        &self.buf[..self.got]
    }

    pub fn into_record(self) -> Vec<u8> {
        self.buf
    }
}

/// What one non-blocking read or write on a connection did.
#[derive(Debug)]
pub enum Io {
    /// Moved this many bytes (at least one).
    Moved(usize),
    /// Nothing now (would block).
    Blocked,
    /// The peer closed (a read that returned 0).
    Closed,
    Failed(Error),
}

/// What became of a half-open connection.
#[derive(Debug)]
pub enum Outcome<C> {
    /// Its whole hello is in: the driver checks and sorts it, and may hold the
    /// connection for a reply ([`Gate::reply`], same deadline: `since`).
    Hello {
        conn: C,
        record: Vec<u8>,
        since: Instant,
    },
    /// Its reply ([`Gate::reply`]) is written: the connection is up.
    Replied(C),
    /// Dropped: evicted, out of time, closed, broken, or not a peer's. The
    /// driver closes it (and WARNs with the reason).
    Dropped(C, Error),
}

struct HalfOpen<C> {
    conn: C,
    since: Instant,
    stage: Half,
}

enum Half {
    Hello(RecordReader),
    Reply { bytes: Vec<u8>, done: usize },
}

/// A listener's half-open connections.
pub struct Gate<C> {
    timeout: Duration,
    max: usize,
    /// Oldest first.
    half: Vec<HalfOpen<C>>,
}

impl<C> Gate<C> {
    /// `timeout`: how long a connection may take from admission to its hello
    /// (and reply); `max`: most connections half-open at once.
    pub fn new(timeout: Duration, max: usize) -> Gate<C> {
        Gate {
            timeout,
            max: max.max(1),
            half: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.half.len()
    }

    pub fn is_empty(&self) -> bool {
        self.half.is_empty()
    }

    /// A connection accepted at `now`, whose hello is read with `f`. Returns the
    /// oldest one if the gate was full: it is dropped to make room.
    pub fn admit(&mut self, conn: C, f: &dyn Framing, now: Instant) -> Option<Outcome<C>> {
        let evicted = (self.half.len() >= self.max).then(|| {
            let old = self.half.remove(0);
            Outcome::Dropped(
                old.conn,
                Error::Remote(format!(
                    "dropped: more than {} half-open connections",
                    self.max
                )),
            )
        });
        self.half.push(HalfOpen {
            conn,
            since: now,
            stage: Half::Hello(RecordReader::new(f)),
        });
        evicted
    }

    /// Holds `conn`, whose hello came at [`Outcome::Hello`], until `bytes` are
    /// written; `since` is the one that outcome gave (the deadline carries on).
    pub fn reply(&mut self, conn: C, bytes: Vec<u8>, since: Instant) {
        self.half.push(HalfOpen {
            conn,
            since,
            stage: Half::Reply { bytes, done: 0 },
        });
    }

    /// Moves every half-open connection as far as it goes at `now`: `read`
    /// fills the buffer it is given from the connection, `write` writes from
    /// it, both without blocking. Returns what became of those that finished
    /// or were dropped; the others stay.
    pub fn poll(
        &mut self,
        now: Instant,
        f: &dyn Framing,
        mut read: impl FnMut(&mut C, &mut [u8]) -> Io,
        mut write: impl FnMut(&mut C, &[u8]) -> Io,
    ) -> Vec<Outcome<C>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.half.len() {
            let h = &mut self.half[i];
            let step = step(h, f, &mut read, &mut write).and_then(|done| {
                if !done && now.saturating_duration_since(h.since) > self.timeout {
                    Err(Error::Remote(format!(
                        "no handshake within {:?} (NCCL_ZIP_HANDSHAKE_TIMEOUT_MS)",
                        self.timeout
                    )))
                } else {
                    Ok(done)
                }
            });
            match step {
                Ok(false) => i += 1,
                Ok(true) => {
                    let h = self.half.remove(i);
                    out.push(match h.stage {
                        Half::Hello(r) => Outcome::Hello {
                            conn: h.conn,
                            record: r.into_record(),
                            since: h.since,
                        },
                        Half::Reply { .. } => Outcome::Replied(h.conn),
                    });
                }
                Err(e) => out.push(Outcome::Dropped(self.half.remove(i).conn, e)),
            }
        }
        out
    }

    /// Drops every half-open connection (nothing they wait for can come).
    pub fn drain(&mut self) -> Vec<C> {
        self.half.drain(..).map(|h| h.conn).collect()
    }
}

/// One connection's step; true once its stage is complete.
fn step<C>(
    h: &mut HalfOpen<C>,
    f: &dyn Framing,
    read: &mut impl FnMut(&mut C, &mut [u8]) -> Io,
    write: &mut impl FnMut(&mut C, &[u8]) -> Io,
) -> Result<bool> {
    match &mut h.stage {
        Half::Hello(r) => loop {
            match read(&mut h.conn, r.space()) {
                Io::Moved(n) => {
                    if r.filled(n, f)? {
                        return Ok(true);
                    }
                }
                Io::Blocked => return Ok(false),
                Io::Closed => {
                    return Err(Error::Remote(
                        "closed before completing the handshake".into(),
                    ))
                }
                Io::Failed(e) => return Err(e),
            }
        },
        Half::Reply { bytes, done } => {
            while *done < bytes.len() {
                match write(&mut h.conn, &bytes[*done..]) {
                    Io::Moved(n) => *done += n,
                    Io::Blocked => return Ok(false),
                    Io::Closed => return Err(Error::Remote("closed during the handshake".into())),
                    Io::Failed(e) => return Err(e),
                }
            }
            Ok(true)
        }
    }
}

/// What a [`Dialer`] needs from its driver next.
#[derive(Debug)]
pub enum Step<'a> {
    /// Wait for the connection to be established ([`Dialer::connected`]), or
    /// call again later.
    Connect,
    /// Write these bytes ([`Dialer::wrote`]).
    Write(&'a [u8]),
    /// Read into this buffer ([`Dialer::read`]).
    Read(&'a mut [u8]),
    /// Done: the reply is [`Dialer::reply`] (empty when none was expected).
    Done,
}

enum Dial {
    Connecting,
    Hello(usize),
    Reply(RecordReader),
    Done,
}

/// The connector's side: connect, write the hello, then (when the transport
/// expects one) read the listener's reply. Resumable: each call goes on from
/// the last; no deadline (see the module doc).
pub struct Dialer {
    stage: Dial,
    hello: Vec<u8>,
    /// How the reply says its length; `None`: no reply (TCP).
    reply: Option<Box<dyn Framing + Send>>,
    got: Option<RecordReader>,
}

impl Dialer {
    pub fn new(hello: Vec<u8>, reply: Option<Box<dyn Framing + Send>>) -> Dialer {
        Dialer {
            stage: Dial::Connecting,
            hello,
            reply,
            got: None,
        }
    }

    /// What to do next.
    pub fn want(&mut self) -> Step<'_> {
        match &mut self.stage {
            Dial::Connecting => Step::Connect,
            Dial::Hello(done) => Step::Write(&self.hello[*done..]),
            Dial::Reply(r) => Step::Read(r.space()),
            Dial::Done => Step::Done,
        }
    }

    /// The connection is established.
    pub fn connected(&mut self) {
        if let Dial::Connecting = self.stage {
            self.stage = Dial::Hello(0);
            self.after_write();
        }
    }

    /// `n` bytes of [`Step::Write`] went out.
    pub fn wrote(&mut self, n: usize) {
        if let Dial::Hello(done) = &mut self.stage {
            *done += n;
            self.after_write();
        }
    }

    fn after_write(&mut self) {
        if let Dial::Hello(done) = self.stage {
            if done >= self.hello.len() {
                self.stage = match &self.reply {
                    Some(f) => Dial::Reply(RecordReader::new(&**f)),
                    None => Dial::Done,
                };
            }
        }
    }

    /// `n` bytes were read into [`Step::Read`]'s buffer; 0: the peer closed.
    pub fn read(&mut self, n: usize) -> Result<()> {
        let Dial::Reply(r) = &mut self.stage else {
            return Err(Error::Internal("a read while no reply is due".into()));
        };
        if n == 0 {
            return Err(Error::Remote(
                "the listener closed the connection before replying".into(),
            ));
        }
        let f = self.reply.as_deref().expect("a reply is due");
        if r.filled(n, f)? {
            let Dial::Reply(r) = std::mem::replace(&mut self.stage, Dial::Done) else {
                unreachable!()
            };
            self.got = Some(r);
        }
        Ok(())
    }

    pub fn done(&self) -> bool {
        matches!(self.stage, Dial::Done)
    }

    /// The listener's reply, once [`Dialer::done`] (empty if none was expected).
    pub fn reply(&self) -> &[u8] {
        self.got.as_ref().map(|r| r.record()).unwrap_or(&[])
    }
}
