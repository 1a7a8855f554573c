//! The process's free staging buffers: a data stream gives its staging back when
//! its comm goes idle (no request in flight) and takes one again for its next
//! compressed or device chunk. So a lightly used comm holds no staging between
//! messages, and a comm that is busy again reuses a buffer instead of allocating
//! and faulting one in. Bounded: at most [`MAX_FREE`] buffers wait here (the
//! others go back to the allocator). Taking never waits: an empty list means a
//! fresh allocation by the stream that needs it, for itself alone.

use std::sync::atomic::Ordering::Relaxed;

use parking_lot::Mutex;

use crate::stats::HELD;

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
