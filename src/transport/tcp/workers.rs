//! The process-wide I/O workers: a few threads, each an epoll loop, that drive
//! the streams of every comm in the process, so the thread count follows the
//! machine, not the number of comms.
//!
//! epoll through `nix` (already a dependency, safe wrappers for epoll and
//! eventfd). A stream belongs to one worker, whose thread alone runs it. It is
//! registered once, edge-triggered, for both directions: the worker notes each
//! edge and runs the stream when it brings what its driver last asked for,
//! bytes (receive) or room (send). A driver asks only once its socket said so
//! (`EAGAIN`, or a transfer shorter than offered: a short write leaves the
//! socket marked as waiting for space, and the kernel signals when it has
//! some; after a short read the next bytes bring an edge, and a FIN or an
//! error whose edge came already is remembered: the stream then runs until
//! its driver sees the end), so no edge is missed, and no `epoll_ctl` re-arms
//! the socket after each run. (With one-shot registration a worker paid a
//! re-arm per wake-up: four system calls per refill of a socket whose window
//! is the limit, where the thread-per-stream design it replaced paid one.)
//! A stream that cannot go on until its comm does something (a receive is
//! posted, a chunk queued) parks; the comm kicks it (an eventfd wakes the
//! worker).
//!
//! How many: the CPUs this process may run on (its affinity mask), shared among
//! the ranks of this node when the mask is not already theirs alone, at most 8,
//! at least one per default data stream (4, see `MIN_WORKERS`);
//! `NCCL_ZIP_IO_THREADS` caps it.
//!
//! **Blocking writers.** Where a socket's window is the limit, an event loop
//! pays an `epoll_wait` and a `sendmsg` per refill of the send buffer (some
//! 13 KiB with 16 KiB buffers), where a thread blocked in `sendmsg` lets the
//! kernel go on copying at each wake-up: one system call per chunk. With the
//! CPUs shared (by the training job, or here by a second busy process), that
//! made the workers move 0.94-0.97x of the thread-per-stream build on the
//! window-limited cell, and 0.975-1.00x with the writers (session 16,
//! `bench/results/tcp-window-2026-11-26-s16.md`).
//! So a send stream whose socket is full with bulk bytes left says
//! [`Next::Lend`], and its worker lends it to one of a few blocking writers
//! (as many as there are workers, started on first need): the writer writes
//! on with blocking sends, each bounded by the socket's send timeout
//! ([`LENT_WAIT`], set by the stream), and gives the stream back when its
//! share is written, its queue is empty, or a send timed out. The worker
//! neither runs nor re-lends a stream while it is lent; edges that come
//! meanwhile are kept, and the stream runs on its worker once it is back.
//! When no writer is idle the stream waits for room on its worker as before.
//! Abort cuts the socket (`shutdown`), which ends a blocked send at once.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, OnceLock};

use nix::poll::PollTimeout;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::stats::HELD;

/// What a stream's driver wants after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run again when the socket has bytes.
    Readable,
    /// Run again when the socket takes bytes.
    Writable,
    /// Run again when kicked ([`Registration::kick`]).
    Park,
    /// Run again soon (waits on a shared resource that has no wake-up, a GPU lane).
    Retry,
    /// Run again after the worker's other ready streams: the run stopped at its
    /// share of the worker, with bytes or room left (no edge will come for them).
    Yield,
    /// The socket is full and bulk bytes are left: a blocking writer may go on
    /// ([`Driven::run_lent`]); as [`Next::Writable`] when none is idle.
    Lend,
    /// Never again: the stream ended or its comm failed or closed.
    Done,
}

/// A stream driven by a worker. `run` is never called twice at once. It returns
/// [`Next::Readable`] or [`Next::Writable`] only after a read or write said
/// `EAGAIN` or moved less than offered: the registration is edge-triggered.
pub trait Driven: Send + Sync {
    fn run(&self) -> Next;
    fn fd(&self) -> RawFd;
    /// Writes on with blocking sends, on a blocking writer, after `run` said
    /// [`Next::Lend`]; returns when the stream should go back to its worker
    /// (which then runs it). Every send must be bounded ([`LENT_WAIT`]).
    fn run_lent(&self) {}
}

/// The longest a blocking writer's send waits for room (the send timeout of a
/// stream that says [`Next::Lend`]): a stalled peer gives the stream back to
/// its worker after this, and a close waits at most this for a lent run.
pub const LENT_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// The id of the worker's own eventfd in its epoll set.
const WAKE: u64 = 0;
/// How long a worker waits before running the streams that asked to retry.
const RETRY_MS: u8 = 1;

struct Worker {
    ep: Epoll,
    wake: EventFd,
    tasks: Mutex<HashMap<u64, Arc<dyn Driven>>>,
    /// Streams kicked since the worker last looked.
    kicked: Mutex<Vec<u64>>,
    /// Streams the blocking writers gave back since the worker last looked.
    returned: Mutex<Vec<u64>>,
    sleeping: AtomicBool,
    writers: Arc<Writers>,
}

pub struct Workers {
    workers: Vec<Arc<Worker>>,
    next_id: AtomicU64,
}

/// A stream lent to a blocking writer, and the worker to give it back to.
struct Lent {
    worker: Arc<Worker>,
    id: u64,
    task: Arc<dyn Driven>,
}

/// The blocking writers (see the module doc): at most `max` threads, started
/// when a stream is lent and none is idle.
struct Writers {
    tx: crossbeam_channel::Sender<Lent>,
    rx: crossbeam_channel::Receiver<Lent>,
    /// Writers waiting for a stream: each will take one sent on `tx`.
    idle: AtomicUsize,
    started: Mutex<usize>,
    max: usize,
}

impl Writers {
    fn new(max: usize) -> Writers {
        let (tx, rx) = crossbeam_channel::unbounded();
        Writers {
            tx,
            rx,
            idle: AtomicUsize::new(0),
            started: Mutex::new(0),
            max,
        }
    }

    /// Hands `job` to an idle writer, or to a new one while fewer than `max`
    /// run; gives it back when all are busy.
    fn try_lend(self: &Arc<Self>, job: Lent) -> std::result::Result<(), Lent> {
        if self
            .idle
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            // That writer is (or will be) waiting on `rx`.
            return self.tx.send(job).map_err(|e| e.into_inner());
        }
        let mut started = self.started.lock();
        if *started >= self.max {
            return Err(job);
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("zip-wr{}", *started))
            .spawn(move || {
                HELD.io_writers.fetch_add(1, Relaxed);
                crate::adapt::count_this_thread();
                // The first job is the one this thread was started for (sent
                // below, not counted in `idle`).
                let mut first = true;
                loop {
                    if !std::mem::take(&mut first) {
                        me.idle.fetch_add(1, SeqCst);
                    }
                    let Ok(j) = me.rx.recv() else { return };
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| j.task.run_lent()))
                        .is_err()
                    {
                        warn!("blocking writer: a stream's driver panicked");
                    }
                    j.worker.give_back(j.id);
                }
            });
        match spawned {
            Ok(_) => {
                *started += 1;
                self.tx.send(job).map_err(|e| e.into_inner())
            }
            Err(e) => {
                warn!("blocking writer: cannot start a thread: {e}");
                Err(job)
            }
        }
    }
}

/// What a worker's epoll set watches on a stream, edge-triggered: both
/// directions, or (`out` false, while a blocking writer has the stream) not
/// room to write, whose edges would wake the worker at every refill for
/// nothing.
fn interest(out: bool) -> EpollFlags {
    let f = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
    if out {
        f | EpollFlags::EPOLLOUT
    } else {
        f
    }
}

/// A stream's place in a worker. Dropping it does not deregister: call
/// [`Registration::close`].
pub struct Registration {
    worker: Arc<Worker>,
    id: u64,
    fd: RawFd,
}

static WORKERS: OnceLock<std::result::Result<Workers, String>> = OnceLock::new();

/// The process's workers, started on first use (`cap`: `NCCL_ZIP_IO_THREADS`).
pub fn workers(cap: Option<usize>) -> Result<&'static Workers> {
    WORKERS
        .get_or_init(|| Workers::start(count(cap)).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Internal(format!("I/O workers: {e}")))
}

/// CPUs in this process's affinity mask (1 if it cannot be read).
pub fn usable_cpus() -> usize {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .count()
            .max(1),
        Err(_) => 1,
    }
}

/// Ranks of this job on this node, from the launcher's environment (1 if none
/// says).
pub fn local_ranks() -> usize {
    [
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok())
    .filter(|&n| n > 0)
    .unwrap_or(1)
}

/// This rank's share of the CPUs: its affinity mask when the mask is narrower
/// than the machine (already this rank's share), else the mask divided among
/// the node's ranks; at least 1.
pub fn cpu_share() -> usize {
    let cpus = usable_cpus();
    let all = std::thread::available_parallelism().map_or(cpus, |n| n.get());
    let share = if cpus < all {
        cpus
    } else {
        cpus / local_ranks()
    };
    share.max(1)
}

/// The number of workers: see the module doc.
pub fn count(cap: Option<usize>) -> usize {
    let n = cpu_share().clamp(MIN_WORKERS, 8);
    cap.map_or(n, |c| n.min(c.max(1)))
}

/// Workers even on a small share of CPUs: one per data stream of a bulk comm
/// (the default count). Where the socket's window is the limit, each stream
/// must be refilled within its window's drain time; two workers serving four
/// streams on a 2-CPU VM (16 KiB socket buffers at 4 Gbit/s, 6 interleaved
/// rounds) moved 0.73-0.86x of the thread-per-stream build, four 0.86-0.95x,
/// eight no better than four. Idle workers sleep in `epoll_wait`.
const MIN_WORKERS: usize = crate::config::DEFAULT_NSTREAMS;

impl Workers {
    fn start(n: usize) -> Result<Workers> {
        let mut workers = Vec::with_capacity(n);
        let writers = Arc::new(Writers::new(n));
        for i in 0..n {
            let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
                .map_err(|e| Error::io("epoll_create", e.into()))?;
            let wake = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(|e| Error::io("eventfd", e.into()))?;
            ep.add(&wake, EpollEvent::new(EpollFlags::EPOLLIN, WAKE))
                .map_err(|e| Error::io("epoll_ctl", e.into()))?;
            let w = Arc::new(Worker {
                ep,
                wake,
                tasks: Mutex::new(HashMap::new()),
                kicked: Mutex::new(Vec::new()),
                returned: Mutex::new(Vec::new()),
                sleeping: AtomicBool::new(false),
                writers: writers.clone(),
            });
            let w2 = w.clone();
            std::thread::Builder::new()
                .name(format!("zip-io{i}"))
                .spawn(move || {
                    HELD.io_workers.fetch_add(1, Relaxed);
                    crate::adapt::count_this_thread();
                    w2.run()
                })
                .map_err(|e| Error::io("spawn I/O worker", e))?;
            workers.push(w);
        }
        info!("{n} I/O workers for every TCP comm of this process");
        Ok(Workers {
            workers,
            next_id: AtomicU64::new(WAKE + 1),
        })
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Adds `task` to a worker (spread by id) and runs it once soon.
    pub fn register(&self, task: Arc<dyn Driven>) -> Result<Registration> {
        let id = self.next_id.fetch_add(1, Relaxed);
        self.insert(id, task)
    }

    /// [`Workers::register`] a task made by `make`, which gets the task's
    /// [`Kicker`] before the task first runs.
    pub fn register_with<T: Driven + 'static>(
        &self,
        make: impl FnOnce(Kicker) -> Arc<T>,
    ) -> Result<(Arc<T>, Registration)> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let made = make(Kicker {
            worker: self.worker(id).clone(),
            id,
        });
        let r = self.insert(id, made.clone())?;
        Ok((made, r))
    }

    fn worker(&self, id: u64) -> &Arc<Worker> {
        &self.workers[(id as usize) % self.workers.len()]
    }

    fn insert(&self, id: u64, task: Arc<dyn Driven>) -> Result<Registration> {
        let w = self.worker(id).clone();
        let fd = task.fd();
        w.tasks.lock().insert(id, task);
        // Edge-triggered, both directions, once: the worker keeps what each
        // edge brought until the stream asks for it (see the module doc).
        // SAFETY: the fd belongs to the task, which stays alive (in `tasks`) at
        // least until `close` deletes it from the set.
        let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Err(e) = w.ep.add(bfd, EpollEvent::new(interest(true), id)) {
            w.tasks.lock().remove(&id);
            return Err(Error::io("epoll_ctl add", e.into()));
        }
        let r = Registration { worker: w, id, fd };
        r.kick();
        Ok(r)
    }
}

/// A handle that runs one stream soon ([`Registration::kick`]), for whoever
/// finishes work the stream waits for (a codec worker). Kicking a stream that
/// was closed meanwhile does nothing.
#[derive(Clone)]
pub struct Kicker {
    worker: Arc<Worker>,
    id: u64,
}

impl Kicker {
    pub fn kick(&self) {
        self.worker.kick(self.id);
    }
}

impl Registration {
    /// Runs the stream soon, whatever it waits for.
    pub fn kick(&self) {
        self.worker.kick(self.id);
    }

    /// Takes the stream out of its worker. A run in progress may still finish:
    /// the task must refuse work once its owner has closed it.
    pub fn close(self) {
        let task = self.worker.tasks.lock().remove(&self.id);
        if task.is_some() {
            // SAFETY: the task (which owns the fd) is alive here.
            let bfd = unsafe { BorrowedFd::borrow_raw(self.fd) };
            let _ = self.worker.ep.delete(bfd);
            // The worker then finds it gone and forgets its edges.
            self.worker.kick(self.id);
        }
    }
}

impl Worker {
    /// Runs task `id` soon.
    fn kick(&self, id: u64) {
        self.kicked.lock().push(id);
        self.wake_if_sleeping();
    }

    /// After an entry in `kicked` or `returned`: the worker announces its sleep
    /// before its last look at both lists, so it either sees the entry or is
    /// woken here.
    fn wake_if_sleeping(&self) {
        if self.sleeping.load(SeqCst) {
            let _ = self.wake.arm();
        }
    }

    /// Watches stream `id` for room to write, or stops (see [`interest`]).
    /// Turning it back on brings an edge if the socket has room. A stream
    /// closed meanwhile is no longer in the set: nothing to do.
    fn watch_out(&self, id: u64, out: bool) {
        let Some(task) = self.tasks.lock().get(&id).cloned() else {
            return;
        };
        // SAFETY: the task owns the fd and is alive (`task`). If `close` took
        // it out of the set meanwhile, `modify` fails and nothing changes.
        let bfd = unsafe { BorrowedFd::borrow_raw(task.fd()) };
        let _ = self.ep.modify(bfd, &mut EpollEvent::new(interest(out), id));
    }

    /// A blocking writer is done with stream `id`: it runs here again soon.
    fn give_back(&self, id: u64) {
        self.returned.lock().push(id);
        self.wake_if_sleeping();
    }

    fn run(self: &Arc<Self>) {
        let mut events = vec![EpollEvent::empty(); 256];
        let mut retry: Vec<u64> = Vec::new();
        let mut yielded: Vec<u64> = Vec::new();
        let mut due: Vec<u64> = Vec::new();
        // Per stream of this worker (only its thread touches it): what the
        // driver last asked for, and the edges seen since.
        let mut slots: HashMap<u64, Slot> = HashMap::new();
        loop {
            let timeout = if !yielded.is_empty() {
                PollTimeout::ZERO
            } else if retry.is_empty() {
                PollTimeout::NONE
            } else {
                PollTimeout::from(RETRY_MS)
            };
            // Announce the sleep before the last look at the kick list: a kick
            // after that look sees `sleeping` and writes the eventfd.
            self.sleeping.store(true, SeqCst);
            let n = if self.kicked.lock().is_empty() && self.returned.lock().is_empty() {
                match self.ep.wait(&mut events, timeout) {
                    Ok(n) => n,
                    Err(nix::errno::Errno::EINTR) => 0,
                    Err(e) => {
                        warn!("I/O worker: epoll_wait failed: {e}");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        0
                    }
                }
            } else {
                0
            };
            self.sleeping.store(false, SeqCst);
            due.clear();
            due.append(&mut retry);
            due.append(&mut yielded);
            for ev in &events[..n] {
                if ev.data() == WAKE {
                    let _ = self.wake.read();
                    continue;
                }
                let slot = slots.entry(ev.data()).or_default();
                slot.ready |= Slot::bits(ev.events());
                if slot.due() {
                    due.push(ev.data());
                }
            }
            due.append(&mut self.kicked.lock());
            for id in self.returned.lock().drain(..) {
                slots.entry(id).or_default().lent = false;
                self.watch_out(id, true);
                due.push(id);
            }
            due.sort_unstable();
            due.dedup();
            for &id in &due {
                if slots.get(&id).is_some_and(|s| s.lent) {
                    continue; // it runs once its writer gives it back
                }
                let Some(task) = self.tasks.lock().get(&id).cloned() else {
                    slots.remove(&id);
                    continue; // closed meanwhile
                };
                let next =
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run())) {
                        Ok(n) => n,
                        Err(_) => {
                            warn!("I/O worker: a stream's driver panicked; it is dropped");
                            Next::Done
                        }
                    };
                let slot = slots.entry(id).or_default();
                slot.want = next;
                match next {
                    // The driver found the socket empty (full): what earlier
                    // edges said is spent; the next edge brings it back.
                    Next::Readable if slot.ready & Slot::END != 0 => {
                        // The peer's FIN (or an error) came with bytes this run
                        // left: no edge follows it, so run until the driver
                        // reads the end.
                        yielded.push(id)
                    }
                    Next::Readable => slot.ready &= !Slot::IN,
                    Next::Writable => slot.ready &= !Slot::OUT,
                    Next::Lend => {
                        let job = Lent {
                            worker: self.clone(),
                            id,
                            task,
                        };
                        match self.writers.try_lend(job) {
                            Ok(()) => {
                                // Stop watching for room while a writer has it.
                                // Its give-back comes through this thread's
                                // loop, which watches again: after this.
                                slot.lent = true;
                                self.watch_out(id, false);
                            }
                            Err(_) => {
                                // Every writer is busy: wait for room here
                                // (the interest was never changed).
                                slot.want = Next::Writable;
                                slot.ready &= !Slot::OUT;
                            }
                        }
                    }
                    Next::Park => {}
                    Next::Retry => retry.push(id),
                    Next::Yield => yielded.push(id),
                    Next::Done => {
                        slots.remove(&id);
                        if self.tasks.lock().remove(&id).is_some() {
                            // SAFETY: the task owns the fd and is alive (`task`).
                            let bfd = unsafe { BorrowedFd::borrow_raw(task.fd()) };
                            let _ = self.ep.delete(bfd);
                        }
                    }
                }
            }
        }
    }
}

/// A worker's view of one stream.
struct Slot {
    want: Next,
    /// Edges seen since the driver last found that direction spent.
    ready: u8,
    /// A blocking writer has it: not run here until given back.
    lent: bool,
}

impl Default for Slot {
    fn default() -> Slot {
        // Until its first run (a kick, on registration) it waits for nothing.
        Slot {
            want: Next::Park,
            ready: 0,
            lent: false,
        }
    }
}

impl Slot {
    const IN: u8 = 1;
    const OUT: u8 = 2;
    /// The peer's FIN or an error: sticky, the socket stays readable.
    const END: u8 = 4;

    /// An error or hang-up wakes a stream whatever it waits for: its next
    /// read or write reports it.
    fn bits(ev: EpollFlags) -> u8 {
        let mut b = 0;
        let end = EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP;
        if ev.intersects(end) {
            b |= Slot::END | Slot::IN;
        }
        if ev.intersects(EpollFlags::EPOLLIN) {
            b |= Slot::IN;
        }
        if ev.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
            b |= Slot::OUT;
        }
        b
    }

    fn due(&self) -> bool {
        match self.want {
            Next::Readable => self.ready & (Slot::IN | Slot::END) != 0,
            Next::Writable => self.ready & Slot::OUT != 0,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_follows_the_cap() {
        assert_eq!(count(Some(1)), 1);
        assert!(count(None) >= MIN_WORKERS && count(None) <= 8);
        assert_eq!(count(Some(2)), 2);
        assert!(count(Some(100)) <= 8);
        assert!(usable_cpus() >= 1);
    }

    /// Reads its end of a socket pair, at most `per_run` bytes a run, and
    /// says what the worker contract asks: `Readable` after `EAGAIN`, `Yield`
    /// when it stopped with bytes left.
    struct Reader {
        sock: std::os::unix::net::UnixStream,
        per_run: usize,
        got: AtomicU64,
        runs: AtomicU64,
        ended: AtomicBool,
    }

    impl Driven for Reader {
        fn fd(&self) -> RawFd {
            use std::os::fd::AsRawFd;
            self.sock.as_raw_fd()
        }

        fn run(&self) -> Next {
            use std::io::Read;
            self.runs.fetch_add(1, SeqCst);
            let mut buf = vec![0u8; self.per_run];
            match (&self.sock).read(&mut buf) {
                Ok(0) => {
                    self.ended.store(true, SeqCst);
                    Next::Done
                }
                Ok(n) => {
                    self.got.fetch_add(n as u64, SeqCst);
                    if n == self.per_run {
                        Next::Yield
                    } else {
                        // A short read: the socket is empty for now.
                        Next::Readable
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Next::Readable,
                Err(_) => Next::Done,
            }
        }
    }

    /// Says [`Next::Lend`] on its first run, then parks; its lent run takes
    /// `hold` and notes whether the worker ever ran it meanwhile.
    struct Lender {
        sock: std::os::unix::net::UnixStream,
        hold: std::time::Duration,
        runs: AtomicU64,
        lent_runs: AtomicU64,
        lent_now: AtomicBool,
        overlapped: AtomicBool,
    }

    impl Lender {
        fn new(hold_ms: u64) -> Arc<Lender> {
            let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
            Arc::new(Lender {
                sock: a,
                hold: std::time::Duration::from_millis(hold_ms),
                runs: AtomicU64::new(0),
                lent_runs: AtomicU64::new(0),
                lent_now: AtomicBool::new(false),
                overlapped: AtomicBool::new(false),
            })
        }
    }

    impl Driven for Lender {
        fn fd(&self) -> RawFd {
            use std::os::fd::AsRawFd;
            self.sock.as_raw_fd()
        }

        fn run(&self) -> Next {
            if self.lent_now.load(SeqCst) {
                self.overlapped.store(true, SeqCst);
            }
            if self.runs.fetch_add(1, SeqCst) == 0 {
                Next::Lend
            } else {
                Next::Park
            }
        }

        fn run_lent(&self) {
            self.lent_now.store(true, SeqCst);
            std::thread::sleep(self.hold);
            self.lent_now.store(false, SeqCst);
            self.lent_runs.fetch_add(1, SeqCst);
        }
    }

    /// A stream that says `Lend` runs on a blocking writer; kicks and edges
    /// that come meanwhile do not run it on its worker; once given back it
    /// runs there again. With every writer busy, `try_lend` refuses (the
    /// stream then waits for room on its worker).
    #[test]
    fn lent_streams_run_on_a_writer_and_come_back() {
        let ws = Workers::start(1).unwrap();
        let l = Lender::new(200);
        let reg = ws.register(l.clone()).unwrap();
        wait_for("lent", || l.lent_now.load(SeqCst));
        for _ in 0..20 {
            reg.kick();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        wait_for("given back and run again", || l.runs.load(SeqCst) >= 2);
        assert_eq!(l.lent_runs.load(SeqCst), 1);
        assert!(!l.overlapped.load(SeqCst), "the worker ran a lent stream");
        assert!(HELD.io_writers.load(SeqCst) >= 1);
        reg.close();

        // One writer at most: a second lend while it is busy is refused.
        let writers = Arc::new(Writers::new(1));
        let w = ws.workers[0].clone();
        let (a, b) = (Lender::new(300), Lender::new(0));
        let job = |t: &Arc<Lender>| Lent {
            worker: w.clone(),
            id: 1_000_000,
            task: t.clone(),
        };
        assert!(writers.try_lend(job(&a)).is_ok());
        wait_for("the first lend runs", || a.lent_now.load(SeqCst));
        assert!(writers.try_lend(job(&b)).is_err());
        wait_for("the writer is idle again", || {
            writers.idle.load(SeqCst) == 1
        });
        assert!(writers.try_lend(job(&b)).is_ok());
        wait_for("the second lend ran", || b.lent_runs.load(SeqCst) == 1);
        assert_eq!(*writers.started.lock(), 1);
    }

    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed().as_secs() < 10, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Edge-triggered registration: a stream that found its socket empty runs
    /// again on every later write, without a re-arm; one that yields with
    /// bytes left is run again although no new edge comes; a FIN that came with
    /// the last bytes is read although its edge preceded the short read.
    #[test]
    fn edges_wake_streams_and_yields_run_again() {
        use std::io::Write;
        let ws = Workers::start(1).unwrap();
        for per_run in [4096, 1] {
            let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            let r = Arc::new(Reader {
                sock: a,
                per_run,
                got: AtomicU64::new(0),
                runs: AtomicU64::new(0),
                ended: AtomicBool::new(false),
            });
            let reg = ws.register(r.clone()).unwrap();
            let mut sent = 0u64;
            for k in 1..=5u64 {
                // Nothing read yet may be pending when the next write comes.
                b.write_all(&vec![7u8; 100 * k as usize]).unwrap();
                sent += 100 * k;
                wait_for(&format!("per_run {per_run}: write {k} read"), || {
                    r.got.load(SeqCst) == sent
                });
            }
            if per_run == 1 {
                // 1,500 bytes a byte a run: yields, not edges, carried it.
                assert!(r.runs.load(SeqCst) >= sent, "{} runs", r.runs.load(SeqCst));
            }
            // Bytes and the FIN at once: the run that reads the bytes short
            // stops there, and the FIN's edge, already seen, must not be lost.
            b.write_all(&[1u8; 10]).unwrap();
            b.shutdown(std::net::Shutdown::Write).unwrap();
            wait_for(&format!("per_run {per_run}: the end read"), || {
                r.ended.load(SeqCst)
            });
            assert_eq!(r.got.load(SeqCst), sent + 10);
            reg.close();
        }
    }
}
