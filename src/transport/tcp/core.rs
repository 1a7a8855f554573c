//! State shared by a comm's progress-thread side and its I/O threads, common to
//! both directions: the request ring, the sockets, and how the comm fails.

use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use socket2::Socket;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::proto::slots::Ring;
use crate::stats::{Stats, HELD};

pub struct Core {
    pub ring: Ring,
    pub socks: Vec<Socket>,
    pub peer: SocketAddr,
    pub stats: Stats,
    error: Mutex<Option<Error>>,
    broken: AtomicBool,
    closing: AtomicBool,
    /// Receive side: streams that ended cleanly.
    pub eofs: AtomicUsize,
    /// `NCCL_ZIP_STATS=1`: an INFO line with the counters at most this often.
    report_every: Option<Duration>,
    born: Instant,
    /// Milliseconds after `born` of the last periodic report.
    last_report_ms: AtomicU64,
    /// "send to" / "recv from", for log lines.
    pub direction: &'static str,
}

impl Core {
    pub fn new(
        socks: Vec<Socket>,
        peer: SocketAddr,
        direction: &'static str,
        report_every: Option<Duration>,
    ) -> Core {
        HELD.comms.fetch_add(1, Relaxed);
        Core {
            ring: Ring::default(),
            socks,
            peer,
            stats: Stats::default(),
            error: Mutex::new(None),
            broken: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            eofs: AtomicUsize::new(0),
            report_every,
            born: Instant::now(),
            last_report_ms: AtomicU64::new(0),
            direction,
        }
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
                if self.closing.load(Acquire) {
                } else if self.ring.idle() && matches!(e, Error::Remote(_)) {
                    info!("connection with {}: {e}", self.peer);
                } else {
                    warn!("connection with {} failed: {e}", self.peer);
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
        for s in &self.socks {
            let _ = s.shutdown(Shutdown::Both);
        }
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

impl Drop for Core {
    fn drop(&mut self) {
        HELD.comms.fetch_sub(1, Relaxed);
        info!("{}", HELD.summary());
    }
}

/// Spawns a comm's I/O thread; a panic inside it fails the comm instead of
/// unwinding into nothing.
pub fn spawn_io(
    name: String,
    core: std::sync::Arc<Core>,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            HELD.io_threads.fetch_add(1, Relaxed);
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                core.fail(Error::Internal(format!("I/O thread panicked: {what}")));
            }
            HELD.io_threads.fetch_sub(1, Relaxed);
        })
        .map_err(|e| Error::io("spawn I/O thread", e))
}
