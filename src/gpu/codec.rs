//! [`GpuCodec`]: the kernels of `kernels/nzc_kernels.cu` behind a batched API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use nccl_zip_codec::DtypeHint;

use super::abi::{self, DecJob, EncJob, JobResult, Status};
use super::driver::{self, DeviceBuffer, DeviceInfo, MappedHost, Unavailable};

/// The fatbin built by build.rs (empty when the build had no nvcc).
static FATBIN: &[u8] = include_bytes!(env!("NZC_FATBIN"));
/// The kernel source, flattened, for the NVRTC fallback.
static KERNEL_SRC: &str = include_str!(env!("NZC_KERNEL_SRC"));
/// `nvcc --version` release line of the build ("none" without nvcc).
pub const NVCC_VERSION: &str = env!("NZC_NVCC_VERSION");

/// The highest codec frame format (docs/FORMAT.md) the kernels decode.
pub const KERNEL_FORMAT: u8 = nccl_zip_codec::format::VERSION;

/// Whether this build embeds the compiled GPU kernels (else only NVRTC can make them).
pub fn kernels_embedded() -> bool {
    !FATBIN.is_empty()
}

/// Errors of the GPU codec API (distinct from "not available", see [`Unavailable`]).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    #[error("invalid GPU codec job: {0}")]
    InvalidJob(String),
    #[error("GPU batch still in flight")]
    Busy,
    #[error("{0}")]
    Unavailable(Unavailable),
    #[error("timed out waiting for the GPU batch")]
    Timeout,
}

/// Where the loaded kernels came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// The embedded fatbin (SASS sm_80/90/100, PTX compute_90).
    Fatbin,
    /// NVRTC compiled the embedded source at run time (driver too old for the fatbin).
    Nvrtc,
}

/// One message to compress: `n` bytes at device address `src` into a frame at `dst`
/// (capacity `dst_cap >= n + 24`). Addresses may be host-mapped pinned memory.
#[derive(Clone, Copy, Debug)]
pub struct EncodeJob {
    pub src: u64,
    pub n: u64,
    pub dst: u64,
    pub dst_cap: u64,
    pub hint: DtypeHint,
    pub checksum: bool,
    pub block_log2: u8,
}

/// One frame to decompress: `src_len` bytes at `src` into `dst` (capacity `dst_cap`).
#[derive(Clone, Copy, Debug)]
pub struct DecodeJob {
    pub src: u64,
    pub src_len: u64,
    pub dst: u64,
    pub dst_cap: u64,
}

/// Per-job outcome: the frame length (encode) or uncompressed length (decode).
pub type JobOutcome = Result<u64, Status>;

/// The GPU codec on one device: context, kernels, launch policy.
pub struct GpuCodec {
    ctx: Arc<CudaContext>,
    encode_fn: CudaFunction,
    decode_fn: CudaFunction,
    /// `nzc_decode_v2`: frames of format 2 (docs/FORMAT.md "Version 2") only.
    decode_v2_fn: CudaFunction,
    info: DeviceInfo,
    source: KernelSource,
    sms: u32,
    ctas_per_sm: u32,
    max_block_log2: u32,
    decode_block_log2: u32,
}

impl GpuCodec {
    /// Opens device `ordinal`. `Ok(None)` (with the reason) when there is no driver, no
    /// device or no loadable kernels: a normal state on CPU-only nodes. Never panics.
    pub fn new(ordinal: usize) -> Result<Result<GpuCodec, Unavailable>, GpuError> {
        if let Err(u) = driver::driver_library_present() {
            return Ok(Err(u));
        }
        match driver::guarded("GpuCodec::new", || Self::open(ordinal)) {
            Ok(r) => Ok(r),
            Err(u) => Ok(Err(u)),
        }
    }

    /// [`GpuCodec::new`] flattened: `None` when unavailable, the reason logged at INFO.
    pub fn try_new(ordinal: usize) -> Option<GpuCodec> {
        match Self::new(ordinal) {
            Ok(Ok(c)) => Some(c),
            Ok(Err(u)) => {
                tracing::info!("gpu codec unavailable: {u}");
                None
            }
            Err(e) => {
                tracing::warn!("gpu codec: {e}");
                None
            }
        }
    }

    fn open(ordinal: usize) -> Result<GpuCodec, Unavailable> {
        let dc = |e: DriverError| Unavailable::DriverCall(e.to_string());
        cudarc::driver::result::init()
            .map_err(|e| Unavailable::NoDevice(format!("cuInit: {e}")))?;
        let count = cudarc::driver::result::device::get_count().map_err(dc)?;
        if count <= 0 || ordinal >= count as usize {
            return Err(Unavailable::NoDevice(format!(
                "{count} CUDA devices, wanted #{ordinal}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(dc)?;
        // SAFETY: nothing here uses cudarc's CudaSlice (all buffers are raw
        // allocations whose uses we order ourselves). With tracking on, the first
        // `new_stream` would call cuCtxSynchronize on the primary context that the
        // application and NCCL share: a deadlock when NCCL's kernel is waiting for
        // the very data this plugin is about to move.
        unsafe { ctx.disable_event_tracking() };
        let info = driver::device_info(&ctx).map_err(dc)?;
        if info.compute_capability.0 < 8 {
            return Err(Unavailable::NoDevice(format!(
                "compute capability {}.{} < 8.0",
                info.compute_capability.0, info.compute_capability.1
            )));
        }
        // The context and the module are never released, also when a step below
        // fails: unloading a module (or destroying the context) may wait for the
        // device, where NCCL's kernels may be spinning (driver::keep_forever).
        driver::keep_forever(ctx.clone());
        let (module, source) = load_module(&ctx)?;
        driver::keep_forever(module.clone());
        // cuModuleGetFunction loads the kernel (driver API, lazy loading: CUDA
        // Programming Guide, "Lazy Loading").
        let encode_fn = module.load_function("nzc_encode").map_err(dc)?;
        let decode_fn = module.load_function("nzc_decode").map_err(dc)?;
        let decode_v2_fn = module.load_function("nzc_decode_v2").map_err(dc)?;
        // Load both kernels now, not lazily at their first launch
        // (CUDA_MODULE_LOADING=LAZY is the default since CUDA 12.2): a lazy load
        // may wait for the device, which would wait on NCCL kernels that wait on
        // this plugin. Drivers >= 12.4 can say so: cuFuncLoad, then cuFuncIsLoaded
        // must read LOADED, else the kernels count as unavailable (lanes then copy
        // and the CPU codec runs: slower, never stuck).
        for (name, f) in [
            ("nzc_encode", &encode_fn),
            ("nzc_decode", &decode_fn),
            ("nzc_decode_v2", &decode_v2_fn),
        ] {
            // SAFETY: a function handle of a module that stays loaded. A driver
            // older than 12.4 lacks the calls: cudarc panics, `guarded` (our
            // caller) would turn that into "unavailable", so probe them separately.
            let r = driver::guarded("cuFuncLoad", || unsafe {
                cudarc::driver::sys::cuFuncLoad(f.cu_function())
            });
            if let Ok(r) = r {
                r.result().map_err(dc)?;
            }
            use cudarc::driver::sys::CUfunctionLoadingState as L;
            let mut state = L::CU_FUNCTION_LOADING_STATE_UNLOADED;
            // SAFETY: as above; writes one enum through a valid pointer.
            let r = driver::guarded("cuFuncIsLoaded", || unsafe {
                cudarc::driver::sys::cuFuncIsLoaded(&mut state, f.cu_function())
            });
            if let Ok(cudarc::driver::sys::CUresult::CUDA_SUCCESS) = r {
                if state != L::CU_FUNCTION_LOADING_STATE_LOADED {
                    return Err(Unavailable::NoKernels(format!(
                        "{name} is still not loaded after cuFuncLoad ({state:?}): a lazy load at its first launch could wait on NCCL's kernels"
                    )));
                }
            }
        }
        // Largest block size whose shared memory fits this device.
        let mut max_block_log2 = 20;
        while max_block_log2 > 12
            && abi::smem_bytes(max_block_log2) > info.max_smem_per_block_optin as u64
        {
            max_block_log2 -= 1;
        }
        use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAXSMEM;
        let smem = abi::smem_bytes(max_block_log2) as i32;
        encode_fn.set_attribute(MAXSMEM, smem).map_err(dc)?;
        decode_fn.set_attribute(MAXSMEM, smem).map_err(dc)?;
        // nzc_decode_v2's carve needs less than the others' at every block size
        // from 64 KiB up, and more below (its staging); set what its largest uses.
        decode_v2_fn
            .set_attribute(MAXSMEM, abi::smem_bytes_v2(max_block_log2) as i32)
            .map_err(dc)?;
        let cfg = crate::config::current();
        let sms = cfg.gpu_sms.clamp(1, info.sm_count.max(1));
        let decode_block_log2 = cfg.gpu_decode_block_log2.clamp(12, max_block_log2);
        let ctas_per_sm = encode_fn
            .occupancy_max_active_blocks_per_multiprocessor(
                abi::THREADS,
                abi::smem_bytes(16) as usize,
                None,
            )
            .map(|v| v.max(1))
            .unwrap_or(1);
        Ok(GpuCodec {
            ctx,
            encode_fn,
            decode_fn,
            decode_v2_fn,
            info,
            source,
            sms,
            ctas_per_sm,
            max_block_log2,
            decode_block_log2,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    pub fn kernel_source(&self) -> KernelSource {
        self.source
    }
    /// SMs a launch may occupy (`NCCL_ZIP_GPU_SMS`, default 16).
    pub fn sms(&self) -> u32 {
        self.sms
    }
    pub fn set_sms(&mut self, sms: u32) {
        self.sms = sms.clamp(1, self.info.sm_count.max(1));
    }
    pub fn ctas_per_sm(&self) -> u32 {
        self.ctas_per_sm
    }
    /// Largest `block_log2` a launch supports on this device.
    pub fn max_block_log2(&self) -> u32 {
        self.max_block_log2
    }
    /// Decode launches are sized for frames with blocks up to this size
    /// (`NCCL_ZIP_GPU_DECODE_BLOCK_LOG2`, default 16); larger ones fail with BadArgs.
    pub fn decode_block_log2(&self) -> u32 {
        self.decode_block_log2
    }

    /// Buffers for batches of up to `max_jobs` messages of up to `max_bytes` each.
    pub fn new_batch(&self, max_jobs: usize, max_bytes: u64) -> Result<GpuBatch, GpuError> {
        let max_jobs = max_jobs.max(1);
        let blocks = max_bytes.div_ceil(4096).max(1);
        let ws_per_job = (abi::ws_bytes(blocks) + 15) & !15;
        Ok(GpuBatch {
            desc_host: MappedHost::new(&self.ctx, 64 * max_jobs)?,
            desc_dev: DeviceBuffer::new(&self.ctx, 64 * max_jobs)?,
            ws: DeviceBuffer::new(&self.ctx, ws_per_job as usize * max_jobs)?,
            results: MappedHost::new(&self.ctx, 16 * max_jobs)?,
            max_jobs,
            max_bytes,
            ws_per_job,
            njobs: 0,
            mark: None,
        })
    }

    /// Launches one kernel that compresses all `jobs` (asynchronous on `stream`).
    /// Results: [`GpuBatch::wait`] / [`GpuBatch::poll`].
    ///
    /// # Safety
    /// Every `src`/`dst` must be device-accessible memory of the stated sizes that
    /// stays valid, and is not written by anyone else, until the batch completes.
    pub unsafe fn encode_batch(
        &self,
        stream: &CudaStream,
        batch: &mut GpuBatch,
        jobs: &[EncodeJob],
    ) -> Result<(), GpuError> {
        batch.begin(jobs.len())?;
        let mut items = 0u64;
        let mut smem_log2 = 12u32;
        for (i, j) in jobs.iter().enumerate() {
            let bl = j.block_log2 as u32;
            if !(12..=self.max_block_log2).contains(&bl) {
                return Err(GpuError::InvalidJob(format!(
                    "job {i}: block_log2 {bl} not in 12..={}",
                    self.max_block_log2
                )));
            }
            if j.n > batch.max_bytes || j.dst_cap < j.n + 24 {
                return Err(GpuError::InvalidJob(format!(
                    "job {i}: n {} (batch max {}), dst_cap {}",
                    j.n, batch.max_bytes, j.dst_cap
                )));
            }
            let nb = j.n.div_ceil(1 << bl);
            items += nb.max(1);
            smem_log2 = smem_log2.max(bl);
            batch.put(
                i,
                as_bytes(&EncJob {
                    src: j.src,
                    dst: j.dst,
                    n: j.n,
                    dst_cap: j.dst_cap,
                    ws: batch.ws_ptr(i),
                    result: batch.result_dev(i),
                    hint: abi::hint_code(j.hint),
                    checksum: j.checksum as u32,
                    block_log2: bl,
                    nb: nb as u32,
                }),
            );
        }
        self.launch(
            stream,
            &self.encode_fn,
            batch,
            jobs.len(),
            items,
            (smem_log2, abi::smem_bytes(smem_log2)),
        )
    }

    /// Launches one kernel that decompresses all `jobs`, frames of format 1 (the wire
    /// default), asynchronous on `stream`.
    ///
    /// # Safety
    /// As [`GpuCodec::encode_batch`].
    pub unsafe fn decode_batch(
        &self,
        stream: &CudaStream,
        batch: &mut GpuBatch,
        jobs: &[DecodeJob],
    ) -> Result<(), GpuError> {
        // SAFETY: the caller's obligations are decode_batch_format's.
        unsafe { self.decode_batch_format(stream, batch, jobs, 1) }
    }

    /// [`GpuCodec::decode_batch`] for frames of `format` (1 or 2: the version byte
    /// of docs/FORMAT.md §2, V2.1): one kernel per format (`nzc_decode`,
    /// `nzc_decode_v2`), each rejecting the other's frames as `Status::Header`.
    /// The format is what the peer writes (negotiated at connection setup); other
    /// values are `InvalidJob`.
    ///
    /// # Safety
    /// As [`GpuCodec::encode_batch`].
    pub unsafe fn decode_batch_format(
        &self,
        stream: &CudaStream,
        batch: &mut GpuBatch,
        jobs: &[DecodeJob],
        format: u8,
    ) -> Result<(), GpuError> {
        let (f, smem) = match format {
            1 => (&self.decode_fn, abi::smem_bytes(self.decode_block_log2)),
            2 => (
                &self.decode_v2_fn,
                abi::smem_bytes_v2(self.decode_block_log2),
            ),
            _ => {
                return Err(GpuError::InvalidJob(format!(
                    "frame format {format} (the kernels decode 1 and 2)"
                )))
            }
        };
        batch.begin(jobs.len())?;
        let mut items = 0u64;
        for (i, j) in jobs.iter().enumerate() {
            if j.dst_cap > batch.max_bytes {
                return Err(GpuError::InvalidJob(format!(
                    "job {i}: dst_cap {} > batch max {}",
                    j.dst_cap, batch.max_bytes
                )));
            }
            items += j.dst_cap.div_ceil(1 << self.decode_block_log2).max(1);
            batch.put(
                i,
                as_bytes(&DecJob {
                    src: j.src,
                    src_len: j.src_len,
                    dst: j.dst,
                    dst_cap: j.dst_cap,
                    ws: batch.ws_ptr(i),
                    result: batch.result_dev(i),
                    ws_blocks: batch.max_bytes.div_ceil(4096).max(1),
                    reserved: 0,
                }),
            );
        }
        self.launch(
            stream,
            f,
            batch,
            jobs.len(),
            items,
            (self.decode_block_log2, smem),
        )
    }

    /// Grid size for `items` work items under the SM cap.
    pub fn grid_for(&self, items: u64) -> u32 {
        (items.max(1)).min((self.sms * self.ctas_per_sm) as u64) as u32
    }

    unsafe fn launch(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        batch: &mut GpuBatch,
        njobs: usize,
        items: u64,
        // (block_log2 the launch is sized for, its dynamic shared memory: the
        // kernel's carve, `abi::smem_bytes` or `abi::smem_bytes_v2`)
        (smem_log2, smem_bytes): (u32, u64),
    ) -> Result<(), GpuError> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread()?;
        let s = stream.cu_stream();
        sys::cuMemcpyHtoDAsync_v2(
            batch.desc_dev.ptr(),
            batch.desc_host.host_ptr() as *const _,
            64 * njobs,
            s,
        )
        .result()?;
        sys::cuMemsetD8Async(batch.ws.ptr(), 0, batch.ws_per_job as usize * njobs, s).result()?;
        if let Some(ev) = batch.mark {
            sys::cuEventRecord(ev.0, s).result()?;
        }
        let cfg = LaunchConfig {
            grid_dim: (self.grid_for(items), 1, 1),
            block_dim: (abi::THREADS, 1, 1),
            shared_mem_bytes: smem_bytes as u32,
        };
        let (jobs_ptr, nj, sl) = (batch.desc_dev.ptr(), njobs as u32, smem_log2);
        let mut b = stream.launch_builder(f);
        b.arg(&jobs_ptr).arg(&nj).arg(&sl);
        b.launch(cfg)?;
        batch.njobs = njobs;
        Ok(())
    }
}

fn as_bytes<T: Copy>(v: &T) -> [u8; 64] {
    let mut out = [0u8; 64];
    let n = std::mem::size_of::<T>().min(64);
    // SAFETY: T is a plain repr(C) descriptor of at most 64 bytes, no padding reads beyond it.
    unsafe { std::ptr::copy_nonoverlapping(v as *const T as *const u8, out.as_mut_ptr(), n) };
    out
}

fn load_module(
    ctx: &Arc<CudaContext>,
) -> Result<(Arc<cudarc::driver::CudaModule>, KernelSource), Unavailable> {
    let mut why = Vec::new();
    let force_nvrtc = crate::config::current().gpu_force_nvrtc;
    if FATBIN.is_empty() {
        why.push("library built without nvcc (empty fatbin)".to_string());
    } else if force_nvrtc {
        why.push("NCCL_ZIP_GPU_FORCE_NVRTC=1".to_string());
    } else {
        match ctx.load_module(Ptx::from_binary(FATBIN.to_vec())) {
            Ok(m) => return Ok((m, KernelSource::Fatbin)),
            Err(e) => why.push(format!(
                "fatbin does not load ({e}; CUDA 13 code needs driver >= 580)"
            )),
        }
    }
    if !driver::nvrtc_library_present() {
        why.push("no libnvrtc for the fallback".into());
        return Err(Unavailable::NoKernels(why.join("; ")));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_80"),
        options: vec!["-std=c++17".into()],
        ..Default::default()
    };
    let r = driver::guarded("nvrtc", || {
        cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SRC, opts)
    });
    match r {
        Ok(Ok(ptx)) => match ctx.load_module(ptx) {
            Ok(m) => {
                tracing::warn!(
                    "gpu codec: using NVRTC-compiled kernels ({})",
                    why.join("; ")
                );
                Ok((m, KernelSource::Nvrtc))
            }
            Err(e) => {
                why.push(format!("NVRTC PTX does not load: {e}"));
                Err(Unavailable::NoKernels(why.join("; ")))
            }
        },
        Ok(Err(e)) => {
            why.push(format!("NVRTC compile failed: {e}"));
            Err(Unavailable::NoKernels(why.join("; ")))
        }
        Err(u) => {
            why.push(u.to_string());
            Err(Unavailable::NoKernels(why.join("; ")))
        }
    }
}

/// Buffers of one batch: descriptors, job workspaces and results (host-mapped).
/// Reusable once the previous batch has completed.
pub struct GpuBatch {
    desc_host: MappedHost,
    desc_dev: DeviceBuffer,
    ws: DeviceBuffer,
    results: MappedHost,
    max_jobs: usize,
    max_bytes: u64,
    ws_per_job: u64,
    njobs: usize,
    /// An event recorded on the launch's stream right before the kernel (after the
    /// descriptor copy and the workspace memset), when set: a lane whose stream does
    /// not drain tells with it whether the work before the kernel ran.
    mark: Option<driver::RawEvent>,
}

impl GpuBatch {
    /// Records `ev` on the stream right before each later launch's kernel.
    ///
    /// # Safety
    /// `ev` must be an event of this batch's context that outlives the batch.
    pub unsafe fn set_mark(&mut self, ev: driver::RawEvent) {
        self.mark = Some(ev);
    }

    fn begin(&mut self, njobs: usize) -> Result<(), GpuError> {
        if self.njobs != 0 && !self.poll() {
            return Err(GpuError::Busy);
        }
        if njobs == 0 || njobs > self.max_jobs {
            return Err(GpuError::InvalidJob(format!(
                "{njobs} jobs (batch holds 1..={})",
                self.max_jobs
            )));
        }
        self.njobs = 0;
        // SAFETY: the results area holds max_jobs entries and no kernel uses it now.
        unsafe { std::ptr::write_bytes(self.results.host_ptr(), 0, 16 * njobs) };
        Ok(())
    }
    fn put(&mut self, i: usize, d: [u8; 64]) {
        // SAFETY: i < max_jobs (checked in begin by the callers' loop bound).
        unsafe {
            std::ptr::copy_nonoverlapping(d.as_ptr(), self.desc_host.host_ptr().add(64 * i), 64)
        };
    }
    fn ws_ptr(&self, i: usize) -> u64 {
        self.ws.ptr() + self.ws_per_job * i as u64
    }
    fn result_dev(&self, i: usize) -> u64 {
        self.results.dev_ptr() + 16 * i as u64
    }
    fn result(&self, i: usize) -> JobResult {
        // SAFETY: in range; volatile because the device writes it concurrently.
        unsafe { std::ptr::read_volatile((self.results.host_ptr() as *const JobResult).add(i)) }
    }
    /// Jobs of the last launch.
    pub fn len(&self) -> usize {
        self.njobs
    }
    pub fn is_empty(&self) -> bool {
        self.njobs == 0
    }
    /// True when every job of the last launch has published its result. When it
    /// is, the results and everything the kernel wrote before them (frames in
    /// mapped memory) may be read: the acquire fence keeps those reads after the
    /// reads of `done` (the kernel writes `done` last, after a system-scope fence).
    pub fn poll(&self) -> bool {
        let done = (0..self.njobs).all(|i| self.result(i).done != 0);
        if done {
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        }
        done
    }
    /// Spins on the host-mapped results until all jobs are done (no stream sync).
    pub fn wait(&self, timeout: Duration) -> Result<Vec<JobOutcome>, GpuError> {
        let t0 = Instant::now();
        while !self.poll() {
            if t0.elapsed() > timeout {
                return Err(GpuError::Timeout);
            }
            std::hint::spin_loop();
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        Ok(self.outcomes())
    }
    /// Forgets the last launch, whose kernel is known to have finished (its stream
    /// drained) without publishing every result: the batch is reusable at once
    /// instead of reporting [`GpuError::Busy`] for good.
    pub fn forget_launch(&mut self) {
        self.njobs = 0;
    }
    /// Results of the last launch (meaningful once [`GpuBatch::poll`] is true).
    pub fn outcomes(&self) -> Vec<JobOutcome> {
        (0..self.njobs)
            .map(|i| {
                let r = self.result(i);
                match Status::from_u32(r.status) {
                    Status::Ok if r.done != 0 => Ok(r.len),
                    Status::Ok => Err(Status::Unknown(u32::MAX)),
                    s => Err(s),
                }
            })
            .collect()
    }
}
