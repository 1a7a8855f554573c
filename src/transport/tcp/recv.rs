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

use std::io::Read;

use super::core::{spawn_io, Core, RxLimits};
use super::sock::configure_data_socket;
use super::stream::{Role, StreamRx, Want};
use crate::config::Config;
use crate::devpath::DevSide;
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::proto::slots::{Slot, Wait, NSLOTS};

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
                recv_loop(&c, i, max_chunk, max_wire, lanes)
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

fn recv_loop(core: &Core, stream: usize, max_chunk: usize, max_wire: usize, lanes: usize) {
    if let Err(e) = recv_chunks(core, stream, max_chunk, max_wire, lanes) {
        if !core.closing() {
            core.fail(e);
        }
    }
}

/// Drives stream `stream`'s receive machine ([`StreamRx`]) with blocking reads.
fn recv_chunks(
    core: &Core,
    stream: usize,
    max_chunk: usize,
    max_wire: usize,
    lanes: usize,
) -> Result<()> {
    let mut rx = StreamRx::new(Role::Data, core.peer, max_chunk);
    // Device chunks: a lane from the device's shared pool per chunk, taken only
    // after the chunk's header arrived (see gpu::pool on why that order matters).
    let mut dev_side = DevSide::new(
        Dir::Recv,
        max_wire,
        lanes,
        &core.stats.staging_bytes,
        || core.stopped(),
    );
    let r = drive(core, stream, &mut rx, &mut dev_side);
    rx.release(&core.stats);
    r
}

fn drive(core: &Core, stream: usize, rx: &mut StreamRx, dev_side: &mut DevSide) -> Result<()> {
    let sock = &core.socks[stream];
    let peer = core.peer;
    let io_err = |e| Error::io(format!("receive from {peer} (stream {stream})"), e);
    let (ring, stats) = (&core.ring, &core.stats);
    loop {
        match rx.want(ring, core, stats)? {
            Want::Read(buf) => {
                let n = read_blocking(sock, buf).map_err(io_err)?;
                if n == 0 {
                    rx.eof()?;
                    core.stream_ended(stream);
                    return Ok(());
                }
                rx.advance(n, ring, stats)?;
                if rx.at_boundary() {
                    core.maybe_report();
                }
            }
            Want::Posted(seq) => match ring.wait_posted(seq, stream, || core.stopped())? {
                Wait::Posted(_) => {}
                Wait::Stopped => return Ok(()),
                Wait::Stalled(seq) => return Err(core.stalled(seq)),
            },
            Want::Device(c) => {
                let b = core.devs[c.seq as usize % NSLOTS]
                    .lock()
                    .clone()
                    .ok_or_else(|| Error::Internal("device chunk without a device".into()))?;
                dev_side.receive(
                    &b,
                    |into| {
                        into.copy_from_slice(c.wire);
                        Ok(())
                    },
                    c.compressed,
                    c.wire.len(),
                    c.dst,
                    c.raw_len,
                    stats,
                )?;
                rx.device_done(ring, stats)?;
            }
        }
    }
}

/// One blocking read (retried on EINTR); 0 at the end of the stream.
fn read_blocking(mut s: &Socket, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            r => return r,
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
