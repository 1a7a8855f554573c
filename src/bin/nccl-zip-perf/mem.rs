//! `--mem`: where the send and receive buffers live and how they are registered.
//!
//! * `host`: `Vec<u8>`, registered `NCCL_PTR_HOST` (what NCCL does for host buffers).
//! * `cuda` on a GPU: `cuMemAlloc` memory on device 0 ([`DeviceBuffer`]), registered
//!   `NCCL_PTR_CUDA`; payloads go in and come back out by synchronous copies.
//! * `cuda` with `NCCL_ZIP_GPU_EMULATE=1|nokernels`: `Vec<u8>` registered
//!   `NCCL_PTR_CUDA`. The plugin treats such memory as emulated device memory (host
//!   bytes it only touches through its device path); this tool reads and writes
//!   them directly.
//!
//! Nothing here panics on a machine without a GPU: libcuda is probed first and every
//! cudarc call runs under [`guarded`].

use std::ffi::c_int;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use nccl_net_zip::ffi::abi::{NCCL_PTR_CUDA, NCCL_PTR_HOST};
use nccl_net_zip::gpu::driver::{driver_library_present, guarded};
use nccl_net_zip::gpu::DeviceBuffer;

use crate::cli::MemKind;

const EMULATE_VAR: &str = "NCCL_ZIP_GPU_EMULATE";

/// The memory kind of a run, opened once before the plugin is loaded (NCCL too has
/// its CUDA context before it loads a net plugin).
pub enum Mem {
    Host,
    /// Real device memory in device 0's primary context.
    Device {
        ctx: Arc<CudaContext>,
        name: String,
    },
    /// Host memory registered as `NCCL_PTR_CUDA`; `setting` is the variable's value.
    Emulated {
        setting: String,
    },
}

/// `NCCL_ZIP_GPU_EMULATE` when it asks for emulation: `Ok(Some(value))`.
fn emulation() -> Result<Option<String>, String> {
    match std::env::var(EMULATE_VAR) {
        Err(_) => Ok(None),
        // The plugin's own parsing.
        Ok(v) => match nccl_net_zip::gpu::Emulation::parse(&v) {
            Some(nccl_net_zip::gpu::Emulation::Off) => Ok(None),
            Some(_) => Ok(Some(v)),
            None => Err(format!("{EMULATE_VAR}={v}: expected 0|1|nokernels")),
        },
    }
}

impl Mem {
    pub fn open(kind: MemKind) -> Result<Mem, String> {
        if kind == MemKind::Host {
            return Ok(Mem::Host);
        }
        // Under emulation the plugin reads NCCL_PTR_CUDA memory as host bytes, so
        // real device pointers must not reach it even when a GPU is present.
        if let Some(setting) = emulation()? {
            return Ok(Mem::Emulated { setting });
        }
        const NEED: &str = "--mem cuda needs a CUDA GPU, or NCCL_ZIP_GPU_EMULATE=1 to emulate one";
        driver_library_present().map_err(|e| format!("{NEED} ({e})"))?;
        let ctx = guarded("cuInit / primary context of device 0", || {
            CudaContext::new(0)
        })
        .map_err(|e| format!("{NEED} ({e})"))?
        .map_err(|e| format!("{NEED} (device 0: {e})"))?;
        let name = guarded("cuDeviceGetName", || ctx.name())
            .map_err(|e| e.to_string())?
            .unwrap_or_else(|e| format!("<name unavailable: {e}>"));
        Ok(Mem::Device { ctx, name })
    }

    pub fn kind(&self) -> MemKind {
        match self {
            Mem::Host => MemKind::Host,
            _ => MemKind::Cuda,
        }
    }

    /// The `type` argument of `regMr`.
    pub fn ptr_type(&self) -> c_int {
        match self {
            Mem::Host => NCCL_PTR_HOST as c_int,
            _ => NCCL_PTR_CUDA as c_int,
        }
    }

    /// The one line that says which mode runs.
    pub fn describe(&self) -> String {
        match self {
            Mem::Host => "mem: host".into(),
            Mem::Device { ctx, name } => format!("mem: cuda (device {}: {name})", ctx.ordinal()),
            Mem::Emulated { setting } => {
                format!("mem: cuda (emulated by {EMULATE_VAR}={setting})")
            }
        }
    }

    /// A zeroed buffer of `len` bytes.
    pub fn alloc(&self, len: usize) -> Result<Buf, String> {
        match self {
            Mem::Host | Mem::Emulated { .. } => Ok(Buf::Host(vec![0u8; len])),
            Mem::Device { ctx, .. } => {
                let d = guarded("cuMemAlloc", || DeviceBuffer::new(ctx, len))
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("cuMemAlloc of {len} bytes: {e}"))?;
                let b = Buf::Device(d, ctx.clone());
                b.settle("cuMemsetD8", |d| d.fill(0))?;
                Ok(b)
            }
        }
    }
}

/// One registered buffer.
pub enum Buf {
    Host(Vec<u8>),
    Device(DeviceBuffer, Arc<CudaContext>),
}

impl Buf {
    /// The address given to `regMr`, `isend` and `irecv` (a device address for
    /// device memory).
    pub fn ptr(&mut self) -> *mut u8 {
        match self {
            Buf::Host(v) => v.as_mut_ptr(),
            Buf::Device(d, _) => d.ptr() as usize as *mut u8,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buf::Host(v) => v.len(),
            Buf::Device(d, _) => d.len(),
        }
    }

    /// The bytes themselves when this process can address them.
    pub fn host(&self) -> Option<&[u8]> {
        match self {
            Buf::Host(v) => Some(v),
            Buf::Device(..) => None,
        }
    }

    pub fn host_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Buf::Host(v) => Some(v),
            Buf::Device(..) => None,
        }
    }

    /// Runs a device operation, then waits until the device has finished it: a
    /// synchronous copy from pageable memory may return before its DMA lands, and
    /// the plugin must see the bytes (and must not have its writes overrun by a late
    /// guard or poison copy) from whatever stream it uses.
    fn settle(
        &self,
        what: &str,
        f: impl FnOnce(&DeviceBuffer) -> Result<(), cudarc::driver::DriverError>,
    ) -> Result<(), String> {
        let Buf::Device(d, ctx) = self else {
            return Ok(());
        };
        guarded(what, || f(d).and_then(|_| ctx.synchronize()))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{what}: {e}"))
    }

    /// Copies `src` into `self[off..off + src.len()]`.
    pub fn load(&mut self, off: usize, src: &[u8]) -> Result<(), String> {
        if off + src.len() > self.len() {
            return Err(format!(
                "load of {} bytes at {off} past a {}-byte buffer",
                src.len(),
                self.len()
            ));
        }
        match self {
            Buf::Host(v) => {
                v[off..off + src.len()].copy_from_slice(src);
                Ok(())
            }
            Buf::Device(..) => self.settle("cuMemcpyHtoD", |d| d.write(off, src)),
        }
    }

    /// Copies `self[off..off + dst.len()]` out into `dst`.
    pub fn store(&self, off: usize, dst: &mut [u8]) -> Result<(), String> {
        if off + dst.len() > self.len() {
            return Err(format!(
                "store of {} bytes at {off} past a {}-byte buffer",
                dst.len(),
                self.len()
            ));
        }
        match self {
            Buf::Host(v) => {
                dst.copy_from_slice(&v[off..off + dst.len()]);
                Ok(())
            }
            // Device-to-pageable-host copies return only once complete.
            Buf::Device(d, _) => guarded("cuMemcpyDtoH", || d.read(off, dst))
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("cuMemcpyDtoH: {e}")),
        }
    }
}
