//! The process-wide budget for compression buffers (issue 20): the IB
//! receivers' staging slots and senders' registered frame buffers, and the TCP
//! senders' and receivers' staging, of every comm together stay under one cap,
//! so that this memory follows the machine, not the number of comms (before: 4 MiB of IB
//! staging and 2 MiB of frame buffers per comm pair, registered at connect;
//! 2,000 comms held 6 GB).
//!
//! A comm reserves buffers when it needs them (IB: a receive posted, a chunk
//! worth compressing, kept until the comm closes; TCP: a chunk to compress,
//! given back when the comm goes idle; TCP receivers: one chunk's, from its header
//! until its bytes are placed). A sender or IB receiver that finds the budget
//! spent never waits: IB receives grant no staging (the sender then writes
//! every chunk raw, straight into NCCL's buffer), sends go raw, and it tries
//! again at its next receive or chunk. A TCP receiver, whose sender already
//! compressed the chunk, stops reading that one stream until budget comes back
//! ([`receiver_reserve`] says why that ends).
//!
//! The cap: `NCCL_ZIP_BUFFER_MB`, or by default 1/32 of the machine's memory
//! shared among the node's ranks, between 64 MiB and 4 GiB per process.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

use parking_lot::Mutex;

/// A count of reserved bytes under a cap.
#[derive(Debug, Default)]
pub struct Budget {
    used: AtomicU64,
}

/// The process's buffer budget.
pub static BUFFERS: Budget = Budget {
    used: AtomicU64::new(0),
};

/// Bytes of a budget held by one comm; given back when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    n: u64,
    b: &'a Budget,
}

impl Reservation<'_> {
    pub fn bytes(&self) -> u64 {
        self.n
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.b.used.fetch_sub(self.n, Relaxed);
        RELEASES.fetch_add(1, SeqCst);
        if WAITING.load(SeqCst) > 0 {
            wake_waiters();
        }
    }
}

/// Reservations given back so far, of every budget: a receiver reads it before
/// it asks, and waits with [`wake_on_release`] when refused.
static RELEASES: AtomicU64 = AtomicU64::new(0);
/// Waiters registered with [`wake_on_release`], and how many (read without the
/// lock on every release).
static WAITERS: Mutex<Vec<Box<dyn FnOnce() + Send>>> = Mutex::new(Vec::new());
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// The count of reservations given back so far ([`wake_on_release`]).
pub fn releases() -> u64 {
    RELEASES.load(SeqCst)
}

/// Calls `wake` once, after a reservation is given back later than
/// [`releases`] said `seen` (at once if one already was): a TCP receiver the
/// budget refused waits for this instead of polling. (Either the release sees
/// the waiter counted, or the waiter sees the release counted: both are
/// sequentially consistent, so no wake-up is lost.)
pub fn wake_on_release(seen: u64, wake: Box<dyn FnOnce() + Send>) {
    WAITERS.lock().push(wake);
    WAITING.fetch_add(1, SeqCst);
    if RELEASES.load(SeqCst) != seen {
        wake_waiters();
    }
}

fn wake_waiters() {
    let woken = std::mem::take(&mut *WAITERS.lock());
    WAITING.fetch_sub(woken.len(), SeqCst);
    for w in woken {
        w();
    }
}

impl Budget {
    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Reserves `n` bytes if that keeps the total within `cap`.
    pub fn reserve(&self, n: u64, cap: u64) -> Option<Reservation<'_>> {
        let mut cur = self.used.load(Relaxed);
        loop {
            let next = cur.checked_add(n).filter(|&t| t <= cap)?;
            match self.used.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return Some(Reservation { n, b: self }),
                Err(now) => cur = now,
            }
        }
    }
}

/// The cap in bytes: `mb` MiB when the user set `NCCL_ZIP_BUFFER_MB`, else
/// [`default_cap`].
pub fn cap(mb: Option<u64>) -> u64 {
    mb.map_or_else(default_cap, |m| m << 20)
}

/// The part of `cap` senders may take: all but [`receiver_reserve`].
pub fn sender_cap(cap: u64) -> u64 {
    cap - receiver_reserve(cap)
}

/// The part of `cap` only receivers may take: 1/8. A TCP receiver that finds
/// the budget spent stops reading its own stream until budget comes back.
/// Budget held by receivers always comes back (a receiver holds it for one
/// chunk, whose bytes its sender already has), while budget held by senders may
/// wait for a remote receiver; so a receiver chunk of at most this size always
/// gets budget in the end. A larger one (a budget under 8 chunks) takes its
/// staging outside the budget when refused, rather than wait on other comms.
pub fn receiver_reserve(cap: u64) -> u64 {
    cap / 8
}

/// The default cap: 1/32 of physical memory divided among the node's ranks,
/// clamped to 64 MiB ..= 4 GiB.
pub fn default_cap() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ram = if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        16 << 30
    };
    let ranks = crate::transport::tcp::workers::local_ranks().max(1) as u64;
    (ram / 32 / ranks).clamp(64 << 20, 4 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_woken_by_a_later_release_or_at_once_after_an_earlier_one() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let b = Budget::default();
        let r = b.reserve(10, 100).expect("fits");
        let woke = Arc::new(AtomicBool::new(false));
        let seen = releases();
        let w = woke.clone();
        wake_on_release(seen, Box::new(move || w.store(true, SeqCst)));
        // Other tests' releases may wake it too (the count is process-wide); this
        // one surely does.
        drop(r);
        assert!(woke.load(SeqCst), "the release woke the waiter");
        // A release between reading the count and waiting: woken at once.
        let seen = releases();
        drop(b.reserve(1, 100).expect("fits"));
        let w = Arc::new(AtomicBool::new(false));
        let w2 = w.clone();
        wake_on_release(seen, Box::new(move || w2.store(true, SeqCst)));
        assert!(w.load(SeqCst), "woken at once: a release came after `seen`");
    }

    #[test]
    fn reservations_stay_under_the_cap_and_come_back() {
        let b = Budget::default();
        let a = b.reserve(600, 1000).expect("fits");
        assert!(b.reserve(600, 1000).is_none(), "over the cap");
        let c = b.reserve(400, 1000).expect("fits exactly");
        drop(a);
        let d = b.reserve(600, 1000).expect("freed");
        drop((c, d));
        assert_eq!(b.used(), 0);
        assert!(default_cap() >= 64 << 20 && default_cap() <= 4 << 30);
    }
}
