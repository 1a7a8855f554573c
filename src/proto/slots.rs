//! Request slots: the ring of at most `NCCL_NET_MAX_REQUESTS` requests a comm has in
//! flight, indexed by message sequence number (`seq % NSLOTS`).
//!
//! The progress thread posts (isend/irecv) and retires (test) slots in order; I/O
//! threads fill them in. A pointer to a [`Slot`] is the request NCCL holds.
//! State moves FREE → PENDING → DONE|FAILED → FREE (a FAILED slot stays failed: NCCL
//! is expected to abort the comm).

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

pub const NSLOTS: usize = crate::ffi::abi::NCCL_NET_MAX_REQUESTS as usize;

const FREE: u8 = 0;
const PENDING: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;

/// Size not yet known (a receive before its first chunk arrived).
const UNKNOWN: usize = usize::MAX;

/// What `test` runs before it looks at a request: its comm's progress for work
/// done on NCCL's thread (the TCP inline stream). `f(data)` must stay valid for
/// as long as the ring: `data` is the comm that owns it.
#[derive(Clone, Copy)]
pub struct Hook {
    pub data: *const (),
    pub f: unsafe fn(*const ()),
}

// SAFETY: a hook only carries the address of its comm, which is Sync, and a plain
// function; it is called from whichever thread tests a request.
unsafe impl Send for Hook {}
unsafe impl Sync for Hook {}

/// Whether a comm's failure has been logged: NCCL 2.20–2.25 re-test a failed
/// request in a hot loop until the job aborts, and NCCL keeps the last WARN as
/// the error text PyTorch shows. So a comm's first error is logged once, as a
/// WARN naming the comm and its peer, and later ones are returned quietly.
#[derive(Default)]
pub struct Report {
    warned: std::sync::atomic::AtomicBool,
    label: OnceLock<String>,
}

impl Report {
    /// Names the comm in log lines ("send comm #3 to 10.0.0.2:4711"); first call wins.
    pub fn set_label(&self, label: String) {
        let _ = self.label.set(label);
    }

    pub fn label(&self) -> &str {
        self.label.get().map_or("comm", String::as_str)
    }

    /// True exactly once per comm: the caller logs the failure.
    pub fn first(&self) -> bool {
        !self.warned.swap(true, AcqRel)
    }

    /// A number for the next comm's label, unique in the process.
    pub fn next_comm_id() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Relaxed)
    }
}

/// One in-flight request.
pub struct Slot {
    state: AtomicU8,
    /// seq + 1 of the request posted here last; 0 = never used.
    tag: AtomicU64,
    /// Message size: known at isend; learned from the first chunk on receive.
    size: AtomicUsize,
    /// Sender: chunks still to write. Receiver: bytes placed so far.
    progress: AtomicUsize,
    /// Receiver: destination and its capacity.
    buf: AtomicUsize,
    cap: AtomicUsize,
    /// Receiver: bytes of the chunks admitted so far, and their edges' sum (see
    /// [`Slot::claim`]).
    claimed: AtomicUsize,
    edges: AtomicU64,
    /// Random per ring, mixed into the edges: a peer cannot aim for a sum that
    /// passes without a tiling.
    edge_key: u64,
    error: Mutex<Option<Error>>,
    hook: OnceLock<Hook>,
    /// The comm's [`Report`], shared by every slot of its ring.
    report: std::sync::Arc<Report>,
}

impl Slot {
    fn new(edge_key: u64, report: std::sync::Arc<Report>) -> Self {
        Slot {
            state: AtomicU8::new(FREE),
            tag: AtomicU64::new(0),
            size: AtomicUsize::new(UNKNOWN),
            progress: AtomicUsize::new(0),
            buf: AtomicUsize::new(0),
            cap: AtomicUsize::new(0),
            claimed: AtomicUsize::new(0),
            edges: AtomicU64::new(0),
            edge_key,
            error: Mutex::new(None),
            hook: OnceLock::new(),
            report,
        }
    }

    /// Its comm's failure report.
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Runs the comm's progress hook, if it has one.
    fn poke(&self) {
        if let Some(h) = self.hook.get() {
            // SAFETY: `Ring::set_hook`'s contract: `h.data` lives as long as the ring.
            unsafe { (h.f)(h.data) }
        }
    }

    /// Destination buffer and capacity of a posted receive.
    pub fn recv_buffer(&self) -> (usize, usize) {
        (self.buf.load(Acquire), self.cap.load(Acquire))
    }

    /// Sender: one chunk written. Returns true when it was the last.
    pub fn chunk_sent(&self) -> bool {
        if self.progress.fetch_sub(1, AcqRel) == 1 {
            self.finish(DONE);
            true
        } else {
            false
        }
    }

    /// Receiver: records the message size announced by a chunk. Every chunk of a
    /// message must announce the same size, and it must fit the posted buffer.
    pub fn learn_size(&self, total: usize) -> Result<()> {
        match self.size.compare_exchange(UNKNOWN, total, AcqRel, Acquire) {
            Ok(_) => Ok(()),
            Err(prev) if prev == total => Ok(()),
            Err(prev) => Err(Error::Remote(format!(
                "corrupt stream: message size {total} after {prev}"
            ))),
        }
    }

    /// Receiver: admits the chunk of `len` bytes at `offset`, after
    /// [`Slot::learn_size`] and before any of its bytes are written. The chunks of a
    /// message must tile it: their lengths never add up to more than its size, and
    /// once they add up to it they cover it. Otherwise a repeated chunk would
    /// complete the receive with bytes that never came, and chunks that overlap
    /// past the size would leave it pending for ever.
    ///
    /// Whether they cover it is told by a sum that telescopes: for non-empty chunks
    /// `[a, b)`, `sum(edge(b) - edge(a))` is `edge(size) - edge(0)` when every inner
    /// edge ends one chunk and starts another, that is when the chunks tile the
    /// message; any overlap or hole leaves an edge unmatched, and `edge` mixes 64
    /// bits, so the sum then differs (short of a 2^-64 coincidence).
    pub fn claim(&self, offset: usize, len: usize) -> Result<()> {
        // (`edge` is keyed per ring, so a broken or hostile peer cannot pick
        // chunks whose unmatched edges cancel.)
        let total = self.size.load(Acquire);
        self.edges.fetch_add(
            self.edge(offset + len).wrapping_sub(self.edge(offset)),
            AcqRel,
        );
        // AcqRel: the claim that reaches `total` sees every earlier claim's edges.
        let claimed = self.claimed.fetch_add(len, AcqRel) + len;
        if claimed > total {
            return Err(Error::Remote(format!(
                "corrupt stream: chunks of a {total}-byte message add up to {claimed} bytes"
            )));
        }
        if claimed == total
            && self.edges.load(Acquire) != self.edge(total).wrapping_sub(self.edge(0))
        {
            return Err(Error::Remote(format!(
                "corrupt stream: the chunks of a {total}-byte message overlap, so they do not tile it"
            )));
        }
        Ok(())
    }

    fn edge(&self, x: usize) -> u64 {
        edge(self.edge_key, x)
    }

    /// Receiver: `n` more bytes landed. Returns true when the message is complete.
    pub fn bytes_placed(&self, n: usize) -> bool {
        let total = self.size.load(Acquire);
        let now = self.progress.fetch_add(n, AcqRel) + n;
        if now == total {
            self.finish(DONE);
            true
        } else {
            false
        }
    }

    /// PENDING → `state`; a request that already failed stays failed.
    fn finish(&self, state: u8) {
        let _ = self.state.compare_exchange(PENDING, state, AcqRel, Acquire);
    }

    /// Marks a pending request failed; returns false if it was not pending.
    pub fn fail(&self, e: &Error) -> bool {
        let mut g = self.error.lock();
        if self
            .state
            .compare_exchange(PENDING, FAILED, AcqRel, Acquire)
            .is_ok()
        {
            *g = Some(e.duplicate());
            true
        } else {
            false
        }
    }

    /// NCCL's `test`: `Ok(None)` while in flight, `Ok(Some(size))` once (then the
    /// slot is free), or the error that failed it. Runs the comm's progress hook
    /// first.
    pub fn test(&self) -> Result<Option<usize>> {
        if self.state.load(Acquire) == PENDING {
            self.poke();
        }
        match self.state.load(Acquire) {
            PENDING => Ok(None),
            DONE => {
                let size = self.size.load(Acquire);
                self.state.store(FREE, Release);
                Ok(Some(size))
            }
            FAILED => Err(self
                .error
                .lock()
                .as_ref()
                .map(Error::duplicate)
                .unwrap_or_else(|| Error::Internal("request failed without a reason".into()))),
            _ => Err(Error::InvalidUsage(
                "test() on a request that is not in flight".into(),
            )),
        }
    }
}

/// A chunk edge (an offset in its message) mixed with `key` to 64 bits
/// (splitmix64's finalizer), for [`Slot::claim`].
fn edge(key: u64, x: usize) -> u64 {
    let mut z = (x as u64 ^ key).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a stream that feeds a receiver is doing (see [`Ring::with_producers`]):
/// reading (or about to), ended, or holding a chunk header for `seq`, which is not
/// posted yet.
const ACTIVE: u64 = u64::MAX;
const ENDED: u64 = u64::MAX - 1;
/// Not there yet, may come (see [`Ring::producer_absent`]).
const ABSENT: u64 = u64::MAX - 2;
// No chunk header carries these (`ChunkHeader::decode` refuses them).
const _: () = assert!(ABSENT > crate::proto::wire::MAX_SEQ);

/// How [`Ring::wait_posted`] ended.
pub enum Wait<'a> {
    Posted(&'a Slot),
    /// `stop()` said to give up.
    Stopped,
    /// Every stream has ended or waits for a receive that is not posted, while the
    /// receive of message `seq` is pending: it can no longer complete.
    Stalled(u64),
}

/// What the I/O side learns when it looks up the request for an incoming seq.
pub enum Lookup<'a> {
    Ready(&'a Slot),
    /// Not posted yet: wait.
    NotYet,
    /// The seq is in the past (or is u64::MAX, which no message has): the stream
    /// is corrupt.
    Stale,
}

/// The ring of slots of one comm.
pub struct Ring {
    slots: Box<[Slot]>,
    next_seq: AtomicU64,
    /// Taken by `post` and by the producers' waits, so that a stall is judged on
    /// one consistent picture of what is posted and who waits for what.
    posted: Mutex<()>,
    posted_cv: Condvar,
    /// Receivers: per stream that feeds the ring, ACTIVE, ENDED or the seq it
    /// waits for. Written under `posted`; read anywhere.
    producers: Box<[AtomicU64]>,
    /// Per producer: `next_seq` when its wait was last judged by
    /// [`Ring::producer_waits`] (only a post can change that verdict later).
    judged_at: Box<[AtomicU64]>,
    /// Set by [`Ring::fail_all`] (under `posted`): a request posted after the comm
    /// failed fails at once.
    failed: OnceLock<Error>,
    report: std::sync::Arc<Report>,
}

impl Default for Ring {
    /// A ring whose stalls nobody tracks (senders, and IB's receivers).
    fn default() -> Self {
        Ring::with_producers(0)
    }
}

impl Ring {
    /// A receiver's ring fed by `n` streams, each of which delivers its chunks in
    /// ascending message order. The ring can then tell when a pending receive can
    /// no longer complete although not every stream has ended: the streams that
    /// have not ended all hold the header of a later message whose receive is not
    /// posted (a peer that closed after starting message k + 1 on one stream but
    /// before finishing message k on another).
    pub fn with_producers(n: usize) -> Ring {
        let report = std::sync::Arc::new(Report::default());
        Ring {
            slots: {
                let key = rand::random();
                (0..NSLOTS)
                    .map(|_| Slot::new(key, report.clone()))
                    .collect()
            },
            report,
            next_seq: AtomicU64::new(0),
            posted: Mutex::new(()),
            posted_cv: Condvar::new(),
            producers: (0..n).map(|_| AtomicU64::new(ACTIVE)).collect(),
            judged_at: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            failed: OnceLock::new(),
        }
    }

    /// With `posted` held: the lowest pending seq if no pending receive can
    /// complete any more (see [`Ring::with_producers`]).
    fn stalled(&self) -> Option<u64> {
        if self.producers.is_empty() {
            return None;
        }
        let next = self.next_seq.load(Relaxed);
        let stuck = self.producers.iter().all(|p| match p.load(Acquire) {
            ENDED => true,
            ACTIVE | ABSENT => false,
            // Waiting for a receive that is still not posted.
            seq => seq >= next,
        });
        if !stuck {
            return None;
        }
        self.slots
            .iter()
            .filter(|s| s.state.load(Acquire) == PENDING)
            .map(|s| s.tag.load(Acquire).saturating_sub(1))
            .min()
    }

    /// Producer `who` ended cleanly. Returns (every producer has ended, the seq of
    /// a pending receive that can no longer complete).
    pub fn producer_ended(&self, who: usize) -> (bool, Option<u64>) {
        let _g = self.posted.lock();
        self.producers[who].store(ENDED, Release);
        let all = self.producers.iter().all(|p| p.load(Acquire) == ENDED);
        (all, self.stalled())
    }

    /// Producer `who` is not there yet (a TCP data stream the sender opens on
    /// demand): it may still come, so no stall is judged without it, until
    /// [`Ring::producer_attach`] or [`Ring::absent_end`].
    pub fn producer_absent(&self, who: usize) {
        let _g = self.posted.lock();
        self.producers[who].store(ABSENT, Release);
    }

    /// Absent producer `who` has come. False if it may no longer (see
    /// [`Ring::absent_end`]) or is already there.
    pub fn producer_attach(&self, who: usize) -> bool {
        let _g = self.posted.lock();
        let p = &self.producers[who];
        if p.load(Acquire) != ABSENT {
            return false;
        }
        p.store(ACTIVE, Release);
        true
    }

    /// No absent producer can come any more (the peer closed): they count as ended.
    pub fn absent_end(&self) {
        let _g = self.posted.lock();
        for p in self.producers.iter() {
            if p.load(Acquire) == ABSENT {
                p.store(ENDED, Release);
            }
        }
    }

    /// Producer `who` ended cleanly (a load, no lock).
    pub fn producer_has_ended(&self, who: usize) -> bool {
        self.producers[who].load(Acquire) == ENDED
    }

    /// Producer `who`, which does not block in [`Ring::wait_posted`], now holds a
    /// header for `waits_for` (not posted) or, with None, no longer waits.
    /// Returns the seq of a pending receive that can no longer complete.
    ///
    /// Called on NCCL's thread at every poll while a header waits, so a repeated
    /// wait for the same seq is judged again only after a post: a producer that
    /// ends or starts waiting judges the stall itself, and a completion cannot
    /// cause one.
    pub fn producer_waits(&self, who: usize, waits_for: Option<u64>) -> Option<u64> {
        let p = &self.producers[who];
        match waits_for {
            // The common case, lock-free: it was not waiting either.
            None if p.load(Acquire) == ACTIVE => None,
            None => {
                let _g = self.posted.lock();
                p.store(ACTIVE, Release);
                None
            }
            Some(seq)
                if p.load(Acquire) == seq
                    && self.judged_at[who].load(Acquire) == self.next_seq.load(Acquire) =>
            {
                None
            }
            Some(seq) => {
                let _g = self.posted.lock();
                p.store(seq, Release);
                self.judged_at[who].store(self.next_seq.load(Relaxed), Release);
                self.stalled()
            }
        }
    }

    /// Posts the next request: a send of `size` bytes in `chunks` chunks, or (with
    /// `recv = Some((buf, cap))`) a receive. `None` when the slot for the next seq is
    /// still busy: NCCL then retries ("NULL request").
    pub fn post(
        &self,
        size: Option<usize>,
        chunks: usize,
        recv: Option<(usize, usize)>,
    ) -> Option<(u64, &Slot)> {
        let seq = self.next_seq.load(Relaxed);
        let slot = &self.slots[seq as usize % NSLOTS];
        if slot.state.load(Acquire) != FREE {
            return None;
        }
        slot.size.store(size.unwrap_or(UNKNOWN), Relaxed);
        match recv {
            Some((buf, cap)) => {
                slot.buf.store(buf, Relaxed);
                slot.cap.store(cap, Relaxed);
                slot.progress.store(0, Relaxed);
                slot.claimed.store(0, Relaxed);
                slot.edges.store(0, Relaxed);
            }
            None => slot.progress.store(chunks, Relaxed),
        }
        *slot.error.lock() = None;
        {
            let _g = self.posted.lock();
            slot.state.store(PENDING, Release);
            slot.tag.store(seq + 1, Release);
            self.next_seq.store(seq + 1, Relaxed);
            // The comm failed after the caller checked it: nothing would end this
            // request any more.
            if let Some(e) = self.failed.get() {
                slot.fail(e);
            }
            self.posted_cv.notify_all();
        }
        Some((seq, slot))
    }

    /// The comm's failure report (see [`Report`]).
    pub fn report(&self) -> &Report {
        &self.report
    }

    /// Installs the progress hook that `test` runs on every request of this ring.
    ///
    /// # Safety
    /// `h.data` must stay valid, and `h.f` callable on it, until the ring is dropped.
    pub unsafe fn set_hook(&self, h: Hook) {
        for s in self.slots.iter() {
            let _ = s.hook.set(h);
        }
    }

    /// The seq the next `post` will take, if its slot is free (only the progress
    /// thread posts, so the answer holds until it posts).
    pub fn next_free(&self) -> Option<u64> {
        let seq = self.next_seq.load(Relaxed);
        (self.slots[seq as usize % NSLOTS].state.load(Acquire) == FREE).then_some(seq)
    }

    /// The slot that holds (or will hold) `seq`.
    pub fn slot(&self, seq: u64) -> &Slot {
        &self.slots[seq as usize % NSLOTS]
    }

    /// Finds the posted request for `seq` without waiting.
    pub fn lookup(&self, seq: u64) -> Lookup<'_> {
        let slot = &self.slots[seq as usize % NSLOTS];
        let tag = slot.tag.load(Acquire);
        let Some(want) = seq.checked_add(1) else {
            return Lookup::Stale; // no message has this number: a corrupt header
        };
        if tag < want {
            Lookup::NotYet
        } else if tag == want && slot.state.load(Acquire) == PENDING {
            Lookup::Ready(slot)
        } else {
            Lookup::Stale
        }
    }

    /// Producer `who` waits until `seq` is posted, until `stop()` says to give up
    /// (checked every 50 ms and whenever [`Ring::wake_all`] is called), or until
    /// the ring is stalled.
    pub fn wait_posted(&self, seq: u64, who: usize, stop: impl Fn() -> bool) -> Result<Wait<'_>> {
        let mut g = self.posted.lock();
        let out = loop {
            match self.lookup(seq) {
                Lookup::Ready(s) => break Ok(Wait::Posted(s)),
                Lookup::Stale => {
                    break Err(Error::Remote(format!(
                        "corrupt stream: chunk for message {seq}, which is not expected"
                    )))
                }
                Lookup::NotYet if stop() => break Ok(Wait::Stopped),
                Lookup::NotYet => {
                    self.producers[who].store(seq, Release);
                    if let Some(p) = self.stalled() {
                        break Ok(Wait::Stalled(p));
                    }
                    self.posted_cv
                        .wait_for(&mut g, std::time::Duration::from_millis(50));
                }
            }
        };
        self.producers[who].store(ACTIVE, Release);
        out
    }

    pub fn wake_all(&self) {
        let _g = self.posted.lock();
        self.posted_cv.notify_all();
    }

    /// Fails every pending request, and every one posted from now on (the comm is
    /// broken). Under `posted`, so that a post that raced with its comm's failure
    /// (checked the comm before it failed, publishes the request after) is either
    /// failed here or sees `failed`.
    pub fn fail_all(&self, e: &Error) {
        let _g = self.posted.lock();
        let _ = self.failed.set(e.duplicate());
        for s in self.slots.iter() {
            s.fail(e);
        }
    }

    /// True when no request is in flight.
    pub fn idle(&self) -> bool {
        self.slots.iter().all(|s| s.state.load(Acquire) != PENDING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_slot_completes_after_last_chunk() {
        let r = Ring::default();
        let (seq, s) = r.post(Some(100), 3, None).unwrap();
        assert_eq!(seq, 0);
        assert_eq!(s.test().unwrap(), None);
        assert!(!s.chunk_sent());
        assert!(!s.chunk_sent());
        assert!(s.chunk_sent());
        assert_eq!(s.test().unwrap(), Some(100));
        // Freed: testing again is a usage error.
        assert!(s.test().is_err());
    }

    #[test]
    fn ring_is_bounded_and_in_order() {
        let r = Ring::default();
        let slots: Vec<_> = (0..NSLOTS)
            .map(|_| r.post(Some(1), 1, None).unwrap().1 as *const Slot)
            .collect();
        assert!(
            r.post(Some(1), 1, None).is_none(),
            "33rd request must be refused"
        );
        let first = unsafe { &*slots[0] };
        first.chunk_sent();
        assert_eq!(first.test().unwrap(), Some(1));
        let (seq, s) = r.post(Some(1), 1, None).unwrap();
        assert_eq!(seq, NSLOTS as u64);
        assert_eq!(s as *const Slot, slots[0]);
    }

    #[test]
    fn recv_matching_states() {
        let r = Ring::default();
        assert!(matches!(r.lookup(0), Lookup::NotYet));
        let (_, s) = r.post(None, 0, Some((0x1000, 64))).unwrap();
        assert!(matches!(r.lookup(0), Lookup::Ready(_)));
        assert!(matches!(r.lookup(1), Lookup::NotYet));
        assert!(
            matches!(r.lookup(u64::MAX), Lookup::Stale),
            "no message has it"
        );
        s.learn_size(10).unwrap();
        assert!(s.learn_size(11).is_err(), "size must agree across chunks");
        assert!(!s.bytes_placed(4));
        assert!(s.bytes_placed(6));
        assert!(
            matches!(r.lookup(0), Lookup::Stale),
            "completed seq is stale"
        );
        assert_eq!(s.test().unwrap(), Some(10));
        assert!(matches!(r.lookup(0), Lookup::Stale));
    }

    #[test]
    fn chunks_must_tile_their_message() {
        let r = Ring::default();
        let post = |total: usize| {
            let (_, s) = r.post(None, 0, Some((0x1000, 1 << 20))).unwrap();
            s.learn_size(total).unwrap();
            s
        };
        // A tiling, in any order, is admitted; so is an empty message's chunk.
        let s = post(10_000);
        for (off, len) in [(8192, 1808), (0, 4096), (4096, 4096)] {
            s.claim(off, len).unwrap();
        }
        assert!(s.bytes_placed(10_000));
        assert_eq!(s.test().unwrap(), Some(10_000));
        let s = post(0);
        s.claim(0, 0).unwrap();
        assert!(s.bytes_placed(0));
        assert_eq!(s.test().unwrap(), Some(0));
        // A repeated chunk, an overlap with a hole, an overlap past the size.
        for chunks in [
            &[(0, 4096), (0, 4096)][..],
            &[(0, 6144), (4096, 2048)],
            &[(0, 6144), (4096, 4096)],
            &[(0, 4096), (1, 4095), (4096, 1)],
        ] {
            let s = post(8192);
            let last = chunks.len() - 1;
            for (i, &(off, len)) in chunks.iter().enumerate() {
                let r = s.claim(off, len);
                assert_eq!(r.is_err(), i == last, "{chunks:?} chunk {i}: {r:?}");
            }
            s.fail(&Error::Remote("test".into()));
            assert!(s.test().is_err());
        }
    }

    #[test]
    fn zero_byte_receive_completes_on_its_empty_chunk() {
        let r = Ring::default();
        let (_, s) = r.post(None, 0, Some((0x1000, 0))).unwrap();
        s.learn_size(0).unwrap();
        assert!(s.bytes_placed(0));
        assert_eq!(s.test().unwrap(), Some(0));
    }

    #[test]
    fn failure_is_sticky_and_reported() {
        let r = Ring::default();
        let (_, s) = r.post(Some(8), 2, None).unwrap();
        r.fail_all(&Error::Remote("peer died".into()));
        assert!(matches!(s.test(), Err(Error::Remote(_))));
        assert!(matches!(s.test(), Err(Error::Remote(_))));
        // Late chunk completions must not turn a failed request into a success.
        s.chunk_sent();
        s.chunk_sent();
        assert!(matches!(s.test(), Err(Error::Remote(_))));
    }

    #[test]
    fn a_request_posted_after_its_ring_failed_fails() {
        // A caller that checked its comm just before the comm failed still posts:
        // that request must fail, not stay pending with nobody to end it.
        let r = Ring::default();
        r.fail_all(&Error::Remote("peer died".into()));
        let (_, s) = r.post(None, 0, Some((0x1000, 64))).unwrap();
        assert!(matches!(s.test(), Err(Error::Remote(m)) if m == "peer died"));
        let (_, s) = r.post(Some(8), 1, None).unwrap();
        assert!(matches!(s.test(), Err(Error::Remote(_))));
    }

    #[test]
    fn wait_posted_wakes_on_post_and_on_stop() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let r = Arc::new(Ring::with_producers(2));
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            matches!(r2.wait_posted(0, 0, || false), Ok(Wait::Posted(_)))
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        r.post(None, 0, Some((1, 1)));
        assert!(t.join().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (r3, s3) = (r.clone(), stop.clone());
        let t = std::thread::spawn(move || {
            matches!(r3.wait_posted(5, 0, || s3.load(Relaxed)), Ok(Wait::Stopped))
        });
        stop.store(true, Relaxed);
        r.wake_all();
        assert!(t.join().unwrap());
    }

    #[test]
    fn a_pending_receive_stalls_only_when_no_stream_can_feed_it() {
        let r = Ring::with_producers(3);
        let (_, s0) = r.post(None, 0, Some((1, 64))).unwrap();
        // Stream 2 (say the inline stream) holds message 1, not posted: streams 0
        // and 1 may still bring message 0.
        assert_eq!(r.producer_waits(2, Some(1)), None);
        assert_eq!(r.producer_ended(0), (false, None));
        // The last stream that could bring message 0 ends: stalled on 0.
        assert_eq!(r.producer_ended(1), (false, Some(0)));
        assert!(r.producer_has_ended(1) && !r.producer_has_ended(2));
        // Once message 0 is done and message 1 posted, the waiting stream can
        // deliver it: not stalled.
        s0.learn_size(0).unwrap();
        assert!(s0.bytes_placed(0));
        assert_eq!(s0.test().unwrap(), Some(0));
        assert_eq!(r.producer_waits(2, Some(1)), None, "nothing pending");
        r.post(None, 0, Some((1, 64))).unwrap();
        assert_eq!(r.producer_waits(2, Some(1)), None, "message 1 is posted");
        // A receive nobody holds data for, after stream 2 moved on to message 3.
        assert_eq!(r.producer_waits(2, None), None);
        assert_eq!(r.producer_waits(2, Some(3)), Some(1));
        assert_eq!(r.producer_ended(2), (true, Some(1)));
    }

    /// A data stream the sender has not opened yet may still bring any message:
    /// no stall is judged without it, until the sender closes (`absent_end`).
    #[test]
    fn an_absent_stream_may_still_come_until_the_peer_closes() {
        let r = Ring::with_producers(3);
        r.producer_absent(0);
        r.producer_absent(1);
        r.post(None, 0, Some((1, 64))).unwrap();
        // The inline stream (2) holds message 1, not posted: 0 or 1 may come.
        assert_eq!(r.producer_waits(2, Some(1)), None);
        assert!(r.producer_attach(0));
        assert!(!r.producer_attach(0), "attached once");
        assert_eq!(
            r.producer_ended(0),
            (false, None),
            "stream 1 may still come"
        );
        // The peer closes: stream 1 can no longer come, and message 0 stalls.
        r.absent_end();
        assert!(!r.producer_attach(1), "too late");
        assert!(r.producer_has_ended(1));
        assert_eq!(r.producer_ended(2), (true, Some(0)));
    }

    #[test]
    fn a_repeated_wait_is_judged_again_after_a_post() {
        let r = Ring::with_producers(2);
        assert_eq!(r.producer_ended(1), (false, None));
        // Producer 0 holds message 1; nothing is pending, polled again and again.
        assert_eq!(r.producer_waits(0, Some(1)), None);
        assert_eq!(r.producer_waits(0, Some(1)), None);
        // The receive of message 0 is posted: nobody can bring it.
        r.post(None, 0, Some((1, 64))).unwrap();
        assert_eq!(r.producer_waits(0, Some(1)), Some(0));
    }

    #[test]
    fn a_blocked_producer_reports_the_stall() {
        let r = Ring::with_producers(2);
        r.post(None, 0, Some((1, 64))).unwrap();
        assert_eq!(r.producer_ended(1), (false, None));
        // Producer 0 holds message 1's header while message 0 is pending and
        // nobody else can bring it.
        assert!(matches!(
            r.wait_posted(1, 0, || false),
            Ok(Wait::Stalled(0))
        ));
        // Without producers (IB), nothing is ever judged stalled.
        let r = Ring::default();
        r.post(None, 0, Some((1, 64))).unwrap();
        assert!(r.stalled().is_none());
    }
}
