//! The process-wide IB progress workers: a few threads that drive the protocol of
//! every IB comm in the process (issue 20), so that the thread count follows the
//! machine, not the number of comms. Before, each comm had its own progress
//! thread: 2,000 comms, 2,000 threads.
//!
//! A comm's progress is a [`Progress`] object: one [`Progress::step`] takes the
//! comm's posted commands, polls its completion queue and its control socket, and
//! says whether it moved anything. A worker steps each of its comms in turn,
//! without pause while any moved something, yielding while some have work in
//! flight but nothing moved, and parking for at most [`IDLE_WAIT`] when all are
//! idle (a post unparks it: [`Membership::kick`]). A comm is given to the
//! worker with the fewest comms when it starts, and stays there.
//!
//! How many: as for the TCP I/O workers ([`crate::transport::tcp::workers::count`]):
//! the CPUs this process may run on shared among the node's ranks, at most 8,
//! `NCCL_ZIP_IO_THREADS` caps it.

use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::stats::HELD;

/// How long an idle worker sleeps between looks at its comms' control sockets.
pub const IDLE_WAIT: Duration = Duration::from_millis(5);

/// What one step of a comm's progress did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Something moved (a command taken, a completion, a control record).
    Moved,
    /// Work is in flight but nothing moved this time.
    Waiting,
    /// Nothing in flight.
    Idle,
    /// Finished: the comm closed (its resources are released) or can never go on.
    Done,
}

/// A comm's protocol progress, driven by one worker, one step at a time.
pub trait Progress: Send {
    fn step(&mut self) -> Step;
    /// The step panicked: fail the comm with `what`; the worker then drops it.
    fn panicked(&mut self, what: String);
}

/// Set once a comm's progress is finished and dropped by its worker.
#[derive(Default)]
struct Finished {
    done: Mutex<bool>,
    cv: Condvar,
}

/// A comm's progress and the flag its close waits on.
type Member = (Box<dyn Progress>, Arc<Finished>);

struct Worker {
    /// Comms handed to this worker since it last looked.
    inbox: Mutex<Vec<Member>>,
    thread: OnceLock<Thread>,
    comms: AtomicUsize,
}

struct Pool {
    workers: Vec<Arc<Worker>>,
}

/// A comm's place in a worker.
pub struct Membership {
    worker: Arc<Worker>,
    finished: Arc<Finished>,
}

impl Membership {
    /// Wakes the comm's worker (a command was posted).
    pub fn kick(&self) {
        if let Some(t) = self.worker.thread.get() {
            t.unpark();
        }
    }

    /// Waits until the worker has finished the comm's progress (after the comm's
    /// command channel was closed, so its next step returns [`Step::Done`]).
    pub fn wait_finished(&self) {
        self.kick();
        let mut d = self.finished.done.lock();
        while !*d {
            // The kick may have landed before the worker parked: kick again now and then.
            if self
                .finished
                .cv
                .wait_for(&mut d, Duration::from_millis(50))
                .timed_out()
            {
                self.kick();
            }
        }
    }
}

static POOL: OnceLock<std::result::Result<Pool, String>> = OnceLock::new();

/// Hands `p` to the least loaded worker (workers start on first use; `cap`:
/// `NCCL_ZIP_IO_THREADS`).
pub fn adopt(p: Box<dyn Progress>, cap: Option<usize>) -> Result<Membership> {
    let pool = POOL
        .get_or_init(|| Pool::start(crate::transport::tcp::workers::count(cap)))
        .as_ref()
        .map_err(|e| Error::Internal(format!("IB progress workers: {e}")))?;
    let worker = pool
        .workers
        .iter()
        .min_by_key(|w| w.comms.load(Relaxed))
        .expect("at least one worker")
        .clone();
    let finished = Arc::new(Finished::default());
    worker.comms.fetch_add(1, Relaxed);
    worker.inbox.lock().push((p, finished.clone()));
    let m = Membership { worker, finished };
    m.kick();
    Ok(m)
}

/// The number of IB progress workers running (0 before the first IB comm).
pub fn running() -> usize {
    POOL.get()
        .and_then(|p| p.as_ref().ok())
        .map_or(0, |p| p.workers.len())
}

impl Pool {
    fn start(n: usize) -> std::result::Result<Pool, String> {
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let w = Arc::new(Worker {
                inbox: Mutex::new(Vec::new()),
                thread: OnceLock::new(),
                comms: AtomicUsize::new(0),
            });
            let w2 = w.clone();
            let h = std::thread::Builder::new()
                .name(format!("zip-ib-{i}"))
                .spawn(move || w2.run())
                .map_err(|e| format!("spawn IB progress worker: {e}"))?;
            let _ = w.thread.set(h.thread().clone());
            HELD.io_threads.fetch_add(1, Relaxed);
            workers.push(w);
        }
        tracing::info!("IB progress: {n} shared workers");
        Ok(Pool { workers })
    }
}

impl Worker {
    fn run(&self) {
        let mut mine: Vec<Member> = Vec::new();
        loop {
            mine.append(&mut self.inbox.lock());
            let (mut moved, mut waiting) = (false, false);
            let mut i = 0;
            while i < mine.len() {
                let p = &mut mine[i].0;
                let step = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.step()))
                {
                    Ok(s) => s,
                    Err(e) => {
                        let what = e
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| e.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        p.panicked(format!("IB progress panicked: {what}"));
                        Step::Done
                    }
                };
                match step {
                    Step::Moved => moved = true,
                    Step::Waiting => waiting = true,
                    Step::Idle => {}
                    Step::Done => {
                        // Dropped (fabric, queues, memory) before the comm's close returns.
                        let (p, fin) = mine.swap_remove(i);
                        drop(p);
                        self.comms.fetch_sub(1, Relaxed);
                        *fin.done.lock() = true;
                        fin.cv.notify_all();
                        continue;
                    }
                }
                i += 1;
            }
            if moved {
                continue;
            }
            if waiting {
                std::thread::yield_now();
            } else if self.inbox.lock().is_empty() {
                std::thread::park_timeout(IDLE_WAIT);
            }
        }
    }
}
