//! The data path's use of the codec: sizing staging buffers, compressing a chunk
//! when the adaptive policy says so, and decoding a received chunk into NCCL's buffer.

use crate::adapt::{Decision, Policy};
use crate::codec::{self, EncodeOptions};
use crate::error::{Error, Result};
use crate::stats::{add_codec_cpu, thread_cpu_ns, Staging, Stats, HELD};
use std::sync::atomic::Ordering;

/// Largest wire payload of one chunk whose uncompressed size is at most `max_chunk`.
pub fn max_wire(max_chunk: usize) -> usize {
    codec::max_compressed_size(max_chunk)
}

/// A sender's compression settings: its adaptive policy and codec options. Every
/// transport compresses chunks through this.
pub struct Coder {
    pub policy: Policy,
    pub opts: EncodeOptions,
}

impl Coder {
    /// Compresses `src` into `out` when the policy wants it, `out` can hold the
    /// worst case, and the frame comes out smaller than `src`. Returns the frame
    /// length, or `None` to send `src` raw (the wire never carries more than the
    /// data). For memory that must not move (registered RDMA buffers).
    pub fn encode_into(&self, src: &[u8], out: &mut [u8], stats: &Stats) -> Option<usize> {
        if !self.wants(src.len(), stats) {
            return None;
        }
        self.compress(src, out, stats)
    }

    /// The policy's decision for a chunk of `len` bytes (bypasses are counted).
    pub fn wants(&self, len: usize, stats: &Stats) -> bool {
        matches!(
            self.decide(len, stats),
            Decision::Compress | Decision::Probe
        )
    }

    /// [`Coder::wants`], telling a probe apart ([`Policy::decide_or_probe`]).
    pub fn decide(&self, len: usize, stats: &Stats) -> Decision {
        let d = self.policy.decide_or_probe(len);
        if d == Decision::RawBypass {
            stats.add(&stats.bypassed, 1);
        }
        d
    }

    /// Runs the codec on `src` (the policy already said yes) and feeds the result
    /// back to the policy; `None` when the frame would not be smaller.
    pub fn compress(&self, src: &[u8], out: &mut [u8], stats: &Stats) -> Option<usize> {
        let out = out.get_mut(..codec::max_compressed_size(src.len()))?;
        let (t0, c0) = (now_ns(), thread_cpu_ns());
        let r = codec::compress(src, out, &self.opts);
        let ns = now_ns().saturating_sub(t0);
        stats.add(&stats.codec_ns, ns);
        add_codec_cpu(stats, c0);
        match r {
            Ok(n) => {
                // The policy wants the codec's CPU time: wall time also counts
                // what other threads (this node's receivers) took the core for.
                let cpu = thread_cpu_ns().saturating_sub(c0);
                self.policy
                    .record(src.len(), n, if cpu > 0 { cpu } else { ns });
                (n < src.len()).then_some(n)
            }
            Err(e) => {
                tracing::warn!(
                    "compressing a {}-byte chunk failed, sending it raw: {e}",
                    src.len()
                );
                None
            }
        }
    }

    /// [`Coder::encode_into`] a per-thread staging buffer that grows to the largest
    /// chunk (TCP). `decided`: the policy was already asked and said compress.
    /// Returns the frame.
    pub fn encode_chunk<'s>(
        &self,
        src: &[u8],
        staging: &'s mut Staging<'_>,
        stats: &Stats,
        decided: bool,
    ) -> Option<&'s [u8]> {
        if !decided && !self.wants(src.len(), stats) {
            return None;
        }
        let out = staging.get(codec::max_compressed_size(src.len()));
        let n = self.compress(src, out, stats)?;
        Some(&out[..n])
    }
}

/// The frame format every peer decodes, whatever it advertises: what a handle
/// or record of an older peer that has no format field (0 there) means.
pub const BASE_FORMAT: u8 = codec::format::VERSION;

/// The highest codec frame format a receiver decodes, which its listener
/// advertises (the handle): the CPU decoder reads versions 1 and 2; a receiver
/// whose compressed chunks may be decoded by the GPU kernels (it offers
/// `NCCL_PTR_CUDA`: `NCCL_ZIP_GPU` and a device, or emulation) states only what
/// the kernels read, version 1 today.
pub fn highest_decodable(cfg: &crate::config::Config) -> u8 {
    if cfg.gpu && crate::gpu::cuda_offered(cfg.gpu_emulate) {
        crate::gpu::codec::KERNEL_FORMAT
    } else {
        codec::format::VERSION_2
    }
}

/// The format a sender writes on one connection: the lower of the highest it
/// writes (`NCCL_ZIP_FORMAT`) and the highest its receiver decodes (0: an older
/// peer that did not say, [`BASE_FORMAT`]).
pub fn agree_format(writes: u8, peer_decodes: u8) -> u8 {
    let decodes = if peer_decodes == 0 {
        BASE_FORMAT
    } else {
        peer_decodes
    };
    writes.min(decodes).max(BASE_FORMAT)
}

/// Refuses a frame whose format is above `agreed`, the one its sender stated
/// in its hello: a peer that writes what it did not agree to is broken, and the
/// error says so before any decoder (CPU or GPU) sees the frame.
pub fn check_format(frame: &[u8], agreed: u8) -> Result<()> {
    match frame.get(4) {
        Some(&v) if frame[..4] == codec::format::MAGIC && v > agreed => Err(Error::Remote(format!(
            "corrupt compressed chunk: a codec format v{v} frame, but the peers agreed on v{agreed} at most"
        ))),
        _ => Ok(()),
    }
}

/// Decodes one compressed chunk into `dst`, which must come out exactly full.
/// The caller has checked its format ([`ChunkDecoder::check`]).
pub fn decode_chunk(frame: &[u8], dst: &mut [u8], stats: &Stats) -> Result<()> {
    decode_by(codec::decompress, frame, dst, stats)
}

/// A receiving thread's decoder: [`decode_chunk`] that keeps the codec's decode
/// tables from chunk to chunk ([`codec::Decoder`], at most 171 KiB, allocated on the
/// first compressed chunk). Counted in [`HELD`]`.decode_tables` while it lives.
/// It refuses frames of a format above the one its connection agreed on
/// ([`check_format`]; [`BASE_FORMAT`] until [`ChunkDecoder::agreed`] says more).
pub struct ChunkDecoder {
    dec: codec::Decoder,
    agreed: u8,
}

impl Default for ChunkDecoder {
    fn default() -> Self {
        ChunkDecoder::agreed(BASE_FORMAT)
    }
}

impl ChunkDecoder {
    /// A decoder for a connection whose sender writes formats up to `agreed`.
    pub fn agreed(agreed: u8) -> ChunkDecoder {
        ChunkDecoder {
            dec: codec::Decoder::default(),
            agreed,
        }
    }

    /// The highest format this decoder takes.
    pub fn format(&self) -> u8 {
        self.agreed
    }

    /// [`check_format`] for a frame that goes elsewhere (a GPU lane).
    pub fn check(&self, frame: &[u8]) -> Result<()> {
        check_format(frame, self.agreed)
    }

    pub fn decode(&mut self, frame: &[u8], dst: &mut [u8], stats: &Stats) -> Result<()> {
        self.check(frame)?;
        let before = self.dec.held_bytes();
        let r = decode_by(|f, d| self.dec.decompress(f, d), frame, dst, stats);
        // The decoder's tables only grow; HELD has what it held before.
        let grown = self.dec.held_bytes() - before;
        if grown > 0 {
            HELD.decode_tables
                .fetch_add(grown as u64, Ordering::Relaxed);
        }
        r
    }
}

impl Drop for ChunkDecoder {
    fn drop(&mut self) {
        HELD.decode_tables
            .fetch_sub(self.dec.held_bytes() as u64, Ordering::Relaxed);
    }
}

fn decode_by(
    decompress: impl FnOnce(&[u8], &mut [u8]) -> std::result::Result<usize, codec::CodecError>,
    frame: &[u8],
    dst: &mut [u8],
    stats: &Stats,
) -> Result<()> {
    let (t0, c0) = (now_ns(), thread_cpu_ns());
    let n = decompress(frame, dst);
    stats.add(&stats.codec_ns, now_ns().saturating_sub(t0));
    add_codec_cpu(stats, c0);
    let n = n.map_err(|e| Error::Remote(format!("corrupt compressed chunk: {e}")))?;
    if n != dst.len() {
        return Err(Error::Remote(format!(
            "corrupt compressed chunk: decodes to {n} bytes, its header says {}",
            dst.len()
        )));
    }
    Ok(())
}

/// Monotonic wall-clock ns.
pub(crate) fn now_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
