//! Chunks of CUDA buffers (`NCCL_PTR_CUDA`) on a stream's I/O thread: the device
//! counterpart of [`crate::codec_glue`]. See [`crate::gpu::backend`] for the lanes.
//!
//! Send, per chunk, after the adaptive policy's decision:
//! * compress with kernels: the GPU writes the frame into the lane's device
//!   scratch, which is copied to pinned staging; a frame that does not shrink goes
//!   raw (a STORED frame already holds the raw bytes);
//! * compress without kernels: copy down, CPU codec;
//! * raw: copy down.
//!
//! Receive, per chunk: the socket fills pinned staging; the frame is copied to the
//! lane's device scratch and the GPU decodes it into NCCL's buffer (or the CPU
//! decodes and the result is copied up); raw chunks are copied up. Every operation completes before the chunk counts as placed, so
//! `test()` reports done only when the device buffer holds the exact bytes.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::codec;
use crate::codec::format::{FLAG_STORED, HEADER_LEN as FORMAT_HEADER_SIZE};
use crate::codec_glue::{decode_chunk, now_ns, Coder};
use crate::error::{Error, Result};
use crate::gpu::pool::{pool, Dir, LaneGuard, LanePool};
use crate::gpu::Backend;
use crate::stats::{Staging, Stats};

/// The bytes of an encoded chunk, wherever they are. A pooled lane stays taken
/// until the socket write is done and this value is dropped.
pub enum Wire<'s> {
    /// `staging[off..off + len]` of a lane.
    Lane {
        lane: LaneGuard,
        off: usize,
        len: usize,
    },
    /// Host memory: NCCL's buffer, or a frame the CPU codec made.
    Host(&'s [u8]),
}

impl std::ops::Deref for Wire<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Wire::Lane { lane, off, len } => lane.bytes(*off, *len),
            Wire::Host(b) => b,
        }
    }
}

/// One device chunk's state on the thread that moves it (a TCP codec or I/O
/// worker): the lane pool of the comm's device (lanes are
/// taken per chunk, see [`crate::gpu::pool`]) and a host buffer for the CPU codec
/// when the device has no kernels.
pub struct DevSide<'a> {
    lanes: Lanes,
    fallback: Staging<'a>,
    stop: Box<dyn Fn() -> bool + Send + 'a>,
}

/// The lanes one side of a comm takes, one per chunk, from the shared pool (see
/// [`crate::gpu::pool`]) of whichever device its buffers are on. Used by the TCP
/// I/O threads ([`DevSide`]) and the IB protocol (`transport::ib::gdr`).
pub struct Lanes {
    dir: Dir,
    cap: usize,
    max_wire: usize,
    /// (backend identity, its pool), found on first use.
    pool: Option<(usize, Arc<LanePool>)>,
}

impl Lanes {
    /// Lanes of `max_wire` bytes of staging on the `dir` side; pools of `cap` lanes.
    pub fn new(dir: Dir, max_wire: usize, cap: usize) -> Lanes {
        Lanes {
            dir,
            cap,
            max_wire,
            pool: None,
        }
    }

    /// The staging size of a lane: the largest compressed chunk.
    pub fn max_wire(&self) -> usize {
        self.max_wire
    }

    /// Whether a lane has been asked for yet.
    pub fn used(&self) -> bool {
        self.pool.is_some()
    }

    /// A lane of `b` if one is free now, without waiting (`None`: all busy). A new
    /// lane is made only when the pool has none at all (never prewarmed).
    pub fn try_take(&mut self, b: &Arc<dyn Backend>) -> Result<Option<LaneGuard>> {
        let p = self.pool_of(b);
        if p.made() == 0 {
            return p.acquire(&|| false).map(Some);
        }
        p.try_acquire()
    }

    fn pool_of(&mut self, b: &Arc<dyn Backend>) -> Arc<LanePool> {
        let id = Arc::as_ptr(b) as *const () as usize;
        if self.pool.as_ref().map(|p| p.0) != Some(id) {
            self.pool = Some((id, pool(b, self.dir, self.max_wire, self.cap)));
        }
        self.pool.as_ref().expect("set above").1.clone()
    }

    /// A lane of `b` for one chunk (back to the pool when dropped); `stop` ends a
    /// wait for one.
    pub fn take(&mut self, b: &Arc<dyn Backend>, stop: &dyn Fn() -> bool) -> Result<LaneGuard> {
        self.pool_of(b).acquire(stop)
    }
}

/// Runs the GPU encoder on `len` bytes at device address `src` into the lane's
/// staging and feeds the result to the policy. The frame length (a STORED frame
/// when coding did not shrink), or `None` when the kernel failed (logged; the
/// caller sends the chunk raw).
pub fn gpu_encode(
    lane: &mut LaneGuard,
    coder: &Coder,
    src: u64,
    len: usize,
    stats: &Stats,
) -> Option<usize> {
    let t0 = now_ns();
    match lane.encode(src, len, &coder.opts) {
        Ok(n) => {
            let ns = now_ns().saturating_sub(t0);
            stats.add(&stats.codec_ns, ns);
            coder.policy.record_device(len, n, ns);
            Some(n)
        }
        Err(e) => {
            tracing::warn!("GPU encode of a {len}-byte chunk failed, sending it raw: {e}");
            None
        }
    }
}

/// Runs the GPU decoder on the frame in the lane's `staging[..frame_len]`, into
/// exactly `raw_len` bytes at device address `dst`.
pub fn gpu_decode(
    lane: &mut LaneGuard,
    frame_len: usize,
    dst: u64,
    raw_len: usize,
    stats: &Stats,
) -> Result<()> {
    let t0 = now_ns();
    let n = lane.decode(frame_len, dst, raw_len)?;
    if n != raw_len {
        return Err(Error::Remote(format!(
            "corrupt compressed chunk: decodes to {n} bytes, its header says {raw_len}"
        )));
    }
    stats.add(&stats.codec_ns, now_ns().saturating_sub(t0));
    Ok(())
}

impl<'a> DevSide<'a> {
    /// `max_wire`: the largest compressed chunk of the comm (lane staging size);
    /// `lanes`: the pool's size (`NCCL_ZIP_GPU_LANES`); `counter`: the comm's
    /// staging counter (for the fallback buffer); `stop`: the comm is failing or
    /// closing (ends a wait for a lane).
    pub fn new(
        dir: Dir,
        max_wire: usize,
        lanes: usize,
        counter: &'a AtomicU64,
        stop: impl Fn() -> bool + Send + 'a,
    ) -> Self {
        DevSide {
            lanes: Lanes::new(dir, max_wire, lanes),
            fallback: Staging::new(counter),
            stop: Box::new(stop),
        }
    }

    /// The largest raw chunk a lane can stage.
    pub fn max_chunk(&self) -> usize {
        self.lanes.max_wire().saturating_sub(FORMAT_HEADER_SIZE)
    }

    fn lane(&mut self, b: &Arc<dyn Backend>) -> Result<LaneGuard> {
        self.lanes.take(b, &*self.stop)
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
    ) -> Result<(bool, Wire<'_>)> {
        if len == 0 {
            return Ok((false, Wire::Host(&[])));
        }
        let mut lane = self.lane(b)?;
        stats.add(&stats.chunks_device, 1);
        let wants = coder.wants(len, stats);
        if wants && lane.kernels() {
            if let Some(n) = gpu_encode(&mut lane, coder, src, len, stats) {
                if n < len {
                    return Ok((
                        true,
                        Wire::Lane {
                            lane,
                            off: 0,
                            len: n,
                        },
                    ));
                }
                if n == codec::max_compressed_size(len) && lane.bytes(5, 1)[0] & FLAG_STORED != 0 {
                    // STORED: the chunk's bytes follow the frame header.
                    let off = FORMAT_HEADER_SIZE;
                    return Ok((false, Wire::Lane { lane, off, len }));
                }
            }
        }
        lane.download(src, len)?;
        if wants && !lane.kernels() {
            let buf = self.fallback.get(codec::max_compressed_size(len));
            if let Some(n) = coder.compress(lane.bytes(0, len), buf, stats) {
                drop(lane);
                return Ok((true, Wire::Host(&self.fallback.get(n)[..])));
            }
        }
        Ok((false, Wire::Lane { lane, off: 0, len }))
    }

    /// Receiver: `read` fills the staging with the chunk's `wire_len` payload bytes
    /// from the socket; the chunk's `raw_len` bytes then land at device address `dst`.
    /// Call it only after the chunk's header has arrived (see [`crate::gpu::pool`]).
    #[allow(clippy::too_many_arguments)]
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
        if raw_len > self.max_chunk() || wire_len > self.lanes.max_wire() {
            return Err(Error::Remote(format!(
                "corrupt stream: a {raw_len}-byte chunk ({wire_len} on the wire) is larger than the sender's chunk size {}",
                self.max_chunk()
            )));
        }
        if raw_len == 0 {
            return read(&mut []);
        }
        let mut lane = self.lane(b)?;
        stats.add(&stats.chunks_device, 1);
        if !compressed {
            read(lane.staging(raw_len)?)?;
            return lane.upload(dst, raw_len);
        }
        read(lane.staging(wire_len)?)?;
        if lane.kernels() {
            gpu_decode(&mut lane, wire_len, dst, raw_len, stats)?;
        } else {
            let out = self.fallback.get(raw_len);
            decode_chunk(lane.bytes(0, wire_len), out, stats)?;
            lane.upload_from(dst, out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::Policy;
    use crate::config::CompressMode;
    use crate::gpu::Lane;
    use crate::gpu::{backend_for, Emulation};

    /// A lane over host memory whose kernels always fail.
    struct Broken(Vec<u8>);
    impl Lane for Broken {
        fn staging(&mut self, len: usize) -> Result<&mut [u8]> {
            Ok(&mut self.0[..len])
        }
        fn bytes(&self, off: usize, len: usize) -> &[u8] {
            &self.0[off..off + len]
        }
        fn kernels(&self) -> bool {
            true
        }
        fn download(&mut self, src: u64, len: usize) -> Result<()> {
            // SAFETY: tests pass the address of a live host buffer of `len` bytes.
            let s = unsafe { std::slice::from_raw_parts(src as usize as *const u8, len) };
            self.0[..len].copy_from_slice(s);
            Ok(())
        }
        fn upload(&mut self, _: u64, _: usize) -> Result<()> {
            unreachable!()
        }
        fn upload_from(&mut self, _: u64, _: &[u8]) -> Result<()> {
            unreachable!()
        }
        fn encode(&mut self, _: u64, _: usize, _: &EncodeOptions) -> Result<usize> {
            Err(Error::Cuda("injected".into()))
        }
        fn decode(&mut self, _: usize, _: u64, _: usize) -> Result<usize> {
            Err(Error::Cuda("injected".into()))
        }
    }
    struct BrokenBackend;
    impl Backend for BrokenBackend {
        fn describe(&self) -> String {
            "broken".into()
        }
        fn lane<'a>(&self, max_wire: usize, _: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>> {
            Ok(Box::new(Broken(vec![0; max_wire])))
        }
    }

    fn coder(mode: CompressMode) -> Coder {
        Coder {
            policy: Policy::new(mode, Some(10_000), 1),
            opts: EncodeOptions::default(),
        }
    }

    use crate::codec::EncodeOptions;

    #[test]
    fn failed_gpu_encode_sends_the_chunk_raw() {
        let stats = Stats::default();
        let b: Arc<dyn Backend> = Arc::new(BrokenBackend);
        let mut d = DevSide::new(
            Dir::Send,
            codec::max_compressed_size(1 << 16),
            2,
            &stats.staging_bytes,
            || false,
        );
        let src: Vec<u8> = (0..1 << 16).map(|i| (i * 7 % 251) as u8).collect();
        let (compressed, wire) = d
            .encode(
                &b,
                &coder(CompressMode::On),
                src.as_ptr() as u64,
                src.len(),
                &stats,
            )
            .unwrap();
        assert!(!compressed);
        assert_eq!(&*wire, &src[..]);
    }

    #[test]
    fn stored_frames_go_raw_and_shrinking_ones_compressed() {
        let stats = Stats::default();
        let b = backend_for(0, Emulation::Kernels).unwrap();
        let mut d = DevSide::new(
            Dir::Send,
            codec::max_compressed_size(1 << 16),
            2,
            &stats.staging_bytes,
            || false,
        );
        let c = coder(CompressMode::On);
        let random: Vec<u8> = (0..1u64 << 16)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect();
        let (compressed, wire) = d
            .encode(&b, &c, random.as_ptr() as u64, random.len(), &stats)
            .unwrap();
        assert!(!compressed);
        assert_eq!(&*wire, &random[..], "a STORED frame's payload is the chunk");
        drop(wire);
        let zeros = vec![0u8; 1 << 16];
        let (compressed, wire) = d
            .encode(&b, &c, zeros.as_ptr() as u64, zeros.len(), &stats)
            .unwrap();
        assert!(compressed && wire.len() < 100, "{}", wire.len());
        drop(wire);
        // Off: raw, and the codec never runs.
        let (compressed, wire) = d
            .encode(
                &b,
                &coder(CompressMode::Off),
                zeros.as_ptr() as u64,
                zeros.len(),
                &stats,
            )
            .unwrap();
        assert!(!compressed && *wire == zeros[..]);
    }

    #[test]
    fn oversized_chunks_are_rejected_before_reading() {
        let stats = Stats::default();
        let b = backend_for(0, Emulation::Kernels).unwrap();
        let mut d = DevSide::new(
            Dir::Recv,
            codec::max_compressed_size(4096),
            2,
            &stats.staging_bytes,
            || false,
        );
        let mut dst = vec![0u8; 8192];
        for (compressed, wire, raw) in [
            (false, 4097, 4097),
            (true, 100, 4097),
            (true, 4096 + 25, 4096),
        ] {
            let e = d
                .receive(
                    &b,
                    |_| panic!("read must not be called"),
                    compressed,
                    wire,
                    dst.as_mut_ptr() as u64,
                    raw,
                    &stats,
                )
                .unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{e}");
        }
    }

    #[test]
    fn corrupt_frames_are_remote_errors_on_both_decoders() {
        let stats = Stats::default();
        for emu in [Emulation::Kernels, Emulation::NoKernels] {
            let b = backend_for(0, emu).unwrap();
            let mut d = DevSide::new(
                Dir::Recv,
                codec::max_compressed_size(4096),
                2,
                &stats.staging_bytes,
                || false,
            );
            let mut dst = vec![0u8; 4096];
            let e = d
                .receive(
                    &b,
                    |buf| {
                        buf.fill(0x5A);
                        Ok(())
                    },
                    true,
                    200,
                    dst.as_mut_ptr() as u64,
                    4096,
                    &stats,
                )
                .unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{emu:?}: {e}");
        }
    }
}
