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
