//! Lanes shared by every comm of the process: one pool per device, direction and
//! staging size. An I/O thread holds a lane only for one chunk (encode + socket
//! write, or socket read + decode), so pinned staging and CUDA streams are bounded
//! per process (`NCCL_ZIP_GPU_LANES` per device and direction), whatever the number
//! of comms NCCL opens (channels × peers).
//!
//! Send and receive lanes come from separate pools. A send lane is held while its
//! chunk is written to a socket, which can block on the peer; the peer's receive
//! threads take receive lanes only after a chunk header has arrived, and then only
//! read the payload that the blocked sender is writing. So a receive never waits on
//! a send lane, and full pools on two nodes cannot wait on each other.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::backend::{Backend, Lane};
use crate::error::{Error, Result};
use crate::stats::HELD;

/// Which side of a connection a pool serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    Send,
    Recv,
}

/// Pinned staging held by pooled lanes (also in `HELD.staging_bytes`).
static POOLED_STAGING: AtomicU64 = AtomicU64::new(0);

/// Bytes of pinned staging the pools hold (they keep their lanes for the process's life).
pub fn pooled_staging_bytes() -> u64 {
    POOLED_STAGING.load(Relaxed)
}

/// How long a chunk may wait for a free lane before the comm fails: far longer
/// than any chunk holds one on a live link.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(120);

pub struct LanePool {
    backend: Arc<dyn Backend>,
    max_wire: usize,
    cap: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    free: Vec<Box<dyn Lane>>,
    /// Wedged lanes ([`Lane::wedged`]): never handed out again, never freed (a free
    /// would wait for their stuck stream), still counted in `made` so that the
    /// pool's memory stays bounded.
    parked: Vec<Box<dyn Lane>>,
    made: usize,
    /// Lanes asked for by [`LanePool::prewarm`] so far, all callers together.
    reserved: usize,
}

type Key = (usize, Dir, usize);

/// The pool for lanes of `max_wire` bytes on `b`, made on first use with at most
/// `cap` lanes.
pub fn pool(b: &Arc<dyn Backend>, dir: Dir, max_wire: usize, cap: usize) -> Arc<LanePool> {
    static POOLS: OnceLock<Mutex<HashMap<Key, Arc<LanePool>>>> = OnceLock::new();
    // Backends live for the whole process, so the address identifies one.
    let key = (Arc::as_ptr(b) as *const () as usize, dir, max_wire);
    POOLS
        .get_or_init(Default::default)
        .lock()
        .entry(key)
        .or_insert_with(|| {
            Arc::new(LanePool {
                backend: b.clone(),
                max_wire,
                cap: cap.max(1),
                state: Mutex::new(PoolState {
                    free: Vec::new(),
                    parked: Vec::new(),
                    made: 0,
                    reserved: 0,
                }),
                freed: Condvar::new(),
            })
        })
        .clone()
}

impl LanePool {
    /// A lane for one chunk (the data path): a free one, else the next one
    /// released. It makes a lane only when the pool has none at all (a pool nobody
    /// prewarmed: the comm's buffers were never registered); lanes are otherwise
    /// made by [`LanePool::prewarm`] alone, at `regMr`, so that an I/O thread never
    /// allocates pinned or device memory or creates a stream while NCCL's kernels
    /// may be waiting for it. `stop` (checked every 50 ms) abandons the wait.
    pub fn acquire(self: &Arc<Self>, stop: &dyn Fn() -> bool) -> Result<LaneGuard> {
        self.acquire_or_make(stop, false)
    }

    /// As [`LanePool::acquire`]; `grow`: also makes a lane while fewer than `cap`
    /// exist (prewarm only).
    fn acquire_or_make(self: &Arc<Self>, stop: &dyn Fn() -> bool, grow: bool) -> Result<LaneGuard> {
        let t0 = Instant::now();
        let mut st = self.state.lock();
        loop {
            if let Some(l) = st.free.pop() {
                return Ok(self.guard(l));
            }
            if st.made < self.cap && (grow || st.made == 0) {
                st.made += 1;
                drop(st);
                return match self.backend.lane(self.max_wire, &POOLED_STAGING) {
                    Ok(l) => {
                        HELD.gpu_lanes.fetch_add(1, Relaxed);
                        tracing::debug!(
                            "new GPU lane ({} B staging) on {}",
                            self.max_wire,
                            self.backend.describe()
                        );
                        Ok(self.guard(l))
                    }
                    Err(e) => {
                        self.state.lock().made -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            if st.parked.len() >= self.cap {
                return Err(self.all_parked());
            }
            if stop() {
                return Err(Error::Internal(
                    "comm stopped while waiting for a GPU lane".into(),
                ));
            }
            if t0.elapsed() > ACQUIRE_TIMEOUT {
                return Err(Error::Internal(format!(
                    "no GPU staging lane came free in {} s ({} lanes, all busy)",
                    ACQUIRE_TIMEOUT.as_secs(),
                    self.cap
                )));
            }
            self.freed.wait_for(&mut st, Duration::from_millis(50));
        }
    }

    /// A free lane, if there is one now; never waits and never makes one. An error
    /// once every lane is parked (none will ever come free).
    pub fn try_acquire(self: &Arc<Self>) -> Result<Option<LaneGuard>> {
        let mut st = self.state.lock();
        if let Some(l) = st.free.pop() {
            drop(st);
            return Ok(Some(self.guard(l)));
        }
        if st.parked.len() >= self.cap {
            return Err(self.all_parked());
        }
        Ok(None)
    }

    fn all_parked(&self) -> Error {
        Error::Cuda(format!(
            "every GPU lane ({}) on {} is disabled: their streams failed or stopped draining",
            self.cap,
            self.backend.describe()
        ))
    }

    /// Makes lanes for `n` more concurrent users: until the sum of every `n` asked
    /// for so far (at most `cap`) exist. Called when NCCL registers a comm's CUDA
    /// buffers (`regMr`, during connection setup), so that the data path never
    /// allocates: the CUDA programming guide lists page-locked and device memory
    /// allocations among the operations that serialize work of different streams
    /// ("implicit synchronization"), which must never happen while NCCL's kernels
    /// wait for this plugin's data.
    ///
    /// The pool is shared by every comm on the device, so what one comm asks for
    /// adds to what the others asked for: prewarming only to `n` would leave the
    /// lanes of a second comm's concurrent I/O threads to be made in the data path.
    /// A comm that registers several buffers asks more than once; the cap bounds it.
    pub fn prewarm(self: &Arc<Self>, n: usize) -> Result<()> {
        let target = {
            let mut st = self.state.lock();
            st.reserved = st.reserved.saturating_add(n);
            st.reserved.min(self.cap)
        };
        let mut made = Vec::new();
        while self.made() < target {
            made.push(self.acquire_or_make(&|| false, true)?);
        }
        drop(made); // back into the free list
        Ok(())
    }

    fn guard(self: &Arc<Self>, l: Box<dyn Lane>) -> LaneGuard {
        LaneGuard {
            pool: self.clone(),
            lane: Some(l),
        }
    }

    /// Lanes made so far (at most `cap`).
    pub fn made(&self) -> usize {
        self.state.lock().made
    }
}

/// A lane taken from a pool; it goes back when dropped.
pub struct LaneGuard {
    pool: Arc<LanePool>,
    lane: Option<Box<dyn Lane>>,
}

impl Deref for LaneGuard {
    type Target = dyn Lane;
    fn deref(&self) -> &(dyn Lane + 'static) {
        self.lane.as_deref().expect("lane present until drop")
    }
}

impl DerefMut for LaneGuard {
    fn deref_mut(&mut self) -> &mut (dyn Lane + 'static) {
        self.lane.as_deref_mut().expect("lane present until drop")
    }
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        if let Some(l) = self.lane.take() {
            let mut st = self.pool.state.lock();
            if l.wedged() {
                st.parked.push(l);
                // Waiters learn that the pool shrank (and may now have no lane left).
                self.pool.freed.notify_all();
            } else {
                st.free.push(l);
                self.pool.freed.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{backend_for, Emulation};

    #[test]
    fn pool_is_bounded_reuses_lanes_and_wakes_waiters() {
        let b = backend_for(0, Emulation::Kernels).unwrap();
        // A size no other test uses, so this pool is ours alone.
        let p = pool(&b, Dir::Send, 12_345, 2);
        let never = || false;
        p.prewarm(2).unwrap();
        let a = p.acquire(&never).unwrap();
        let c = p.acquire(&never).unwrap();
        assert_eq!(p.made(), 2);
        let p2 = p.clone();
        let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = released.clone();
        let waiter = std::thread::spawn(move || {
            let _l = p2.acquire(&|| false).unwrap();
            // Got a lane: only possible once one was given back.
            r2.load(std::sync::atomic::Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(100));
        released.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(a);
        assert!(
            waiter.join().unwrap(),
            "a waiter got a lane while all were taken"
        );
        assert_eq!(p.made(), 2, "a released lane is reused, not a third made");
        p.prewarm(5).unwrap();
        assert_eq!(p.made(), 2, "prewarm stops at the cap");
        let q = pool(&b, Dir::Recv, 12_345, 4);
        q.prewarm(3).unwrap();
        assert_eq!(q.made(), 3);
        // A second comm on the same pool adds its own need (up to the cap), so its
        // I/O threads do not make lanes in the data path.
        q.prewarm(3).unwrap();
        assert_eq!(
            q.made(),
            4,
            "prewarms of comms sharing a pool add up to the cap"
        );
        drop(c);
        // A stopped comm stops waiting.
        let _x = p.acquire(&never).unwrap();
        let _y = p.acquire(&never).unwrap();
        let e = p
            .acquire(&|| true)
            .err()
            .expect("a stopped comm gets an error");
        assert!(e.to_string().contains("stopped"), "{e}");
    }

    #[test]
    fn the_data_path_makes_no_lane_once_the_pool_has_one() {
        let b = backend_for(0, Emulation::Kernels).unwrap();
        let p = pool(&b, Dir::Recv, 23_456, 4);
        let never = || false;
        // A pool nobody prewarmed still serves (one lane, made on demand)...
        let a = p.acquire(&never).unwrap();
        assert_eq!(p.made(), 1);
        // ...but a second user waits for it instead of allocating in the data path.
        let e = p
            .acquire(&|| true)
            .err()
            .expect("a second concurrent user must wait, not make a lane");
        assert!(e.to_string().contains("stopped"), "{e}");
        assert_eq!(p.made(), 1, "acquire made a lane in the data path");
        drop(a);
        // prewarm (regMr) is what grows the pool.
        p.prewarm(3).unwrap();
        assert_eq!(p.made(), 3);
    }

    /// A backend whose lanes the test can wedge: lane k (in order of making) reports
    /// `flags[k]`.
    #[derive(Default)]
    struct Wedgeable(Mutex<Vec<Arc<std::sync::atomic::AtomicBool>>>);
    struct FakeLane(Arc<std::sync::atomic::AtomicBool>);
    impl Lane for FakeLane {
        fn staging(&mut self, _: usize) -> Result<&mut [u8]> {
            unreachable!()
        }
        fn bytes(&self, _: usize, _: usize) -> &[u8] {
            unreachable!()
        }
        fn kernels(&self) -> bool {
            false
        }
        fn download(&mut self, _: u64, _: usize) -> Result<()> {
            unreachable!()
        }
        fn upload(&mut self, _: u64, _: usize) -> Result<()> {
            unreachable!()
        }
        fn upload_from(&mut self, _: u64, _: &[u8]) -> Result<()> {
            unreachable!()
        }
        fn encode(&mut self, _: u64, _: usize, _: &crate::codec::EncodeOptions) -> Result<usize> {
            unreachable!()
        }
        fn decode(&mut self, _: usize, _: u64, _: usize) -> Result<usize> {
            unreachable!()
        }
        fn wedged(&self) -> bool {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }
    impl Backend for Wedgeable {
        fn describe(&self) -> String {
            "test backend".into()
        }
        fn lane<'a>(&self, _: usize, _: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>> {
            let f = Arc::new(std::sync::atomic::AtomicBool::new(false));
            self.0.lock().push(f.clone());
            Ok(Box::new(FakeLane(f)))
        }
    }

    #[test]
    fn wedged_lanes_are_parked_not_handed_out_again() {
        use std::sync::atomic::Ordering::SeqCst;
        let fake = Arc::new(Wedgeable::default());
        let b: Arc<dyn Backend> = fake.clone();
        let p = pool(&b, Dir::Send, 4096, 2);
        let never = || false;
        p.prewarm(2).unwrap();
        // The free list is a stack: the lane made second (flags[1]) comes out first.
        let (l1, l0) = (p.acquire(&never).unwrap(), p.acquire(&never).unwrap());
        let flags = fake.0.lock().clone();
        flags[1].store(true, SeqCst);
        assert!(l1.wedged() && !l0.wedged());
        drop(l1);
        drop(l0);
        // Only the healthy lane comes back; while it is out, nothing is left to
        // hand out (the wedged one is parked, and no third lane is made: cap 2).
        let a = p.acquire(&never).unwrap();
        assert!(!a.wedged());
        let e = p
            .acquire(&|| true)
            .err()
            .expect("the wedged lane must not come back");
        assert!(e.to_string().contains("stopped"), "{e}");
        assert_eq!(p.made(), 2);
        drop(a);
        // With the last healthy lane wedged too, a request fails at once instead of
        // waiting for a lane that will never come.
        let a = p.acquire(&never).unwrap();
        flags[0].store(true, SeqCst);
        drop(a);
        let t0 = Instant::now();
        let e = p.acquire(&never).err().expect("no usable lane left");
        assert!(e.to_string().contains("disabled"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        // The non-waiting path (NCCL's thread) gets the same error, not "retry".
        let e = p.try_acquire().err().expect("no usable lane left");
        assert!(e.to_string().contains("disabled"), "{e}");
    }
}
