//! Chunks of CUDA buffers (`NCCL_PTR_CUDA`) on the IB data path: GPUDirect RDMA
//! for raw chunks, a GPU lane for compressed ones. See docs/IB.md, "Device
//! buffers".
//!
//! The HCA reads and writes NCCL's device buffer directly (its registration
//! covers it: nvidia-peermem or DMA-BUF), so a raw chunk never touches the host.
//! Only compressed chunks go through a [`Lane`](crate::gpu::Lane):
//!
//! * send: the GPU kernel encodes the chunk from device memory into the lane's
//!   pinned staging, and the frame is copied into one of the sender's registered
//!   compression buffers, which the HCA then reads. That copy (compressed bytes
//!   only) goes away once the lane staging itself is registered with the HCA.
//!   A frame that does not shrink is dropped and the chunk goes raw by GDR.
//!   Without kernels the chunk is copied down and the CPU codec runs on it.
//! * receive: the frame lands in the receiver's registered staging pool as for
//!   host buffers; it is copied into the lane's staging and the GPU decodes it
//!   into NCCL's buffer. Without kernels the CPU decodes it and the result is
//!   copied up.
//!
//! Lanes come from the process-wide pools of [`crate::gpu::pool`] (per device
//! and direction, `NCCL_ZIP_GPU_LANES`), as on TCP. The comm's progress thread
//! takes one per compressed device chunk and gives it back as soon as the chunk
//! is coded: it is held only while the GPU (or the copy) works, never across a
//! network wait. Every lane operation completes before it returns, so a received
//! chunk counts as placed only when the device buffer holds its bytes.

use std::sync::Arc;

use crate::codec_glue::{decode_chunk, max_wire, now_ns, Coder};
use crate::error::{Error, Result};
use crate::gpu::pool::{pool, Dir, LaneGuard, LanePool};
use crate::gpu::Backend;
use crate::stats::Stats;

/// One protocol side's access to GPU lanes for its CUDA buffers, and a host
/// buffer for the CPU codec when the device has no kernels.
pub struct DevLane {
    dir: Dir,
    /// Lanes per device and direction (`NCCL_ZIP_GPU_LANES`).
    lanes: usize,
    /// (backend identity, its pool), found on first use.
    pool: Option<(usize, Arc<LanePool>)>,
    max_chunk: usize,
    fallback: Vec<u8>,
}

impl DevLane {
    /// For chunks of at most `max_chunk` bytes (the comm's compression chunk
    /// size), on the `dir` side, with pools of `lanes` lanes.
    pub fn new(dir: Dir, max_chunk: usize, lanes: usize) -> DevLane {
        DevLane {
            dir,
            lanes,
            pool: None,
            max_chunk,
            fallback: Vec::new(),
        }
    }

    /// Whether a device chunk has needed a lane yet (tests).
    pub fn has_lane(&self) -> bool {
        self.pool.is_some()
    }

    /// A lane of `b` for one chunk; it goes back to the pool when dropped.
    fn lane(&mut self, b: &Arc<dyn Backend>) -> Result<LaneGuard> {
        let id = Arc::as_ptr(b) as *const () as usize;
        if self.pool.as_ref().map(|p| p.0) != Some(id) {
            let p = pool(b, self.dir, max_wire(self.max_chunk), self.lanes);
            self.pool = Some((id, p));
        }
        // Lanes are held only while a chunk is coded, so a wait is short; the
        // pool gives up (an error) after its timeout.
        self.pool.as_ref().expect("set above").1.acquire(&|| false)
    }

    /// Sender: compresses `len` bytes at device address `src` of `b` into `out`
    /// (a registered buffer) when the policy wants it and the frame comes out
    /// smaller. `None`: send the chunk raw, straight from device memory. Does not
    /// count `chunks_device` (the protocol counts every device chunk).
    pub fn compress_into(
        &mut self,
        b: &Arc<dyn Backend>,
        coder: &Coder,
        src: u64,
        len: usize,
        out: &mut [u8],
        stats: &Stats,
    ) -> Result<Option<usize>> {
        if len == 0 || len > self.max_chunk || !coder.wants(len, stats) {
            return Ok(None);
        }
        let mut lane = self.lane(b)?;
        if !lane.kernels() {
            lane.download(src, len)?;
            return Ok(coder.compress(lane.bytes(0, len), out, stats));
        }
        let t0 = now_ns();
        match lane.encode(src, len, &coder.opts) {
            Ok(n) => {
                // A STORED frame (n >= len) is dropped: GDR sends the chunk itself.
                let keep = n < len && n <= out.len();
                if keep {
                    out[..n].copy_from_slice(lane.bytes(0, n));
                }
                // The copy into the registered buffer is part of this path's cost.
                let ns = now_ns().saturating_sub(t0);
                stats.add(&stats.codec_ns, ns);
                coder.policy.record(len, n, ns);
                Ok(keep.then_some(n))
            }
            Err(e) => {
                tracing::warn!("GPU encode of a {len}-byte chunk failed, sending it raw: {e}");
                Ok(None)
            }
        }
    }

    /// Receiver: decodes `frame` (host memory: the staging pool) into exactly
    /// `raw_len` bytes at device address `dst` of `b`.
    pub fn decode_into(
        &mut self,
        b: &Arc<dyn Backend>,
        frame: &[u8],
        dst: u64,
        raw_len: usize,
        stats: &Stats,
    ) -> Result<()> {
        if raw_len > self.max_chunk || frame.len() > max_wire(self.max_chunk) {
            return Err(Error::Remote(format!(
                "compressed chunk of {raw_len} bytes ({} on the wire) exceeds this side's chunk size {} (NCCL_ZIP_CHUNK_SIZE must be the same on every rank)",
                frame.len(),
                self.max_chunk
            )));
        }
        let mut lane = self.lane(b)?;
        if !lane.kernels() {
            if self.fallback.len() < raw_len {
                self.fallback.resize(raw_len, 0);
            }
            let out = &mut self.fallback[..raw_len];
            decode_chunk(frame, out, stats)?;
            return lane.upload_from(dst, out);
        }
        let t0 = now_ns();
        lane.staging(frame.len())?.copy_from_slice(frame);
        let n = lane.decode(frame.len(), dst, raw_len)?;
        if n != raw_len {
            return Err(Error::Remote(format!(
                "corrupt compressed chunk: decodes to {n} bytes, its header says {raw_len}"
            )));
        }
        stats.add(&stats.codec_ns, now_ns().saturating_sub(t0));
        Ok(())
    }
}
