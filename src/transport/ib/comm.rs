//! The IB comms NCCL holds: [`IbListenComm`], [`IbConnect`] (a resumable
//! connect), [`IbSendComm`] and [`IbRecvComm`]. They wrap the protocol of
//! [`super::proto`] with what NCCL needs around it:
//!
//! - **Bootstrap.** The listen handle carries a TCP address and a secret. The
//!   connector sends a [`Boot`] record (secret, its QPs' info, its CTS FIFO); the
//!   listener creates its fabric and receiver, connects its QPs, and answers with
//!   its own record (QPs, info table). Both sides then move their QPs to RTS.
//!   Every step is non-blocking; `connect` keeps its state behind the handle's
//!   stage area (bytes 64..80), as the TCP transport does.
//! - **Progress on shared workers** ([`progress`], issue 20): each comm's
//!   driver owns the fabric and the Sender/Receiver, takes the requests
//!   isend/irecv queue (they only post a [`Slot`] and a command, and wake the
//!   comm's worker, so NCCL's progress thread never waits), polls completions,
//!   and completes the slots, so `test()` is the TCP transport's. A few
//!   process-wide workers step every comm's driver (before: a thread per comm).
//! - **The bootstrap socket stays open** as the control channel: a side that
//!   fails sends its error there (so a receive whose sender saw the size
//!   mismatch fails too, with ncclInvalidUsage), and EOF means the peer closed.
//!
//! Generic over [`Opener`], so the whole comm runs over the in-memory fabric in
//! tests (tests/ib_comm.rs) and over verbs in the plugin.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver as ChanRx, Sender as ChanTx, TryRecvError};
use parking_lot::Mutex;
use socket2::Socket;
use tracing::{info, warn};

use super::fabric::{Fabric, Link, Mr, Opener, QpInfo, Registrar, Registration};
use super::progress;
use super::proto::{Coders, Endpoint, Event, Params, Receiver, Sender, MAX_MESSAGE};
use crate::adapt::Policy;
use crate::codec::EncodeOptions;
use crate::codec_glue::Coder;
use crate::config::{CompressMode, Config, DtypeHint};
use crate::error::{Error, Result};
use crate::gpu::Backend;
use crate::proto::bootstrap::{Dialer, Framing, Gate, Io, Outcome, MAX_HALF_OPEN};
use crate::proto::slots::{Ring, Slot};
use crate::proto::wire::{self, HANDLE_SIZE};
use crate::transport::boot::{accept_and_poll, dial, read_nb, Conn};
use crate::transport::tcp::sock::{bind_listener, random_secret, start_connect};

/// Largest QP count a peer may announce (`NCCL_ZIP_IB_QPS` is capped the same).
pub const MAX_QPS: usize = 16;

/// Settings of IB comms (from [`Config`], or set directly by tests).
#[derive(Clone, Debug)]
pub struct IbConfig {
    pub nqps: usize,
    pub params: Params,
    pub compress: CompressMode,
    pub dtype: DtypeHint,
    pub checksum: bool,
    /// `NCCL_ZIP_EFFORT`: the version-2 encoder's effort.
    pub effort: crate::codec::Effort,
    /// The link speed the user gave (`NCCL_ZIP_LINK_MBPS`) for the adaptive
    /// policy's static model; the port's nominal speed is not used (see
    /// [`crate::adapt`]).
    pub link_mbps: Option<u64>,
    pub handshake_timeout: Duration,
    /// Caps the shared progress workers (`NCCL_ZIP_IO_THREADS`).
    pub io_threads: Option<usize>,
    /// The highest codec frame format this side writes (`NCCL_ZIP_FORMAT`).
    pub format: u8,
    /// The highest codec frame format this side's receive comms decode (its
    /// listen handle: `codec_glue::highest_decodable`).
    pub decodes: u8,
}

impl IbConfig {
    /// `_nominal_mbps`: the port's speed, which the policy does not take (see above).
    pub fn from_config(c: &Config, _nominal_mbps: u64) -> IbConfig {
        IbConfig {
            nqps: c.ib_qps,
            params: Params {
                max_chunk: c.max_chunk,
                min_chunk: c.min_chunk,
                stage_slots: c.ib_stage_slots,
                stage_bytes: c.ib_stage_bytes,
                gpu_lanes: c.gpu_lanes,
                // IB holds its buffers until the comm closes, as a TCP sender
                // does: it leaves the TCP receivers' reserve alone.
                buffer_cap: crate::budget::sender_cap(crate::budget::cap(c.buffer_mb)),
                ..Params::default()
            },
            compress: c.compress,
            dtype: c.dtype,
            checksum: c.checksum,
            effort: c.effort,
            link_mbps: c.link_mbps,
            handshake_timeout: c.handshake_timeout,
            io_threads: c.io_threads,
            format: c.format,
            decodes: crate::codec_glue::highest_decodable(c),
        }
    }

    /// The compressors of a send comm that writes codec format `format` at most.
    fn coders(&self, format: u8) -> Coders {
        let coder = || Coder {
            // One progress thread compresses for the whole comm.
            policy: Policy::new(self.compress, self.link_mbps, 1),
            opts: EncodeOptions {
                dtype: self.dtype,
                checksum: self.checksum,
                format,
                effort: self.effort,
                ..EncodeOptions::default()
            },
        };
        // Host and device chunks run at different codec speeds: one policy each.
        Coders {
            host: coder(),
            dev: coder(),
        }
    }
}

// ---------------------------------------------------------------------------
// Handle and bootstrap records

const HANDLE_MAGIC: u32 = u32::from_le_bytes(*b"NZIB");
/// Version of the IB handle, bootstrap records and data protocol.
pub const IB_VERSION: u16 = 1;
const _: () = assert!(
    wire::STAGE_OFFSET >= 40 && wire::STAGE_OFFSET + 16 <= HANDLE_SIZE,
    "the connect stage area must not overlap the address and secret"
);

/// What an IB listener publishes: the bootstrap address, the secret, and the
/// highest codec frame format it decodes (as `proto::wire::Handle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbHandle {
    pub addr: SocketAddr,
    pub secret: u64,
    pub decodes: u8,
}

const IB_HANDLE: wire::HandleKind = wire::HandleKind {
    magic: HANDLE_MAGIC,
    version: IB_VERSION,
    name: "IB",
};

impl IbHandle {
    /// The shared handle layout (`proto::wire::Handle`) with IB's magic and
    /// version; bytes 64..80 are the connect stage.
    pub fn encode(&self, out: &mut [u8; HANDLE_SIZE]) {
        wire::Handle {
            addr: self.addr,
            secret: self.secret,
            decodes: self.decodes,
        }
        .encode_as(&IB_HANDLE, out)
    }

    pub fn decode(b: &[u8; HANDLE_SIZE]) -> Result<IbHandle> {
        let h = wire::Handle::decode_as(b, &IB_HANDLE)?;
        Ok(IbHandle {
            addr: h.addr,
            secret: h.secret,
            decodes: h.decodes,
        })
    }
}

/// One side's bootstrap record: its QPs and the memory the peer writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Boot {
    pub secret: u64,
    pub endpoint: Endpoint,
    pub qps: Vec<QpInfo>,
    /// The connector's: the codec frame format it writes at most (agreed from
    /// the handle); the listener's reply echoes it. 0 in an older peer's
    /// record: `codec_glue::BASE_FORMAT`.
    pub format: u8,
}

const BOOT_MAGIC: u32 = u32::from_le_bytes(*b"NZIQ");
pub const BOOT_HEADER: usize = 32;
pub const BOOT_QP: usize = 32;
/// The longest record a peer may send (a later version may append fields).
pub const BOOT_MAX: usize = 1024;

impl Boot {
    /// Header: magic @0, version @4, nqps @6, secret @8, endpoint addr @16,
    /// rkey @24, codec format @28 (u16), record length @30 (u16; 0 in records
    /// before it: 32 + 32 × nqps); then per QP: qpn @0, lid @4, mtu @8,
    /// gid @16..32; then what a later version appends (skipped). Bytes 0..16
    /// keep their meaning in every version.
    pub fn encode(&self) -> Vec<u8> {
        let len = BOOT_HEADER + BOOT_QP * self.qps.len();
        let mut b = vec![0u8; len];
        b[0..4].copy_from_slice(&BOOT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&IB_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.qps.len() as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.secret.to_le_bytes());
        b[16..24].copy_from_slice(&self.endpoint.addr.to_le_bytes());
        b[24..28].copy_from_slice(&self.endpoint.rkey.to_le_bytes());
        b[28..30].copy_from_slice(&(self.format as u16).to_le_bytes());
        b[30..32].copy_from_slice(&(len as u16).to_le_bytes());
        for (i, q) in self.qps.iter().enumerate() {
            let o = BOOT_HEADER + i * BOOT_QP;
            b[o..o + 4].copy_from_slice(&q.qpn.to_le_bytes());
            b[o + 4..o + 6].copy_from_slice(&q.lid.to_le_bytes());
            b[o + 8..o + 12].copy_from_slice(&q.mtu.to_le_bytes());
            b[o + 16..o + 32].copy_from_slice(&q.gid);
        }
        b
    }

    /// Checks a header for its magic and QP count; returns the record's
    /// whole length.
    pub fn length(h: &[u8]) -> Result<usize> {
        if h.len() < BOOT_HEADER || u32::from_le_bytes(h[0..4].try_into().unwrap()) != BOOT_MAGIC {
            return Err(Error::Remote(
                "not an nccl-net-zip IB bootstrap record".into(),
            ));
        }
        let n = u16::from_le_bytes(h[6..8].try_into().unwrap()) as usize;
        if n == 0 || n > MAX_QPS {
            return Err(Error::Remote(format!("IB bootstrap with {n} QPs")));
        }
        let least = BOOT_HEADER + n * BOOT_QP;
        match u16::from_le_bytes(h[30..32].try_into().unwrap()) as usize {
            0 => Ok(least),
            len if (least..=BOOT_MAX).contains(&len) => Ok(len),
            len => Err(Error::Remote(format!(
                "IB bootstrap record of {len} bytes with {n} QPs"
            ))),
        }
    }

    /// A whole record ([`Boot::length`] bytes), whose sender must know
    /// `secret`. A peer that knows it but speaks another version is an
    /// `InvalidUsage` naming both versions.
    pub fn decode(b: &[u8], secret: u64) -> Result<Boot> {
        let len = Self::length(b)?;
        if b.len() != len {
            return Err(Error::Remote(
                "IB bootstrap record of the wrong length".into(),
            ));
        }
        if u64::from_le_bytes(b[8..16].try_into().unwrap()) != secret {
            return Err(Error::Remote("IB bootstrap with the wrong secret".into()));
        }
        let v = u16::from_le_bytes(b[4..6].try_into().unwrap());
        if v != IB_VERSION {
            return Err(Error::InvalidUsage(format!(
                "the peer speaks nccl-net-zip IB protocol v{v}, we speak v{IB_VERSION}: install the same plugin on every node"
            )));
        }
        let n = u16::from_le_bytes(b[6..8].try_into().unwrap()) as usize;
        let qps = (0..n)
            .map(|i| {
                let o = BOOT_HEADER + i * BOOT_QP;
                QpInfo {
                    qpn: u32::from_le_bytes(b[o..o + 4].try_into().unwrap()),
                    lid: u16::from_le_bytes(b[o + 4..o + 6].try_into().unwrap()),
                    mtu: u32::from_le_bytes(b[o + 8..o + 12].try_into().unwrap()),
                    gid: b[o + 16..o + 32].try_into().unwrap(),
                }
            })
            .collect();
        Ok(Boot {
            secret,
            endpoint: Endpoint {
                addr: u64::from_le_bytes(b[16..24].try_into().unwrap()),
                rkey: u32::from_le_bytes(b[24..28].try_into().unwrap()),
            },
            qps,
            format: match u16::from_le_bytes(b[28..30].try_into().unwrap()) {
                0 => crate::codec_glue::BASE_FORMAT,
                f => u8::try_from(f).unwrap_or(u8::MAX),
            },
        })
    }
}

/// How an IB bootstrap record says its length, for `proto::bootstrap`.
pub struct BootFraming;

impl Framing for BootFraming {
    fn prefix_len(&self) -> usize {
        BOOT_HEADER
    }

    fn total_len(&self, prefix: &[u8]) -> Result<usize> {
        Boot::length(prefix)
    }
}

// ---------------------------------------------------------------------------
// Listen / accept

/// A half-open bootstrap connection, once its record came: our side, built,
/// while the reply is written.
type Built<L> = (L, Receiver);

pub struct IbListenComm<O: Opener> {
    listener: Socket,
    handle: IbHandle,
    /// Half-open bootstrap connections (the shared bootstrap).
    gate: Gate<Conn<Built<O::L>>>,
    /// Bootstraps done, and mismatched peers' errors, not handed out yet.
    done: VecDeque<Conn<Built<O::L>>>,
    errors: VecDeque<Error>,
    opener: Arc<O>,
    cfg: Arc<IbConfig>,
}

impl<O: Opener> IbListenComm<O> {
    /// Binds an ephemeral bootstrap port on `addr`.
    pub fn bind(addr: SocketAddr, opener: Arc<O>, cfg: Arc<IbConfig>) -> Result<Self> {
        let (s, local) = bind_listener(addr)?;
        let secret = random_secret();
        Ok(IbListenComm {
            listener: s,
            handle: IbHandle {
                addr: local,
                secret,
                decodes: cfg.decodes,
            },
            gate: Gate::new(cfg.handshake_timeout, MAX_HALF_OPEN),
            done: VecDeque::new(),
            errors: VecDeque::new(),
            opener,
            cfg,
        })
    }

    pub fn handle(&self) -> &IbHandle {
        &self.handle
    }

    /// One non-blocking step; a recv comm once a connector's bootstrap is done.
    /// A stranger's or broken connection is dropped with a WARN and does not
    /// disturb the listener; a peer that knows the secret but is mismatched
    /// (another version, a codec format not offered) fails `accept`.
    pub fn accept(&mut self) -> Result<Option<IbRecvComm>> {
        let what = format!("IB bootstrap listener {}", self.handle.addr);
        // A second pass writes the replies of records that came in the first.
        for _ in 0..2 {
            let mut replying = false;
            for o in accept_and_poll(&self.listener, &mut self.gate, &BootFraming, &what) {
                match o {
                    Outcome::Hello {
                        mut conn,
                        record,
                        since,
                    } => match self.build(&record) {
                        Ok((built, reply)) => {
                            conn.built = Some(built);
                            self.gate.reply(conn, reply, since);
                            replying = true;
                        }
                        Err(e @ Error::InvalidUsage(_)) => self.errors.push_back(
                            Error::InvalidUsage(format!("IB connection from {}: {e}", conn.peer)),
                        ),
                        Err(e) => warn!("{what}: rejected connection from {}: {e}", conn.peer),
                    },
                    Outcome::Replied(conn) => self.done.push_back(conn),
                    Outcome::Dropped(..) => {}
                }
            }
            if !replying {
                break;
            }
        }
        if let Some(e) = self.errors.pop_front() {
            return Err(e);
        }
        let Some(conn) = self.done.pop_front() else {
            return Ok(None);
        };
        let (fab, recv) = conn.built.expect("built before the reply");
        info!("IB recv comm from {}: {} QPs", conn.peer, fab.nqps());
        IbRecvComm::start(conn.sock, conn.peer, fab, recv, self.cfg.io_threads).map(Some)
    }

    /// Our side of a connection whose record is `record`: QPs connected,
    /// receives posted; and our reply.
    fn build(&self, record: &[u8]) -> Result<(Built<O::L>, Vec<u8>)> {
        let secret = self.handle.secret;
        let boot = Boot::decode(record, secret)?;
        if boot.format > self.handle.decodes {
            return Err(Error::InvalidUsage(format!(
                "the connector states codec format v{}, this listener offered v{} at most",
                boot.format, self.handle.decodes
            )));
        }
        let prm = &self.cfg.params;
        let mut fab = self
            .opener
            .open(boot.qps.len(), prm.sq_depth, prm.rq_depth())?;
        let mut recv = Receiver::new(&mut fab, prm.clone())?;
        fab.connect(&boot.qps)?;
        recv.connect(boot.endpoint);
        recv.agree_format(boot.format);
        let reply = Boot {
            secret,
            endpoint: recv.endpoint(),
            qps: fab.local_info()?,
            format: boot.format,
        };
        Ok(((fab, recv), reply.encode()))
    }
}

// ---------------------------------------------------------------------------
// Connect

/// A connect in progress (NCCL keeps its address in the handle's stage area).
/// Its stages (connect, our record, the listener's reply) are the shared
/// bootstrap's (`proto::bootstrap::Dialer`).
pub struct IbConnect<L: Link> {
    sock: Socket,
    /// Set once connected (our record needs the QPs' info).
    dialer: Option<Dialer>,
    peer: SocketAddr,
    secret: u64,
    fab: L,
    sender: Sender,
    io_threads: Option<usize>,
    /// The codec frame format our sender writes at most (our record says so).
    format: u8,
}

impl<L: Link> IbConnect<L> {
    /// Creates our side (QPs in INIT, FIFO registered) and starts the TCP connect.
    pub fn start<O: Opener<L = L>>(h: &IbHandle, opener: &O, cfg: &IbConfig) -> Result<Self> {
        let p = &cfg.params;
        let nqps = cfg.nqps.clamp(1, MAX_QPS);
        let mut fab = opener.open(nqps, p.sq_depth, p.rq_depth())?;
        let format = crate::codec_glue::agree_format(cfg.format, h.decodes);
        let sender = Sender::new(&mut fab, p.clone(), cfg.coders(format))?;
        let sock = start_connect(h.addr)?;
        Ok(IbConnect {
            sock,
            dialer: None,
            peer: h.addr,
            secret: h.secret,
            fab,
            sender,
            io_threads: cfg.io_threads,
            format,
        })
    }

    /// One non-blocking step; true once both sides are connected (then
    /// [`IbConnect::finish`]). No deadline of its own: the reply comes when the
    /// peer's `accept` runs, which NCCL may call long after (runtime connect),
    /// and NCCL calls `connect` again until then or until the job aborts.
    pub fn progress(&mut self) -> Result<bool> {
        let peer = self.peer;
        let d = match &mut self.dialer {
            Some(d) => d,
            None => {
                let boot = Boot {
                    secret: self.secret,
                    endpoint: self.sender.endpoint(),
                    qps: self.fab.local_info()?,
                    format: self.format,
                };
                self.dialer
                    .insert(Dialer::new(boot.encode(), Some(Box::new(BootFraming))))
            }
        };
        if !dial(&self.sock, d, peer)? {
            return Ok(false);
        }
        let b = Boot::decode(d.reply(), self.secret)?;
        if b.qps.len() != self.fab.nqps() {
            return Err(Error::Remote(format!(
                "{peer} answered with {} QPs, we have {}",
                b.qps.len(),
                self.fab.nqps()
            )));
        }
        self.fab.connect(&b.qps)?;
        self.sender.connect(b.endpoint);
        Ok(true)
    }

    /// Turns a finished connect into a send comm.
    pub fn finish(self) -> Result<IbSendComm> {
        info!("IB send comm to {}: {} QPs", self.peer, self.fab.nqps());
        IbSendComm::start(self.sock, self.peer, self.fab, self.sender, self.io_threads)
    }
}

// ---------------------------------------------------------------------------
// Memory registration

/// A registration NCCL holds as an mhandle (`regMr`); comms share one
/// registration per (address, length) while any handle to it is alive.
#[derive(Clone)]
pub struct IbMr {
    reg: Arc<Registration>,
}

impl IbMr {
    pub fn mr(&self) -> Mr {
        self.reg.mr
    }

    /// `Ok` when `len` bytes at `addr` lie inside this registration.
    fn covers(&self, addr: u64, len: usize) -> Result<()> {
        let m = self.reg.mr;
        let ok = addr >= m.addr
            && addr
                .checked_add(len as u64)
                .is_some_and(|e| e <= m.addr + m.len);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "buffer {addr:#x}+{len} is outside its memory handle {:#x}+{}",
                m.addr, m.len
            )))
        }
    }
}

/// `regMr` with an (address, length) cache: registering the same buffer again
/// (NCCL does, per comm and per connection) returns the live registration.
pub struct MrCache {
    registrar: Arc<dyn Registrar>,
    map: Mutex<HashMap<(u64, usize), Weak<Registration>>>,
}

impl MrCache {
    pub fn new(registrar: Arc<dyn Registrar>) -> MrCache {
        MrCache {
            registrar,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn cached(
        &self,
        key: (u64, usize),
        make: impl FnOnce() -> Result<Registration>,
    ) -> Result<IbMr> {
        let mut m = self.map.lock();
        if let Some(reg) = m.get(&key).and_then(Weak::upgrade) {
            return Ok(IbMr { reg });
        }
        if m.len() >= 64 {
            m.retain(|_, w| w.strong_count() > 0);
        }
        let reg = Arc::new(make()?);
        m.insert(key, Arc::downgrade(&reg));
        Ok(IbMr { reg })
    }

    /// Host memory (and, with nvidia-peermem, CUDA memory).
    ///
    /// # Safety
    /// `len` bytes at `addr` must stay mapped while the returned handle (or a
    /// clone) lives.
    pub unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<IbMr> {
        self.cached((addr as u64, len), || self.registrar.reg(addr, len))
    }

    /// # Safety
    /// As [`Registrar::reg_dmabuf`].
    pub unsafe fn register_dmabuf(
        &self,
        addr: u64,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> Result<IbMr> {
        // The fd is part of the key: the same address may come from another buffer.
        self.cached((addr ^ ((fd as u64) << 48) ^ offset, len), || {
            self.registrar.reg_dmabuf(addr, len, offset, fd)
        })
    }

    pub fn supports_dmabuf(&self) -> bool {
        self.registrar.supports_dmabuf()
    }

    /// Registrations alive now (tests).
    pub fn live(&self) -> usize {
        self.map
            .lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

// ---------------------------------------------------------------------------
// The comms and their progress thread

/// Work isend/irecv hand to the progress thread.
struct Cmd {
    seq: u64,
    addr: u64,
    len: usize,
    key: u32,
    /// The buffer is device memory of this backend.
    dev: Option<Arc<dyn Backend>>,
}

/// One side's protocol engine, owned by the progress thread.
trait Engine: Send + 'static {
    fn post(&mut self, c: Cmd) -> Result<()>;
    fn progress(&mut self, ev: &mut Vec<Event>) -> Result<()>;
    fn pending(&self) -> usize;
    fn stats(&self) -> &Stats;
    /// Deregisters the side's memory; the fabric is dropped after.
    fn close(self) -> Result<()>;
}

use crate::stats::Stats;

struct SendEngine<L: Link> {
    fab: L,
    s: Sender,
}

impl<L: Link> Engine for SendEngine<L> {
    fn post(&mut self, c: Cmd) -> Result<()> {
        self.s.isend(c.seq, c.addr, c.len, c.key, c.dev)
    }
    fn progress(&mut self, ev: &mut Vec<Event>) -> Result<()> {
        self.s.progress(&mut self.fab, ev)
    }
    fn pending(&self) -> usize {
        self.s.pending()
    }
    fn stats(&self) -> &Stats {
        &self.s.stats
    }
    fn close(mut self) -> Result<()> {
        self.s.close(&mut self.fab)
    }
}

struct RecvEngine<L: Link> {
    fab: L,
    r: Receiver,
}

impl<L: Link> Engine for RecvEngine<L> {
    fn post(&mut self, c: Cmd) -> Result<()> {
        self.r.irecv(c.seq, c.addr, c.len, c.key, c.dev)
    }
    fn progress(&mut self, ev: &mut Vec<Event>) -> Result<()> {
        self.r.progress(&mut self.fab, ev)
    }
    fn pending(&self) -> usize {
        self.r.pending()
    }
    fn stats(&self) -> &Stats {
        &self.r.stats
    }
    fn close(mut self) -> Result<()> {
        self.r.close(&mut self.fab)
    }
}

/// What NCCL's threads and the progress thread share.
struct Shared {
    ring: Ring,
    broken: AtomicBool,
    error: Mutex<Option<Error>>,
    peer: SocketAddr,
    what: &'static str,
    /// A copy of the engine's counters, refreshed by the progress thread.
    stats: Stats,
}

impl crate::stats_export::CommStats for Shared {
    fn comm_stats(&self) -> &Stats {
        &self.stats
    }
    fn peer(&self) -> SocketAddr {
        self.peer
    }
    fn kind(&self) -> &'static str {
        if self.what.starts_with("send") {
            "send"
        } else {
            "recv"
        }
    }
    fn transport(&self) -> &'static str {
        "ib"
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        crate::stats_export::retire(self);
    }
}

impl Shared {
    /// Fails the comm (first error wins) and every pending request. Returns
    /// true for the first failure.
    fn fail(&self, e: Error) -> bool {
        let mut g = self.error.lock();
        let first = g.is_none();
        if first {
            if self.ring.idle() && matches!(e, Error::Remote(_)) {
                info!("{}: {e}", self.ring.report().label());
            } else if self.ring.report().first() {
                warn!("{} failed: {e}", self.ring.report().label());
            }
            *g = Some(e);
        }
        self.broken.store(true, Release);
        self.ring.fail_all(g.as_ref().expect("set above"));
        first
    }

    fn check(&self) -> Result<()> {
        if self.broken.load(Acquire) {
            Err(self
                .error
                .lock()
                .as_ref()
                .map(Error::duplicate)
                .unwrap_or_else(|| Error::Internal("comm broken".into())))
        } else {
            Ok(())
        }
    }
}

fn sync_stats(src: &Stats, dst: &Stats) {
    for (s, d) in [
        (&src.messages, &dst.messages),
        (&src.raw_bytes, &dst.raw_bytes),
        (&src.wire_bytes, &dst.wire_bytes),
        (&src.chunks_compressed, &dst.chunks_compressed),
        (&src.chunks_raw, &dst.chunks_raw),
        (&src.bypassed, &dst.bypassed),
        (&src.chunks_device, &dst.chunks_device),
        (&src.codec_ns, &dst.codec_ns),
        (&src.budget_refusals, &dst.budget_refusals),
    ] {
        d.store(s.load(Relaxed), Relaxed);
    }
}

/// How often busy progress looks at the control socket (idle progress looks
/// each time its worker wakes, at least every [`progress::IDLE_WAIT`]).
const CONTROL_EVERY: Duration = Duration::from_millis(1);

/// Error kinds on the control channel.
const CTL_INVALID_USAGE: u8 = 1;
const CTL_REMOTE: u8 = 2;

/// The bootstrap socket after setup: carries at most one error record each
/// way (`kind u8, 0, 0, 0, len u32, message`), and its EOF is the peer closing.
struct Control {
    sock: Socket,
    inbox: Vec<u8>,
    eof: bool,
}

enum PeerNews {
    Closed,
    Failed(Error),
}

impl Control {
    /// Best effort: the record is small and the socket otherwise idle.
    fn send_error(&self, e: &Error) {
        let kind = match e {
            Error::InvalidUsage(_) => CTL_INVALID_USAGE,
            _ => CTL_REMOTE,
        };
        let msg = e.to_string();
        let msg = &msg.as_bytes()[..msg.len().min(4000)];
        let mut b = vec![kind, 0, 0, 0];
        b.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        b.extend_from_slice(msg);
        let _ = self.sock.send_with_flags(&b, libc::MSG_NOSIGNAL);
    }

    fn poll(&mut self) -> Option<PeerNews> {
        if self.eof {
            return None;
        }
        let mut b = [0u8; 4096];
        loop {
            match read_nb(&self.sock, &mut b, "IB control connection") {
                Io::Closed => break,
                Io::Moved(n) => self.inbox.extend_from_slice(&b[..n]),
                Io::Blocked => return self.parse(),
                Io::Failed(e) => {
                    self.eof = true;
                    return Some(PeerNews::Failed(e));
                }
            }
        }
        self.eof = true;
        Some(self.parse().unwrap_or(PeerNews::Closed))
    }

    fn parse(&mut self) -> Option<PeerNews> {
        if self.inbox.len() < 8 {
            return None;
        }
        let len = u32::from_le_bytes(self.inbox[4..8].try_into().unwrap()) as usize;
        if self.inbox.len() < 8 + len {
            return None;
        }
        let msg = String::from_utf8_lossy(&self.inbox[8..8 + len]).into_owned();
        self.eof = true; // one record per connection; nothing else follows
        Some(PeerNews::Failed(match self.inbox[0] {
            CTL_INVALID_USAGE => Error::InvalidUsage(format!("peer: {msg}")),
            _ => Error::Remote(format!("peer failed: {msg}")),
        }))
    }
}

fn complete(sh: &Shared, ev: &[Event]) -> Result<()> {
    for e in ev {
        match *e {
            Event::SendDone { seq } => {
                sh.ring.slot(seq).chunk_sent();
            }
            Event::RecvDone { seq, size } => {
                let slot = sh.ring.slot(seq);
                slot.learn_size(size)?;
                slot.bytes_placed(size);
            }
        }
    }
    Ok(())
}

/// A comm's progress, driven by a shared worker ([`progress`]): commands in,
/// protocol progress, completions out.
struct Driver<E: Engine> {
    /// Until the comm closes (`finish` consumes it).
    eng: Option<E>,
    sh: Arc<Shared>,
    rx: ChanRx<Cmd>,
    ctl: Control,
    ev: Vec<Event>,
    last_ctl: Instant,
}

fn eng_of<E>(e: &mut Option<E>) -> &mut E {
    e.as_mut().expect("the engine lives until the comm closes")
}

impl<E: Engine> Driver<E> {
    fn fail(&self, e: Error) {
        let copy = e.duplicate();
        if self.sh.fail(e) {
            self.ctl.send_error(&copy);
        }
    }

    fn take(&mut self, c: Cmd) {
        match self.sh.check() {
            Err(e) => {
                self.sh.ring.slot(c.seq).fail(&e);
            }
            Ok(()) => {
                if let Err(e) = self.eng.as_mut().expect("engine").post(c) {
                    self.fail(e);
                }
            }
        }
    }

    /// The comm closed: final figures, and the engine releases its resources.
    fn finish(&mut self) {
        if let Some(eng) = self.eng.take() {
            sync_stats(eng.stats(), &self.sh.stats);
            if let Err(e) = eng.close() {
                warn!("closing IB comm ({} {}): {e}", self.sh.what, self.sh.peer);
            }
        }
    }
}

impl<E: Engine + Send> progress::Progress for Driver<E> {
    fn step(&mut self) -> progress::Step {
        if self.eng.is_none() {
            return progress::Step::Done;
        }
        let sh = self.sh.clone();
        let mut got = false;
        loop {
            match self.rx.try_recv() {
                Ok(c) => {
                    got = true;
                    self.take(c);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.finish();
                    return progress::Step::Done;
                }
            }
        }
        self.ev.clear();
        if !sh.broken.load(Acquire) {
            let r = eng_of(&mut self.eng)
                .progress(&mut self.ev)
                .and_then(|()| complete(&sh, &self.ev));
            if !self.ev.is_empty() {
                sync_stats(eng_of(&mut self.eng).stats(), &sh.stats);
            }
            if let Err(e) = r {
                self.fail(e);
            }
        }
        let busy = eng_of(&mut self.eng).pending() > 0 && !sh.broken.load(Acquire);
        if !busy || self.last_ctl.elapsed() >= CONTROL_EVERY {
            self.last_ctl = Instant::now();
            match self.ctl.poll() {
                None => {}
                Some(PeerNews::Failed(e)) => {
                    sh.fail(e);
                }
                Some(PeerNews::Closed) => {
                    // What landed before the peer closed is in our CQ: take it.
                    self.ev.clear();
                    if !sh.broken.load(Acquire) {
                        let r = eng_of(&mut self.eng)
                            .progress(&mut self.ev)
                            .and_then(|()| complete(&sh, &self.ev));
                        sync_stats(eng_of(&mut self.eng).stats(), &sh.stats);
                        if let Err(e) = r {
                            sh.fail(e);
                        }
                    }
                    let n = eng_of(&mut self.eng).pending();
                    sh.fail(Error::Remote(if n > 0 {
                        format!(
                            "{} closed the connection with {n} requests in flight",
                            sh.peer
                        )
                    } else {
                        format!("{} closed the connection", sh.peer)
                    }));
                }
            }
        }
        if got || !self.ev.is_empty() {
            progress::Step::Moved
        } else if busy {
            progress::Step::Waiting
        } else {
            progress::Step::Idle
        }
    }

    fn panicked(&mut self, what: String) {
        self.sh.fail(Error::Internal(what));
    }
}

/// What the send and receive comms have in common.
struct Comm {
    sh: Arc<Shared>,
    /// The lock keeps slot order and command order the same.
    tx: Mutex<Option<ChanTx<Cmd>>>,
    member: progress::Membership,
    mrs: MrCache,
}

impl Comm {
    fn start<E: Engine>(
        sock: Socket,
        peer: SocketAddr,
        what: &'static str,
        eng: E,
        registrar: Arc<dyn Registrar>,
        io_threads: Option<usize>,
    ) -> Result<Comm> {
        let sh = Arc::new(Shared {
            ring: Ring::default(),
            broken: AtomicBool::new(false),
            error: Mutex::new(None),
            peer,
            what,
            stats: Stats::default(),
        });
        sh.ring.report().set_label(format!(
            "IB {} comm #{} ({what} {peer})",
            if what.starts_with("send") {
                "send"
            } else {
                "recv"
            },
            crate::proto::slots::Report::next_comm_id()
        ));
        let weak = Arc::downgrade(&sh);
        crate::stats_export::register(weak);
        let (tx, rx) = crossbeam_channel::unbounded();
        let driver = Driver {
            eng: Some(eng),
            sh: sh.clone(),
            rx,
            ctl: Control {
                sock,
                inbox: Vec::new(),
                eof: false,
            },
            ev: Vec::new(),
            last_ctl: Instant::now(),
        };
        let member = progress::adopt(Box::new(driver), io_threads)?;
        Ok(Comm {
            sh,
            tx: Mutex::new(Some(tx)),
            member,
            mrs: MrCache::new(registrar),
        })
    }

    fn post(
        &self,
        send_size: Option<usize>,
        addr: u64,
        len: usize,
        key: u32,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<Option<&Slot>> {
        self.sh.check()?;
        let tx = self.tx.lock();
        let tx = tx
            .as_ref()
            .ok_or_else(|| Error::Internal("request on a closed comm".into()))?;
        let recv = send_size.is_none().then_some((addr as usize, len));
        let Some((seq, slot)) = self.sh.ring.post(send_size, 1, recv) else {
            return Ok(None);
        };
        tx.send(Cmd {
            seq,
            addr,
            len,
            key,
            dev,
        })
        .map_err(|_| Error::Internal("IB progress is gone".into()))?;
        self.member.kick();
        Ok(Some(slot))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Requests still in flight at close are abandoned (NCCL closes idle
        // comms); the worker deregisters our memory and drops the fabric
        // before this returns.
        self.tx.lock().take();
        self.member.wait_finished();
        info!(
            "closed IB comm ({} {}): {}",
            self.sh.what,
            self.sh.peer,
            self.sh.stats.summary()
        );
    }
}

/// The sending end of an IB connection.
pub struct IbSendComm {
    c: Comm,
}

impl IbSendComm {
    fn start<L: Link>(
        sock: Socket,
        peer: SocketAddr,
        fab: L,
        s: Sender,
        io_threads: Option<usize>,
    ) -> Result<Self> {
        let reg = fab.registrar();
        Ok(IbSendComm {
            c: Comm::start(
                sock,
                peer,
                "send to",
                SendEngine { fab, s },
                reg,
                io_threads,
            )?,
        })
    }

    /// Queues `size` bytes at `data`, covered by `mr` (NCCL's mhandle from
    /// `regMr`); device memory of `dev` when given (GPUDirect RDMA: `mr` covers
    /// the device buffer). `Ok(None)`: all request slots busy, retry later.
    pub fn isend(
        &self,
        data: *const u8,
        size: usize,
        mr: Option<&IbMr>,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<Option<&Slot>> {
        if size > MAX_MESSAGE {
            return Err(Error::InvalidArgument(format!(
                "isend of {size} bytes: the v8 API allows at most 1 GiB"
            )));
        }
        let key = key_for(data as u64, size, mr, "isend")?.map_or(0, |m| m.lkey);
        self.c.post(Some(size), data as u64, size, key, dev)
    }

    pub fn mrs(&self) -> &MrCache {
        &self.c.mrs
    }

    /// This comm's failure report (one WARN per comm).
    pub fn report(&self) -> &crate::proto::slots::Report {
        self.c.sh.ring.report()
    }

    pub fn stats(&self) -> &Stats {
        &self.c.sh.stats
    }
}

/// The receiving end of an IB connection.
pub struct IbRecvComm {
    c: Comm,
}

impl IbRecvComm {
    fn start<L: Link>(
        sock: Socket,
        peer: SocketAddr,
        fab: L,
        r: Receiver,
        io_threads: Option<usize>,
    ) -> Result<Self> {
        let reg = fab.registrar();
        Ok(IbRecvComm {
            c: Comm::start(
                sock,
                peer,
                "recv from",
                RecvEngine { fab, r },
                reg,
                io_threads,
            )?,
        })
    }

    /// Posts `cap` bytes at `buf`, covered by `mr`, for the next message; device
    /// memory of `dev` when given.
    pub fn irecv(
        &self,
        buf: *mut u8,
        cap: usize,
        mr: Option<&IbMr>,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<Option<&Slot>> {
        let key = key_for(buf as u64, cap, mr, "irecv")?.map_or(0, |m| m.rkey);
        self.c.post(None, buf as u64, cap, key, dev)
    }

    /// `iflush` of a completed receive: for a buffer in device memory (`dev`),
    /// makes the HCA's writes into it visible to later GPU work
    /// (`cuFlushGPUDirectRDMAWrites`; synchronous, so NCCL gets no request to
    /// test). Host memory needs nothing. Empty receives need nothing either.
    pub fn flush(&self, dev: Option<&Arc<dyn Backend>>, size: usize) -> Result<()> {
        match dev {
            Some(b) if size > 0 => b.flush_rdma_writes(),
            _ => Ok(()),
        }
    }

    pub fn mrs(&self) -> &MrCache {
        &self.c.mrs
    }

    /// This comm's failure report (one WARN per comm).
    pub fn report(&self) -> &crate::proto::slots::Report {
        self.c.sh.ring.report()
    }

    pub fn stats(&self) -> &Stats {
        &self.c.sh.stats
    }
}

/// The registration covering a request's buffer (none needed for 0 bytes).
fn key_for(addr: u64, len: usize, mr: Option<&IbMr>, what: &str) -> Result<Option<Mr>> {
    match mr {
        Some(m) => {
            m.covers(addr, len)?;
            Ok(Some(m.mr()))
        }
        None if len == 0 => Ok(None),
        None => Err(Error::InvalidArgument(format!(
            "{what} of {len} bytes without a memory handle (regMr)"
        ))),
    }
}
