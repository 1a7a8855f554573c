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

use crate::codec_glue::{decode_chunk, max_wire, Coder};
use crate::devpath::{gpu_decode, gpu_encode, Lanes};
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::stats::Stats;

/// One protocol side's access to GPU lanes for its CUDA buffers, and a host
/// buffer for the CPU codec when the device has no kernels.
pub struct DevLane {
    lanes: Lanes,
    max_chunk: usize,
    fallback: Vec<u8>,
}

impl DevLane {
    /// For chunks of at most `max_chunk` bytes (the comm's compression chunk
    /// size), on the `dir` side, with pools of `lanes` lanes.
    pub fn new(dir: Dir, max_chunk: usize, lanes: usize) -> DevLane {
        DevLane {
            lanes: Lanes::new(dir, max_wire(max_chunk), lanes),
            max_chunk,
            fallback: Vec::new(),
        }
    }

    /// Whether a device chunk has needed a lane yet (tests).
    pub fn has_lane(&self) -> bool {
        self.lanes.used()
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
        // Lanes are held only while a chunk is coded, so a wait is short; the
        // pool gives up (an error) after its timeout.
        let mut lane = self.lanes.take(b, &|| false)?;
        if !lane.kernels() {
            lane.download(src, len)?;
            return Ok(coder.compress(lane.bytes(0, len), out, stats));
        }
        // A STORED frame (n >= len) is dropped: GDR sends the chunk itself.
        Ok(gpu_encode(&mut lane, coder, src, len, stats)
            .filter(|&n| n < len && n <= out.len())
            .map(|n| {
                out[..n].copy_from_slice(lane.bytes(0, n));
                n
            }))
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
        if raw_len > self.max_chunk || frame.len() > self.lanes.max_wire() {
            return Err(Error::Remote(format!(
                "compressed chunk of {raw_len} bytes ({} on the wire) exceeds this side's chunk size {} (NCCL_ZIP_CHUNK_SIZE must be the same on every rank)",
                frame.len(),
                self.max_chunk
            )));
        }
        let mut lane = self.lanes.take(b, &|| false)?;
        if !lane.kernels() {
            if self.fallback.len() < raw_len {
                self.fallback.resize(raw_len, 0);
            }
            let out = &mut self.fallback[..raw_len];
            decode_chunk(frame, out, stats)?;
            return lane.upload_from(dst, out);
        }
        lane.staging(frame.len())?.copy_from_slice(frame);
        gpu_decode(&mut lane, frame.len(), dst, raw_len, stats)
    }
}
