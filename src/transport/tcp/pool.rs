//! The process's free staging buffers: a data stream gives its staging back when
//! its comm goes idle (no request in flight) and takes one again for its next
//! compressed or device chunk. So a lightly used comm holds no staging between
//! messages, and a comm that is busy again reuses a buffer instead of allocating
//! and faulting one in. Bounded: at most [`MAX_FREE`] buffers wait here (the
//! others go back to the allocator). Taking never waits: an empty list means a
//! fresh allocation by the stream that needs it, for itself alone.

use std::sync::atomic::Ordering::Relaxed;

use parking_lot::Mutex;

use crate::budget::{Reservation, BUFFERS};
use crate::stats::{Stats, HELD};

/// Most free buffers kept (each at most one chunk's worst-case frame).
const MAX_FREE: usize = 32;

static FREE: Mutex<Vec<Vec<u8>>> = parking_lot::const_mutex(Vec::new());

/// A buffer of at least `n` bytes (its length; contents unspecified), from the
/// free list when one is there. Not counted anywhere: the caller counts it as
/// its staging.
pub fn take(n: usize) -> Vec<u8> {
    let got = {
        let mut free = FREE.lock();
        // The largest is at the end (see `give`).
        match free.last() {
            Some(b) if b.len() >= n => free.pop(),
            _ => None,
        }
    };
    match got {
        Some(b) => {
            HELD.pooled_bytes.fetch_sub(b.len() as u64, Relaxed);
            b
        }
        None => vec![0u8; n],
    }
}

/// Gives `b` back (the caller has uncounted it from its staging).
pub fn give(b: Vec<u8>) {
    if b.is_empty() {
        return;
    }
    let mut free = FREE.lock();
    if free.len() >= MAX_FREE {
        // Keep the larger buffers: drop the smallest.
        if free[0].len() >= b.len() {
            return;
        }
        let old = free.remove(0);
        HELD.pooled_bytes.fetch_sub(old.len() as u64, Relaxed);
    }
    HELD.pooled_bytes.fetch_add(b.len() as u64, Relaxed);
    let at = free.partition_point(|x| x.len() <= b.len());
    free.insert(at, b);
}

/// A stream's staging buffer: taken from the free list, counted in its comm's
/// stats and in [`HELD`] while held, given back when the comm goes idle. What a
/// sender holds counts against the process's buffer budget ([`crate::budget`]).
#[derive(Default)]
pub struct Staging {
    buf: Vec<u8>,
    /// The budget the buffer holds (senders).
    res: Option<Reservation<'static>>,
}

impl Staging {
    /// At least `n` bytes, counted. For a receiver: a chunk already on its way
    /// must be read whatever the budget says.
    pub fn grow(&mut self, n: usize, stats: &Stats) {
        if self.buf.is_empty() {
            self.buf = take(n);
            let got = self.buf.len() as u64;
            stats.add(&stats.staging_bytes, got);
            HELD.staging_bytes.fetch_add(got, Relaxed);
        }
        if self.buf.len() < n {
            let grow = (n - self.buf.len()) as u64;
            self.buf.resize(n, 0);
            stats.add(&stats.staging_bytes, grow);
            HELD.staging_bytes.fetch_add(grow, Relaxed);
        }
    }

    /// As [`Staging::grow`], within the process's buffer budget of `cap` bytes:
    /// `false` (nothing taken; the caller sends raw) when it would go over.
    pub fn try_grow(&mut self, n: usize, stats: &Stats, cap: u64) -> bool {
        let held = self.res.as_ref().map_or(0, |r| r.bytes()) as usize;
        if n > held {
            // One reservation for the whole buffer: the old one goes once the
            // new one is granted.
            match BUFFERS.reserve(n.max(self.buf.len()) as u64, cap) {
                Some(r) => self.res = Some(r),
                None => {
                    stats.add(&stats.budget_refusals, 1);
                    return false;
                }
            }
        }
        self.grow(n, stats);
        true
    }

    /// Gives the buffer (and its budget) back, uncounted.
    pub fn release(&mut self, stats: &Stats) {
        let b = std::mem::take(&mut self.buf);
        let n = b.len() as u64;
        stats.staging_bytes.fetch_sub(n, Relaxed);
        HELD.staging_bytes.fetch_sub(n, Relaxed);
        self.res = None;
        give(b);
    }
}

impl std::ops::Deref for Staging {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for Staging {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Not released: the comm's counters go with the comm; the plugin-wide
        // one must not keep the buffer.
        HELD.staging_bytes.fetch_sub(self.buf.len() as u64, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_larger_first_and_the_list_is_bounded() {
        let held = || HELD.pooled_bytes.load(Relaxed);
        let before = held();
        give(vec![1u8; 1000]);
        give(vec![2u8; 5000]);
        assert!(held() >= before + 6000);
        // The largest fits; a request larger than every free buffer allocates.
        let b = take(4000);
        assert!(b.len() >= 4000);
        let c = take(1 << 22);
        assert_eq!(c.len(), 1 << 22);
        for _ in 0..2 * MAX_FREE {
            give(vec![0u8; 10]);
        }
        assert!(FREE.lock().len() <= MAX_FREE);
        // Sorted by size: the largest at the end.
        let f = FREE.lock();
        assert!(f.windows(2).all(|w| w[0].len() <= w[1].len()));
    }
}
