//! The CUDA [`Backend`]: lanes with a stream, a one-job kernel batch and a pinned,
//! device-mapped staging buffer. Everything goes through cudarc, loaded at run
//! time; every driver call runs under [`driver::guarded`], so a missing library or
//! symbol is an error, never a panic across the FFI boundary.
//!
//! Status: compiled and reviewed, not yet run on a GPU (no GPU was lent when it was
//! written). The emulated backend runs the same data-path logic in the test suite.

use std::ffi::c_void;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaContext, CudaStream, DriverError};

use super::backend::{opened, Backend, Lane};
use super::codec::{DecodeJob, EncodeJob, GpuBatch, GpuCodec};
use super::driver::{self, MappedHost};
use super::Status;
use crate::codec::{self, EncodeOptions};
use crate::error::{Error, Result};
use crate::stats::Charge;

/// A kernel that has not finished after this long means a wedged GPU: the comm
/// fails with an error instead of hanging NCCL's progress.
const KERNEL_TIMEOUT: Duration = Duration::from_secs(60);

fn cuda_err(what: &str) -> impl Fn(DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e}"))
}

/// Runs `f` with cudarc's panics (missing library or symbol) turned into errors.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    driver::guarded(what, f).map_err(|u| Error::Cuda(u.to_string()))?
}

/// Puts the calling thread's current CUDA context back when dropped.
///
/// `regMr` (NCCL's proxy thread) and `iflush` (its progress thread) run on threads
/// that have NCCL's own context current; cudarc's `bind_to_thread` replaces it with
/// the primary context of the buffer's device. That is the same context in the
/// usual case (one device per thread, runtime primary contexts), but NCCL's next
/// runtime call on that thread must never find another device's context (or a
/// non-primary context the application made) swapped out under it.
struct KeepCurrent(Option<sys::CUcontext>);

impl KeepCurrent {
    fn save() -> Result<KeepCurrent> {
        cudarc::driver::result::ctx::get_current()
            .map(KeepCurrent)
            .map_err(cuda_err("cuCtxGetCurrent"))
    }
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        let now = cudarc::driver::result::ctx::get_current().ok().flatten();
        if now != self.0 {
            // SAFETY: a context that was current on this thread when `save` ran (or
            // none); contexts this plugin touches are never destroyed.
            let r = unsafe {
                cudarc::driver::result::ctx::set_current(self.0.unwrap_or(std::ptr::null_mut()))
            };
            if let Err(e) = r {
                tracing::warn!("could not restore the thread's CUDA context: {e}");
            }
        }
    }
}

/// CUDA devices visible to this process (no context is created).
pub fn device_count() -> std::result::Result<i32, String> {
    driver::driver_library_present().map_err(|u| u.to_string())?;
    guarded("cuDeviceGetCount", || {
        cudarc::driver::result::init().map_err(cuda_err("cuInit"))?;
        cudarc::driver::result::device::get_count().map_err(cuda_err("cuDeviceGetCount"))
    })
    .map_err(|e| e.to_string())
}

/// One 32-bit pointer attribute of `ptr`.
fn pointer_attr(ptr: u64, attr: sys::CUpointer_attribute) -> std::result::Result<u32, DriverError> {
    let mut v: u32 = 0;
    // SAFETY: the attributes asked for are 32-bit values, written into `v`; the
    // driver validates `ptr` itself (unified addressing: no current context needed).
    unsafe { sys::cuPointerGetAttribute(&mut v as *mut u32 as *mut c_void, attr, ptr) }
        .result()
        .map(|()| v)
}

/// The CUDA ordinal owning device memory at `ptr` (an error for any other memory).
fn pointer_ordinal(ptr: u64) -> Result<i32> {
    use sys::CUpointer_attribute::*;
    let mem_type = pointer_attr(ptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE).map_err(|e| {
        Error::InvalidArgument(format!(
            "regMr(NCCL_PTR_CUDA) of {ptr:#x}: not CUDA memory ({e})"
        ))
    })?;
    if mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(Error::InvalidArgument(format!(
            "regMr(NCCL_PTR_CUDA) of {ptr:#x}: CUDA memory type {mem_type}, not device memory"
        )));
    }
    let ordinal = pointer_attr(ptr, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        .map_err(cuda_err("cuPointerGetAttribute(DEVICE_ORDINAL)"))?;
    Ok(ordinal as i32)
}

/// The backend of the device that owns `ptr`, opened on first use.
pub fn backend_for(ptr: u64) -> Result<Arc<dyn Backend>> {
    driver::driver_library_present()
        .map_err(|u| Error::InvalidArgument(format!("regMr(NCCL_PTR_CUDA) but {u}")))?;
    let (ordinal, _keep) = guarded("cuPointerGetAttribute", || {
        cudarc::driver::result::init().map_err(cuda_err("cuInit"))?;
        let keep = KeepCurrent::save()?;
        Ok((pointer_ordinal(ptr)?, keep))
    })?;
    let mut m = opened().lock();
    m.entry(ordinal)
        .or_insert_with(|| {
            CudaBackend::open(ordinal)
                .map(|b| {
                    tracing::info!("device path: {}", b.describe());
                    Arc::new(b) as Arc<dyn Backend>
                })
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|why| Error::Cuda(format!("CUDA device {ordinal} unusable: {why}")))
}

struct CudaBackend {
    ordinal: i32,
    ctx: Arc<CudaContext>,
    /// `None`: the kernels did not load; lanes copy and the CPU codec runs.
    codec: Option<Arc<GpuCodec>>,
}

impl CudaBackend {
    fn open(ordinal: i32) -> Result<CudaBackend> {
        let codec = match GpuCodec::new(ordinal as usize) {
            Ok(Ok(c)) => Some(Arc::new(c)),
            Ok(Err(u)) => {
                tracing::warn!(
                    "GPU codec unavailable on device {ordinal} ({u}): CUDA buffers are copied to host and compressed on the CPU"
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    "GPU codec failed on device {ordinal} ({e}): CUDA buffers are copied to host and compressed on the CPU"
                );
                None
            }
        };
        let ctx = match &codec {
            Some(c) => c.context().clone(),
            None => guarded("cuDevicePrimaryCtxRetain", || {
                let ctx = CudaContext::new(ordinal as usize).map_err(cuda_err("CUDA context"))?;
                // SAFETY: as in GpuCodec::open: no CudaSlice is used, and tracking
                // would make the first stream synchronize the shared context.
                unsafe { ctx.disable_event_tracking() };
                Ok(ctx)
            })?,
        };
        Ok(CudaBackend {
            ordinal,
            ctx,
            codec,
        })
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        match &self.codec {
            Some(c) => format!(
                "CUDA device {} ({}), GPU codec kernels from {:?}, {} SMs per launch",
                self.ordinal,
                c.info().name,
                c.kernel_source(),
                c.sms()
            ),
            None => format!(
                "CUDA device {} without GPU codec kernels (copies + CPU codec)",
                self.ordinal
            ),
        }
    }

    fn flush_rdma_writes(&self) -> Result<()> {
        use sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER;
        use sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX;
        guarded("cuFlushGPUDirectRDMAWrites", || {
            let e = cuda_err("cuFlushGPUDirectRDMAWrites");
            // iflush runs on NCCL's progress thread.
            let _keep = KeepCurrent::save()?;
            self.ctx.bind_to_thread().map_err(&e)?;
            // SAFETY: no arguments beyond the two enums; the context is current.
            unsafe {
                sys::cuFlushGPUDirectRDMAWrites(
                    CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                    CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
                )
            }
            .result()
            .map_err(&e)
        })
    }

    fn lane<'a>(&self, max_wire: usize, counter: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>> {
        guarded("lane", || {
            let e = cuda_err("lane setup");
            // Lanes are made from regMr (NCCL's proxy thread) by the pools' prewarm.
            let _keep = KeepCurrent::save()?;
            self.ctx.bind_to_thread().map_err(&e)?;
            // Highest priority: a lane's kernels and copies are small and NCCL's
            // kernels wait on them; they should not queue behind compute kernels.
            // The context's event tracking is off (see GpuCodec::open), so this
            // never synchronizes the context.
            debug_assert!(!self.ctx.is_event_tracking());
            let (_, greatest) = cudarc::driver::result::stream::get_priority_range().map_err(&e)?;
            let stream = self.ctx.new_stream_with_priority(greatest).map_err(&e)?;
            let staging = MappedHost::new(&self.ctx, max_wire).map_err(&e)?;
            let batch = match &self.codec {
                Some(c) => Some(
                    c.new_batch(1, max_wire as u64)
                        .map_err(|e| Error::Cuda(format!("GPU batch: {e}")))?,
                ),
                None => None,
            };
            Ok(Box::new(CudaLane {
                ctx: self.ctx.clone(),
                codec: self.codec.clone(),
                stream,
                batch,
                staging,
                wedged: false,
                _charge: Charge::new(counter, max_wire as u64),
            }) as Box<dyn Lane + 'a>)
        })
    }
}

struct CudaLane<'a> {
    ctx: Arc<CudaContext>,
    codec: Option<Arc<GpuCodec>>,
    stream: Arc<CudaStream>,
    batch: Option<GpuBatch>,
    staging: MappedHost,
    /// Set when a kernel did not finish within [`KERNEL_TIMEOUT`]: the stream may
    /// never drain, so every later operation fails at once instead of queueing
    /// behind it (a stream sync there would hang the I/O thread for good).
    wedged: bool,
    _charge: Charge<'a>,
}

impl CudaLane<'_> {
    fn usable(&self, what: &str) -> Result<()> {
        if self.wedged {
            return Err(Error::Cuda(format!(
                "{what}: this GPU lane's stream is stuck (a kernel ran past {KERNEL_TIMEOUT:?})"
            )));
        }
        Ok(())
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.staging.len() {
            return Err(Error::Internal(format!(
                "device chunk of {len} bytes exceeds the lane's {}-byte staging",
                self.staging.len()
            )));
        }
        Ok(())
    }

    /// Runs one stream operation and waits for the stream.
    fn sync_op(&self, what: &str, op: impl FnOnce(sys::CUstream) -> sys::CUresult) -> Result<()> {
        self.usable(what)?;
        guarded(what, || {
            let e = cuda_err(what);
            self.ctx.bind_to_thread().map_err(&e)?;
            op(self.stream.cu_stream()).result().map_err(&e)?;
            self.stream.synchronize().map_err(&e)
        })
    }

    fn run_one(
        &mut self,
        what: &str,
        launch: impl FnOnce(
            &GpuCodec,
            &CudaStream,
            &mut GpuBatch,
        ) -> std::result::Result<(), super::GpuError>,
    ) -> Result<std::result::Result<u64, Status>> {
        self.usable(what)?;
        let (Some(codec), Some(batch)) = (self.codec.as_deref(), self.batch.as_mut()) else {
            return Err(Error::Internal(format!("{what} on a lane without kernels")));
        };
        let stream = &self.stream;
        let mut timed_out = false;
        let r = guarded(what, || {
            launch(codec, stream, batch).map_err(|e| Error::Cuda(format!("{what}: {e}")))?;
            let out = batch.wait(KERNEL_TIMEOUT).map_err(|e| {
                timed_out = matches!(e, super::GpuError::Timeout);
                Error::Cuda(format!("{what}: {e}"))
            })?;
            Ok(out[0])
        });
        if timed_out {
            self.wedged = true;
            tracing::warn!(
                "{what}: kernel still running after {KERNEL_TIMEOUT:?}; this GPU lane is disabled and its comm fails"
            );
        }
        r
    }
}

impl Lane for CudaLane<'_> {
    fn staging(&mut self, len: usize) -> Result<&mut [u8]> {
        self.check_len(len)?;
        // SAFETY: `len` bytes of the pinned allocation this lane owns; no kernel or
        // copy uses it while the I/O thread holds the slice (all operations sync).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.staging.host_ptr(), len) })
    }
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.staging.len(), "staging range");
        // SAFETY: in range, as above.
        unsafe { std::slice::from_raw_parts(self.staging.host_ptr().add(off), len) }
    }
    fn kernels(&self) -> bool {
        self.batch.is_some()
    }
    fn download(&mut self, src: u64, len: usize) -> Result<()> {
        self.check_len(len)?;
        let host = self.staging.host_ptr() as *mut c_void;
        // SAFETY: `src` is device memory NCCL registered and owns for this request;
        // the staging buffer holds `len` bytes.
        self.sync_op("cuMemcpyDtoHAsync", |s| unsafe {
            sys::cuMemcpyDtoHAsync_v2(host, src, len, s)
        })
    }
    fn upload(&mut self, dst: u64, len: usize) -> Result<()> {
        self.check_len(len)?;
        let host = self.staging.host_ptr() as *const c_void;
        // SAFETY: as in download.
        self.sync_op("cuMemcpyHtoDAsync", |s| unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, host, len, s)
        })
    }
    fn upload_from(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        let (p, n) = (src.as_ptr() as *const c_void, src.len());
        // SAFETY: as in download; `src` lives across the synchronous copy.
        self.sync_op("cuMemcpyHtoDAsync", |s| unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, p, n, s)
        })
    }
    fn encode(&mut self, src: u64, len: usize, opts: &EncodeOptions) -> Result<usize> {
        let need = codec::max_compressed_size(len);
        self.check_len(need)?;
        let job = EncodeJob {
            src,
            n: len as u64,
            dst: self.staging.dev_ptr(),
            dst_cap: need as u64,
            hint: opts.dtype,
            checksum: opts.checksum,
            block_log2: opts.block_log2,
        };
        // SAFETY: `src` is registered device memory of `len` bytes owned by this
        // request; `dst` is this lane's staging, idle until the batch completes.
        match self.run_one("GPU encode", |c, s, b| unsafe {
            c.encode_batch(s, b, &[job])
        })? {
            Ok(n) => Ok(n as usize),
            Err(st) => Err(Error::Internal(format!("GPU encode failed: {st:?}"))),
        }
    }
    fn decode(&mut self, frame_len: usize, dst: u64, cap: usize) -> Result<usize> {
        self.check_len(frame_len)?;
        let job = DecodeJob {
            src: self.staging.dev_ptr(),
            src_len: frame_len as u64,
            dst,
            dst_cap: cap as u64,
        };
        // SAFETY: as in encode, with the roles of staging and device memory swapped.
        match self.run_one("GPU decode", |c, s, b| unsafe {
            c.decode_batch(s, b, &[job])
        })? {
            Ok(n) => Ok(n as usize),
            // Blocks larger than the launch was sized for: decode on the CPU.
            Err(Status::BadArgs) => {
                let mut out = vec![0u8; cap];
                let n = codec::decompress(self.bytes(0, frame_len), &mut out)
                    .map_err(|e| Error::Remote(format!("corrupt compressed chunk: {e}")))?;
                self.upload_from(dst, &out[..n])?;
                Ok(n)
            }
            Err(st) => Err(Error::Remote(format!(
                "corrupt compressed chunk (GPU decoder: {st:?})"
            ))),
        }
    }
}
