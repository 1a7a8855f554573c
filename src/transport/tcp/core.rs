//! State shared by a comm's progress-thread side and its I/O threads, common to
//! both directions: the request ring, the sockets, and how the comm fails.

use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use socket2::Socket;
use tracing::{info, warn};

use super::inline::Inline;
use super::stream::{self, Placement};
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::proto::slots::{Hook, Ring, NSLOTS};
use crate::stats::{Stats, HELD};

/// Per request slot of a receiver: the device whose memory the posted buffer is.
/// Written by `irecv` before the slot is published, read after.
pub type Devs = [Mutex<Option<std::sync::Arc<dyn Backend>>>; NSLOTS];

/// What a receiver's inline stream needs to know of its peer.
#[derive(Clone, Copy, Debug)]
pub struct RxLimits {
    /// The sender's chunk size: the largest inline message.
    pub max_chunk: usize,
    /// Lane staging size and lane pool size, for messages into device memory.
    pub max_wire: usize,
    pub lanes: usize,
    /// The process's buffer budget in bytes, for staging ([`crate::budget`]).
    pub buffer_cap: u64,
    /// The codec frame format the sender agreed to write at most (its hello).
    pub format: u8,
}

pub struct Core {
    pub ring: Ring,
    /// The data streams, each set once it is up (the sender opens them on
    /// demand, see `send.rs`); shared with whoever drives them.
    pub socks: Box<[OnceLock<Arc<Socket>>]>,
    /// The inline stream, driven by NCCL's thread.
    pub inline: Inline,
    /// Receivers: the limits of inline messages (None: this is a sender).
    pub rx: Option<RxLimits>,
    /// Receivers: the device of each posted buffer.
    pub devs: Devs,
    pub peer: SocketAddr,
    pub stats: Stats,
    error: Mutex<Option<Error>>,
    broken: AtomicBool,
    closing: AtomicBool,
    /// `NCCL_ZIP_STATS=1`: an INFO line with the counters at most this often.
    report_every: Option<Duration>,
    born: Instant,
    /// Milliseconds after `born` of the last periodic report.
    last_report_ms: AtomicU64,
    /// "send to" / "recv from", for log lines.
    pub direction: &'static str,
}

impl Core {
    /// `nstreams` data streams at most (none up yet: see [`Core::attach`]), and
    /// the inline stream `inline`. `rx`: receivers only. The core is returned in
    /// an `Arc` with the ring's progress hook pointing at it.
    pub fn new(
        nstreams: usize,
        inline: Socket,
        peer: SocketAddr,
        direction: &'static str,
        report_every: Option<Duration>,
        rx: Option<RxLimits>,
    ) -> Result<std::sync::Arc<Core>> {
        if nstreams == 0 {
            return Err(Error::Internal(
                "a comm needs at least one data stream".into(),
            ));
        }
        let inline = Inline::new(inline, peer, rx)?;
        HELD.comms.fetch_add(1, Relaxed);
        // A receiver's ring is fed by the data streams and the inline stream;
        // the data streams are absent until the sender opens them.
        let ring = match rx {
            Some(_) => {
                let r = Ring::with_producers(nstreams + 1);
                (0..nstreams).for_each(|k| r.producer_absent(k));
                r
            }
            None => Ring::default(),
        };
        let core = std::sync::Arc::new(Core {
            ring,
            socks: (0..nstreams).map(|_| OnceLock::new()).collect(),
            inline,
            rx,
            devs: std::array::from_fn(|_| Mutex::new(None)),
            peer,
            stats: Stats::default(),
            error: Mutex::new(None),
            broken: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            report_every,
            born: Instant::now(),
            last_report_ms: AtomicU64::new(0),
            direction,
        });
        let kind = if rx.is_some() { "recv" } else { "send" };
        let weak = Arc::downgrade(&core);
        crate::stats_export::register(weak);
        core.ring.report().set_label(format!(
            "{kind} comm #{} ({direction} {peer})",
            crate::proto::slots::Report::next_comm_id()
        ));
        // SAFETY: the hook's data is this core, and the ring is inside it: the hook
        // cannot outlive what it points to.
        unsafe {
            core.ring.set_hook(Hook {
                data: std::sync::Arc::as_ptr(&core) as *const (),
                f: Core::poke_raw,
            })
        };
        Ok(core)
    }

    /// The ring's progress hook: moves the inline stream along (from `test`).
    ///
    /// # Safety
    /// `p` is a live `Core`.
    unsafe fn poke_raw(p: *const ()) {
        (*(p as *const Core)).poke();
    }

    /// Moves the inline stream along: writes what the sender has queued, or reads
    /// what has arrived for the receiver. Never blocks.
    pub fn poke(&self) {
        match self.rx {
            None => self.inline.progress_tx(self),
            Some(lim) => self.inline.progress_rx(self, lim),
        }
    }

    /// Receive side: the producer index of the inline stream (data streams are
    /// 0..n, in the ring and in the sockets).
    pub fn inline_producer(&self) -> usize {
        self.socks.len()
    }

    /// Receive side: stream `who` (a data stream, or [`Core::inline_producer`])
    /// ended cleanly between messages. Once all have, nothing more can arrive and
    /// the comm fails with a remote error (quietly if nothing is pending). It fails
    /// earlier if a pending receive can no longer complete: see [`Core::stalled`].
    pub fn stream_ended(&self, who: usize) {
        if who == self.inline_producer() {
            // The sender closed: a data stream not attached by now never carried
            // a byte (the sender writes only once we have attached it).
            self.ring.absent_end();
        }
        let verdict = stream::stream_ended(&self.ring, who, self.peer);
        if self.closing() {
            return;
        }
        if let Some(e) = verdict {
            self.fail(e);
        }
    }

    /// The error of a receive, for message `seq`, that can no longer complete: the
    /// streams that have not ended all hold a later message, not posted yet.
    pub fn stalled(&self, seq: u64) -> Error {
        stream::stalled_error(seq, self.peer)
    }

    /// Receive side: the inline stream has ended cleanly.
    pub fn inline_ended(&self) -> bool {
        self.ring.producer_has_ended(self.inline_producer())
    }

    /// Logs the counters if a periodic report is due. One relaxed load when it is not.
    pub fn maybe_report(&self) {
        let Some(every) = self.report_every else {
            return;
        };
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_report_ms.load(Relaxed);
        if now.saturating_sub(last) >= every.as_millis() as u64
            && self
                .last_report_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            info!(
                "stats {} {}: {}",
                self.direction,
                self.peer,
                self.stats.summary()
            );
        }
    }

    /// The comm is unusable: the first error is kept, logged once, given to every
    /// pending request and to every later call; the sockets are shut so that the
    /// other I/O threads stop too.
    pub fn fail(&self, e: Error) {
        {
            let mut g = self.error.lock();
            if g.is_none() {
                // A peer that closes while nothing is in flight is an orderly
                // teardown: no WARN. Any later call still gets the error.
                // Otherwise the first failure is the one WARN of this comm
                // (see `Report`).
                if self.closing.load(Acquire) {
                } else if self.ring.idle() && matches!(e, Error::Remote(_)) {
                    info!("{}: {e}", self.ring.report().label());
                } else if self.ring.report().first() {
                    warn!("{} failed: {e}", self.ring.report().label());
                }
                *g = Some(e);
            }
            self.broken.store(true, Release);
            self.ring.fail_all(g.as_ref().expect("set above"));
        }
        self.shutdown();
        self.ring.wake_all();
    }

    /// `Err` once the comm has failed.
    pub fn check(&self) -> Result<()> {
        if self.broken.load(Acquire) {
            Err(self
                .error
                .lock()
                .as_ref()
                .map(Error::duplicate)
                .unwrap_or_else(|| Error::Internal("comm broken".into())))
        } else {
            Ok(())
        }
    }

    /// I/O threads stop waiting when this is true.
    pub fn stopped(&self) -> bool {
        self.broken.load(Acquire) || self.closing.load(Acquire)
    }

    pub fn closing(&self) -> bool {
        self.closing.load(Acquire)
    }

    pub fn shutdown(&self) {
        for s in self
            .socks
            .iter()
            .filter_map(|s| s.get().map(|s| &**s))
            .chain([self.inline.socket()])
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Data stream `who` is up with `sock`. False if it already was, or (receivers)
    /// if it can no longer come because the sender closed.
    pub fn attach(&self, who: usize, sock: Arc<Socket>) -> bool {
        let Some(slot) = self.socks.get(who) else {
            return false;
        };
        if self.rx.is_some() && !self.ring.producer_attach(who) {
            return false;
        }
        if slot.set(sock).is_err() {
            return false;
        }
        self.stats.add(&self.stats.streams, 1);
        HELD.data_streams.fetch_add(1, Relaxed);
        if self.stopped() {
            // Raced with a failure or a close: cut it like the others.
            self.shutdown();
        }
        true
    }

    /// Data streams up now.
    pub fn streams_up(&self) -> usize {
        self.socks.iter().filter(|s| s.get().is_some()).count()
    }

    /// Close: with `abort`, in-flight I/O is cut off; otherwise queued data drains.
    pub fn begin_close(&self, abort: bool) {
        self.closing.store(true, Release);
        if abort {
            self.shutdown();
        }
        self.ring.wake_all();
    }
}

/// A receiver's posted buffers: device memory where `irecv` said so.
impl Placement for Core {
    fn is_device(&self, seq: u64) -> bool {
        self.devs[seq as usize % NSLOTS].lock().is_some()
    }
}

impl crate::stats_export::CommStats for Core {
    fn comm_stats(&self) -> &Stats {
        &self.stats
    }
    fn peer(&self) -> SocketAddr {
        self.peer
    }
    fn kind(&self) -> &'static str {
        if self.rx.is_some() {
            "recv"
        } else {
            "send"
        }
    }
    fn transport(&self) -> &'static str {
        "tcp"
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        crate::stats_export::retire(self);
        HELD.comms.fetch_sub(1, Relaxed);
        HELD.data_streams
            .fetch_sub(self.streams_up() as u64, Relaxed);
        info!("{}", HELD.summary());
    }
}
