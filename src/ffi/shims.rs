//! The vtable entries. Each one: check pointers, cast, call [`crate::plugin`], map the result.

use std::ffi::{c_char, c_int, c_void};

use super::abi::*;
use super::boundary::{call, call_quiet, out, Fail, Kind, Obj};
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::plugin::{self, AnyListen, AnyRecv, AnySend, MAX_RECVS};
use crate::proto::slots::Slot;
use crate::proto::wire::HANDLE_SIZE;
use crate::transport::ib::comm::{IbMr, MrCache};
use std::sync::Arc;

impl Kind for AnyListen {
    const TAG: u64 = u64::from_le_bytes(*b"zipLISTN");
    const NAME: &'static str = "listen comm";
}
impl Kind for AnySend {
    const TAG: u64 = u64::from_le_bytes(*b"zipSENDC");
    const NAME: &'static str = "send comm";
}
impl Kind for AnyRecv {
    const TAG: u64 = u64::from_le_bytes(*b"zipRECVC");
    const NAME: &'static str = "recv comm";
}

/// What `regMr` returns. Host memory needs no registration with TCP; the handle
/// records the kind so the data path can tell host from device buffers. With IB
/// it holds the (cached) registration whose lkey/rkey isend/irecv use (for CUDA
/// memory too: GPUDirect RDMA).
pub struct MemHandle {
    #[allow(dead_code)]
    ptr_type: c_int,
    ib: Option<IbMr>,
    /// CUDA memory: the device its chunks are staged through (TCP), or whose
    /// lanes code its compressed chunks (IB).
    dev: Option<Arc<dyn Backend>>,
}

/// The registration cache of an IB comm (send or recv); `None` for TCP comms.
///
/// # Safety
/// `comm` must be NULL or a comm pointer this plugin handed out.
unsafe fn ib_mrs<'a>(comm: *mut c_void) -> Result<Option<&'a MrCache>> {
    if let Ok(c) = Obj::<AnySend>::get(comm) {
        return Ok(match c {
            AnySend::Ib(c) => Some(c.mrs()),
            AnySend::Tcp(_) => None,
        });
    }
    match Obj::<AnyRecv>::get(comm)? {
        AnyRecv::Ib(c) => Ok(Some(c.mrs())),
        AnyRecv::Tcp(_) => Ok(None),
    }
}

/// The IB registration behind an isend/irecv mhandle (NULL: none).
///
/// # Safety
/// `mh` must be NULL or an mhandle from `regMr`.
unsafe fn ib_mr<'a>(mh: *mut c_void) -> Result<Option<&'a IbMr>> {
    if mh.is_null() {
        return Ok(None);
    }
    Ok(Obj::<MemHandle>::get(mh)?.ib.as_ref())
}

/// Makes the GPU lanes a TCP comm will use on `b`, at registration time.
///
/// # Safety
/// `comm` must be a comm pointer this plugin handed out.
unsafe fn prewarm_tcp(comm: *mut c_void, b: &Arc<dyn Backend>) -> Result<()> {
    if let Ok(c) = Obj::<AnySend>::get(comm) {
        if let AnySend::Tcp(c) = c {
            c.prewarm_device(b)?;
        }
        return Ok(());
    }
    if let AnyRecv::Tcp(c) = Obj::<AnyRecv>::get(comm)? {
        c.prewarm_device(b)?;
    }
    Ok(())
}

/// `regMr` or `regMrDmaBuf` (`entry`) of CUDA memory on an IB comm: refused
/// unless the device path is on (ptrSupport offers `NCCL_PTR_CUDA`, and so
/// `NCCL_PTR_DMABUF`, only then); else the device owning `data`, with the lane
/// the comm's progress thread will code its chunks on made now, so that the
/// data path never allocates. The HCA registers the memory itself (GPUDirect
/// RDMA: nvidia-peermem or DMA-BUF; emulated device memory is host memory).
///
/// # Safety
/// `comm` must be an IB comm pointer this plugin handed out.
unsafe fn ib_cuda_device(
    entry: &str,
    comm: *mut c_void,
    data: *mut c_void,
) -> Result<Arc<dyn Backend>> {
    let p = plugin::get()?;
    if !p.ib_gpu_enabled() {
        return Err(Error::InvalidArgument(format!(
            "{entry} of CUDA memory on an IB comm, but ptrSupport does not offer NCCL_PTR_CUDA (NCCL_ZIP_GPU is off, or no CUDA device)"
        )));
    }
    let b = crate::gpu::backend_for(data as u64, p.cfg.gpu_emulate)?;
    // The comm's progress thread codes one chunk at a time: one lane.
    let dir = if Obj::<AnySend>::get(comm).is_ok() {
        Dir::Send
    } else {
        Dir::Recv
    };
    let max_wire = crate::codec_glue::max_wire(p.cfg.max_chunk);
    crate::gpu::pool::pool(&b, dir, max_wire, p.cfg.gpu_lanes).prewarm(1)?;
    Ok(b)
}

/// The device behind an isend/irecv mhandle: `None` for host memory (or NULL).
///
/// # Safety
/// `mh` must be NULL or an mhandle from `regMr`.
unsafe fn dev_of(mh: *mut c_void) -> Result<Option<Arc<dyn Backend>>> {
    if mh.is_null() {
        return Ok(None);
    }
    Ok(Obj::<MemHandle>::get(mh)?.dev.clone())
}
impl Kind for MemHandle {
    const TAG: u64 = u64::from_le_bytes(*b"zipMHNDL");
    const NAME: &'static str = "memory handle";
}

/// # Safety
/// NCCL passes a buffer of NCCL_NET_HANDLE_MAXSIZE bytes.
unsafe fn handle_bytes<'a>(h: *mut c_void) -> Result<&'a mut [u8; HANDLE_SIZE]> {
    out(h as *mut [u8; HANDLE_SIZE], "handle")
}

/// Never fails (see [`plugin::init`]): a plugin that cannot work reports 0
/// devices. Even a panic while installing the logger only leaves `devices()`
/// to fail.
unsafe extern "C" fn init(logger: ncclDebugLogger_t) -> ncclResult_t {
    let _ = call("init", || {
        crate::log::install(logger);
        plugin::init();
        Ok(())
    });
    ncclResult_t::ncclSuccess
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> ncclResult_t {
    call("devices", || {
        *out(ndev, "ndev")? = plugin::get()?.ndevs() as c_int;
        Ok(())
    })
}

unsafe extern "C" fn get_properties(
    dev: c_int,
    props: *mut ncclNetProperties_v8_t,
) -> ncclResult_t {
    call("getProperties", || {
        let props = out(props, "props")?;
        let p = plugin::get()?.properties(dev)?;
        *props = ncclNetProperties_v8_t {
            name: p.name.as_ptr() as *mut c_char,
            pciPath: p
                .pci_path
                .map_or(std::ptr::null_mut(), |s| s.as_ptr() as *mut c_char),
            guid: p.guid,
            ptrSupport: p.ptr_support,
            regIsGlobal: 0,
            speed: p.speed_mbps,
            port: p.port,
            latency: 0.0,
            maxComms: 65536,
            maxRecvs: p.max_recvs,
            netDeviceType: ncclNetDeviceType::NCCL_NET_DEVICE_HOST,
            netDeviceVersion: 0,
        };
        Ok(())
    })
}

unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    call("listen", || {
        let lc = out(listen_comm, "listenComm")?;
        *lc = std::ptr::null_mut();
        let l = plugin::get()?.listen_any(dev, handle_bytes(handle)?)?;
        *lc = Obj::into_raw(l);
        Ok(())
    })
}

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    call("connect", || {
        let sc = out(send_comm, "sendComm")?;
        *sc = std::ptr::null_mut();
        if let Some(d) = send_dev_comm.as_mut() {
            *d = std::ptr::null_mut();
        }
        if let Some(c) = plugin::get()?.connect_any(dev, handle_bytes(handle)?)? {
            *sc = Obj::into_raw(c);
        }
        Ok(())
    })
}

unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    call("accept", || {
        let rc = out(recv_comm, "recvComm")?;
        *rc = std::ptr::null_mut();
        if let Some(d) = recv_dev_comm.as_mut() {
            *d = std::ptr::null_mut();
        }
        let l = Obj::<AnyListen>::get_mut(listen_comm)?;
        if let Some(c) = plugin::accept_any(l)? {
            *rc = Obj::into_raw(c);
        }
        Ok(())
    })
}

unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    call("regMr", || {
        let mh = out(mhandle, "mhandle")?;
        *mh = std::ptr::null_mut();
        if comm.is_null() {
            return Err(Error::InvalidArgument("regMr on a NULL comm".into()));
        }
        let ib = ib_mrs(comm)?;
        let dev = match (ty as u32, ib) {
            (NCCL_PTR_HOST, _) => None,
            (NCCL_PTR_CUDA, None) => {
                let p = plugin::get()?;
                if !p.tcp_offers_cuda() {
                    return Err(Error::InvalidArgument(
                        "regMr of CUDA memory, but ptrSupport does not offer NCCL_PTR_CUDA (NCCL_ZIP_GPU is off, or no CUDA device)".into(),
                    ));
                }
                let b = crate::gpu::backend_for(data as u64, p.cfg.gpu_emulate)?;
                prewarm_tcp(comm, &b)?;
                Some(b)
            }
            (NCCL_PTR_CUDA, Some(_)) => Some(ib_cuda_device("regMr", comm, data)?),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "regMr of pointer type {ty}: expected NCCL_PTR_HOST or NCCL_PTR_CUDA"
                )))
            }
        };
        let ib = match ib {
            Some(m) => Some(m.register(data as *mut u8, size).map_err(|e| {
                if dev.is_some() {
                    gdr_hint(e)
                } else {
                    e
                }
            })?),
            None => None,
        };
        *mh = Obj::into_raw(MemHandle {
            ptr_type: ty,
            ib,
            dev,
        });
        Ok(())
    })
}

unsafe extern "C" fn reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    call("regMrDmaBuf", || {
        if let Some(m) = mhandle.as_mut() {
            *m = std::ptr::null_mut();
        }
        if let Some(m) = ib_mrs(comm)?.filter(|m| m.supports_dmabuf()) {
            let mh = out(mhandle, "mhandle")?;
            // A DMA-BUF of CUDA memory: its compressed chunks go through the
            // device's lanes, like a regMr'd CUDA buffer, and are refused as
            // there when the device path is off.
            let dev = match ty as u32 {
                NCCL_PTR_CUDA => Some(ib_cuda_device("regMrDmaBuf", comm, data)?),
                _ => None,
            };
            let r = m.register_dmabuf(data as u64, size, offset, fd)?;
            *mh = Obj::into_raw(MemHandle {
                ptr_type: ty,
                ib: Some(r),
                dev,
            });
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "regMrDmaBuf (type {ty}) is not supported: ptrSupport does not offer DMA-BUF"
        )))
    })
}

unsafe extern "C" fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    // NCCL's proxy deregisters a user buffer's handle even when it is NULL
    // (`send/recvProxyDeregBuffer` call deregMr unconditionally): nothing to do.
    if mhandle.is_null() {
        return ncclResult_t::ncclSuccess;
    }
    call("deregMr", || Obj::<MemHandle>::take(mhandle).map(drop))
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    _tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    call_quiet("isend", || {
        let req = out(request, "request")?;
        *req = std::ptr::null_mut();
        let comm = Obj::<AnySend>::get(send_comm)?;
        let slot = (|| {
            let size = usize::try_from(size)
                .map_err(|_| Error::InvalidArgument(format!("isend of {size} bytes")))?;
            match comm {
                AnySend::Tcp(c) => c.isend(data as *const u8, size, dev_of(mhandle)?),
                AnySend::Ib(c) => {
                    c.isend(data as *const u8, size, ib_mr(mhandle)?, dev_of(mhandle)?)
                }
            }
        })()
        .map_err(|e| Fail::per_comm("isend", comm.report(), e))?;
        if let Some(slot) = slot {
            *req = slot as *const Slot as *mut c_void;
        }
        Ok(())
    })
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    _tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    call_quiet("irecv", || {
        let req = out(request, "request")?;
        *req = std::ptr::null_mut();
        let comm = Obj::<AnyRecv>::get(recv_comm)?;
        let slot = (|| {
            if n != MAX_RECVS {
                return Err(Error::InvalidArgument(format!(
                    "irecv of {n} buffers: maxRecvs is {MAX_RECVS}"
                )));
            }
            let buf = *out(data, "data")?;
            let cap = *out(sizes, "sizes")?;
            let cap = usize::try_from(cap)
                .map_err(|_| Error::InvalidArgument(format!("irecv of {cap} bytes")))?;
            let mh = mhandles.as_ref().map_or(std::ptr::null_mut(), |m| *m);
            match comm {
                AnyRecv::Tcp(c) => c.irecv(buf as *mut u8, cap, dev_of(mh)?),
                AnyRecv::Ib(c) => c.irecv(buf as *mut u8, cap, ib_mr(mh)?, dev_of(mh)?),
            }
        })()
        .map_err(|e| Fail::per_comm("irecv", comm.report(), e))?;
        if let Some(slot) = slot {
            *req = slot as *const Slot as *mut c_void;
        }
        Ok(())
    })
}

unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    _data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // Host buffers are coherent once test() reported done, and so are TCP's
    // device buffers (written by copies and kernels): nothing to flush. An IB
    // receive into device memory was (partly) written by the HCA: flush those
    // writes now, synchronously, and hand back no request (done).
    call("iflush", || {
        *out(request, "request")? = std::ptr::null_mut();
        let AnyRecv::Ib(c) = Obj::<AnyRecv>::get(recv_comm)? else {
            return Ok(());
        };
        if mhandles.is_null() {
            return Ok(());
        }
        for i in 0..usize::try_from(n).unwrap_or(0).min(MAX_RECVS as usize) {
            // SAFETY: NCCL passes `n` mhandles (and sizes) for the `n` buffers
            // of the receive being flushed.
            let mh = *mhandles.add(i);
            let size = if sizes.is_null() { 1 } else { *sizes.add(i) };
            c.flush(dev_of(mh)?.as_ref(), size.max(0) as usize)?;
        }
        Ok(())
    })
}

/// A failed registration of CUDA memory with the HCA, with what it needs.
fn gdr_hint(e: Error) -> Error {
    const HINT: &str = "registering CUDA memory with the HCA needs GPUDirect RDMA (the nvidia-peermem module, or DMA-BUF)";
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{m} ({HINT})")),
        Error::Internal(m) => Error::Internal(format!("{m} ({HINT})")),
        Error::Remote(m) => Error::Remote(format!("{m} ({HINT})")),
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("{m} ({HINT})")),
        Error::Cuda(m) => Error::Cuda(format!("{m} ({HINT})")),
        Error::System { context, source } => Error::System {
            context: format!("{context} ({HINT})"),
            source,
        },
    }
}

unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    call_quiet("test", || {
        let d = out(done, "done")?;
        *d = 0;
        // SAFETY: NCCL passes back a request pointer we returned from isend/irecv.
        let slot = (request as *const Slot)
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("test on a NULL request".into()))?;
        let r = slot
            .test()
            .map_err(|e| Fail::per_comm("test", slot.report(), e))?;
        if let Some(n) = r {
            *d = 1;
            if let Some(s) = sizes.as_mut() {
                *s = n as c_int;
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn close_send(c: *mut c_void) -> ncclResult_t {
    call("closeSend", || Obj::<AnySend>::take(c).map(drop))
}

unsafe extern "C" fn close_recv(c: *mut c_void) -> ncclResult_t {
    call("closeRecv", || Obj::<AnyRecv>::take(c).map(drop))
}

unsafe extern "C" fn close_listen(c: *mut c_void) -> ncclResult_t {
    call("closeListen", || Obj::<AnyListen>::take(c).map(drop))
}

unsafe extern "C" fn get_device_mr(
    _comm: *mut c_void,
    _mhandle: *mut c_void,
    dptr: *mut *mut c_void,
) -> ncclResult_t {
    // Only called for device-offload (netDeviceType != HOST), which we never report.
    call("getDeviceMr", || {
        *out(dptr, "dptr_mhandle")? = std::ptr::null_mut();
        Ok(())
    })
}

unsafe extern "C" fn irecv_consumed(
    _recv_comm: *mut c_void,
    _n: c_int,
    _request: *mut c_void,
) -> ncclResult_t {
    ncclResult_t::ncclSuccess
}

/// The exported vtable. `repr(transparent)` keeps NCCL's layout; the wrapper only
/// lets a struct of raw pointers be a `static`.
#[repr(transparent)]
pub struct Vtable(pub ncclNet_v8_t);
// SAFETY: the vtable is immutable; its pointers are to 'static data and functions.
unsafe impl Sync for Vtable {}

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v8: Vtable = Vtable(ncclNet_v8_t {
    name: c"Zip".as_ptr(),
    init: Some(init),
    devices: Some(devices),
    getProperties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    regMr: Some(reg_mr),
    regMrDmaBuf: Some(reg_mr_dma_buf),
    deregMr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    closeSend: Some(close_send),
    closeRecv: Some(close_recv),
    closeListen: Some(close_listen),
    getDeviceMr: Some(get_device_mr),
    irecvConsumed: Some(irecv_consumed),
});
