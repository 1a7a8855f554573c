//! The IB data protocol as two deterministic state machines, [`Sender`] and
//! [`Receiver`], that drive a [`Fabric`] and never block. They are the whole of
//! the protocol; the comms around them only add threads and NCCL's request slots.
//! docs/IB.md describes the protocol; in short:
//!
//! 1. `irecv` (seq s) takes a staging slot (a credit) and RDMA-writes a CTS entry
//!    {buf, rkey, cap, stage, stage_rkey, stage_len, s+1} into FIFO entry `s % 32`
//!    of the sender. No free staging slot: the CTS waits (credit exhaustion).
//! 2. `isend` (seq s) waits until FIFO entry `s % 32` carries stamp `s+1`.
//! 3. The sender cuts the message into at most [`MAX_CHUNKS`] chunks spread over the
//!    QPs. Before chunk 0 (same QP, so RC ordering makes it visible first) it writes
//!    an info record {total, chunk size, s+1} into the receiver's info table.
//! 4. Each chunk is compressed when the policy says so and the frame fits the rest
//!    of the staging slot; it is RDMA-written (with immediate data) either raw
//!    straight into NCCL's buffer, or as a frame into the staging slot at a
//!    64-byte-aligned bump offset. The immediate carries (FIFO index, compressed,
//!    chunk index, staging offset); the completion's byte_len is the wire length.
//! 5. The receiver reposts a receive per completion, decodes compressed chunks into
//!    NCCL's buffer as they land (chunks seen before chunk 0 wait for the info
//!    record), and completes the message when all chunks are placed; then the
//!    staging slot is free for the next CTS.
//! 6. The sender's request is done when all its writes have completed.
//!    Any error completion (flush, retries exceeded, protection) fails the side.
//!
//! A message whose buffer is device memory (`NCCL_PTR_CUDA`, GPUDirect RDMA)
//! carries its [`Backend`]: raw chunks are written from / land in the device
//! buffer exactly as for host memory; compressed chunks are encoded and decoded
//! by a GPU lane ([`super::gdr`]), with a separate adaptive policy.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::codec_glue::{max_wire, ChunkDecoder, Coder};
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::proto::plan;
use crate::proto::slots::NSLOTS;
use crate::stats::{OwnedCharge, Stats};

use super::fabric::{Completion, Fabric, Local, Mr, Remote, WcOp, WcStatus};
use super::gdr::DevLane;
use super::region::Region;
use crate::budget::{Budget, Reservation, BUFFERS};

/// CTS FIFO entries: one per request slot, indexed by `seq % FIFO_DEPTH`.
pub const FIFO_DEPTH: usize = NSLOTS;
const _: () = assert!(
    FIFO_DEPTH == 32,
    "the immediate data gives the FIFO index 5 bits"
);

/// Bytes of one CTS entry (fields at fixed offsets, little-endian; see [`Cts`]).
pub const CTS_SIZE: usize = 64;
/// Bytes of one info record (see [`Info`]).
pub const INFO_SIZE: usize = 16;
/// A message is cut into at most this many chunks (6 bits of immediate data).
pub const MAX_CHUNKS: usize = 64;
/// Compressed frames start at multiples of this in a staging slot.
pub const STAGE_ALIGN: usize = 64;
/// Largest staging slot the immediate's 20-bit offset (in STAGE_ALIGN units) reaches.
pub const MAX_STAGE_BYTES: usize = (1 << 20) * STAGE_ALIGN;
/// Largest message (NCCL's v8 shim rejects isends above 1 GiB).
pub const MAX_MESSAGE: usize = 1 << 30;

/// Tunables of one connection.
#[derive(Clone, Debug)]
pub struct Params {
    /// Largest chunk the sender compresses (`NCCL_ZIP_CHUNK_SIZE`).
    pub max_chunk: usize,
    /// Messages below this are not split (`NCCL_ZIP_MIN_CHUNK`).
    pub min_chunk: usize,
    /// Staging slots at the receiver = CTS credits (`NCCL_ZIP_IB_STAGE_SLOTS`).
    pub stage_slots: usize,
    /// Bytes per staging slot (`NCCL_ZIP_IB_STAGE_BYTES`).
    pub stage_bytes: usize,
    /// Compressed frames the sender can have in flight (registered buffers).
    pub send_bufs: usize,
    /// Work requests one QP may have outstanding on the send side.
    pub sq_depth: usize,
    /// GPU lanes per device and direction for compressed chunks of device
    /// buffers (`NCCL_ZIP_GPU_LANES`; the pools are shared by all comms).
    pub gpu_lanes: usize,
    /// Cap on the process's staging and frame buffers, all IB comms together
    /// ([`crate::budget`]; `NCCL_ZIP_BUFFER_MB`).
    pub buffer_cap: u64,
    /// The budget they count against ([`BUFFERS`]; tests give their own).
    pub budget: &'static Budget,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            max_chunk: 256 << 10,
            min_chunk: 32 << 10,
            stage_slots: 8,
            stage_bytes: 512 << 10,
            send_bufs: 8,
            sq_depth: 128,
            gpu_lanes: 16,
            buffer_cap: u64::MAX,
            budget: &BUFFERS,
        }
    }
}

impl Params {
    /// Receives each receiver QP keeps posted: enough for every chunk of every
    /// message that can hold a credit at once.
    pub fn rq_depth(&self) -> usize {
        self.stage_slots * MAX_CHUNKS
    }

    fn validate(&self) -> Result<()> {
        let ok = self.max_chunk > 0
            && self.stage_slots > 0
            && self.stage_slots <= FIFO_DEPTH
            && self.stage_bytes <= MAX_STAGE_BYTES
            && self.sq_depth >= 2
            && self.send_bufs <= 200;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "bad IB parameters {self:?}"
            )))
        }
    }
}

/// Chunk size of a `total`-byte message on `nqps` QPs: the TCP plan's size, raised
/// so that no message has more than [`MAX_CHUNKS`] chunks.
pub fn chunk_size(total: usize, nqps: usize, p: &Params) -> usize {
    let c = plan::chunk_size(total, nqps, p.min_chunk, p.max_chunk);
    c.max(total.div_ceil(MAX_CHUNKS).div_ceil(4096) * 4096)
        .max(1)
}

fn nchunks(total: usize, chunk: usize) -> usize {
    if total == 0 {
        1
    } else {
        total.div_ceil(chunk)
    }
}

// ---------------------------------------------------------------------------
// Wire records

/// A clear-to-send entry, written by the receiver into the sender's FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cts {
    pub buf: u64,
    pub stage: u64,
    pub buf_rkey: u32,
    pub stage_rkey: u32,
    pub cap: u32,
    pub stage_len: u32,
    /// seq + 1: a stale or never-written entry does not match.
    pub stamp: u64,
}

impl Cts {
    pub fn encode(&self) -> [u8; CTS_SIZE] {
        let mut b = [0u8; CTS_SIZE];
        b[0..8].copy_from_slice(&self.buf.to_le_bytes());
        b[8..16].copy_from_slice(&self.stage.to_le_bytes());
        b[16..20].copy_from_slice(&self.buf_rkey.to_le_bytes());
        b[20..24].copy_from_slice(&self.stage_rkey.to_le_bytes());
        b[24..28].copy_from_slice(&self.cap.to_le_bytes());
        b[28..32].copy_from_slice(&self.stage_len.to_le_bytes());
        // The stamp is last, so a NIC that writes in ascending order (as NCCL's
        // net_ib also assumes for its FIFO) makes it land after the rest.
        b[32..40].copy_from_slice(&self.stamp.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; CTS_SIZE]) -> Cts {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        Cts {
            buf: u64_at(0),
            stage: u64_at(8),
            buf_rkey: u32_at(16),
            stage_rkey: u32_at(20),
            cap: u32_at(24),
            stage_len: u32_at(28),
            stamp: u64_at(32),
        }
    }
}

/// A message's size and chunking, written by the sender before chunk 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    pub total: u32,
    pub chunk: u32,
    pub stamp: u64,
}

impl Info {
    pub fn encode(&self) -> [u8; INFO_SIZE] {
        let mut b = [0u8; INFO_SIZE];
        b[0..4].copy_from_slice(&self.total.to_le_bytes());
        b[4..8].copy_from_slice(&self.chunk.to_le_bytes());
        b[8..16].copy_from_slice(&self.stamp.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; INFO_SIZE]) -> Info {
        Info {
            total: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            chunk: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            stamp: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        }
    }
}

/// The 32 bits of immediate data of one chunk write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Imm {
    pub fifo: u8,
    pub compressed: bool,
    pub chunk: u8,
    /// Offset of the frame in the staging slot (compressed chunks), bytes.
    pub stage_off: u32,
}

impl Imm {
    pub fn encode(&self) -> u32 {
        debug_assert!((self.fifo as usize) < FIFO_DEPTH && (self.chunk as usize) < MAX_CHUNKS);
        debug_assert!((self.stage_off as usize).is_multiple_of(STAGE_ALIGN));
        (self.fifo as u32 & 31)
            | (self.compressed as u32) << 5
            | (self.chunk as u32 & 63) << 6
            | (self.stage_off / STAGE_ALIGN as u32) << 12
    }

    pub fn decode(v: u32) -> Imm {
        Imm {
            fifo: (v & 31) as u8,
            compressed: v & (1 << 5) != 0,
            chunk: ((v >> 6) & 63) as u8,
            stage_off: (v >> 12) * STAGE_ALIGN as u32,
        }
    }
}

/// What a state machine reports to its comm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    SendDone { seq: u64 },
    RecvDone { seq: u64, size: usize },
}

/// Where a side's remotely written memory is, exchanged at connection setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: u64,
    pub rkey: u32,
}

fn wc_error(c: &Completion, side: &str) -> Error {
    let what = match c.status {
        WcStatus::Success => return Error::Internal("not an error".into()),
        WcStatus::Flushed => "flushed: the queue pair is in the error state",
        WcStatus::RetryExceeded => "transport retries exceeded: the peer is unreachable",
        WcStatus::RemoteAccess => "remote access error: the peer refused the write",
        WcStatus::LocalProtection => {
            return Error::Internal(format!(
                "{side}: local protection error on QP {} (bad memory registration)",
                c.qp
            ))
        }
        WcStatus::Other(n) => {
            return Error::Remote(format!("{side}: completion status {n} on QP {}", c.qp))
        }
    };
    Error::Remote(format!("{side}: {what} (QP {})", c.qp))
}

/// A failed side stays failed; every later call returns the first error.
#[derive(Default)]
struct Failure(Option<Error>);

impl Failure {
    fn check(&self) -> Result<()> {
        self.0.as_ref().map_or(Ok(()), |e| Err(e.duplicate()))
    }
    fn set(&mut self, e: Error) -> Error {
        let d = e.duplicate();
        self.0.get_or_insert(e);
        d
    }
}

// ---------------------------------------------------------------------------
// Sender

/// The sender's compression settings: one adaptive policy for chunks of host
/// buffers (CPU codec) and one for chunks of device buffers (GPU kernels), whose
/// codec speeds differ.
pub struct Coders {
    pub host: Coder,
    pub dev: Coder,
}

const WR_INFO: u64 = 1;
const WR_CHUNK: u64 = 2;
const WR_CTS: u64 = 3;
const WR_RECV: u64 = 4;

fn wr_id(kind: u64, seq: u64, chunk: u64, buf: u64) -> u64 {
    kind << 56 | (buf & 0xff) << 40 | (chunk & 0xff) << 32 | (seq & 0xffff_ffff)
}
fn wr_kind(id: u64) -> u64 {
    id >> 56
}
fn wr_seq32(id: u64) -> u32 {
    id as u32
}
fn wr_buf(id: u64) -> usize {
    ((id >> 40) & 0xff) as usize
}

struct OutMsg {
    seq: u64,
    addr: u64,
    size: usize,
    lkey: u32,
    /// Device memory of this backend (else host memory).
    dev: Option<Arc<dyn Backend>>,
    cts: Option<Cts>,
    chunk: usize,
    nchunks: usize,
    next: usize,
    stage_cursor: usize,
    outstanding: usize,
}

pub struct Sender {
    p: Params,
    nqps: usize,
    fifo: Region,
    fifo_mr: Mr,
    info_src: Region,
    info_mr: Mr,
    /// Registered compression outputs, made when the first chunk is worth
    /// compressing and the budget allows ([`Sender::ensure_bufs`]).
    bufs: Vec<Vec<u8>>,
    buf_mrs: Vec<Mr>,
    free_bufs: Vec<usize>,
    /// The budget `bufs` hold, and their charge in the stats.
    bufs_held: Option<(Reservation<'static>, OwnedCharge)>,
    peer_info: Option<Endpoint>,
    queue: VecDeque<OutMsg>,
    next_seq: u64,
    sq_used: Vec<usize>,
    coders: Coders,
    /// GPU lane for compressed chunks of device buffers (made on first use).
    lane: DevLane,
    pub stats: Stats,
    /// The FIFO and info regions, counted in the stats and `HELD`.
    _held: OwnedCharge,
    failed: Failure,
    wc: Vec<Completion>,
}

impl Sender {
    pub fn new<F: Fabric>(fab: &mut F, p: Params, coders: Coders) -> Result<Sender> {
        p.validate()?;
        let nqps = fab.nqps();
        let fifo = Region::new(FIFO_DEPTH * CTS_SIZE)?;
        let info_src = Region::new(FIFO_DEPTH * INFO_SIZE)?;
        // SAFETY: the regions live in the returned Sender, which deregisters them
        // in `close` before dropping them (or the fabric's own teardown does).
        let fifo_mr = unsafe { fab.reg_mr(fifo.as_mut_ptr(), fifo.len())? };
        let info_mr = unsafe { fab.reg_mr(info_src.as_mut_ptr(), info_src.len())? };
        let stats = Stats::default();
        let held = OwnedCharge::new(&stats, (fifo.len() + info_src.len()) as u64);
        Ok(Sender {
            free_bufs: Vec::new(),
            nqps,
            fifo,
            fifo_mr,
            info_src,
            info_mr,
            bufs: Vec::new(),
            buf_mrs: Vec::new(),
            bufs_held: None,
            peer_info: None,
            queue: VecDeque::new(),
            next_seq: 0,
            sq_used: vec![0; nqps],
            coders,
            lane: DevLane::new(Dir::Send, p.max_chunk, p.gpu_lanes),
            stats,
            _held: held,
            failed: Failure::default(),
            wc: Vec::new(),
            p,
        })
    }

    /// Makes and registers the frame buffers if the budget allows; `false`
    /// (send raw) when it does not. Tried again at the next chunk worth
    /// compressing; never waits.
    fn ensure_bufs<F: Fabric>(&mut self, fab: &mut F) -> Result<bool> {
        if self.bufs_held.is_some() {
            return Ok(true);
        }
        let blen = max_wire(self.p.max_chunk);
        let total = (blen * self.p.send_bufs) as u64;
        let Some(res) = self.p.budget.reserve(total, self.p.buffer_cap) else {
            self.stats.add(&self.stats.budget_refusals, 1);
            return Ok(false);
        };
        for _ in 0..self.p.send_bufs {
            let mut b = vec![0u8; blen];
            // SAFETY: the Vec's heap block never moves (it is never resized) and
            // lives in the Sender like the regions (deregistered in `close`).
            match unsafe { fab.reg_mr(b.as_mut_ptr(), b.len()) } {
                Ok(mr) => self.buf_mrs.push(mr),
                Err(e) => {
                    for m in self.buf_mrs.drain(..) {
                        let _ = fab.dereg_mr(&m);
                    }
                    self.bufs.clear();
                    return Err(e);
                }
            }
            self.bufs.push(b);
        }
        self.free_bufs = (0..self.bufs.len()).rev().collect();
        self.bufs_held = Some((res, OwnedCharge::new(&self.stats, total)));
        Ok(true)
    }

    /// Whether a device chunk has needed a GPU lane (tests).
    pub fn has_lane(&self) -> bool {
        self.lane.has_lane()
    }

    /// The FIFO the receiver writes CTS entries into.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.fifo_mr.addr,
            rkey: self.fifo_mr.rkey,
        }
    }

    /// The receiver's info table (from its [`Receiver::endpoint`]).
    pub fn connect(&mut self, peer: Endpoint) {
        self.peer_info = Some(peer);
    }

    /// Requests still in flight.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Queues message `seq` (the next one) of `size` bytes at `addr` (readable with
    /// `lkey`): host memory, or device memory of `dev`.
    pub fn isend(
        &mut self,
        seq: u64,
        addr: u64,
        size: usize,
        lkey: u32,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<()> {
        self.failed.check()?;
        if seq != self.next_seq {
            return Err(Error::Internal(format!(
                "isend seq {seq}, expected {}",
                self.next_seq
            )));
        }
        if size > MAX_MESSAGE {
            return Err(Error::InvalidArgument(format!(
                "isend of {size} bytes: the v8 API allows at most 1 GiB"
            )));
        }
        let chunk = chunk_size(size, self.nqps, &self.p);
        self.queue.push_back(OutMsg {
            seq,
            addr,
            size,
            lkey,
            dev,
            cts: None,
            chunk,
            nchunks: nchunks(size, chunk),
            next: 0,
            stage_cursor: 0,
            outstanding: 0,
        });
        self.next_seq += 1;
        Ok(())
    }

    /// Does all the work that can be done now: completions, CTS matching, and
    /// compressing and posting chunks. Finished requests are appended to `ev`.
    pub fn progress<F: Fabric>(&mut self, fab: &mut F, ev: &mut Vec<Event>) -> Result<()> {
        self.failed.check()?;
        match self.step(fab, ev) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed.set(e)),
        }
    }

    fn step<F: Fabric>(&mut self, fab: &mut F, ev: &mut Vec<Event>) -> Result<()> {
        self.reap(fab, ev)?;
        for i in 0..self.queue.len() {
            if self.queue[i].cts.is_none() {
                match self.read_cts(self.queue[i].seq) {
                    Some(c) => {
                        let m = &self.queue[i];
                        if m.size > c.cap as usize {
                            return Err(Error::InvalidUsage(format!(
                                "message {} is {} bytes but the posted receive holds only {} bytes",
                                m.seq, m.size, c.cap
                            )));
                        }
                        self.queue[i].cts = Some(c);
                    }
                    // CTS entries are consumed in order.
                    None => break,
                }
            }
            while self.queue[i].next < self.queue[i].nchunks {
                if !self.send_chunk(fab, i)? {
                    return Ok(()); // out of send-queue credits: wait for completions
                }
            }
        }
        self.reap(fab, ev)
    }

    fn read_cts(&self, seq: u64) -> Option<Cts> {
        let mut b = [0u8; CTS_SIZE];
        self.fifo
            .read_volatile((seq as usize % FIFO_DEPTH) * CTS_SIZE + 32, &mut b[32..40]);
        if u64::from_le_bytes(b[32..40].try_into().unwrap()) != seq + 1 {
            return None;
        }
        self.fifo
            .read_volatile((seq as usize % FIFO_DEPTH) * CTS_SIZE, &mut b[..32]);
        Some(Cts::decode(&b))
    }

    /// Posts the next chunk of message `i`; false when its QP has no room.
    fn send_chunk<F: Fabric>(&mut self, fab: &mut F, i: usize) -> Result<bool> {
        let peer = self
            .peer_info
            .ok_or_else(|| Error::Internal("sender used before connect".into()))?;
        let nqps = self.nqps;
        let m = &self.queue[i];
        let cts = m.cts.expect("chunks are sent only after the CTS");
        let idx = m.next;
        let qp = (m.seq as usize + idx) % nqps;
        let first = idx == 0;
        let need = if first { 2 } else { 1 };
        if self.sq_used[qp] + need > self.p.sq_depth {
            return Ok(false);
        }
        let fifo = (m.seq as usize % FIFO_DEPTH) as u8;
        let (seq, chunk, total) = (m.seq, m.chunk, m.size);
        if first {
            // The info record goes on chunk 0's QP ahead of it: RC executes the
            // writes of one QP in order, so it is in place when chunk 0 completes.
            let rec = Info {
                total: total as u32,
                chunk: chunk as u32,
                stamp: seq + 1,
            };
            let off = fifo as usize * INFO_SIZE;
            self.info_src.write(off, &rec.encode());
            let local = Local {
                addr: self.info_mr.addr + off as u64,
                len: INFO_SIZE as u32,
                lkey: self.info_mr.lkey,
            };
            let remote = Remote {
                addr: peer.addr + off as u64,
                rkey: peer.rkey,
            };
            // SAFETY: info_src is registered and entry `fifo` is not rewritten
            // before message seq+32, which cannot start before this one completes.
            unsafe { fab.post_write(qp, wr_id(WR_INFO, seq, 0, 0), local, remote, None)? };
            self.sq_used[qp] += 1;
            self.queue[i].outstanding += 1;
        }
        let off = idx * chunk;
        let len = chunk.min(total - off.min(total));
        let m = &self.queue[i];
        let src_addr = m.addr + off as u64;
        let mut wire: Option<(usize, usize)> = None; // (buf, wire len)
        let room = (cts.stage_len as usize).saturating_sub(m.stage_cursor);
        let on_dev = m.dev.is_some();
        if len > 0
            && len <= self.p.max_chunk
            && room >= crate::adapt::MIN_COMPRESS_BYTES.min(len)
            && self.ensure_bufs(fab)?
        {
            let m = &self.queue[i];
            if let Some(b) = self.free_bufs.pop() {
                let r = match &m.dev {
                    None => {
                        // SAFETY: NCCL keeps the send buffer unchanged until the
                        // request is done, which is after every write of it completed.
                        let src = unsafe { std::slice::from_raw_parts(src_addr as *const u8, len) };
                        Ok(self
                            .coders
                            .host
                            .encode_into(src, &mut self.bufs[b], &self.stats))
                    }
                    // Device memory: encoded by a GPU lane, the frame copied into
                    // the registered buffer (never read by the CPU otherwise).
                    Some(d) => self.lane.compress_into(
                        d,
                        &self.coders.dev,
                        src_addr,
                        len,
                        &mut self.bufs[b],
                        &self.stats,
                    ),
                };
                match r {
                    Ok(Some(n)) if n <= room => wire = Some((b, n)),
                    Ok(_) => self.free_bufs.push(b),
                    Err(e) => {
                        self.free_bufs.push(b);
                        return Err(e);
                    }
                }
            }
        }
        let m = &mut self.queue[i];
        let (local, remote, imm, bufno) = match wire {
            Some((b, n)) => {
                let at = m.stage_cursor;
                m.stage_cursor = (at + n).div_ceil(STAGE_ALIGN) * STAGE_ALIGN;
                (
                    Local {
                        addr: self.buf_mrs[b].addr,
                        len: n as u32,
                        lkey: self.buf_mrs[b].lkey,
                    },
                    Remote {
                        addr: cts.stage + at as u64,
                        rkey: cts.stage_rkey,
                    },
                    Imm {
                        fifo,
                        compressed: true,
                        chunk: idx as u8,
                        stage_off: at as u32,
                    },
                    b as u64 + 1,
                )
            }
            None => (
                Local {
                    addr: src_addr,
                    len: len as u32,
                    lkey: m.lkey,
                },
                Remote {
                    addr: cts.buf + off as u64,
                    rkey: cts.buf_rkey,
                },
                Imm {
                    fifo,
                    compressed: false,
                    chunk: idx as u8,
                    stage_off: 0,
                },
                0,
            ),
        };
        // SAFETY: the source is NCCL's send buffer (valid until done) or a staging
        // buffer that stays off the free list until this write completes.
        unsafe {
            fab.post_write(
                qp,
                wr_id(WR_CHUNK, seq, idx as u64, bufno),
                local,
                remote,
                Some(imm.encode()),
            )?
        };
        self.sq_used[qp] += 1;
        m.outstanding += 1;
        m.next += 1;
        let st = &self.stats;
        st.add(&st.wire_bytes, local.len as u64);
        if on_dev && len > 0 {
            st.add(&st.chunks_device, 1);
        }
        st.add(
            if imm.compressed {
                &st.chunks_compressed
            } else {
                &st.chunks_raw
            },
            1,
        );
        Ok(true)
    }

    fn reap<F: Fabric>(&mut self, fab: &mut F, ev: &mut Vec<Event>) -> Result<()> {
        let mut wc = std::mem::take(&mut self.wc);
        let r = self.reap_into(fab, ev, &mut wc);
        wc.clear();
        self.wc = wc;
        r
    }

    fn reap_into<F: Fabric>(
        &mut self,
        fab: &mut F,
        ev: &mut Vec<Event>,
        wc: &mut Vec<Completion>,
    ) -> Result<()> {
        loop {
            wc.clear();
            if fab.poll(wc, 64)? == 0 {
                return Ok(());
            }
            for c in wc.iter() {
                if c.status != WcStatus::Success {
                    return Err(wc_error(c, "send"));
                }
                if c.op != WcOp::Write || !matches!(wr_kind(c.wr_id), WR_INFO | WR_CHUNK) {
                    return Err(Error::Internal(format!(
                        "sender got unexpected completion {c:?}"
                    )));
                }
                self.sq_used[c.qp] -= 1;
                if let Some(b) = wr_buf(c.wr_id).checked_sub(1) {
                    self.free_bufs.push(b);
                }
                let s32 = wr_seq32(c.wr_id);
                let pos = self
                    .queue
                    .iter()
                    .position(|m| m.seq as u32 == s32)
                    .ok_or_else(|| {
                        Error::Internal(format!("completion for unknown message {s32}"))
                    })?;
                let m = &mut self.queue[pos];
                m.outstanding -= 1;
                if m.outstanding == 0 && m.next == m.nchunks {
                    let m = self.queue.remove(pos).expect("found above");
                    self.stats.add(&self.stats.messages, 1);
                    self.stats.add(&self.stats.raw_bytes, m.size as u64);
                    ev.push(Event::SendDone { seq: m.seq });
                }
            }
        }
    }

    /// Deregisters this side's memory (best effort; errors are returned, not panicked).
    pub fn close<F: Fabric>(self, fab: &mut F) -> Result<()> {
        let mut r = fab.dereg_mr(&self.fifo_mr);
        r = r.and(fab.dereg_mr(&self.info_mr));
        for m in &self.buf_mrs {
            r = r.and(fab.dereg_mr(m));
        }
        r
    }
}

// ---------------------------------------------------------------------------
// Receiver

struct Early {
    chunk: usize,
    compressed: bool,
    stage_off: usize,
    byte_len: usize,
}

struct InMsg {
    seq: u64,
    buf: u64,
    cap: usize,
    rkey: u32,
    /// Device memory of this backend (else host memory).
    dev: Option<Arc<dyn Backend>>,
    stage: Option<usize>,
    cts_posted: bool,
    /// (total, chunk, nchunks) once chunk 0 brought the info record.
    info: Option<(usize, usize, usize)>,
    early: Vec<Early>,
    /// The chunks placed so far, one bit each ([`MAX_CHUNKS`] fit).
    placed: u64,
}
const _: () = assert!(MAX_CHUNKS <= 64);

pub struct Receiver {
    p: Params,
    nqps: usize,
    info: Region,
    info_mr: Mr,
    /// The staging slots' memory, made at the first receive the budget allows
    /// ([`Receiver::ensure_stage`]); without it receives grant no staging.
    stage: Option<Stage>,
    /// Staging slots = credits, whether or not they have memory.
    free_stage: Vec<usize>,
    cts_src: Region,
    cts_mr: Mr,
    peer_fifo: Option<Endpoint>,
    msgs: Vec<Option<InMsg>>,
    /// Posted receives waiting for a staging slot, in order.
    waiting: VecDeque<u64>,
    next_seq: u64,
    sq_used: usize,
    /// GPU lane decoding compressed chunks into device buffers (made on first use).
    lane: DevLane,
    /// Host chunks' decoder (keeps decode tables across chunks).
    decoder: ChunkDecoder,
    pub stats: Stats,
    /// The info and CTS regions, counted in the stats and `HELD`.
    _held: OwnedCharge,
    failed: Failure,
    wc: Vec<Completion>,
}

/// A receiver's registered staging memory and the budget it holds.
struct Stage {
    region: Region,
    mr: Mr,
    _res: Reservation<'static>,
    _charge: OwnedCharge,
}

impl Receiver {
    pub fn new<F: Fabric>(fab: &mut F, p: Params) -> Result<Receiver> {
        p.validate()?;
        let nqps = fab.nqps();
        let info = Region::new(FIFO_DEPTH * INFO_SIZE)?;
        let cts_src = Region::new(FIFO_DEPTH * CTS_SIZE)?;
        // SAFETY: as in Sender::new: the regions live in the Receiver.
        let info_mr = unsafe { fab.reg_mr(info.as_mut_ptr(), info.len())? };
        let cts_mr = unsafe { fab.reg_mr(cts_src.as_mut_ptr(), cts_src.len())? };
        for qp in 0..nqps {
            for _ in 0..p.rq_depth() {
                fab.post_recv(qp, wr_id(WR_RECV, 0, 0, 0))?;
            }
        }
        let stats = Stats::default();
        let held = OwnedCharge::new(&stats, (info.len() + cts_src.len()) as u64);
        Ok(Receiver {
            free_stage: (0..p.stage_slots).rev().collect(),
            nqps,
            info,
            info_mr,
            stage: None,
            cts_src,
            cts_mr,
            peer_fifo: None,
            msgs: (0..FIFO_DEPTH).map(|_| None).collect(),
            waiting: VecDeque::new(),
            next_seq: 0,
            sq_used: 0,
            lane: DevLane::new(Dir::Recv, p.max_chunk, p.gpu_lanes),
            decoder: ChunkDecoder::default(),
            stats,
            _held: held,
            failed: Failure::default(),
            wc: Vec::new(),
            p,
        })
    }

    /// Makes and registers the staging memory if the budget allows; `false`
    /// when it does not (the receive grants no staging: its chunks come raw).
    fn ensure_stage<F: Fabric>(&mut self, fab: &mut F) -> Result<bool> {
        if self.stage.is_some() {
            return Ok(true);
        }
        let len = self.p.stage_slots * self.p.stage_bytes;
        let Some(res) = self.p.budget.reserve(len as u64, self.p.buffer_cap) else {
            self.stats.add(&self.stats.budget_refusals, 1);
            return Ok(false);
        };
        let region = Region::new(len)?;
        // SAFETY: the region lives in the Receiver (deregistered in `close`).
        let mr = unsafe { fab.reg_mr(region.as_mut_ptr(), region.len())? };
        self.stage = Some(Stage {
            region,
            mr,
            _res: res,
            _charge: OwnedCharge::new(&self.stats, len as u64),
        });
        Ok(true)
    }

    /// Whether a device chunk has needed a GPU lane (tests).
    pub fn has_lane(&self) -> bool {
        self.lane.has_lane()
    }

    /// Whether this receiver holds staging memory (tests).
    pub fn has_stage(&self) -> bool {
        self.stage.is_some()
    }

    /// The info table the sender writes records into.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.info_mr.addr,
            rkey: self.info_mr.rkey,
        }
    }

    /// The sender's CTS FIFO (from its [`Sender::endpoint`]).
    pub fn connect(&mut self, peer: Endpoint) {
        self.peer_fifo = Some(peer);
    }

    /// The codec frame format the sender agreed to write at most (its
    /// bootstrap record); frames above it fail the comm. Until this is called:
    /// `codec_glue::BASE_FORMAT`.
    pub fn agree_format(&mut self, format: u8) {
        self.decoder = ChunkDecoder::agreed(format);
    }

    pub fn pending(&self) -> usize {
        self.msgs.iter().filter(|m| m.is_some()).count()
    }

    /// Posts receive `seq` (the next one): `cap` bytes at `buf`, writable by the
    /// peer with `rkey`: host memory, or device memory of `dev`.
    pub fn irecv(
        &mut self,
        seq: u64,
        buf: u64,
        cap: usize,
        rkey: u32,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<()> {
        self.failed.check()?;
        if seq != self.next_seq {
            return Err(Error::Internal(format!(
                "irecv seq {seq}, expected {}",
                self.next_seq
            )));
        }
        let k = seq as usize % FIFO_DEPTH;
        if self.msgs[k].is_some() {
            return Err(Error::Internal(format!(
                "irecv {seq}: FIFO entry {k} still in use"
            )));
        }
        self.msgs[k] = Some(InMsg {
            seq,
            buf,
            cap: cap.min(u32::MAX as usize),
            rkey,
            dev,
            stage: None,
            cts_posted: false,
            info: None,
            early: Vec::new(),
            placed: 0,
        });
        self.waiting.push_back(seq);
        self.next_seq += 1;
        Ok(())
    }

    pub fn progress<F: Fabric>(&mut self, fab: &mut F, ev: &mut Vec<Event>) -> Result<()> {
        self.failed.check()?;
        match self.step(fab, ev) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed.set(e)),
        }
    }

    fn step<F: Fabric>(&mut self, fab: &mut F, ev: &mut Vec<Event>) -> Result<()> {
        self.reap(fab, ev)?;
        self.post_cts(fab)?;
        Ok(())
    }

    /// Grants credits: one CTS per waiting receive while staging slots are free.
    fn post_cts<F: Fabric>(&mut self, fab: &mut F) -> Result<()> {
        let peer = self
            .peer_fifo
            .ok_or_else(|| Error::Internal("receiver used before connect".into()))?;
        while let Some(&seq) = self.waiting.front() {
            if self.free_stage.is_empty() || self.sq_used >= self.p.sq_depth {
                return Ok(());
            }
            let staged = self.ensure_stage(fab)?;
            let slot = self.free_stage.pop().expect("checked");
            let k = seq as usize % FIFO_DEPTH;
            let m = self.msgs[k].as_mut().expect("waiting receives are posted");
            m.stage = Some(slot);
            // Without staging memory the credit grants none: the sender writes
            // every chunk raw into NCCL's buffer.
            let (stage, stage_rkey, stage_len) = match (&self.stage, staged) {
                (Some(st), true) => (
                    st.mr.addr + (slot * self.p.stage_bytes) as u64,
                    st.mr.rkey,
                    self.p.stage_bytes as u32,
                ),
                _ => (0, 0, 0),
            };
            let cts = Cts {
                buf: m.buf,
                stage,
                buf_rkey: m.rkey,
                stage_rkey,
                cap: m.cap as u32,
                stage_len,
                stamp: seq + 1,
            };
            self.cts_src.write(k * CTS_SIZE, &cts.encode());
            let local = Local {
                addr: self.cts_mr.addr + (k * CTS_SIZE) as u64,
                len: CTS_SIZE as u32,
                lkey: self.cts_mr.lkey,
            };
            let remote = Remote {
                addr: peer.addr + (k * CTS_SIZE) as u64,
                rkey: peer.rkey,
            };
            // SAFETY: cts_src entry k is not rewritten before receive seq+32 is
            // posted, which needs this receive to be complete first.
            unsafe { fab.post_write(0, wr_id(WR_CTS, seq, 0, 0), local, remote, None)? };
            self.sq_used += 1;
            m.cts_posted = true;
            self.waiting.pop_front();
        }
        Ok(())
    }

    fn reap<F: Fabric>(&mut self, fab: &mut F, ev: &mut Vec<Event>) -> Result<()> {
        let mut wc = std::mem::take(&mut self.wc);
        let r = self.reap_into(fab, ev, &mut wc);
        wc.clear();
        self.wc = wc;
        r
    }

    fn reap_into<F: Fabric>(
        &mut self,
        fab: &mut F,
        ev: &mut Vec<Event>,
        wc: &mut Vec<Completion>,
    ) -> Result<()> {
        loop {
            wc.clear();
            if fab.poll(wc, 64)? == 0 {
                return Ok(());
            }
            for c in wc.iter() {
                if c.status != WcStatus::Success {
                    return Err(wc_error(c, "receive"));
                }
                match (c.op, wr_kind(c.wr_id)) {
                    (WcOp::Write, WR_CTS) => self.sq_used -= 1,
                    (WcOp::RecvImm, WR_RECV) => {
                        fab.post_recv(c.qp, wr_id(WR_RECV, 0, 0, 0))?;
                        self.on_chunk(c, ev)?;
                    }
                    _ => {
                        return Err(Error::Internal(format!(
                            "receiver got unexpected completion {c:?}"
                        )))
                    }
                }
            }
        }
    }

    fn on_chunk(&mut self, c: &Completion, ev: &mut Vec<Event>) -> Result<()> {
        let imm = Imm::decode(c.imm);
        let k = imm.fifo as usize;
        let corrupt = |why: String| Error::Remote(format!("corrupt IB stream: {why}"));
        let m = match self.msgs[k].as_mut() {
            Some(m) if m.cts_posted => m,
            _ => {
                return Err(corrupt(format!(
                    "chunk for FIFO entry {k}, which has no CTS"
                )))
            }
        };
        let e = Early {
            chunk: imm.chunk as usize,
            compressed: imm.compressed,
            stage_off: imm.stage_off as usize,
            byte_len: c.byte_len as usize,
        };
        if m.info.is_none() {
            if e.chunk != 0 {
                // A message has at most MAX_CHUNKS chunks: more before chunk 0 come
                // from a broken sender, and must not grow the list without bound.
                if m.early.len() + 1 >= MAX_CHUNKS {
                    return Err(corrupt(format!(
                        "{} chunks of message {} before its chunk 0",
                        m.early.len() + 1,
                        m.seq
                    )));
                }
                m.early.push(e);
                return Ok(());
            }
            let mut b = [0u8; INFO_SIZE];
            self.info.read_volatile(k * INFO_SIZE, &mut b);
            let info = Info::decode(&b);
            let (total, chunk) = (info.total as usize, info.chunk as usize);
            if info.stamp != m.seq + 1 {
                return Err(corrupt(format!(
                    "info record stamp {} for message {}",
                    info.stamp, m.seq
                )));
            }
            if total > m.cap {
                return Err(Error::InvalidUsage(format!(
                    "message {} is {total} bytes but the posted receive holds only {} bytes",
                    m.seq, m.cap
                )));
            }
            if chunk == 0 || nchunks(total, chunk) > MAX_CHUNKS {
                return Err(corrupt(format!(
                    "message {} of {total} bytes in chunks of {chunk}",
                    m.seq
                )));
            }
            m.info = Some((total, chunk, nchunks(total, chunk)));
            let early = std::mem::take(&mut m.early);
            self.place(k, e)?;
            for e in early {
                self.place(k, e)?;
            }
        } else {
            self.place(k, e)?;
        }
        let m = self.msgs[k].as_ref().expect("present");
        let (total, _, n) = m.info.expect("known");
        if m.placed.count_ones() as usize == n {
            let m = self.msgs[k].take().expect("present");
            self.free_stage
                .push(m.stage.expect("a CTS'd receive holds a slot"));
            self.stats.add(&self.stats.messages, 1);
            ev.push(Event::RecvDone {
                seq: m.seq,
                size: total,
            });
        }
        Ok(())
    }

    /// Puts one landed chunk of the message in FIFO entry `k` in place.
    fn place(&mut self, k: usize, e: Early) -> Result<()> {
        let m = self.msgs[k].as_mut().expect("present");
        let (total, chunk, n) = m.info.expect("known");
        let corrupt = |why: String| Error::Remote(format!("corrupt IB stream: {why}"));
        if e.chunk >= n {
            return Err(corrupt(format!("chunk {} of a {n}-chunk message", e.chunk)));
        }
        // A chunk that came twice would complete the message with another's bytes
        // missing.
        if m.placed & (1 << e.chunk) != 0 {
            return Err(corrupt(format!(
                "chunk {} of message {} arrived twice",
                e.chunk, m.seq
            )));
        }
        let off = e.chunk * chunk;
        let raw_len = chunk.min(total - off);
        if e.compressed {
            let slot = m.stage.expect("a CTS'd receive holds a slot");
            let Some(st) = &self.stage else {
                return Err(corrupt(format!(
                    "compressed chunk {} of message {} with no staging granted",
                    e.chunk, m.seq
                )));
            };
            if e.stage_off + e.byte_len > self.p.stage_bytes || raw_len == 0 {
                return Err(corrupt(format!(
                    "frame {}+{} beyond the staging slot",
                    e.stage_off, e.byte_len
                )));
            }
            // SAFETY: the frame's write completed (we hold its completion), and no
            // other write targets this part of the slot until the message is done.
            let frame = unsafe {
                st.region
                    .settled(slot * self.p.stage_bytes + e.stage_off, e.byte_len)
            };
            // Before either decoder (CPU or GPU lane) sees it.
            self.decoder.check(frame)?;
            let dst = m.buf + off as u64;
            match &m.dev {
                None => {
                    // SAFETY: NCCL's buffer holds cap >= total bytes and is ours
                    // until the request is reported done; chunks never overlap.
                    let dst = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, raw_len) };
                    self.decoder.decode(frame, dst, &self.stats)?;
                }
                // Device memory: only a GPU lane writes it (decode, or CPU decode
                // and copy up); the call returns when the bytes are in place.
                Some(b) => self.lane.decode_into(b, frame, dst, raw_len, &self.stats)?,
            }
            self.stats.add(&self.stats.chunks_compressed, 1);
        } else {
            if e.byte_len != raw_len {
                return Err(corrupt(format!(
                    "raw chunk of {} bytes, expected {raw_len}",
                    e.byte_len
                )));
            }
            self.stats.add(&self.stats.chunks_raw, 1);
        }
        if m.dev.is_some() && raw_len > 0 {
            // Into device memory: by the HCA (raw, GPUDirect RDMA) or the lane.
            self.stats.add(&self.stats.chunks_device, 1);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        self.stats.add(&self.stats.wire_bytes, e.byte_len as u64);
        self.stats.add(&self.stats.raw_bytes, raw_len as u64);
        crate::adapt::RECEIVED.add(raw_len as u64);
        m.placed |= 1 << e.chunk;
        Ok(())
    }

    pub fn close<F: Fabric>(self, fab: &mut F) -> Result<()> {
        let mut r = fab.dereg_mr(&self.info_mr).and(fab.dereg_mr(&self.cts_mr));
        if let Some(st) = &self.stage {
            r = r.and(fab.dereg_mr(&st.mr));
        }
        r
    }

    /// QPs this side drives.
    pub fn nqps(&self) -> usize {
        self.nqps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let c = Cts {
            buf: 0x1122_3344_5566_7788,
            stage: 42,
            buf_rkey: 7,
            stage_rkey: 9,
            cap: 1 << 30,
            stage_len: 512 << 10,
            stamp: 33,
        };
        assert_eq!(Cts::decode(&c.encode()), c);
        let i = Info {
            total: 12345,
            chunk: 4096,
            stamp: 5,
        };
        assert_eq!(Info::decode(&i.encode()), i);
        for imm in [
            Imm {
                fifo: 31,
                compressed: true,
                chunk: 63,
                stage_off: (MAX_STAGE_BYTES - STAGE_ALIGN) as u32,
            },
            Imm {
                fifo: 0,
                compressed: false,
                chunk: 0,
                stage_off: 0,
            },
            Imm {
                fifo: 5,
                compressed: true,
                chunk: 17,
                stage_off: 4096,
            },
        ] {
            assert_eq!(Imm::decode(imm.encode()), imm);
        }
    }

    #[test]
    fn chunking_is_bounded() {
        let p = Params::default();
        for total in [0usize, 1, 4095, 128 << 10, 1 << 20, 5 << 20, 1 << 30] {
            for q in 1..=8 {
                let c = chunk_size(total, q, &p);
                assert!(
                    nchunks(total, c) <= MAX_CHUNKS,
                    "{total} on {q} QPs: chunk {c}"
                );
            }
        }
    }
}
