//! Owned verbs resources (`Drop` releases them and never panics; failures are
//! logged) and [`VerbsFabric`], the real [`Fabric`]: one CQ and `nqps` RC QPs on
//! one port, connected to a peer's QPs.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use tracing::{info, warn};

use super::loader::{lib, Lib};
use super::sys::*;
use crate::error::{Error, Result};
use crate::transport::ib::fabric::{Completion, Fabric, Local, Mr, Remote, WcOp, WcStatus};

fn unavailable(e: String) -> Error {
    Error::Internal(format!("InfiniBand unavailable: {e}"))
}

/// A verbs return code (0, or an errno, or -1 with errno set) as a Result.
fn check(rc: c_int, what: &str) -> Result<()> {
    match rc {
        0 => Ok(()),
        n if n > 0 => Err(Error::io(what.to_string(), io::Error::from_raw_os_error(n))),
        _ => Err(Error::io(what.to_string(), io::Error::last_os_error())),
    }
}

/// An open device with its protection domain.
pub struct Context {
    lib: &'static Lib,
    ctx: NonNull<ibv_context>,
    pd: NonNull<ibv_pd>,
    pub name: String,
    pub port: u8,
    /// Whether the kernel and provider take DMA-BUF registrations, probed once.
    dmabuf: OnceLock<bool>,
}

// SAFETY: verbs objects are thread-safe per rdma-core's documentation (each call
// locks what it touches); we only hand out the raw pointers to verbs calls.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// Opens device `name` (as listed by `ibv_get_device_list`) for use on `port`.
    pub fn open(name: &str, port: u8) -> Result<Arc<Context>> {
        let l = lib().map_err(unavailable)?;
        let mut n: c_int = 0;
        // SAFETY: plain verbs calls; the list is freed below, after we opened ours.
        unsafe {
            let list = (l.get_device_list)(&mut n);
            if list.is_null() {
                return Err(Error::io("ibv_get_device_list", io::Error::last_os_error()));
            }
            let mut found = None;
            for i in 0..n.max(0) as usize {
                let d = *list.add(i);
                if CStr::from_ptr((l.get_device_name)(d)).to_string_lossy() == name {
                    found = NonNull::new((l.open_device)(d));
                    break;
                }
            }
            (l.free_device_list)(list);
            let ctx =
                found.ok_or_else(|| Error::Internal(format!("cannot open IB device {name}")))?;
            let Some(pd) = NonNull::new((l.alloc_pd)(ctx.as_ptr())) else {
                (l.close_device)(ctx.as_ptr());
                return Err(Error::io(
                    format!("ibv_alloc_pd on {name}"),
                    io::Error::last_os_error(),
                ));
            };
            Ok(Arc::new(Context {
                lib: l,
                ctx,
                pd,
                name: name.to_string(),
                port,
                dmabuf: OnceLock::new(),
            }))
        }
    }

    pub fn query_port(&self) -> Result<ibv_port_attr> {
        let mut a = ibv_port_attr::default();
        // SAFETY: `a` is zeroed and large enough for the compat prefix.
        check(
            unsafe { (self.lib.query_port)(self.ctx.as_ptr(), self.port, &mut a) },
            "ibv_query_port",
        )?;
        Ok(a)
    }

    pub fn query_gid(&self, index: u8) -> Result<ibv_gid> {
        let mut g = ibv_gid::default();
        // SAFETY: plain query into a 16-byte out parameter.
        check(
            unsafe { (self.lib.query_gid)(self.ctx.as_ptr(), self.port, index as c_int, &mut g) },
            "ibv_query_gid",
        )?;
        Ok(g)
    }

    /// Registers host or CUDA memory (CUDA needs nvidia-peermem / GPUDirect RDMA).
    ///
    /// # Safety
    /// The memory must stay mapped until the registration is dropped.
    pub unsafe fn reg_mr(self: &Arc<Self>, addr: *mut c_void, len: usize) -> Result<MemReg> {
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let mr = (self.lib.reg_mr)(self.pd.as_ptr(), addr, len, access);
        let mr =
            NonNull::new(mr).ok_or_else(|| Error::io("ibv_reg_mr", io::Error::last_os_error()))?;
        Ok(MemReg {
            ctx: self.clone(),
            mr,
        })
    }

    /// Registers a DMA-BUF (NCCL's `regMrDmaBuf` with `NCCL_PTR_DMABUF`).
    ///
    /// # Safety
    /// `fd` must be a DMA-BUF that covers `offset..offset+len`, mapped at `iova`.
    pub unsafe fn reg_dmabuf_mr(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: c_int,
    ) -> Result<MemReg> {
        let f = self.lib.reg_dmabuf_mr.ok_or_else(|| {
            Error::Internal("this libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)".into())
        })?;
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        let mr = f(self.pd.as_ptr(), offset, len, iova, fd, access);
        let mr = NonNull::new(mr)
            .ok_or_else(|| Error::io("ibv_reg_dmabuf_mr", io::Error::last_os_error()))?;
        Ok(MemReg {
            ctx: self.clone(),
            mr,
        })
    }

    /// Whether this device can register a DMA-BUF. A libibverbs that has
    /// `ibv_reg_dmabuf_mr` is not enough: the kernel (5.12 and later) and the
    /// provider must take it too. As NCCL's own IB transport does, a dummy
    /// registration of fd -1 tells: it fails with `EOPNOTSUPP` or
    /// `EPROTONOSUPPORT` where DMA-BUF is unsupported, and with `EBADF` where it is.
    pub fn supports_dmabuf(&self) -> bool {
        *self.dmabuf.get_or_init(|| {
            let Some(f) = self.lib.reg_dmabuf_mr else {
                return false;
            };
            // SAFETY: fd -1 names no DMA-BUF, so the call registers nothing (an MR
            // it returns anyway is deregistered at once); errno is read right after.
            let errno = unsafe {
                *libc::__errno_location() = 0;
                let mr = f(self.pd.as_ptr(), 0, 0, 0, -1, 0);
                let errno = *libc::__errno_location();
                if !mr.is_null() {
                    (self.lib.dereg_mr)(mr);
                }
                errno
            };
            let ok = dmabuf_probe_errno_means_supported(errno);
            if !ok {
                info!(
                    "{}: no DMA-BUF registration ({})",
                    self.name,
                    io::Error::from_raw_os_error(errno)
                );
            }
            ok
        })
    }
}

/// What the errno of a dummy `ibv_reg_dmabuf_mr(fd = -1)` says about DMA-BUF support.
fn dmabuf_probe_errno_means_supported(errno: c_int) -> bool {
    errno != libc::EOPNOTSUPP && errno != libc::EPROTONOSUPPORT
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created in `open`; every MemReg/VerbsFabric holds an Arc to us, so
        // nothing allocated from this PD is alive any more.
        unsafe {
            if (self.lib.dealloc_pd)(self.pd.as_ptr()) != 0 {
                warn!("ibv_dealloc_pd on {} failed", self.name);
            }
            if (self.lib.close_device)(self.ctx.as_ptr()) != 0 {
                warn!("ibv_close_device on {} failed", self.name);
            }
        }
    }
}

/// One memory registration.
pub struct MemReg {
    ctx: Arc<Context>,
    mr: NonNull<ibv_mr>,
}

// SAFETY: see Context.
unsafe impl Send for MemReg {}
unsafe impl Sync for MemReg {}

impl MemReg {
    pub fn mr(&self) -> Mr {
        // SAFETY: a live ibv_mr; we read its plain fields.
        let m = unsafe { self.mr.as_ref() };
        Mr {
            addr: m.addr as u64,
            len: m.length as u64,
            lkey: m.lkey,
            rkey: m.rkey,
        }
    }
}

impl Drop for MemReg {
    fn drop(&mut self) {
        // SAFETY: registered in Context::reg_mr*; deregistered exactly once.
        if unsafe { (self.ctx.lib.dereg_mr)(self.mr.as_ptr()) } != 0 {
            warn!("ibv_dereg_mr failed: {}", io::Error::last_os_error());
        }
    }
}

/// What one QP tells its peer at connection setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// `ibv_mtu` enum value of the port.
    pub mtu: u32,
}

/// Connection tunables (NCCL's names and defaults).
#[derive(Clone, Copy, Debug)]
pub struct QpParams {
    /// `NCCL_IB_GID_INDEX`; `None` on InfiniBand (LID routing).
    pub gid_index: Option<u8>,
    pub sl: u8,
    pub traffic_class: u8,
    /// `NCCL_IB_TIMEOUT`, 4.096 us * 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
}

impl Default for QpParams {
    fn default() -> Self {
        QpParams {
            gid_index: None,
            sl: 0,
            traffic_class: 0,
            timeout: 20,
            retry_cnt: 7,
        }
    }
}

/// `nqps` RC QPs sharing one CQ: the real [`Fabric`].
pub struct VerbsFabric {
    ctx: Arc<Context>,
    cq: NonNull<ibv_cq>,
    qps: Vec<NonNull<ibv_qp>>,
    by_qpn: HashMap<u32, usize>,
    mrs: HashMap<u32, MemReg>,
    wc: Vec<ibv_wc>,
    qp_params: QpParams,
    port: ibv_port_attr,
}

// SAFETY: see Context; a VerbsFabric is used by one thread at a time.
unsafe impl Send for VerbsFabric {}

impl VerbsFabric {
    /// Creates the CQ and the QPs, and moves them to INIT.
    pub fn new(
        ctx: Arc<Context>,
        nqps: usize,
        sq_depth: usize,
        rq_depth: usize,
        qp_params: QpParams,
    ) -> Result<VerbsFabric> {
        let l = ctx.lib;
        let port = ctx.query_port()?;
        let cqe = (nqps * (sq_depth + rq_depth)) as c_int;
        // SAFETY: plain verbs calls on our live context/PD; results checked.
        let cq = NonNull::new(unsafe {
            (l.create_cq)(
                ctx.ctx.as_ptr(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })
        .ok_or_else(|| Error::io("ibv_create_cq", io::Error::last_os_error()))?;
        let mut f = VerbsFabric {
            ctx,
            cq,
            qps: Vec::new(),
            by_qpn: HashMap::new(),
            mrs: HashMap::new(),
            wc: vec![ibv_wc::default(); 64],
            qp_params,
            port,
        };
        for i in 0..nqps {
            let mut init = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq.as_ptr(),
                recv_cq: cq.as_ptr(),
                srq: std::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: sq_depth as u32,
                    max_recv_wr: rq_depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: as above.
            let qp = NonNull::new(unsafe { (l.create_qp)(f.ctx.pd.as_ptr(), &mut init) })
                .ok_or_else(|| Error::io("ibv_create_qp", io::Error::last_os_error()))?;
            f.qps.push(qp);
            // SAFETY: live QP.
            f.by_qpn.insert(unsafe { qp.as_ref().qp_num }, i);
            let mut a = ibv_qp_attr {
                qp_state: IBV_QPS_INIT,
                pkey_index: 0,
                port_num: f.ctx.port,
                qp_access_flags: (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) as u32,
                ..Default::default()
            };
            let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
            // SAFETY: live QP, initialised attribute struct.
            check(
                unsafe { (l.modify_qp)(qp.as_ptr(), &mut a, mask) },
                "ibv_modify_qp(INIT)",
            )?;
        }
        Ok(f)
    }

    /// What the peer needs to connect to our QPs.
    pub fn local_info(&self) -> Result<Vec<QpInfo>> {
        let gid = match self.qp_params.gid_index {
            Some(i) => self.ctx.query_gid(i)?.raw,
            None => [0; 16],
        };
        Ok(self
            .qps
            .iter()
            // SAFETY: live QPs.
            .map(|q| QpInfo {
                qpn: unsafe { q.as_ref().qp_num },
                lid: self.port.lid,
                gid,
                mtu: self.port.active_mtu,
            })
            .collect())
    }

    /// INIT → RTR → RTS against the peer's QPs (NCCL's attribute choices).
    pub fn connect(&mut self, remote: &[QpInfo]) -> Result<()> {
        if remote.len() != self.qps.len() {
            return Err(Error::Remote(format!(
                "peer has {} QPs, we have {}",
                remote.len(),
                self.qps.len()
            )));
        }
        let l = self.ctx.lib;
        for (qp, r) in self.qps.iter().zip(remote) {
            let mut ah = ibv_ah_attr {
                dlid: r.lid,
                sl: self.qp_params.sl,
                port_num: self.ctx.port,
                ..Default::default()
            };
            if let Some(gi) = self.qp_params.gid_index {
                ah.is_global = 1;
                ah.grh.dgid.raw = r.gid;
                ah.grh.sgid_index = gi;
                ah.grh.hop_limit = 255;
                ah.grh.traffic_class = self.qp_params.traffic_class;
            }
            let mut a = ibv_qp_attr {
                qp_state: IBV_QPS_RTR,
                path_mtu: self.port.active_mtu.min(r.mtu),
                dest_qp_num: r.qpn,
                rq_psn: 0,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ah_attr: ah,
                ..Default::default()
            };
            let mask = IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER;
            // SAFETY: live QP, initialised attributes.
            check(
                unsafe { (l.modify_qp)(qp.as_ptr(), &mut a, mask) },
                "ibv_modify_qp(RTR)",
            )?;
            let mut a = ibv_qp_attr {
                qp_state: IBV_QPS_RTS,
                timeout: self.qp_params.timeout,
                retry_cnt: self.qp_params.retry_cnt,
                rnr_retry: 7,
                sq_psn: 0,
                max_rd_atomic: 1,
                ..Default::default()
            };
            let mask = IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC;
            // SAFETY: as above.
            check(
                unsafe { (l.modify_qp)(qp.as_ptr(), &mut a, mask) },
                "ibv_modify_qp(RTS)",
            )?;
        }
        Ok(())
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Adds a registration made elsewhere (NCCL's regMr) so `dereg_mr` finds it.
    pub fn adopt(&mut self, m: MemReg) -> Mr {
        let mr = m.mr();
        self.mrs.insert(mr.lkey, m);
        mr
    }
}

fn status(s: u32) -> WcStatus {
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RetryExceeded,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
        IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
        n => WcStatus::Other(n),
    }
}

impl Fabric for VerbsFabric {
    fn nqps(&self) -> usize {
        self.qps.len()
    }

    unsafe fn reg_mr(&mut self, addr: *mut u8, len: usize) -> Result<Mr> {
        let m = self.ctx.reg_mr(addr as *mut c_void, len)?;
        Ok(self.adopt(m))
    }

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()> {
        self.mrs
            .remove(&mr.lkey)
            .map(drop)
            .ok_or_else(|| Error::Internal(format!("deregistering unknown lkey {}", mr.lkey)))
    }

    unsafe fn post_write(
        &mut self,
        qp: usize,
        wr_id: u64,
        local: Local,
        remote: Remote,
        imm: Option<u32>,
    ) -> Result<()> {
        let q = *self
            .qps
            .get(qp)
            .ok_or_else(|| Error::Internal(format!("no QP {qp}")))?;
        let mut sge = ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = (local.len > 0) as c_int;
        wr.opcode = if imm.is_some() {
            IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            IBV_WR_RDMA_WRITE
        };
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm_data = imm.unwrap_or(0).to_be();
        wr.remote_addr = remote.addr;
        wr.rkey = remote.rkey;
        let mut bad = std::ptr::null_mut();
        // The inline ibv_post_send: qp->context->ops.post_send(qp, wr, bad_wr).
        let ctx = q.as_ref().context;
        let post = (*ctx)
            .ops
            .post_send
            .ok_or_else(|| Error::Internal("provider has no post_send".into()))?;
        check(post(q.as_ptr(), &mut wr, &mut bad), "ibv_post_send")
    }

    fn post_recv(&mut self, qp: usize, wr_id: u64) -> Result<()> {
        let q = *self
            .qps
            .get(qp)
            .ok_or_else(|| Error::Internal(format!("no QP {qp}")))?;
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the inline ibv_post_recv dispatch through ops.post_recv.
        unsafe {
            let ctx = q.as_ref().context;
            let post = (*ctx)
                .ops
                .post_recv
                .ok_or_else(|| Error::Internal("provider has no post_recv".into()))?;
            check(post(q.as_ptr(), &mut wr, &mut bad), "ibv_post_recv")
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let n = max.min(self.wc.len()) as c_int;
        // SAFETY: live CQ; `wc` has room for n entries. The inline ibv_poll_cq
        // dispatch: cq->context->ops.poll_cq(cq, n, wc).
        let got = unsafe {
            let ctx = self.cq.as_ref().context;
            let poll = (*ctx)
                .ops
                .poll_cq
                .ok_or_else(|| Error::Internal("provider has no poll_cq".into()))?;
            poll(self.cq.as_ptr(), n, self.wc.as_mut_ptr())
        };
        if got < 0 {
            return Err(Error::Internal(format!("ibv_poll_cq failed ({got})")));
        }
        for w in &self.wc[..got as usize] {
            out.push(Completion {
                wr_id: w.wr_id,
                qp: self.by_qpn.get(&w.qp_num).copied().unwrap_or(0),
                status: status(w.status),
                op: if w.opcode == IBV_WC_RECV_RDMA_WITH_IMM || (w.opcode & 128) != 0 {
                    WcOp::RecvImm
                } else {
                    WcOp::Write
                },
                imm: u32::from_be(w.imm_data),
                byte_len: w.byte_len,
            });
        }
        Ok(got as usize)
    }
}

impl Drop for VerbsFabric {
    fn drop(&mut self) {
        self.mrs.clear();
        let l = self.ctx.lib;
        for q in self.qps.drain(..) {
            // SAFETY: created in `new`, destroyed once, before its CQ.
            if unsafe { (l.destroy_qp)(q.as_ptr()) } != 0 {
                warn!("ibv_destroy_qp failed: {}", io::Error::last_os_error());
            }
        }
        // SAFETY: no QP uses the CQ any more.
        if unsafe { (l.destroy_cq)(self.cq.as_ptr()) } != 0 {
            warn!("ibv_destroy_cq failed: {}", io::Error::last_os_error());
        }
    }
}

impl crate::transport::ib::fabric::Link for VerbsFabric {
    fn local_info(&self) -> Result<Vec<QpInfo>> {
        VerbsFabric::local_info(self)
    }

    fn connect(&mut self, remote: &[QpInfo]) -> Result<()> {
        VerbsFabric::connect(self, remote)
    }

    fn registrar(&self) -> Arc<dyn crate::transport::ib::fabric::Registrar> {
        Arc::new(VerbsRegistrar(self.ctx.clone()))
    }
}

/// Opens [`VerbsFabric`]s on one device port (one [`Context`], so one PD, shared
/// by every comm on that port).
pub struct VerbsOpener {
    pub ctx: Arc<Context>,
    pub qp_params: QpParams,
}

impl crate::transport::ib::fabric::Opener for VerbsOpener {
    type L = VerbsFabric;
    fn open(&self, nqps: usize, sq_depth: usize, rq_depth: usize) -> Result<VerbsFabric> {
        VerbsFabric::new(self.ctx.clone(), nqps, sq_depth, rq_depth, self.qp_params)
    }
}

/// `regMr` through the device's PD.
pub struct VerbsRegistrar(pub Arc<Context>);

impl crate::transport::ib::fabric::Registrar for VerbsRegistrar {
    unsafe fn reg(
        &self,
        addr: *mut u8,
        len: usize,
    ) -> Result<crate::transport::ib::fabric::Registration> {
        let m = self.0.reg_mr(addr as *mut c_void, len)?;
        Ok(crate::transport::ib::fabric::Registration::new(
            m.mr(),
            Box::new(m),
        ))
    }

    unsafe fn reg_dmabuf(
        &self,
        addr: u64,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> Result<crate::transport::ib::fabric::Registration> {
        let m = self.0.reg_dmabuf_mr(offset, len, addr, fd)?;
        Ok(crate::transport::ib::fabric::Registration::new(
            m.mr(),
            Box::new(m),
        ))
    }

    fn supports_dmabuf(&self) -> bool {
        self.0.supports_dmabuf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmabuf_probe_reads_errno_as_nccl_does() {
        // Unsupported by the kernel or the provider.
        assert!(!dmabuf_probe_errno_means_supported(libc::EOPNOTSUPP));
        assert!(!dmabuf_probe_errno_means_supported(libc::EPROTONOSUPPORT));
        // Supported: the bad fd itself is what failed.
        assert!(dmabuf_probe_errno_means_supported(libc::EBADF));
    }
}
