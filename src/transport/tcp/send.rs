//! Send comm: `isend` cuts a message into chunks and queues them; each stream's
//! thread takes the next chunk, compresses it into its own staging buffer when the
//! adaptive policy says it pays (otherwise writes straight from NCCL's buffer, no
//! copy), and writes header and payload. Chunks go on the wire as soon as each is
//! ready (split-send), and the request is done when its last chunk is written.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use socket2::Socket;
use tracing::info;

use super::core::{spawn_io, Core};
use super::sock::{configure_data_socket, send_all};
use crate::adapt::Policy;
use crate::codec::EncodeOptions;
use crate::codec_glue::Coder;
use crate::config::Config;
use crate::devpath::{DevSide, Wire};
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::proto::plan;
use crate::proto::slots::Slot;
use crate::proto::wire::FLAG_COMPRESSED;
use crate::proto::wire::{ChunkHeader, MAX_MESSAGE};
use crate::stats::Staging;

/// One chunk to write. `data` is NCCL's buffer, valid until `test` reports done;
/// with `dev`, it is device memory staged through that device.
struct Task {
    seq: u64,
    data: usize,
    total: u32,
    offset: u32,
    len: u32,
    dev: Option<Arc<dyn Backend>>,
    /// The adaptive policy already chose to compress this chunk (in `isend`).
    compress: bool,
}

pub struct SendComm {
    core: Arc<Core>,
    tx: Option<Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
    coders: Arc<Coders>,
    cfg: Arc<Config>,
}

impl SendComm {
    /// `link_mbps`: the device's nominal speed (logged; the adaptive policy takes
    /// only a speed the user gave, `NCCL_ZIP_LINK_MBPS`).
    pub fn new(
        socks: Vec<Socket>,
        peer: SocketAddr,
        link_mbps: u64,
        cfg: Arc<Config>,
    ) -> Result<SendComm> {
        for s in &socks {
            configure_data_socket(s, cfg.peer_timeout)
                .map_err(|e| Error::io("configure socket", e))?;
        }
        let core = Core::new(
            socks,
            peer,
            "send to",
            cfg.stats.then_some(STATS_EVERY),
            None,
        )?;
        let n = core.socks.len();
        let (tx, rx) = crossbeam_channel::unbounded::<Task>();
        let opts = EncodeOptions {
            dtype: cfg.dtype,
            checksum: cfg.checksum,
            ..EncodeOptions::default()
        };
        // Host and device chunks run at different codec speeds: one policy each.
        let coders = Arc::new(Coders {
            host: Coder {
                policy: Policy::new(cfg.compress, cfg.link_mbps, n),
                opts,
            },
            dev: Coder {
                policy: Policy::new(cfg.compress, cfg.link_mbps, n),
                opts,
            },
        });
        let max_wire = crate::codec_glue::max_wire(cfg.max_chunk);
        let lanes = cfg.gpu_lanes;
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let (c, rx, coders) = (core.clone(), rx.clone(), coders.clone());
            threads.push(spawn_io(format!("zip-send{i}"), core.clone(), move || {
                send_loop(&c, i, rx, &coders, max_wire, lanes)
            })?);
        }
        info!(
            "send comm to {peer}: {n} streams and the inline stream (messages up to {} B), compress={:?}, link {link_mbps} Mbps",
            cfg.inline_max, cfg.compress
        );
        Ok(SendComm {
            core,
            tx: Some(tx),
            threads,
            coders,
            cfg,
        })
    }

    /// Queues `size` bytes at `data` (device memory of `dev` when given).
    /// `Ok(None)`: all request slots busy, retry later.
    pub fn isend(
        &self,
        data: *const u8,
        size: usize,
        dev: Option<Arc<dyn Backend>>,
    ) -> Result<Option<&Slot>> {
        self.core.check()?;
        if size > MAX_MESSAGE as usize {
            return Err(Error::InvalidArgument(format!(
                "isend of {size} bytes: the v8 API allows at most 1 GiB"
            )));
        }
        if data.is_null() && size > 0 {
            return Err(Error::InvalidArgument("isend with a NULL buffer".into()));
        }
        // A small host message the policy sends raw goes whole on the inline
        // stream, written from this thread (see `inline`); one it compresses goes
        // to the I/O threads with that decision. So does a larger one, up to a
        // chunk, while the inline stream has nothing queued: a lone message then
        // costs no thread wake-up on either side, and once the inline socket backs
        // up (the link is slower than this thread fills it), the next messages
        // spread over the data streams.
        let small = dev.is_none()
            && self.cfg.inline_max > 0
            && (size <= self.cfg.inline_max
                || (size <= self.cfg.max_chunk && self.core.inline.tx_idle()));
        // Ask the policy only once the request can be posted: a refused isend is
        // retried by NCCL and must not count twice.
        if small && self.core.ring.next_free().is_none() {
            return Ok(None);
        }
        let compress = small && self.coders.host.wants(size, &self.core.stats);
        let inline = small && !compress;
        let chunk = plan::chunk_size(
            size,
            self.core.socks.len(),
            self.cfg.min_chunk,
            self.cfg.max_chunk,
        );
        let nchunks = if inline {
            1
        } else {
            plan::chunks(size, chunk).count()
        };
        let Some((seq, slot)) = self.core.ring.post(Some(size), nchunks, None) else {
            return Ok(None);
        };
        let st = &self.core.stats;
        st.add(&st.messages, 1);
        st.add(&st.raw_bytes, size as u64);
        if inline {
            self.core.inline.send(&self.core, seq, data, size);
            return Ok(Some(slot));
        }
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| Error::Internal("isend after close".into()))?;
        for (offset, len) in plan::chunks(size, chunk) {
            let t = Task {
                seq,
                data: data as usize,
                total: size as u32,
                offset: offset as u32,
                len: len as u32,
                dev: dev.clone(),
                compress,
            };
            tx.send(t)
                .map_err(|_| Error::Internal("send queue closed".into()))?;
        }
        Ok(Some(slot))
    }
}

/// Period of the `NCCL_ZIP_STATS=1` lines.
pub const STATS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The sender's codecs: one adaptive policy for host chunks, one for device chunks.
struct Coders {
    host: Coder,
    dev: Coder,
}

fn send_loop(
    core: &Core,
    stream: usize,
    rx: Receiver<Task>,
    coders: &Coders,
    max_wire: usize,
    lanes: usize,
) {
    let sock = &core.socks[stream];
    // Bounded: at most one compressed chunk (max_compressed_size(max_chunk)).
    let mut staging = Staging::new(&core.stats.staging_bytes);
    // Device chunks: a lane from the device's shared pool per chunk.
    let mut dev_side = DevSide::new(
        Dir::Send,
        max_wire,
        lanes,
        &core.stats.staging_bytes,
        || core.stopped(),
    );
    while let Ok(t) = rx.recv() {
        if core.stopped() && core.check().is_err() {
            continue; // the comm failed: its requests already carry the error
        }
        let slot = core.ring.slot(t.seq);
        let encoded = match &t.dev {
            None => {
                let payload: &[u8] = if t.len == 0 {
                    &[]
                } else {
                    // SAFETY: NCCL keeps the send buffer alive and unchanged until
                    // `test` reports this request done, which happens only after
                    // this write.
                    unsafe {
                        std::slice::from_raw_parts(
                            (t.data + t.offset as usize) as *const u8,
                            t.len as usize,
                        )
                    }
                };
                Ok(
                    match coders
                        .host
                        .encode_chunk(payload, &mut staging, &core.stats, t.compress)
                    {
                        Some(frame) => (true, Wire::Host(frame)),
                        None => (false, Wire::Host(payload)),
                    },
                )
            }
            Some(b) => dev_side.encode(
                b,
                &coders.dev,
                (t.data + t.offset as usize) as u64,
                t.len as usize,
                &core.stats,
            ),
        };
        let (compressed, wire) = match encoded {
            Ok(x) => x,
            Err(e) => {
                core.fail(e);
                continue;
            }
        };
        let flags = if compressed { FLAG_COMPRESSED } else { 0 };
        let hdr = ChunkHeader {
            flags,
            seq: t.seq,
            total: t.total,
            offset: t.offset,
            raw_len: t.len,
            wire_len: wire.len() as u32,
        }
        .encode();
        let sent = send_all(sock, &mut [IoSlice::new(&hdr), IoSlice::new(&wire)]);
        let wire_len = wire.len();
        drop(wire); // gives a pooled lane back
        match sent {
            Ok(()) => {
                let st = &core.stats;
                st.add(&st.wire_bytes, wire_len as u64);
                st.add(
                    if flags == 0 {
                        &st.chunks_raw
                    } else {
                        &st.chunks_compressed
                    },
                    1,
                );
                slot.chunk_sent();
                core.maybe_report();
            }
            Err(e) => core.fail(Error::io(
                format!("send to {} (stream {stream})", core.peer),
                e,
            )),
        }
    }
}

impl SendComm {
    /// Makes the lanes this comm's streams can use at once on device `b` (from
    /// `regMr`, so that sends never allocate).
    pub fn prewarm_device(&self, b: &Arc<dyn Backend>) -> Result<()> {
        let max_wire = crate::codec_glue::max_wire(self.cfg.max_chunk);
        crate::gpu::pool::pool(b, Dir::Send, max_wire, self.cfg.gpu_lanes)
            .prewarm(self.core.socks.len())
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

impl Drop for SendComm {
    fn drop(&mut self) {
        // Requests still in flight at close are abandoned: cut the sockets so no
        // thread stays blocked on a peer that no longer reads.
        self.core.begin_close(!self.core.ring.idle());
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        info!(
            "closed send comm to {}: {}",
            self.core.peer,
            self.core.stats.summary()
        );
    }
}
