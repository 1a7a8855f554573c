//! The process-wide codec workers: a few threads that compress the chunks TCP
//! senders put on the wire and decompress the chunks TCP receivers take off it,
//! for every comm of the process. The I/O workers ([`super::workers`]) never run
//! the codec: a stream hands its chunk over ([`CommQueue::submit`]), waits parked
//! (it never blocks its worker), and is kicked when the job is done.
//!
//! Fairness: each comm has its own queue ([`CommQueue`]); the workers serve the
//! comms that have work in turn, one job at a time (round robin over a
//! crossbeam channel of ready queues, where a queue sits at most once). A comm
//! with many chunks queued therefore delays another comm's chunk by at most one
//! job per worker, never by its whole backlog. Jobs of one comm may run on
//! several workers at once (the chunks of a large message compress in parallel,
//! and each goes on the wire as soon as it is done: split-send).
//!
//! How many: this rank's share of the CPUs ([`super::workers::cpu_share`]), at
//! most [`MAX_WORKERS`]; `NCCL_ZIP_CODEC_THREADS` caps it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use tracing::{info, warn};

use crate::codec_glue::ChunkDecoder;
use crate::error::{Error, Result};
use crate::stats::HELD;

/// Most codec workers (a bound whatever the machine says).
pub const MAX_WORKERS: usize = 64;

/// One piece of codec work.
pub type Job = Box<dyn FnOnce() + Send>;

/// The pool's end that takes ready comm queues.
pub struct CodecWorkers {
    ready: Sender<Arc<CommQueue>>,
    n: usize,
}

static POOL: OnceLock<std::result::Result<CodecWorkers, String>> = OnceLock::new();

/// The process's codec workers, started on first use (`cap`:
/// `NCCL_ZIP_CODEC_THREADS`).
pub fn codec_workers(cap: Option<usize>) -> Result<&'static CodecWorkers> {
    POOL.get_or_init(|| CodecWorkers::start(count(cap)).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Internal(format!("codec workers: {e}")))
}

/// The number of codec workers: see the module doc.
pub fn count(cap: Option<usize>) -> usize {
    let n = super::workers::cpu_share().clamp(1, MAX_WORKERS);
    cap.map_or(n, |c| n.min(c.max(1)))
}

impl CodecWorkers {
    fn start(n: usize) -> Result<CodecWorkers> {
        let (tx, rx) = crossbeam_channel::unbounded::<Arc<CommQueue>>();
        for i in 0..n {
            let (rx, tx) = (rx.clone(), tx.clone());
            std::thread::Builder::new()
                .name(format!("zip-codec{i}"))
                .spawn(move || {
                    HELD.codec_workers.fetch_add(1, Relaxed);
                    crate::adapt::count_this_thread();
                    serve(&rx, &tx)
                })
                .map_err(|e| Error::io("spawn codec worker", e))?;
        }
        info!("{n} codec workers for every TCP comm of this process");
        Ok(CodecWorkers { ready: tx, n })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// A fresh queue for one comm.
    pub fn queue(&'static self) -> Arc<CommQueue> {
        Arc::new(CommQueue {
            ready: &self.ready,
            st: Mutex::new(QueueState::default()),
            idle: Condvar::new(),
        })
    }
}

thread_local! {
    /// A codec worker's decode tables, kept from chunk to chunk whichever comm
    /// the chunk is for, dropped when the worker runs out of work (so that an
    /// idle process holds none).
    static DECODER: RefCell<Option<ChunkDecoder>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's decoder (a codec worker's, kept until it idles),
/// which takes every format.
pub fn with_thread_decoder<R>(f: impl FnOnce(&mut ChunkDecoder) -> R) -> R {
    // Any format: each frame is checked against its connection's agreement
    // before it gets here (`stream::Frame::decode`).
    DECODER.with(|d| {
        f(d.borrow_mut()
            .get_or_insert_with(|| ChunkDecoder::agreed(u8::MAX)))
    })
}

/// A worker's loop: take the next comm with work, run one of its jobs, put the
/// comm back at the end of the line if it has more.
fn serve(rx: &Receiver<Arc<CommQueue>>, tx: &Sender<Arc<CommQueue>>) {
    loop {
        let q = match rx.try_recv() {
            Ok(q) => q,
            Err(_) => {
                // Out of work: hold no decode tables while idle.
                DECODER.with(|d| d.borrow_mut().take());
                match rx.recv() {
                    Ok(q) => q,
                    Err(_) => return,
                }
            }
        };
        let job = {
            let mut st = q.st.lock();
            let job = st.jobs.pop_front();
            if st.jobs.is_empty() {
                st.scheduled = false;
            } else {
                let _ = tx.send(q.clone());
            }
            if job.is_some() {
                st.running += 1;
            }
            job
        };
        let Some(job) = job else { continue };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            warn!("codec worker: a job panicked; its stream will not go on");
        }
        let mut st = q.st.lock();
        st.running -= 1;
        if st.running == 0 {
            q.idle.notify_all();
        }
    }
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// In the pool's ready channel (at most once).
    scheduled: bool,
    /// Jobs of this comm running now.
    running: usize,
    closed: bool,
}

/// One comm's codec jobs.
pub struct CommQueue {
    ready: &'static Sender<Arc<CommQueue>>,
    st: Mutex<QueueState>,
    idle: Condvar,
}

impl CommQueue {
    /// Queues `job`; it runs on a codec worker soon. False (the job is dropped,
    /// not run) once the queue is closed.
    pub fn submit(self: &Arc<Self>, job: Job) -> bool {
        let mut st = self.st.lock();
        if st.closed {
            return false;
        }
        st.jobs.push_back(job);
        if !st.scheduled {
            st.scheduled = true;
            // The receiving end lives as long as the process (its workers never
            // exit), so this cannot fail.
            let _ = self.ready.send(self.clone());
        }
        true
    }

    /// Its comm closes: jobs not started are dropped, and this waits for the
    /// running ones (which may touch NCCL's buffers) to finish. Waits for this
    /// comm's own work only, one chunk's codec time at most.
    pub fn close(&self) {
        let mut st = self.st.lock();
        st.closed = true;
        let dropped = std::mem::take(&mut st.jobs);
        while st.running > 0 {
            self.idle.wait(&mut st);
        }
        drop(st);
        drop(dropped); // their captures (staging, budget) go back outside the lock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(20), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn count_follows_the_cap() {
        assert_eq!(count(Some(1)), 1);
        assert!((1..=MAX_WORKERS).contains(&count(None)));
        assert!(count(Some(1000)) <= MAX_WORKERS);
    }

    /// A comm with a long backlog does not hold back another comm's job: the
    /// workers take the comms in turn.
    #[test]
    fn a_busy_comm_does_not_starve_another() {
        let pool = codec_workers(None).unwrap();
        let (busy, other) = (pool.queue(), pool.queue());
        let busy_ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..1000 {
            let r = busy_ran.clone();
            assert!(busy.submit(Box::new(move || {
                r.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            })));
        }
        let before = busy_ran.load(SeqCst);
        let seen = Arc::new(AtomicUsize::new(usize::MAX));
        let (r, s) = (busy_ran.clone(), seen.clone());
        assert!(other.submit(Box::new(move || s.store(r.load(SeqCst), SeqCst))));
        wait_for("the other comm's job", || seen.load(SeqCst) != usize::MAX);
        // Served in turn: the other comm waited for about one busy job per
        // worker (a loose bound: a worker may be descheduled between taking the
        // other comm's job and running it while the rest go on), not for the
        // busy comm's backlog, which a single queue would have run first.
        let waited = seen.load(SeqCst) - before;
        assert!(
            waited <= 100 && seen.load(SeqCst) < 500,
            "{waited} busy jobs started before the other comm's ({} in all) with {} workers",
            seen.load(SeqCst),
            pool.len()
        );
        busy.close();
        assert!(!busy.submit(Box::new(|| {})), "closed");
    }

    /// `close` drops the jobs not started and returns only once the running one
    /// has finished.
    #[test]
    fn close_waits_for_running_jobs_and_drops_the_rest() {
        let pool = codec_workers(None).unwrap();
        let q = pool.queue();
        let started = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let (s, f) = (started.clone(), finished.clone());
        q.submit(Box::new(move || {
            s.store(1, SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            f.store(1, SeqCst);
        }));
        let ran_late = Arc::new(AtomicUsize::new(0));
        wait_for("the first job", || started.load(SeqCst) == 1);
        for _ in 0..10 {
            let r = ran_late.clone();
            q.submit(Box::new(move || {
                r.fetch_add(1, SeqCst);
            }));
        }
        q.close();
        assert_eq!(finished.load(SeqCst), 1, "close returned during a job");
        let late = ran_late.load(SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(ran_late.load(SeqCst), late, "a job ran after close");
    }
}
