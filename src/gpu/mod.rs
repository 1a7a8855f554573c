//! GPU codec: the CUDA kernels of `kernels/` (frames of docs/FORMAT.md, byte-identical
//! to the CPU encoder in `nccl-zip-codec`), loaded at run time through cudarc.
//!
//! Layers (as cudarc's sys/result/safe): [`abi`] holds the `#[repr(C)]` descriptors
//! shared with the kernels; [`driver`] probes libcuda without linking it and owns
//! device/pinned memory; [`codec`] is the safe API.
//!
//! ```no_run
//! use nccl_net_zip::gpu::{GpuCodec, EncodeJob};
//! # fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let Some(codec) = GpuCodec::try_new(0) else { return Ok(()) }; // no GPU: CPU path
//! let stream = codec.context().default_stream();
//! let mut batch = codec.new_batch(8, 1 << 20)?;
//! # let (src, dst, n) = (0u64, 0u64, 0u64);
//! let jobs = [EncodeJob { src, n, dst, dst_cap: n + 24, hint: Default::default(),
//!                         checksum: false, block_log2: 16 }];
//! unsafe { codec.encode_batch(&stream, &mut batch, &jobs)? };
//! let lens = batch.wait(std::time::Duration::from_secs(1))?; // frame lengths
//! # Ok(()) }
//! ```
//!
//! * One launch per batch (up to `max_jobs` messages); a CTA claims the blocks of
//!   each message in order; at most `NCCL_ZIP_GPU_SMS` (default 16) SMs.
//! * Results land in host-mapped memory: [`GpuBatch::poll`] / [`GpuBatch::wait`]
//!   need no stream synchronisation.
//! * [`GpuCodec::new`] returns the reason when the GPU path is unavailable (no
//!   driver, no device, kernels that neither load nor NVRTC-compile); nothing panics.
//!
//! Design and the variants still to measure: docs/GPU.md.

pub mod abi;
pub mod backend;
pub mod codec;
mod cuda_lane;
pub mod driver;
pub mod pool;

pub use abi::Status;
pub use backend::{backend_for, cuda_offered, Backend, Emulation, Lane};
pub use codec::{
    DecodeJob, EncodeJob, GpuBatch, GpuCodec, GpuError, JobOutcome, KernelSource, NVCC_VERSION,
};
pub use driver::{DeviceBuffer, DeviceInfo, MappedHost, Unavailable};
