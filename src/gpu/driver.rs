//! Run-time CUDA loading and the small owned resources the codec needs.
//!
//! cudarc's dynamic loader panics when libcuda is missing, so [`probe`] first opens
//! `libcuda.so.1` with libloading and reports "no CUDA driver" as a normal state;
//! every later cudarc call runs under `catch_unwind` (a missing symbol on an old
//! driver also panics inside cudarc). Nothing here links libcuda: `readelf -d` of the
//! plugin shows no CUDA dependency (tests/gpu_load.rs).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

/// Why the GPU codec is not available (a normal state, not an error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    NoDriver(String),
    NoDevice(String),
    NoKernels(String),
    DriverCall(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NoDriver(s) => write!(f, "no CUDA driver ({s})"),
            Unavailable::NoDevice(s) => write!(f, "no usable CUDA device ({s})"),
            Unavailable::NoKernels(s) => write!(f, "GPU kernels unavailable ({s})"),
            Unavailable::DriverCall(s) => write!(f, "CUDA driver call failed ({s})"),
        }
    }
}

/// Whether `libcuda.so.1` can be opened (without loading it for cudarc).
pub fn driver_library_present() -> Result<(), Unavailable> {
    // SAFETY: opening the NVIDIA driver library runs its initialisers, which is what
    // every CUDA application does; the handle is closed again at once.
    match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(_) => Ok(()),
        Err(e) => Err(Unavailable::NoDriver(format!(
            "libcuda.so.1 not found: {e}"
        ))),
    }
}

/// Whether some NVRTC library cudarc would load is present.
pub fn nvrtc_library_present() -> bool {
    cudarc::get_lib_name_candidates("nvrtc")
        .iter()
        // SAFETY: as above, for libnvrtc.
        .any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

/// Runs `f`, turning a panic inside cudarc (missing library or symbol) into an error.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Unavailable> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        Unavailable::DriverCall(format!("{what}: {msg}"))
    })
}

/// Sets the calling thread's stream-capture mode to relaxed until dropped, then puts
/// the previous mode back (`cuThreadExchangeStreamCaptureMode`, the exchange NCCL
/// wraps around its own allocations, e.g. `ncclCudaMalloc` in NCCL 2.28.9
/// src/include/alloc.h).
///
/// While any thread of the process captures a CUDA graph in global mode (PyTorch's
/// and vLLM's default), "potentially unsafe" driver calls (allocations, synchronous
/// copies, queries) made by a thread in global or thread-local mode fail with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidate the user's capture. Every
/// driver call of the plugin runs inside one of these: on NCCL's threads (which
/// stay in whatever mode NCCL left them) and on the plugin's own I/O threads.
///
/// Call only once libcuda is known to be present; a driver without the call (or
/// any failure) leaves the mode as it was, and the drop does nothing.
pub struct RelaxedCapture(Option<sys::CUstreamCaptureMode>);

impl RelaxedCapture {
    pub fn enter() -> RelaxedCapture {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a thread-local setting, written through a valid pointer.
        let r = guarded("cuThreadExchangeStreamCaptureMode", || unsafe {
            sys::cuThreadExchangeStreamCaptureMode(&mut mode)
        });
        match r {
            Ok(sys::CUresult::CUDA_SUCCESS) => RelaxedCapture(Some(mode)),
            _ => RelaxedCapture(None),
        }
    }
    /// The mode the thread had before (None: the exchange did not happen).
    pub fn previous(&self) -> Option<sys::CUstreamCaptureMode> {
        self.0
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut prev) = self.0 {
            // SAFETY: as in `enter`; gives the thread its own mode back.
            let _ = guarded("cuThreadExchangeStreamCaptureMode", || unsafe {
                sys::cuThreadExchangeStreamCaptureMode(&mut prev)
            });
        }
    }
}

/// Keeps `v` alive for the rest of the process: what the plugin allocates from the
/// driver (modules, streams, pinned and device memory, its reference to the
/// primary context) is never given back while the process may run NCCL kernels,
/// because `cuMemFree`, `cuMemFreeHost`, `cuStreamDestroy` and `cuModuleUnload` may
/// wait for the device, and NCCL's kernels may be spinning on data this plugin has
/// to move (a deadlock). Also on error paths: a half-made lane is leaked, not freed.
pub fn keep_forever<T>(v: T) {
    std::mem::forget(v);
}

/// Device `ordinal`'s primary context, or why there is none (no driver library,
/// no device, a cudarc panic): for the GPU tests and tools, which skip with the
/// reason.
pub fn open_context(ordinal: usize) -> Result<Arc<CudaContext>, Unavailable> {
    driver_library_present()?;
    guarded("CudaContext::new", || CudaContext::new(ordinal))?
        .map_err(|e| Unavailable::NoDevice(e.to_string()))
}

/// Driver facts printed by tests and the benchmark.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub driver_version: i32,
    pub compute_capability: (i32, i32),
    pub sm_count: u32,
    pub max_smem_per_block_optin: u32,
}

pub fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, DriverError> {
    use sys::CUdevice_attribute::*;
    let mut dv = 0i32;
    // SAFETY: plain query with a valid out pointer.
    unsafe { sys::cuDriverGetVersion(&mut dv) }.result()?;
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        driver_version: dv,
        compute_capability: ctx.compute_capability()?,
        sm_count: ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        max_smem_per_block_optin: ctx
            .attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as u32,
    })
}

/// Device memory owned by this value (`cuMemAlloc`/`cuMemFree`). Free errors in
/// `Drop` are recorded in the log, never panicked on.
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<DeviceBuffer, DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: allocation of at least one byte; the memory is owned by the value.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }?;
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len,
        })
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Synchronous copy from the host into `self[off..off + src.len()]`.
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), DriverError> {
        assert!(
            off + src.len() <= self.len,
            "DeviceBuffer::write out of range"
        );
        self.ctx.bind_to_thread()?;
        // SAFETY: the range is inside the allocation; the copy is synchronous.
        unsafe {
            sys::cuMemcpyHtoD_v2(
                self.ptr + off as u64,
                src.as_ptr() as *const c_void,
                src.len(),
            )
        }
        .result()
    }
    /// Synchronous copy of `self[off..off + dst.len()]` to the host.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), DriverError> {
        assert!(
            off + dst.len() <= self.len,
            "DeviceBuffer::read out of range"
        );
        self.ctx.bind_to_thread()?;
        // SAFETY: as in write.
        unsafe {
            sys::cuMemcpyDtoH_v2(
                dst.as_mut_ptr() as *mut c_void,
                self.ptr + off as u64,
                dst.len(),
            )
        }
        .result()
    }
    /// Synchronous fill.
    pub fn fill(&self, v: u8) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the whole allocation.
        unsafe { sys::cuMemsetD8_v2(self.ptr, v, self.len) }.result()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let r = self.ctx.bind_to_thread().and_then(|_| {
            // SAFETY: allocated by malloc_sync and freed once.
            unsafe { result::free_sync(self.ptr) }
        });
        if let Err(e) = r {
            tracing::warn!("gpu: cuMemFree failed: {e}");
        }
    }
}

// SAFETY: a device address is plain data; the context is thread-safe.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

/// Page-locked host memory mapped into the device address space
/// (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`): the kernels write job results here and
/// the host polls them without a stream synchronisation.
pub struct MappedHost {
    ctx: Arc<CudaContext>,
    host: *mut u8,
    dev: u64,
    len: usize,
}

impl MappedHost {
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<MappedHost, DriverError> {
        ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocation owned by the value; zeroed before use.
        let host = unsafe { result::malloc_host(len.max(1), flags) }? as *mut u8;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host was returned by cuMemHostAlloc with DEVICEMAP.
        let r =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) }.result();
        if let Err(e) = r {
            // SAFETY: allocated above, freed once.
            let _ = unsafe { result::free_host(host as *mut c_void) };
            return Err(e);
        }
        // SAFETY: len.max(1) bytes were allocated.
        unsafe { std::ptr::write_bytes(host, 0, len.max(1)) };
        Ok(MappedHost {
            ctx: ctx.clone(),
            host,
            dev,
            len,
        })
    }
    pub fn dev_ptr(&self) -> u64 {
        self.dev
    }
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        let r = self.ctx.bind_to_thread().and_then(|_| {
            // SAFETY: allocated by malloc_host and freed once.
            unsafe { result::free_host(self.host as *mut c_void) }
        });
        if let Err(e) = r {
            tracing::warn!("gpu: cuMemFreeHost failed: {e}");
        }
    }
}

// SAFETY: the mapping is plain memory owned by this value.
unsafe impl Send for MappedHost {}
unsafe impl Sync for MappedHost {}

/// A raw CUDA event handle that may move between threads (the driver's handles are
/// thread-safe; the owner decides when, if ever, it is destroyed).
#[derive(Clone, Copy, Debug)]
pub struct RawEvent(pub cudarc::driver::sys::CUevent);

// SAFETY: CUDA event handles may be used from any thread of the process.
unsafe impl Send for RawEvent {}
// SAFETY: as above; the driver serializes concurrent use.
unsafe impl Sync for RawEvent {}
