//! The CUDA [`Backend`]: lanes with a stream, a one-job kernel batch, a pinned,
//! device-mapped staging buffer (what the socket reads and writes) and a device
//! scratch buffer (what the kernels read and write: frames are moved between the
//! two by the copy engine, so the kernels' byte-granular accesses stay in device
//! memory instead of crossing PCIe one by one; `NCCL_ZIP_GPU_ZEROCOPY=1` makes the
//! kernels use the mapped staging directly, for comparison). Everything goes
//! through cudarc, loaded at run time; every driver call runs under
//! [`driver::guarded`], so a missing library or symbol is an error, never a panic
//! across the FFI boundary.
//!
//! Waiting is always a poll of `cuStreamQuery`, never `cuStreamSynchronize`: it
//! never blocks, never synchronizes the context, returns a kernel's sticky error at
//! once, and lets every wait have a deadline ([`KERNEL_TIMEOUT`]).
//!
//! Status: ran on an H100 in real NCCL (bench/results/gpu-2026-11-27-h100): bitwise
//! under Simple, LL and LL128, but a lane's stream stopped draining under
//! back-to-back collectives when kernels run (copies alone did not); the emulated
//! backend runs the same data-path logic in the test suite.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext, CudaStream, DriverError};

use super::backend::{opened, Backend, Lane};
use super::codec::{DecodeJob, EncodeJob, GpuBatch, GpuCodec};
use super::driver::{self, DeviceBuffer, MappedHost};
use super::Status;
use crate::codec::{self, EncodeOptions};
use crate::error::{Error, Result};
use crate::stats::Charge;

/// A lane's stream that has not drained after this long (a kernel or a copy) means a
/// wedged GPU: the comm fails with an error instead of hanging NCCL's progress.
const KERNEL_TIMEOUT: Duration = Duration::from_secs(60);

/// [`KERNEL_TIMEOUT`], or `NCCL_ZIP_GPU_TIMEOUT_MS` (shorter for experiments that
/// provoke a stuck lane on purpose).
fn kernel_timeout() -> Duration {
    crate::config::current()
        .gpu_timeout_ms
        .map_or(KERNEL_TIMEOUT, Duration::from_millis)
}

/// The settings of the CUDA driver that decide whether a lane can wait behind other
/// work, for a stuck lane's WARN.
fn driver_env() -> String {
    ["CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING"]
        .iter()
        .map(|k| {
            format!(
                "{k}={}",
                std::env::var(k).unwrap_or_else(|_| "unset".into())
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `NCCL_ZIP_GPU_ZEROCOPY=1`: kernels read and write the lanes' mapped host staging
/// directly (no device scratch, no copies): the variant to compare against.
fn zero_copy() -> bool {
    crate::config::current().gpu_zerocopy
}

fn cuda_err(what: &str) -> impl Fn(DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e}"))
}

/// Runs `f` with cudarc's panics (missing library or symbol) turned into errors,
/// and with the calling thread in relaxed stream-capture mode
/// ([`driver::RelaxedCapture`]): every driver call of the device path goes through
/// here, on NCCL's threads and on the plugin's own, so none of them can fail or
/// invalidate a CUDA graph the application is capturing meanwhile.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _relaxed = driver::RelaxedCapture::enter();
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
            // Module load, context, attributes: on NCCL's proxy thread, maybe while
            // the application captures a graph.
            let _relaxed = driver::RelaxedCapture::enter();
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
    /// Kernels work on the mapped staging itself (no device scratch).
    zero_copy: bool,
}

impl CudaBackend {
    fn open(ordinal: i32) -> Result<CudaBackend> {
        let codec = if !crate::config::current().gpu_kernels {
            tracing::info!(
                "NCCL_ZIP_GPU_KERNELS=off: CUDA buffers on device {ordinal} are copied to host and compressed on the CPU (no kernel is launched)"
            );
            None
        } else {
            Self::open_codec(ordinal)
        };
        let ctx = match &codec {
            Some(c) => c.context().clone(),
            None => guarded("cuDevicePrimaryCtxRetain", || {
                let ctx = CudaContext::new(ordinal as usize).map_err(cuda_err("CUDA context"))?;
                // SAFETY: as in GpuCodec::open: no CudaSlice is used, and tracking
                // would make the first stream synchronize the shared context.
                unsafe { ctx.disable_event_tracking() };
                // Our reference to the primary context is never released.
                driver::keep_forever(ctx.clone());
                Ok(ctx)
            })?,
        };
        Ok(CudaBackend {
            ordinal,
            ctx,
            codec,
            zero_copy: zero_copy(),
        })
    }

    /// The GPU codec of device `ordinal`, or None (with a WARN) when it cannot load.
    fn open_codec(ordinal: i32) -> Option<Arc<GpuCodec>> {
        match GpuCodec::new(ordinal as usize) {
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
        }
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        match &self.codec {
            Some(c) => format!(
                "CUDA device {} ({}), GPU codec kernels from {:?}, {} SMs per launch, frames {}",
                self.ordinal,
                c.info().name,
                c.kernel_source(),
                c.sms(),
                if self.zero_copy {
                    "in mapped host staging (zero-copy)"
                } else {
                    "in device scratch, copied to and from host staging"
                }
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
            //
            // Nothing made here is ever given back (see driver::keep_forever): not
            // when a later step fails, and not when the lane is dropped (pools keep
            // their lanes for the process's life anyway).
            let stream = self.ctx.new_stream_with_priority(greatest).map_err(&e)?;
            driver::keep_forever(stream.clone());
            let staging = ManuallyDrop::new(MappedHost::new(&self.ctx, max_wire).map_err(&e)?);
            let mut batch = match &self.codec {
                Some(c) => Some(ManuallyDrop::new(
                    c.new_batch(1, max_wire as u64)
                        .map_err(|e| Error::Cuda(format!("GPU batch: {e}")))?,
                )),
                None => None,
            };
            // The event recorded before each kernel (never destroyed, as the stream):
            // a stuck lane's WARN says with it whether the work queued before its
            // kernel ran.
            let mut mark: sys::CUevent = std::ptr::null_mut();
            // SAFETY: creates an event of the current (the lane's) context.
            unsafe {
                sys::cuEventCreate(
                    &mut mark,
                    sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32,
                )
            }
            .result()
            .map_err(&e)?;
            if let Some(b) = batch.as_mut() {
                // SAFETY: an event of the lane's context that is never destroyed.
                unsafe { b.set_mark(driver::RawEvent(mark)) };
            }
            let scratch = match (&batch, self.zero_copy) {
                (Some(_), false) => Some(ManuallyDrop::new(
                    DeviceBuffer::new(&self.ctx, max_wire).map_err(&e)?,
                )),
                _ => None,
            };
            let held = max_wire as u64 * if scratch.is_some() { 2 } else { 1 };
            Ok(Box::new(CudaLane {
                ctx: self.ctx.clone(),
                codec: self.codec.clone(),
                stream,
                batch,
                staging,
                scratch,
                wedged: false,
                mark: driver::RawEvent(mark),
                _charge: Charge::new(counter, held),
            }) as Box<dyn Lane + 'a>)
        })
    }
}

struct CudaLane<'a> {
    ctx: Arc<CudaContext>,
    codec: Option<Arc<GpuCodec>>,
    stream: Arc<CudaStream>,
    // Never freed (ManuallyDrop): see `CudaBackend::lane`.
    batch: Option<ManuallyDrop<GpuBatch>>,
    staging: ManuallyDrop<MappedHost>,
    /// Device memory the kernels read frames from and write them to (as large as
    /// `staging`); None with zero-copy or without kernels.
    scratch: Option<ManuallyDrop<DeviceBuffer>>,
    /// Set when the stream did not drain within [`KERNEL_TIMEOUT`] or reported an
    /// error: it may never drain, so every later operation fails at once instead of
    /// queueing behind it, and the pool parks the lane (see [`Lane::wedged`]).
    wedged: bool,
    /// Recorded right before each kernel (see `GpuBatch::set_mark`).
    mark: driver::RawEvent,
    _charge: Charge<'a>,
}

impl CudaLane<'_> {
    fn usable(&self, what: &str) -> Result<()> {
        if self.wedged {
            return Err(Error::Cuda(format!(
                "{what}: this GPU lane is disabled (its stream failed or did not drain within {:?})",
                kernel_timeout()
            )));
        }
        Ok(())
    }

    /// Where a stream that does not drain is stuck, as far as the lane can tell.
    /// `published`: whether the kernel queued on the stream, if any, published its
    /// result.
    fn stuck_detail(&self, published: Option<bool>) -> String {
        let at = match published {
            None => "a copy is stuck: no kernel is queued on this lane",
            Some(true) => {
                "the kernel published its result, so a copy after it or a late CTA is stuck"
            }
            // SAFETY: the lane's own event, never destroyed.
            Some(false) => match unsafe { sys::cuEventQuery(self.mark.0) } {
                sys::CUresult::CUDA_SUCCESS => "the copies and memset before the kernel ran, so the kernel itself has not finished (still running, or waiting for SMs)",
                sys::CUresult::CUDA_ERROR_NOT_READY => "even the copies and memset queued before the kernel have not run: the stream waits behind other work (a hardware queue shared with a stream whose next kernel waits, or a module load or free elsewhere in the process)",
                _ => "the state of the work before the kernel is unknown",
            },
        };
        format!("{at}; {}", driver_env())
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

    /// Waits, by polling, until everything queued on the lane's stream has run.
    /// A stream error (a kernel's sticky error) or [`KERNEL_TIMEOUT`] wedges the
    /// lane. Call with the lane's context current.
    fn drain(&mut self, what: &str) -> Result<()> {
        self.drain_with(what, None)
    }

    /// [`CudaLane::drain`] after a kernel launch: `published` reads whether the
    /// kernel published its result, for the WARN of a stream that does not drain.
    fn drain_with(&mut self, what: &str, published: Option<&dyn Fn() -> bool>) -> Result<()> {
        let t0 = Instant::now();
        let mut polls = 0u32;
        loop {
            // SAFETY: the lane's own stream, alive as long as the lane.
            match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => {
                    self.wedged = true;
                    tracing::warn!(
                        "{what}: the GPU lane's stream failed ({e:?}); this lane is disabled"
                    );
                    return Err(Error::Cuda(format!("{what}: {}", DriverError(e))));
                }
            }
            if t0.elapsed() > kernel_timeout() {
                self.wedged = true;
                tracing::warn!(
                    "{what}: the GPU lane's stream has not drained after {:?} ({}); this lane is disabled and its comm fails",
                    kernel_timeout(),
                    self.stuck_detail(published.map(|p| p()))
                );
                return Err(Error::Cuda(format!(
                    "{what}: GPU work still running after {:?}",
                    kernel_timeout()
                )));
            }
            // A chunk's kernel or copy takes microseconds: spin briefly, then give
            // the core away between polls, and after a millisecond poll the driver
            // only every 50 us (up to 32 lanes may be waiting at once).
            polls += 1;
            if polls < 64 {
                std::hint::spin_loop();
            } else if t0.elapsed() < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Runs one stream operation and waits for it. May run on NCCL's thread (the
    /// inline stream's receives), whose current context it leaves as it was.
    fn sync_op(
        &mut self,
        what: &str,
        op: impl FnOnce(sys::CUstream) -> sys::CUresult,
    ) -> Result<()> {
        self.usable(what)?;
        let ctx = self.ctx.clone();
        let stream = self.stream.cu_stream();
        guarded(what, || {
            let e = cuda_err(what);
            let _keep = KeepCurrent::save()?;
            ctx.bind_to_thread().map_err(&e)?;
            if let Err(err) = op(stream).result() {
                let _ = self.drain(what);
                return Err(e(err));
            }
            self.drain(what)
        })
    }

    /// Queues `launch` (the kernel, with any copies around it) on the lane's stream
    /// and waits until the stream has drained: only then is the lane free for the
    /// next chunk. (The kernel publishes its result before its last CTAs exit, and
    /// a late CTA may still read the frame; a copy after the kernel has not run yet.)
    fn run_one(
        &mut self,
        what: &str,
        launch: impl FnOnce(
            &GpuCodec,
            &CudaStream,
            &mut GpuBatch,
            &Lanebufs,
        ) -> std::result::Result<(), super::GpuError>,
    ) -> Result<std::result::Result<u64, Status>> {
        self.usable(what)?;
        let (Some(codec), Some(mut batch)) = (self.codec.clone(), self.batch.take()) else {
            return Err(Error::Internal(format!("{what} on a lane without kernels")));
        };
        let bufs = Lanebufs {
            staging_host: self.staging.host_ptr() as u64,
            scratch: self.scratch.as_ref().map(|d| d.ptr()),
        };
        let ctx = self.ctx.clone();
        let stream = self.stream.clone();
        let r = guarded(what, || {
            ctx.bind_to_thread().map_err(cuda_err(what))?;
            if let Err(e) = launch(&codec, &stream, &mut batch, &bufs) {
                // Part of the work may be queued: the lane is free only once it ran
                // (and a sticky error found here disables the lane).
                let _ = self.drain(what);
                return Err(Error::Cuda(format!("{what}: {e}")));
            }
            // The kernel's result lands in mapped memory: wait for it there first
            // (no driver call), then for the stream (copies, late CTAs).
            let t0 = Instant::now();
            while !batch.poll() && t0.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            }
            self.drain_with(what, Some(&|| batch.poll()))?;
            if !batch.poll() {
                // The stream is idle, so nothing will publish any more.
                batch.forget_launch();
                return Err(Error::Cuda(format!(
                    "{what}: the kernel finished without publishing its result"
                )));
            }
            Ok(batch.outcomes()[0])
        });
        self.batch = Some(batch);
        r
    }

    /// Where the kernels read or write a frame: the device scratch, or the mapped
    /// staging itself (zero-copy).
    fn frame_dev(&self) -> u64 {
        self.scratch
            .as_ref()
            .map_or(self.staging.dev_ptr(), |d| d.ptr())
    }
}

/// A lane's buffers, as the launch closures of [`CudaLane::run_one`] see them.
struct Lanebufs {
    staging_host: u64,
    scratch: Option<u64>,
}

impl Lane for CudaLane<'_> {
    fn wedged(&self) -> bool {
        self.wedged
    }
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
            dst: self.frame_dev(),
            dst_cap: need as u64,
            hint: opts.dtype,
            checksum: opts.checksum,
            block_log2: opts.block_log2,
        };
        // SAFETY: `src` is registered device memory of `len` bytes owned by this
        // request; `dst` is this lane's scratch (or staging), idle until the stream
        // drains; the copy moves at most `need` <= staging bytes.
        match self.run_one("GPU encode", |c, s, b, m| unsafe {
            c.encode_batch(s, b, &[job])?;
            if let Some(scratch) = m.scratch {
                // The frame's length is known only once the kernel ran: copy the
                // largest it can be, in the same stream.
                sys::cuMemcpyDtoHAsync_v2(
                    m.staging_host as *mut c_void,
                    scratch,
                    need,
                    s.cu_stream(),
                )
                .result()?;
            }
            Ok(())
        })? {
            Ok(n) => Ok(n as usize),
            Err(st) => Err(Error::Internal(format!("GPU encode failed: {st:?}"))),
        }
    }
    fn decode(&mut self, frame_len: usize, dst: u64, cap: usize) -> Result<usize> {
        self.check_len(frame_len)?;
        let job = DecodeJob {
            src: self.frame_dev(),
            src_len: frame_len as u64,
            dst,
            dst_cap: cap as u64,
        };
        // SAFETY: as in encode, with the roles of staging and device memory swapped;
        // the frame is copied into the scratch first, in the same stream.
        match self.run_one("GPU decode", |c, s, b, m| unsafe {
            if let Some(scratch) = m.scratch {
                sys::cuMemcpyHtoDAsync_v2(
                    scratch,
                    m.staging_host as *const c_void,
                    frame_len,
                    s.cu_stream(),
                )
                .result()?;
            }
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
