//! Receive comm: `irecv` posts a buffer for the next message; each stream's thread
//! reads chunk headers, finds the posted receive for the chunk's message, checks
//! that it fits, and reads the payload straight into NCCL's buffer.
//!
//! A stream that ends cleanly between chunks is a peer that closed; once every
//! stream has ended, or the streams left all hold later messages than a pending
//! receive, pending receives fail with a remote error. Anything else unexpected
//! fails the comm at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use socket2::Socket;
use tracing::info;

use super::core::{spawn_io, Core, RxLimits};
use super::sock::{configure_data_socket, recv_exact, recv_exact_or_eof};
use crate::codec_glue::ChunkDecoder;
use crate::config::Config;
use crate::devpath::DevSide;
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::proto::slots::NSLOTS;
use crate::proto::slots::{Slot, Wait};
use crate::proto::wire::{ChunkHeader, CHUNK_HEADER_SIZE};
use crate::stats::Staging;

pub struct RecvComm {
    core: Arc<Core>,
    /// Largest compressed chunk of the peer (lane staging size) and lane pool size.
    max_wire: usize,
    lanes: usize,
    threads: Vec<JoinHandle<()>>,
}

impl RecvComm {
    /// `socks`: the data streams, then the inline stream. `max_chunk` is the
    /// sender's (from its hello); it bounds a chunk and an inline message.
    pub fn new(
        socks: Vec<Socket>,
        peer: SocketAddr,
        max_chunk: usize,
        cfg: Arc<Config>,
    ) -> Result<RecvComm> {
        for s in &socks {
            configure_data_socket(s, cfg.peer_timeout)
                .map_err(|e| Error::io("configure socket", e))?;
        }
        let max_wire = crate::codec_glue::max_wire(max_chunk);
        let lanes = cfg.gpu_lanes;
        let core = Core::new(
            socks,
            peer,
            "recv from",
            cfg.stats.then_some(super::send::STATS_EVERY),
            Some(RxLimits {
                max_chunk,
                max_wire,
                lanes,
            }),
        )?;
        let n = core.socks.len();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let c = core.clone();
            threads.push(spawn_io(format!("zip-recv{i}"), core.clone(), move || {
                recv_loop(&c, i, max_wire, lanes)
            })?);
        }
        info!("recv comm from {peer}: {n} streams and the inline stream");
        Ok(RecvComm {
            core,
            max_wire,
            lanes,
            threads,
        })
    }

    /// Posts `cap` bytes at `buf` (device memory of `dev` when given) for the next
    /// message. `Ok(None)`: retry later.
    pub fn irecv(
        &self,
        buf: *mut u8,
        cap: usize,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<Option<&Slot>> {
        self.core.check()?;
        if buf.is_null() && cap > 0 {
            return Err(Error::InvalidArgument("irecv with a NULL buffer".into()));
        }
        let ring = &self.core.ring;
        let Some(seq) = ring.next_free() else {
            return Ok(None);
        };
        // The slot is free, so no I/O thread reads this entry until `post` below
        // publishes the request (the ring's lock orders the two).
        *self.core.devs[seq as usize % NSLOTS].lock() = dev;
        let slot = ring
            .post(None, 0, Some((buf as usize, cap)))
            .map(|(_, s)| s);
        // A small message may already wait on the inline stream.
        self.core.poke();
        Ok(slot)
    }
}

fn recv_loop(core: &Core, stream: usize, max_wire: usize, lanes: usize) {
    if let Err(e) = recv_chunks(core, stream, max_wire, lanes) {
        if !core.closing() {
            core.fail(e);
        }
    }
}

fn recv_chunks(core: &Core, stream: usize, max_wire: usize, lanes: usize) -> Result<()> {
    let sock = &core.socks[stream];
    let peer = core.peer;
    let io_err = |e| Error::io(format!("receive from {peer} (stream {stream})"), e);
    let mut staging = Staging::new(&core.stats.staging_bytes);
    let mut decoder = ChunkDecoder::default();
    // Device chunks: a lane from the device's shared pool per chunk, taken only
    // after the chunk's header arrived (see gpu::pool on why that order matters).
    let mut dev_side = DevSide::new(
        Dir::Recv,
        max_wire,
        lanes,
        &core.stats.staging_bytes,
        || core.stopped(),
    );
    loop {
        let mut hb = [0u8; CHUNK_HEADER_SIZE];
        if !recv_exact_or_eof(sock, &mut hb).map_err(io_err)? {
            // Clean end between chunks.
            core.stream_ended(stream);
            return Ok(());
        }
        let h = ChunkHeader::decode(&hb, max_wire)?;
        let slot = match core.ring.wait_posted(h.seq, stream, || core.stopped())? {
            Wait::Posted(s) => s,
            Wait::Stopped => return Ok(()),
            Wait::Stalled(seq) => return Err(core.stalled(seq)),
        };
        let buf = core.admit(slot, &h)?;
        let dev = core.devs[h.seq as usize % NSLOTS].lock().clone();
        if let Some(b) = dev {
            dev_side.receive(
                &b,
                |into| recv_exact(sock, into).map_err(io_err),
                h.compressed(),
                h.wire_len as usize,
                (buf + h.offset as usize) as u64,
                h.raw_len as usize,
                &core.stats,
            )?;
        } else {
            let dst: &mut [u8] = if h.raw_len == 0 {
                &mut []
            } else {
                // SAFETY: the receive buffer holds `cap` >= total >= offset + raw_len
                // bytes (checked above and in decode) and is ours until `test`
                // reports done. Chunks of one message do not overlap (offsets come
                // from one plan); a broken peer's that do fail the receive before it
                // completes (`admit`), though their bytes may race into the buffer.
                unsafe {
                    std::slice::from_raw_parts_mut(
                        (buf + h.offset as usize) as *mut u8,
                        h.raw_len as usize,
                    )
                }
            };
            if h.compressed() {
                let frame = staging.get(h.wire_len as usize);
                recv_exact(sock, frame).map_err(io_err)?;
                decoder.decode(frame, dst, &core.stats)?;
            } else {
                recv_exact(sock, dst).map_err(io_err)?;
            }
        }
        core.stats.add(
            if h.compressed() {
                &core.stats.chunks_compressed
            } else {
                &core.stats.chunks_raw
            },
            1,
        );
        core.stats.add(&core.stats.wire_bytes, h.wire_len as u64);
        core.stats.add(&core.stats.raw_bytes, h.raw_len as u64);
        crate::adapt::RECEIVED.add(h.raw_len as u64);
        if slot.bytes_placed(h.raw_len as usize) {
            core.stats.add(&core.stats.messages, 1);
            core.maybe_report();
        }
    }
}

impl RecvComm {
    /// Makes the lanes this comm's streams can use at once on device `b` (from
    /// `regMr`, so that receives never allocate).
    pub fn prewarm_device(&self, b: &Arc<dyn Backend>) -> Result<()> {
        crate::gpu::pool::pool(b, Dir::Recv, self.max_wire, self.lanes)
            .prewarm(self.core.socks.len() + 1) // + 1: the inline stream's reader
    }

    /// This comm's counters.
    /// This comm's failure report (one WARN per comm).
    pub fn report(&self) -> &crate::proto::slots::Report {
        self.core.ring.report()
    }

    pub fn stats(&self) -> &crate::stats::Stats {
        &self.core.stats
    }
}

impl Drop for RecvComm {
    fn drop(&mut self) {
        self.core.begin_close(true);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        info!(
            "closed recv comm from {}: {}",
            self.core.peer,
            self.core.stats.summary()
        );
    }
}
