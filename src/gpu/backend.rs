//! Device memory in the data path: what a transport's I/O thread needs to move a
//! chunk of a CUDA buffer (`NCCL_PTR_CUDA`) on and off the wire.
//!
//! A [`Backend`] is one device; a [`Lane`] is one I/O thread's share of it: a
//! pinned, device-mapped staging buffer (bounded: one compressed chunk), a CUDA
//! stream and a one-job kernel batch. Per chunk:
//!
//! * send: the GPU kernel compresses the chunk straight from device memory into the
//!   staging buffer ([`Lane::encode`]), or the chunk is copied there raw
//!   ([`Lane::download`]); the socket writes from staging;
//! * receive: the socket reads into staging; the GPU kernel decodes from there into
//!   NCCL's device buffer ([`Lane::decode`]), or raw bytes are copied up
//!   ([`Lane::upload`]).
//!
//! Each I/O thread runs its own chunk, so encode, copies and the socket of
//! different streams overlap (split-send across streams, as on the host path).
//!
//! Two backends:
//! * [`cuda`](super::cuda_lane) — the real one (cudarc, loaded at run time). When the
//!   kernels cannot load, its lanes still work: [`Lane::kernels`] is false and the
//!   caller compresses the downloaded chunk on the CPU.
//! * [`SimBackend`] — `NCCL_ZIP_GPU_EMULATE=1|nokernels`: "device memory" is host
//!   memory touched only through this interface, and the CPU codec plays the
//!   kernels (it produces the same bytes: tests/kernels_host.rs). It exists so the
//!   device data path is tested end to end on machines without a GPU.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::codec::{self, EncodeOptions};
use crate::error::{Error, Result};
use crate::stats::Charge;

/// `NCCL_ZIP_GPU_EMULATE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Emulation {
    /// Real CUDA only (default).
    #[default]
    Off,
    /// Emulated device memory; the CPU codec stands in for the kernels.
    Kernels,
    /// Emulated device memory without kernels: exercises the copy + CPU codec fallback.
    NoKernels,
}

impl Emulation {
    /// A value of `NCCL_ZIP_GPU_EMULATE`: `0`/`off`/empty, `1`/`on`, `nokernels`
    /// (any case); `None` for anything else.
    pub fn parse(v: &str) -> Option<Emulation> {
        match v.to_ascii_lowercase().as_str() {
            "0" | "off" | "" => Some(Emulation::Off),
            "1" | "on" => Some(Emulation::Kernels),
            "nokernels" => Some(Emulation::NoKernels),
            _ => None,
        }
    }
}

/// One I/O thread's resources on a device. All offsets are into its staging buffer.
pub trait Lane: Send {
    /// The staging buffer's first `len` bytes (host view), for the socket to fill.
    fn staging(&mut self, len: usize) -> Result<&mut [u8]>;
    /// The staging buffer's bytes `[off, off + len)`, for the socket to send.
    fn bytes(&self, off: usize, len: usize) -> &[u8];
    /// Whether GPU kernels run on this lane (else [`Lane::encode`]/[`Lane::decode`]
    /// must not be called: the caller uses the CPU codec on staged bytes).
    fn kernels(&self) -> bool;
    /// Copies `len` bytes at device address `src` into `staging[..len]`.
    fn download(&mut self, src: u64, len: usize) -> Result<()>;
    /// Copies `staging[..len]` to device address `dst`.
    fn upload(&mut self, dst: u64, len: usize) -> Result<()>;
    /// Copies host bytes to device address `dst`.
    fn upload_from(&mut self, dst: u64, src: &[u8]) -> Result<()>;
    /// Compresses `len` bytes at device address `src` into `staging`, returning the
    /// frame length (at most `len + 24`; a STORED frame when coding does not shrink).
    fn encode(&mut self, src: u64, len: usize, opts: &EncodeOptions) -> Result<usize>;
    /// Decodes the frame in `staging[..frame_len]` into `cap` bytes at `dst`,
    /// returning the decoded length.
    fn decode(&mut self, frame_len: usize, dst: u64, cap: usize) -> Result<usize>;
    /// The lane's stream failed or never drained: every operation on it fails, and
    /// its pool parks it instead of handing it out again.
    fn wedged(&self) -> bool {
        false
    }
}

/// A device the data path can stage through.
pub trait Backend: Send + Sync {
    /// For log lines: the device and whether its kernels loaded.
    fn describe(&self) -> String;
    /// A lane whose staging holds `max_wire` bytes, counted in `counter`.
    fn lane<'a>(&self, max_wire: usize, counter: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>>;
    /// Makes RDMA writes a NIC has completed into this device's memory visible to
    /// later GPU work (`iflush` with GPUDirect RDMA on pre-Hopper GPUs):
    /// `cuFlushGPUDirectRDMAWrites`. Synchronous.
    fn flush_rdma_writes(&self) -> Result<()> {
        Ok(())
    }
}

/// The backend of `ptr`, a buffer NCCL registers as `NCCL_PTR_CUDA`: the emulator,
/// or the CUDA device that owns it (opened on first use, then shared by every comm).
pub fn backend_for(ptr: u64, emulate: Emulation) -> Result<Arc<dyn Backend>> {
    match emulate {
        Emulation::Off => super::cuda_lane::backend_for(ptr),
        e => {
            static SIM: OnceLock<[Arc<SimBackend>; 2]> = OnceLock::new();
            let s = SIM.get_or_init(|| {
                [
                    Arc::new(SimBackend { kernels: true }),
                    Arc::new(SimBackend { kernels: false }),
                ]
            });
            Ok(s[(e == Emulation::NoKernels) as usize].clone())
        }
    }
}

/// Whether `getProperties` may offer `NCCL_PTR_CUDA`: emulation, or a CUDA driver
/// with at least one device. Cheap after the first call; creates no context.
pub fn cuda_offered(emulate: Emulation) -> bool {
    if emulate != Emulation::Off {
        return true;
    }
    static OFFERED: OnceLock<bool> = OnceLock::new();
    *OFFERED.get_or_init(|| match super::cuda_lane::device_count() {
        Ok(n) => n > 0,
        Err(why) => {
            tracing::info!("NCCL_PTR_CUDA not offered: {why}");
            false
        }
    })
}

/// Backends opened so far, by CUDA ordinal (a failure is remembered too, so a
/// device whose kernels cannot load is probed once).
pub(crate) type Opened = Mutex<HashMap<i32, std::result::Result<Arc<dyn Backend>, String>>>;

pub(crate) fn opened() -> &'static Opened {
    static M: OnceLock<Opened> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// Emulated device: addresses are host addresses.
pub struct SimBackend {
    kernels: bool,
}

impl Backend for SimBackend {
    fn describe(&self) -> String {
        format!(
            "emulated device (NCCL_ZIP_GPU_EMULATE, {})",
            if self.kernels {
                "CPU codec as kernels"
            } else {
                "no kernels"
            }
        )
    }
    fn lane<'a>(&self, max_wire: usize, counter: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>> {
        Ok(Box::new(SimLane {
            buf: vec![0; max_wire],
            kernels: self.kernels,
            _charge: Charge::new(counter, max_wire as u64),
        }))
    }
}

struct SimLane<'a> {
    buf: Vec<u8>,
    kernels: bool,
    _charge: Charge<'a>,
}

/// # Safety
/// `addr..addr + len` must be emulated device memory registered with the plugin
/// and owned by the current request (NCCL's contract for isend/irecv buffers).
unsafe fn dev<'x>(addr: u64, len: usize) -> &'x mut [u8] {
    if len == 0 {
        return &mut [];
    }
    std::slice::from_raw_parts_mut(addr as usize as *mut u8, len)
}

fn too_big(len: usize, cap: usize) -> Error {
    Error::Internal(format!(
        "device chunk of {len} bytes exceeds the lane's {cap}-byte staging"
    ))
}

impl Lane for SimLane<'_> {
    fn staging(&mut self, len: usize) -> Result<&mut [u8]> {
        let cap = self.buf.len();
        self.buf.get_mut(..len).ok_or_else(|| too_big(len, cap))
    }
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        &self.buf[off..off + len]
    }
    fn kernels(&self) -> bool {
        self.kernels
    }
    fn download(&mut self, src: u64, len: usize) -> Result<()> {
        // SAFETY: see `dev`; the staging buffer is a distinct allocation.
        let s = unsafe { dev(src, len) };
        self.staging(len)?.copy_from_slice(s);
        Ok(())
    }
    fn upload(&mut self, dst: u64, len: usize) -> Result<()> {
        let s = self.staging(len)?;
        // SAFETY: as in download.
        unsafe { dev(dst, len) }.copy_from_slice(s);
        Ok(())
    }
    fn upload_from(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: as in download; `src` is host memory of the caller.
        unsafe { dev(dst, src.len()) }.copy_from_slice(src);
        Ok(())
    }
    fn encode(&mut self, src: u64, len: usize, opts: &EncodeOptions) -> Result<usize> {
        assert!(self.kernels, "encode on a lane without kernels");
        let need = codec::max_compressed_size(len);
        let cap = self.buf.len();
        let out = self.buf.get_mut(..need).ok_or_else(|| too_big(need, cap))?;
        // SAFETY: as in download.
        let s = unsafe { dev(src, len) };
        codec::compress(s, out, opts)
            .map_err(|e| Error::Internal(format!("emulated GPU encode failed: {e}")))
    }
    fn decode(&mut self, frame_len: usize, dst: u64, cap: usize) -> Result<usize> {
        assert!(self.kernels, "decode on a lane without kernels");
        let frame = self
            .buf
            .get(..frame_len)
            .ok_or_else(|| too_big(frame_len, self.buf.len()))?;
        // SAFETY: as in download.
        let d = unsafe { dev(dst, cap) };
        codec::decompress(frame, d)
            .map_err(|e| Error::Remote(format!("corrupt compressed chunk: {e}")))
    }
}
