//! A TCP receive comm with no sockets and no threads: the streams' receive
//! machines (`transport::tcp::stream`) fed bytes by the test, over a request ring,
//! with the comm's rules around them (the first error fails every request; a
//! stream that ends between chunks is a peer that closed; a pending receive that
//! no stream can bring any more fails). Deterministic: what a run does depends
//! only on the bytes fed and the order of calls.
#![allow(dead_code)]

use std::net::SocketAddr;

use nccl_net_zip::error::Error;
use nccl_net_zip::proto::slots::{Ring, Slot};
use nccl_net_zip::stats::Stats;
use nccl_net_zip::transport::tcp::stream::{
    stalled_error, stream_ended, Fed, HostOnly, Role, StreamRx,
};

/// Two data streams, then the inline stream (as `inproc_util::raw_peer`).
pub const NDATA: usize = 2;
pub const INLINE: usize = 2;
pub const NSTREAMS: usize = 3;
/// The sender's chunk size, as `raw_peer` announces it.
pub const MAX_CHUNK: usize = 1 << 20;

struct Stream {
    rx: StreamRx,
    /// Bytes the peer wrote that the machine has not taken yet (a socket's buffer).
    queued: Vec<u8>,
    /// The peer shut its side after `queued`.
    fin: bool,
    ended: bool,
}

pub struct Rx {
    pub ring: Ring,
    pub stats: Stats,
    streams: Vec<Stream>,
    error: Option<Error>,
    peer: SocketAddr,
}

impl Default for Rx {
    fn default() -> Self {
        Rx::new(MAX_CHUNK)
    }
}

impl Rx {
    /// A receiver whose peer announced chunks of at most `max_chunk` bytes.
    pub fn new(max_chunk: usize) -> Rx {
        Rx::with_budget(max_chunk, u64::MAX)
    }

    /// [`Rx::new`], its streams' staging within a process buffer budget of `cap`
    /// bytes (`nccl_net_zip::budget`).
    pub fn with_budget(max_chunk: usize, cap: u64) -> Rx {
        let peer: SocketAddr = "10.0.0.1:4242".parse().unwrap();
        Rx {
            ring: Ring::with_producers(NSTREAMS),
            stats: Stats::default(),
            streams: (0..NSTREAMS)
                .map(|i| Stream {
                    rx: StreamRx::new(
                        if i == INLINE {
                            Role::Inline
                        } else {
                            Role::Data
                        },
                        peer,
                        max_chunk,
                        nccl_net_zip::codec::format::VERSION_2,
                    )
                    .with_budget(cap),
                    queued: Vec::new(),
                    fin: false,
                    ended: false,
                })
                .collect(),
            error: None,
            peer,
        }
    }

    /// The comm's error, once it has failed.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    /// The comm fails: the first error is kept and fails every request.
    pub fn fail(&mut self, e: Error) {
        if self.error.is_none() {
            self.ring.fail_all(&e);
            self.error = Some(e);
        }
    }

    /// `irecv`: posts `cap` bytes at `buf`. `None`: the slot is busy (retry).
    pub fn post(&mut self, buf: *mut u8, cap: usize) -> Option<*const Slot> {
        let s = self
            .ring
            .post(None, 0, Some((buf as usize, cap)))
            .map(|(_, s)| s as *const Slot);
        self.pump();
        s
    }

    /// [`Rx::post`] of a whole buffer.
    pub fn post_buf(&mut self, buf: &mut [u8]) -> *const Slot {
        self.post(buf.as_mut_ptr(), buf.len()).expect("a free slot")
    }

    /// The peer writes `bytes` on stream `st`.
    pub fn feed(&mut self, st: usize, bytes: &[u8]) {
        assert!(!self.streams[st].fin, "write after shutdown");
        self.streams[st].queued.extend_from_slice(bytes);
        self.pump();
    }

    /// The peer shuts stream `st` for writing (a FIN after what it wrote).
    pub fn shutdown(&mut self, st: usize) {
        self.streams[st].fin = true;
        self.pump();
    }

    /// The peer resets stream `st` (a RST): the receiver's read fails.
    pub fn reset(&mut self, st: usize) {
        self.streams[st].queued.clear();
        self.streams[st].ended = true;
        self.fail(Error::io(
            format!("receive from {} (stream {st})", self.peer),
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ));
    }

    /// Bytes of stream `st` not taken yet (held back until a receive is posted).
    pub fn queued(&self, st: usize) -> usize {
        self.streams[st].queued.len()
    }

    /// Lets every stream take what it can, as the I/O threads and `test` would.
    pub fn pump(&mut self) {
        loop {
            let mut moved = false;
            for st in 0..NSTREAMS {
                if self.error.is_some() {
                    return;
                }
                moved |= self.step(st);
            }
            if !moved {
                return;
            }
        }
    }

    /// One stream takes what it can. True if anything changed.
    fn step(&mut self, st: usize) -> bool {
        if self.streams[st].ended {
            return false;
        }
        let queued = std::mem::take(&mut self.streams[st].queued);
        let r = self.streams[st]
            .rx
            .handle_bytes(&queued, &self.ring, &HostOnly, &self.stats);
        let (used, waits) = match r {
            Ok(Fed::All) => (queued.len(), None),
            Ok(Fed::Posted { used, seq }) => (used, Some(seq)),
            Ok(Fed::Device { .. }) => unreachable!("no device buffers here"),
            // The stream waits for budget (a later pump tries again).
            Ok(Fed::Budget { used }) => (used, None),
            Err(e) => {
                self.fail(e);
                return true;
            }
        };
        self.streams[st].queued = queued[used..].to_vec();
        // A stream that holds a header whose receive is not posted: a stall if no
        // other stream can bring the pending receives.
        if let Some(seq) = self.ring.producer_waits(st, waits) {
            self.fail(stalled_error(seq, self.peer));
            return true;
        }
        let s = &mut self.streams[st];
        if s.queued.is_empty() && s.fin && waits.is_none() {
            s.ended = true;
            let verdict = match s.rx.eof() {
                Ok(()) => stream_ended(&self.ring, st, self.peer),
                Err(e) => Some(e),
            };
            if let Some(e) = verdict {
                self.fail(e);
            }
            return true;
        }
        used > 0
    }
}

/// `test()` on a request: `None` while pending.
pub fn test(s: *const Slot) -> Option<Result<usize, Error>> {
    // SAFETY: the slot is in a ring the caller keeps alive.
    match unsafe { &*s }.test() {
        Ok(None) => None,
        Ok(Some(n)) => Some(Ok(n)),
        Err(e) => Some(Err(e)),
    }
}
