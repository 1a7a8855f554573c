//! An in-memory model of two RC endpoints, for testing the protocol without a NIC.
//!
//! What it models, after the InfiniBand RC rules the protocol relies on:
//! - QP `i` of side 0 is connected to QP `i` of side 1. Writes posted on one QP are
//!   executed in posting order; different QPs progress independently, so the test
//!   harness decides (e.g. from a seeded RNG) which QP moves next.
//! - A write copies real process memory: the source must lie in a region
//!   registered locally under the given lkey, the destination in a region the peer
//!   registered under the rkey (else a protection / remote-access error).
//! - Write-with-immediate consumes the peer QP's oldest posted receive and puts a
//!   `RecvImm` completion (imm, byte_len) on the peer's CQ; with no receive posted
//!   the write fails with an RNR error (we model RNR retries as exhausted at once,
//!   which makes a credit-accounting bug visible).
//! - Every write is signaled: a `Write` completion follows its execution.
//! - An error puts the QP in the error state: its outstanding writes and posted
//!   receives complete with `Flushed`, and so does anything posted later. A write
//!   towards a QP that is in the error state (or a lost peer) completes with
//!   `RetryExceeded` and errors the writer's QP.
//! - Peer loss: a side that is gone neither executes nor answers anything.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use super::fabric::{
    Completion, Fabric, Link, Local, Mr, Opener, QpInfo, Registrar, Registration, Remote, WcOp,
    WcStatus,
};
use crate::error::{Error, Result};

#[derive(Clone)]
struct Wr {
    wr_id: u64,
    local: Local,
    remote: Remote,
    imm: Option<u32>,
    /// A copy made by [`MemNet::duplicate_front`]: its sender posted it once, so
    /// it reports no completion of its own.
    copy: bool,
}

#[derive(Default)]
struct QpState {
    sq: VecDeque<Wr>,
    rq: VecDeque<u64>,
    error: bool,
}

#[derive(Default)]
struct Side {
    /// key → (addr, len). lkey == rkey in this model.
    mrs: HashMap<u32, (u64, u64)>,
    qps: Vec<QpState>,
    cq: VecDeque<Completion>,
    lost: bool,
    /// Writes executed (for tests that count traffic).
    writes: u64,
    bytes: u64,
}

struct World {
    sides: [Side; 2],
    next_key: u32,
    /// Threaded mode ([`MemFabric::open`]): `poll` executes the polling side's
    /// own writes, and dropping a side is losing it.
    auto: bool,
    /// Threaded mode: the listener's side has moved in as side 1.
    joined: bool,
    /// xorshift state: which busy QP moves next in threaded mode.
    rng: u64,
}

/// The shared model of one connection; [`MemNet::endpoints`] gives both sides.
#[derive(Clone)]
pub struct MemNet(Arc<Mutex<World>>);

/// One side of a [`MemNet`], implementing [`Fabric`].
pub struct MemFabric {
    net: MemNet,
    side: usize,
    /// Threaded mode: this fabric's id in the [`HUB`] (its "QP number").
    id: u32,
}

/// Threaded mode's stand-in for the subnet: unconnected fabrics by id, so the
/// listener's side can find the connector's model from the id in its QP info.
static HUB: Mutex<Option<HashMap<u32, MemNet>>> = Mutex::new(None);
static NEXT_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl MemNet {
    pub fn new(nqps: usize) -> MemNet {
        let side = || Side {
            qps: (0..nqps).map(|_| QpState::default()).collect(),
            ..Side::default()
        };
        MemNet(Arc::new(Mutex::new(World {
            sides: [side(), side()],
            next_key: 0x100,
            auto: false,
            joined: false,
            rng: 0x9E37_79B9_7F4A_7C15,
        })))
    }

    pub fn endpoints(&self) -> (MemFabric, MemFabric) {
        (
            MemFabric {
                net: self.clone(),
                side: 0,
                id: 0,
            },
            MemFabric {
                net: self.clone(),
                side: 1,
                id: 0,
            },
        )
    }

    pub fn nqps(&self) -> usize {
        self.0.lock().sides[0].qps.len()
    }

    /// `(side, qp)` pairs that have a write waiting to execute.
    pub fn busy(&self) -> Vec<(usize, usize)> {
        let w = self.0.lock();
        let mut v = Vec::new();
        for (s, side) in w.sides.iter().enumerate() {
            for (q, qp) in side.qps.iter().enumerate() {
                if !qp.sq.is_empty() && !side.lost {
                    v.push((s, q));
                }
            }
        }
        v
    }

    /// Executes the oldest write of `side`'s QP `qp`. False if there was none.
    pub fn step(&self, side: usize, qp: usize) -> bool {
        Self::step_world(&mut self.0.lock(), side, qp)
    }

    fn step_world(w: &mut World, side: usize, qp: usize) -> bool {
        let Some(wr) = w.sides[side].qps[qp].sq.pop_front() else {
            return false;
        };
        let peer = 1 - side;
        // The write's own completion; a copy (`duplicate_front`) reports none.
        let local = |w: &mut World, c: Completion| {
            if !wr.copy {
                w.sides[side].cq.push_back(c);
            }
        };
        let done = |status| Completion {
            wr_id: wr.wr_id,
            qp,
            status,
            op: WcOp::Write,
            imm: 0,
            byte_len: 0,
        };
        // Local protection: the source must be registered here.
        if wr.local.len > 0
            && !covers(
                &w.sides[side].mrs,
                wr.local.lkey,
                wr.local.addr,
                wr.local.len as u64,
            )
        {
            local(w, done(WcStatus::LocalProtection));
            Self::qp_fail(&mut w.sides[side], qp);
            return true;
        }
        if w.sides[peer].lost || w.sides[peer].qps[qp].error {
            local(w, done(WcStatus::RetryExceeded));
            Self::qp_fail(&mut w.sides[side], qp);
            return true;
        }
        if wr.local.len > 0
            && !covers(
                &w.sides[peer].mrs,
                wr.remote.rkey,
                wr.remote.addr,
                wr.local.len as u64,
            )
        {
            local(w, done(WcStatus::RemoteAccess));
            Self::qp_fail(&mut w.sides[side], qp);
            Self::qp_fail(&mut w.sides[peer], qp);
            return true;
        }
        let recv = match wr.imm {
            Some(_) => match w.sides[peer].qps[qp].rq.pop_front() {
                Some(r) => Some(r),
                None => {
                    // Receiver not ready, retries exhausted.
                    local(w, done(WcStatus::Other(13)));
                    Self::qp_fail(&mut w.sides[side], qp);
                    return true;
                }
            },
            None => None,
        };
        if wr.local.len > 0 {
            // SAFETY: both ranges lie in registered regions (checked above), whose
            // owners keep them allocated while registered; they belong to different
            // allocations or are disjoint parts of one.
            unsafe {
                std::ptr::copy(
                    wr.local.addr as *const u8,
                    wr.remote.addr as *mut u8,
                    wr.local.len as usize,
                )
            };
        }
        w.sides[side].writes += 1;
        w.sides[side].bytes += wr.local.len as u64;
        if let (Some(imm), Some(rid)) = (wr.imm, recv) {
            w.sides[peer].cq.push_back(Completion {
                wr_id: rid,
                qp,
                status: WcStatus::Success,
                op: WcOp::RecvImm,
                imm,
                byte_len: wr.local.len,
            });
        }
        local(w, done(WcStatus::Success));
        true
    }

    /// Executes everything that can run, QP by QP in round robin. Returns the
    /// number of writes executed.
    pub fn run(&self) -> usize {
        let mut n = 0;
        loop {
            let busy = self.busy();
            if busy.is_empty() {
                return n;
            }
            for (s, q) in busy {
                n += self.step(s, q) as usize;
            }
        }
    }

    /// Threaded mode: executes `side`'s queued writes, picking the next busy QP at
    /// random each time, so chunks on different QPs land in varying order.
    fn run_side(w: &mut World, side: usize) {
        loop {
            if w.sides[side].lost {
                return;
            }
            let busy: Vec<usize> = (0..w.sides[side].qps.len())
                .filter(|&q| !w.sides[side].qps[q].sq.is_empty())
                .collect();
            if busy.is_empty() {
                return;
            }
            w.rng ^= w.rng << 13;
            w.rng ^= w.rng >> 7;
            w.rng ^= w.rng << 17;
            let q = busy[(w.rng % busy.len() as u64) as usize];
            Self::step_world(w, side, q);
        }
    }

    fn qp_fail(side: &mut Side, qp: usize) {
        let q = &mut side.qps[qp];
        q.error = true;
        let mut flushed: Vec<Completion> =
            q.sq.drain(..)
                .filter(|wr| !wr.copy)
                .map(|wr| Completion {
                    wr_id: wr.wr_id,
                    qp,
                    status: WcStatus::Flushed,
                    op: WcOp::Write,
                    imm: 0,
                    byte_len: 0,
                })
                .collect();
        flushed.extend(q.rq.drain(..).map(|id| Completion {
            wr_id: id,
            qp,
            status: WcStatus::Flushed,
            op: WcOp::RecvImm,
            imm: 0,
            byte_len: 0,
        }));
        side.cq.extend(flushed);
    }

    /// Queues a second copy of the oldest write waiting on `side`'s QP `qp`, as a
    /// broken peer that sends one chunk twice would (RC hardware never does).
    /// False if none waits.
    pub fn duplicate_front(&self, side: usize, qp: usize) -> bool {
        let mut w = self.0.lock();
        let sq = &mut w.sides[side].qps[qp].sq;
        match sq.front().cloned() {
            Some(wr) => {
                sq.push_front(Wr { copy: true, ..wr });
                true
            }
            None => false,
        }
    }

    /// Injects an error on `side`'s QP `qp` (e.g. a link flap seen by that HCA).
    pub fn inject_qp_error(&self, side: usize, qp: usize) {
        Self::qp_fail(&mut self.0.lock().sides[side], qp);
    }

    /// `side` disappears (process killed, node down): it executes nothing more, and
    /// writes towards it fail with retries exceeded.
    pub fn lose(&self, side: usize) {
        let mut w = self.0.lock();
        w.sides[side].lost = true;
        for q in w.sides[side].qps.iter_mut() {
            q.sq.clear();
            q.rq.clear();
        }
    }

    /// Writes `side` has executed and their payload bytes.
    pub fn traffic(&self, side: usize) -> (u64, u64) {
        let w = self.0.lock();
        (w.sides[side].writes, w.sides[side].bytes)
    }

    /// Receives currently posted on `side`'s QP `qp`.
    pub fn posted_recvs(&self, side: usize, qp: usize) -> usize {
        self.0.lock().sides[side].qps[qp].rq.len()
    }
}

impl MemFabric {
    /// Threaded mode: one side of a connection-to-be, with `nqps` QPs, as a comm
    /// creates it before the bootstrap exchange. Its [`MemFabric::id`] travels as
    /// the QP number; [`MemFabric::join`] connects the two sides. In this mode
    /// `poll` executes this side's posted writes (each side's "NIC" runs when
    /// its owner polls), so both sides may live on different threads, and
    /// dropping a side makes it lost to its peer, as a destroyed QP is.
    pub fn open(nqps: usize) -> MemFabric {
        let net = MemNet::new(nqps);
        net.0.lock().auto = true;
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        HUB.lock()
            .get_or_insert_with(HashMap::new)
            .insert(id, net.clone());
        MemFabric { net, side: 0, id }
    }

    /// The id the peer passes to [`MemFabric::join`].
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Connects to the side whose id is `peer`. The first side to join moves
    /// its state (registrations, posted receives) into the peer's model as side
    /// 1; the second finds itself joined already.
    pub fn join(&mut self, peer: u32) -> Result<()> {
        let mut hub = HUB.lock();
        let hub = hub.get_or_insert_with(HashMap::new);
        if self.net.0.lock().joined {
            hub.remove(&self.id);
            return Ok(());
        }
        let other = hub
            .remove(&peer)
            .ok_or_else(|| Error::Remote(format!("no in-memory fabric {peer} to connect to")))?;
        hub.remove(&self.id);
        let mine = std::mem::take(&mut self.net.0.lock().sides[0]);
        {
            let mut w = other.0.lock();
            if w.joined || w.sides[1].qps.len() != mine.qps.len() {
                return Err(Error::Remote(format!(
                    "in-memory fabric {peer} is taken or has a different QP count"
                )));
            }
            w.sides[1] = mine;
            w.joined = true;
        }
        self.net = other;
        self.side = 1;
        Ok(())
    }

    /// The model this side belongs to (tests inject faults through it).
    pub fn net(&self) -> &MemNet {
        &self.net
    }
}

impl Link for MemFabric {
    fn local_info(&self) -> Result<Vec<QpInfo>> {
        Ok((0..self.nqps())
            .map(|_| QpInfo {
                qpn: self.id,
                lid: 0,
                gid: [0; 16],
                mtu: 5,
            })
            .collect())
    }

    fn connect(&mut self, remote: &[QpInfo]) -> Result<()> {
        if remote.len() != self.nqps() {
            return Err(Error::Remote(format!(
                "peer has {} QPs, we have {}",
                remote.len(),
                self.nqps()
            )));
        }
        self.join(remote[0].qpn)
    }

    fn registrar(&self) -> Arc<dyn Registrar> {
        Arc::new(MemRegistrar {
            net: self.net.clone(),
            side: self.side,
        })
    }
}

/// Threaded-mode fabrics for comms ([`MemFabric::open`]).
pub struct MemOpener;

impl Opener for MemOpener {
    type L = MemFabric;
    fn open(&self, nqps: usize, _sq: usize, _rq: usize) -> Result<MemFabric> {
        Ok(MemFabric::open(nqps))
    }
}

struct MemRegistrar {
    net: MemNet,
    side: usize,
}

struct MemKey {
    net: MemNet,
    side: usize,
    key: u32,
}

impl Drop for MemKey {
    fn drop(&mut self) {
        self.net.0.lock().sides[self.side].mrs.remove(&self.key);
    }
}

impl Registrar for MemRegistrar {
    unsafe fn reg(&self, addr: *mut u8, len: usize) -> Result<Registration> {
        let mut w = self.net.0.lock();
        let key = w.next_key;
        w.next_key += 1;
        w.sides[self.side]
            .mrs
            .insert(key, (addr as u64, len as u64));
        let mr = Mr {
            addr: addr as u64,
            len: len as u64,
            lkey: key,
            rkey: key,
        };
        Ok(Registration::new(
            mr,
            Box::new(MemKey {
                net: self.net.clone(),
                side: self.side,
                key,
            }),
        ))
    }

    /// The model has no device memory (emulated device memory is host
    /// memory): a DMA-BUF is taken to map the `len` bytes NCCL sees at `addr`,
    /// as a CUDA DMA-BUF maps the buffer it was exported from. Only the fd's
    /// sign is checked.
    unsafe fn reg_dmabuf(
        &self,
        addr: u64,
        len: usize,
        _offset: u64,
        fd: i32,
    ) -> Result<Registration> {
        if fd < 0 {
            return Err(Error::InvalidArgument(format!(
                "DMA-BUF registration with fd {fd}"
            )));
        }
        self.reg(addr as *mut u8, len)
    }

    fn supports_dmabuf(&self) -> bool {
        true
    }
}

impl Drop for MemFabric {
    fn drop(&mut self) {
        let mut w = self.net.0.lock();
        if w.auto {
            let s = &mut w.sides[self.side];
            s.lost = true;
            for q in s.qps.iter_mut() {
                q.sq.clear();
                q.rq.clear();
            }
            drop(w);
            if let Some(h) = HUB.lock().as_mut() {
                h.remove(&self.id);
            }
        }
    }
}

fn covers(mrs: &HashMap<u32, (u64, u64)>, key: u32, addr: u64, len: u64) -> bool {
    match mrs.get(&key) {
        Some(&(a, l)) => addr >= a && addr.checked_add(len).is_some_and(|e| e <= a + l),
        None => false,
    }
}

impl Fabric for MemFabric {
    fn nqps(&self) -> usize {
        self.net.nqps()
    }

    unsafe fn reg_mr(&mut self, addr: *mut u8, len: usize) -> Result<Mr> {
        let mut w = self.net.0.lock();
        let key = w.next_key;
        w.next_key += 1;
        w.sides[self.side]
            .mrs
            .insert(key, (addr as u64, len as u64));
        Ok(Mr {
            addr: addr as u64,
            len: len as u64,
            lkey: key,
            rkey: key,
        })
    }

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()> {
        let mut w = self.net.0.lock();
        w.sides[self.side]
            .mrs
            .remove(&mr.lkey)
            .map(|_| ())
            .ok_or_else(|| Error::Internal(format!("deregistering unknown key {}", mr.lkey)))
    }

    unsafe fn post_write(
        &mut self,
        qp: usize,
        wr_id: u64,
        local: Local,
        remote: Remote,
        imm: Option<u32>,
    ) -> Result<()> {
        let mut w = self.net.0.lock();
        let side = &mut w.sides[self.side];
        let q = side
            .qps
            .get_mut(qp)
            .ok_or_else(|| Error::Internal(format!("no QP {qp}")))?;
        if q.error {
            side.cq.push_back(Completion {
                wr_id,
                qp,
                status: WcStatus::Flushed,
                op: WcOp::Write,
                imm: 0,
                byte_len: 0,
            });
        } else {
            q.sq.push_back(Wr {
                wr_id,
                local,
                remote,
                imm,
                copy: false,
            });
        }
        Ok(())
    }

    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()> {
        let mut w = self.net.0.lock();
        let side = &mut w.sides[self.side];
        let q = side
            .qps
            .get_mut(qp)
            .ok_or_else(|| Error::Internal(format!("no QP {qp}")))?;
        if q.error {
            side.cq.push_back(Completion {
                wr_id,
                qp,
                status: WcStatus::Flushed,
                op: WcOp::RecvImm,
                imm: 0,
                byte_len: 0,
            });
        } else {
            q.rq.push_back(wr_id);
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut w = self.net.0.lock();
        if w.auto {
            MemNet::run_side(&mut w, self.side);
        }
        let side = &mut w.sides[self.side];
        if side.lost {
            return Ok(0);
        }
        let n = max.min(side.cq.len());
        out.extend(side.cq.drain(..n));
        Ok(n)
    }
}
