//! Chunks of CUDA buffers (`NCCL_PTR_CUDA`) on a stream's I/O thread: the device
//! counterpart of [`crate::codec_glue`]. See [`crate::gpu::backend`] for the lanes.
//!
//! Send, per chunk, after the adaptive policy's decision:
//! * compress with kernels: the GPU writes the frame into pinned staging; a frame
//!   that does not shrink goes raw (a STORED frame already holds the raw bytes);
//! * compress without kernels: copy down, CPU codec;
//! * raw: copy down.
//!
//! Receive, per chunk: the socket fills pinned staging; the GPU decodes from there
//! into NCCL's buffer (or the CPU decodes and the result is copied up); raw chunks
//! are copied up. Every operation completes before the chunk counts as placed, so
//! `test()` reports done only when the device buffer holds the exact bytes.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::codec::format::{FLAG_STORED, HEADER_LEN as FORMAT_HEADER_SIZE};
use crate::codec;
use crate::codec_glue::{decode_chunk, now_ns, Coder};
use crate::error::{Error, Result};
use crate::gpu::{Backend, Lane};
use crate::stats::{Staging, Stats};

/// Where the wire bytes of an encoded chunk are.
enum Out {
    /// `staging[off..off + len]` of the lane.
    Lane { off: usize, len: usize },
    /// The CPU codec's frame in the fallback buffer.
    Fallback(usize),
}

/// One I/O thread's device state: a lane on the comm's device (made on first use)
/// and a host buffer for the CPU codec when the lane has no kernels.
pub struct DevSide<'a> {
    lane: Option<(*const (), Box<dyn Lane + 'a>)>,
    fallback: Staging<'a>,
    max_wire: usize,
    counter: &'a AtomicU64,
}

// SAFETY: the raw pointer is only an identity for comparison, never dereferenced.
unsafe impl Send for DevSide<'_> {}

impl<'a> DevSide<'a> {
    /// `max_wire`: the largest compressed chunk of the comm (staging size);
    /// `counter`: the comm's staging counter.
    pub fn new(max_wire: usize, counter: &'a AtomicU64) -> Self {
        DevSide {
            lane: None,
            fallback: Staging::new(counter),
            max_wire,
            counter,
        }
    }

    /// The largest raw chunk a lane can stage.
    pub fn max_chunk(&self) -> usize {
        self.max_wire.saturating_sub(FORMAT_HEADER_SIZE)
    }

    fn lane(&mut self, b: &Arc<dyn Backend>) -> Result<()> {
        let id = Arc::as_ptr(b) as *const ();
        if self.lane.as_ref().map(|l| l.0) != Some(id) {
            self.lane = None; // release the old staging before taking new
            let l = b.lane(self.max_wire, self.counter)?;
            tracing::debug!("device lane on {}", b.describe());
            self.lane = Some((id, l));
        }
        Ok(())
    }

    /// Sender: the wire bytes of `len` bytes at device address `src`, and whether
    /// they are a compressed frame.
    pub fn encode(
        &mut self,
        b: &Arc<dyn Backend>,
        coder: &Coder,
        src: u64,
        len: usize,
        stats: &Stats,
    ) -> Result<(bool, &[u8])> {
        if len == 0 {
            return Ok((false, &[]));
        }
        self.lane(b)?;
        stats.add(&stats.chunks_device, 1);
        let lane = &mut self.lane.as_mut().expect("set by lane()").1;
        let wants = coder.wants(len, stats);
        let mut out = None;
        if wants && lane.kernels() {
            let t0 = now_ns();
            match lane.encode(src, len, &coder.opts) {
                Ok(n) => {
                    let ns = now_ns().saturating_sub(t0);
                    stats.add(&stats.codec_ns, ns);
                    coder.policy.record(len, n, ns);
                    if n < len {
                        out = Some((true, Out::Lane { off: 0, len: n }));
                    } else if n == codec::max_compressed_size(len)
                        && lane.bytes(5, 1)[0] & FLAG_STORED != 0
                    {
                        // STORED: the chunk's bytes follow the frame header.
                        out = Some((
                            false,
                            Out::Lane {
                                off: FORMAT_HEADER_SIZE,
                                len,
                            },
                        ));
                    }
                }
                Err(e) => tracing::warn!("GPU encode of a {len}-byte chunk failed, sending it raw: {e}"),
            }
        }
        let (compressed, out) = match out {
            Some(o) => o,
            None => {
                lane.download(src, len)?;
                let mut o = (false, Out::Lane { off: 0, len });
                if wants && !lane.kernels() {
                    let buf = self.fallback.get(codec::max_compressed_size(len));
                    if let Some(n) = coder.compress(lane.bytes(0, len), buf, stats) {
                        o = (true, Out::Fallback(n));
                    }
                }
                o
            }
        };
        Ok(match out {
            Out::Lane { off, len } => (compressed, lane.bytes(off, len)),
            Out::Fallback(n) => (compressed, &self.fallback.get(n)[..]),
        })
    }

    /// Receiver: `read` fills the staging with the chunk's `wire_len` payload bytes
    /// from the socket; the chunk's `raw_len` bytes then land at device address `dst`.
    pub fn receive(
        &mut self,
        b: &Arc<dyn Backend>,
        read: impl FnOnce(&mut [u8]) -> Result<()>,
        compressed: bool,
        wire_len: usize,
        dst: u64,
        raw_len: usize,
        stats: &Stats,
    ) -> Result<()> {
        if raw_len > self.max_chunk() || wire_len > self.max_wire {
            return Err(Error::Remote(format!(
                "corrupt stream: a {raw_len}-byte chunk ({wire_len} on the wire) is larger than the sender's chunk size {}",
                self.max_chunk()
            )));
        }
        if raw_len == 0 {
            return read(&mut []);
        }
        self.lane(b)?;
        stats.add(&stats.chunks_device, 1);
        let lane = &mut self.lane.as_mut().expect("set by lane()").1;
        if !compressed {
            read(lane.staging(raw_len)?)?;
            return lane.upload(dst, raw_len);
        }
        read(lane.staging(wire_len)?)?;
        let t0 = now_ns();
        if lane.kernels() {
            let n = lane.decode(wire_len, dst, raw_len)?;
            if n != raw_len {
                return Err(Error::Remote(format!(
                    "corrupt compressed chunk: decodes to {n} bytes, its header says {raw_len}"
                )));
            }
            stats.add(&stats.codec_ns, now_ns().saturating_sub(t0));
        } else {
            let out = self.fallback.get(raw_len);
            decode_chunk(lane.bytes(0, wire_len), out, stats)?;
            lane.upload_from(dst, out)?;
        }
        Ok(())
    }
}
