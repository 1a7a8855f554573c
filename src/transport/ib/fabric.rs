//! The verbs operations the IB protocol needs, as a trait. Two implementations:
//! [`super::verbs::VerbsFabric`] (real RC queue pairs through a runtime-loaded
//! libibverbs) and [`super::mem_fabric::MemFabric`] (an in-memory model of RC
//! semantics used by the test suite).
//!
//! One `Fabric` is one side of one connection: `nqps()` reliable-connected queue
//! pairs to one peer, one completion queue for all of them, and the memory
//! registrations of this side. QP `i` here is connected to QP `i` of the peer.

use crate::error::Result;

/// A registered memory region. `lkey` lets local work requests read it; `rkey`
/// lets the peer RDMA-write into it (every region we register allows that).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    pub addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub rkey: u32,
}

/// Source of an RDMA write: `len` bytes at `addr`, covered by `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// Destination of an RDMA write in the peer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub addr: u64,
    pub rkey: u32,
}

/// What a completion reports (`ibv_wc.opcode`, reduced to what we post).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOp {
    /// One of our RDMA writes (with or without immediate) finished.
    Write,
    /// A peer's write-with-immediate consumed one of our posted receives.
    RecvImm,
}

/// `ibv_wc.status`, reduced to the cases the protocol tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The QP went to the error state; this request was never executed.
    Flushed,
    /// The peer did not answer (transport or RNR retries exhausted): peer lost.
    RetryExceeded,
    /// The peer refused the access (bad rkey or range).
    RemoteAccess,
    /// Our own lkey or range was wrong.
    LocalProtection,
    /// Any other `ibv_wc_status`, by number.
    Other(u32),
}

/// One entry of the completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub qp: usize,
    pub status: WcStatus,
    pub op: WcOp,
    /// Immediate data (host order), for `RecvImm`.
    pub imm: u32,
    /// Bytes the peer's write carried, for `RecvImm`.
    pub byte_len: u32,
}

/// What the protocol asks of the hardware. All calls are non-blocking.
pub trait Fabric {
    /// Number of RC queue pairs to the peer.
    fn nqps(&self) -> usize;

    /// Registers `len` bytes at `addr` for local reads and remote writes.
    ///
    /// # Safety
    /// The memory must stay allocated until [`Fabric::dereg_mr`] (or the fabric is
    /// dropped); the peer may write into it at any time until then.
    unsafe fn reg_mr(&mut self, addr: *mut u8, len: usize) -> Result<Mr>;

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()>;

    /// Posts a signaled RDMA write on `qp`; with `imm`, a write with immediate data,
    /// which consumes one receive posted at the peer and completes there as
    /// [`WcOp::RecvImm`]. Writes on one QP are executed and completed in order.
    ///
    /// # Safety
    /// `local` must stay valid and unchanged until this request's completion.
    unsafe fn post_write(
        &mut self,
        qp: usize,
        wr_id: u64,
        local: Local,
        remote: Remote,
        imm: Option<u32>,
    ) -> Result<()>;

    /// Posts one zero-length receive on `qp` (a landing spot for one
    /// write-with-immediate).
    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()>;

    /// Appends up to `max` completions to `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize>;
}

/// What one QP tells its peer at connection setup (for the in-memory fabric,
/// `qpn` carries its id and the rest is unused).
pub use super::verbs::QpInfo;

/// A [`Fabric`] that a comm can bring up: it is created with its QPs in INIT,
/// publishes [`QpInfo`]s, and connects (RTR, RTS) to the peer's.
pub trait Link: Fabric + Send + 'static {
    fn local_info(&self) -> Result<Vec<QpInfo>>;
    fn connect(&mut self, remote: &[QpInfo]) -> Result<()>;
    /// Registers NCCL's buffers (`regMr`) from any thread, outside the fabric's
    /// owner (the comm's progress thread).
    fn registrar(&self) -> std::sync::Arc<dyn Registrar>;
}

/// Creates one side's [`Link`] for a new connection.
pub trait Opener: Send + Sync + 'static {
    type L: Link;
    fn open(&self, nqps: usize, sq_depth: usize, rq_depth: usize) -> Result<Self::L>;
}

/// A registration of NCCL memory; dropping it deregisters.
pub struct Registration {
    pub mr: Mr,
    /// What keeps the registration alive (a verbs `MemReg`, or the in-memory
    /// model's key); dropped last.
    _hold: Box<dyn Send + Sync>,
}

impl Registration {
    pub fn new(mr: Mr, hold: Box<dyn Send + Sync>) -> Registration {
        Registration { mr, _hold: hold }
    }
}

/// Thread-safe memory registration for one protection domain.
pub trait Registrar: Send + Sync {
    /// # Safety
    /// `len` bytes at `addr` must stay mapped while the registration lives.
    unsafe fn reg(&self, addr: *mut u8, len: usize) -> Result<Registration>;

    /// Registers `len` bytes at `offset` of DMA-BUF `fd`, seen by NCCL at `addr`.
    ///
    /// # Safety
    /// `fd` must be a DMA-BUF covering `offset..offset+len`, alive while the
    /// registration lives.
    unsafe fn reg_dmabuf(
        &self,
        addr: u64,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> Result<Registration> {
        let _ = (addr, len, offset, fd);
        Err(crate::error::Error::InvalidArgument(
            "DMA-BUF registration is not supported by this device".into(),
        ))
    }

    fn supports_dmabuf(&self) -> bool {
        false
    }
}
