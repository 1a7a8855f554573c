//! Send comm: `isend` cuts a message into chunks and queues them; the comm's
//! data streams, driven by the process's shared I/O workers
//! ([`super::workers`]), take the next chunk and, when the adaptive policy says
//! compression pays and the buffer budget grants the staging, hand it to the
//! codec workers ([`super::codec_workers`]) to compress into the stream's
//! staging, parked until they kick it back (otherwise they write straight from
//! NCCL's buffer, no copy). Each stream's send machine ([`StreamTx`]) writes
//! header and payload without blocking. Chunks go on the wire as soon as each is
//! ready (split-send), and the request is done when its last chunk is written. A
//! stream with nothing queued parks until `isend` kicks it.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Weak};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use socket2::Socket;
use tracing::info;

use super::codec_workers::{codec_workers, CommQueue};
use super::connect::Target;
use super::core::Core;
use super::listen::STREAM_ACK;
use super::pool::Staging;
use super::recv::{read_some, would_block};
use super::sock::{configure_data_socket, send_chunk_part, start_connect, writable};
use super::stream::Role;
use super::stream_tx::{ChunkOut, Payload, StreamTx, Wrote};
use super::workers::{workers, Driven, Kicker, Next, Registration, LENT_WAIT};
use crate::adapt::{Decision, Policy};
use crate::codec::EncodeOptions;
use crate::codec_glue::Coder;
use crate::config::Config;
use crate::devpath::DevSide;
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::proto::plan;
use crate::proto::slots::Slot;
use crate::proto::wire::{HELLO_SIZE, MAX_MESSAGE};

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
    /// The other end of `tx`, for data streams opened later.
    queue: Receiver<Task>,
    /// The data streams opened so far (up, or still connecting), each registered
    /// with a worker.
    tasks: Mutex<Vec<(Arc<TxTask>, Registration)>>,
    coders: Arc<Coders>,
    /// This comm's jobs for the codec workers.
    codec: Arc<CommQueue>,
    /// Where data streams connect, and their hellos.
    target: Target,
    cfg: Arc<Config>,
}

impl SendComm {
    /// A comm on `inline`, the connected inline stream (its hello written); data
    /// streams are opened on demand to `target`. `link_mbps`: the device's nominal
    /// speed (logged; the adaptive policy takes only a speed the user gave,
    /// `NCCL_ZIP_LINK_MBPS`).
    pub fn new(
        inline: Socket,
        target: Target,
        link_mbps: u64,
        cfg: Arc<Config>,
    ) -> Result<SendComm> {
        configure_data_socket(&inline, cfg.peer_timeout)
            .map_err(|e| Error::io("configure socket", e))?;
        let peer = target.peer;
        let n = cfg.nstreams;
        let core = Core::new(
            n,
            inline,
            peer,
            "send to",
            cfg.stats.then_some(STATS_EVERY),
            None,
        )?;
        let (tx, rx) = crossbeam_channel::unbounded::<Task>();
        let opts = EncodeOptions {
            dtype: cfg.dtype,
            checksum: cfg.checksum,
            format: target.format,
            effort: cfg.effort,
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
        workers(cfg.io_threads)?;
        let codec = codec_workers(cfg.codec_threads)?.queue();
        info!(
            "send comm to {peer}: the inline stream (messages up to {} B), up to {n} data streams on demand, compress={:?}, link {link_mbps} Mbps",
            cfg.inline_max, cfg.compress
        );
        Ok(SendComm {
            core,
            tx: Some(tx),
            queue: rx,
            tasks: Mutex::new(Vec::with_capacity(n)),
            coders,
            codec,
            target,
            cfg,
        })
    }

    /// Opens data streams until `want` (at most the configured count) are open
    /// or connecting. Never blocks: the connects are progressed by the workers.
    fn grow(&self, tasks: &mut Vec<(Arc<TxTask>, Registration)>, want: usize) -> Result<()> {
        let want = want.min(self.cfg.nstreams);
        while tasks.len() < want {
            let who = tasks.len();
            let sock = start_connect(self.target.peer)?;
            let make = |kicker| {
                Arc::new_cyclic(|me| TxTask {
                    me: me.clone(),
                    core: Arc::downgrade(&self.core),
                    sock: Arc::new(sock),
                    who,
                    queue: self.queue.clone(),
                    coders: self.coders.clone(),
                    codec: self.codec.clone(),
                    kicker,
                    compressed: Mutex::new(None),
                    max_wire: crate::codec_glue::max_wire(self.cfg.max_chunk),
                    buffer_cap: crate::budget::cap(self.cfg.buffer_mb),
                    lanes: self.cfg.gpu_lanes,
                    peer_timeout: self.cfg.peer_timeout,
                    hello: self.target.hello(who),
                    parked: AtomicBool::new(false),
                    state: Mutex::new(Some(TxState {
                        setup: Setup::Connecting,
                        tx: StreamTx::new(Role::Data, self.target.peer, who),
                        compressing: None,
                        no_lend_until: None,
                    })),
                })
            };
            tasks.push(workers(self.cfg.io_threads)?.register_with(make)?);
        }
        Ok(())
    }

    /// Data streams opened so far (up or connecting).
    pub fn streams_opened(&self) -> usize {
        self.tasks.lock().len()
    }

    /// Data streams up (connected and attached by the receiver).
    pub fn streams_up(&self) -> usize {
        self.core.streams_up()
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
        let decision = if small {
            self.coders.host.decide(size, &self.core.stats)
        } else {
            Decision::RawSmall
        };
        // A probe of a small message (the policy sends raw, but measures the codec
        // every so often) runs the codec here and sends the message raw, inline:
        // through the I/O and codec workers, its thread wake-ups made every 65th
        // message of an incompressible stream 2-3 times slower (the p99 of
        // `scripts/bench_latency.sh` at 4-64 KiB). Messages compressed because it
        // pays still go to the workers.
        if decision == Decision::Probe {
            self.probe_here(data, size);
        }
        let compress = decision == Decision::Compress;
        let inline = small && !compress;
        let chunk = plan::chunk_size(
            size,
            self.cfg.nstreams,
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
        let mut tasks = self.tasks.lock();
        // As many data streams as this message has chunks (up to the configured
        // count; a small compressed message: one, so a lightly used comm stays
        // within 2 sockets). Until they are up its chunks wait in the queue.
        if let Err(e) = self.grow(&mut tasks, if small { 1 } else { nchunks }) {
            if tasks.is_empty() {
                self.core.fail(e.duplicate());
                return Err(e);
            }
            tracing::warn!("send to {}: opening a data stream: {e}", self.core.peer);
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
        // Wake as many parked streams as there are chunks. (Pairs with the fence
        // in `TxTask::run`: either it sees the queued chunks, or we see that it
        // parked.)
        fence(SeqCst);
        let mut want = nchunks;
        for (t, reg) in tasks.iter() {
            if want == 0 {
                break;
            }
            if t.parked.swap(false, SeqCst) {
                reg.kick();
                want -= 1;
            }
        }
        Ok(Some(slot))
    }
}

impl SendComm {
    /// Measures a probe of the `size` bytes at `data` (NCCL's host buffer) on
    /// this thread, for the policy only, in a scratch buffer taken from the
    /// process's buffer budget and given back at once (none left: not measured,
    /// the next probe comes after the usual bypass).
    fn probe_here(&self, data: *const u8, size: usize) {
        let stats = &self.core.stats;
        let mut scratch = Staging::default();
        let cap = crate::budget::sender_cap(crate::budget::cap(self.cfg.buffer_mb));
        if scratch.try_grow(crate::codec::max_compressed_size(size), stats, cap) {
            // SAFETY: NCCL's buffer holds `size` bytes until the request is done,
            // and a small host message's isend has not returned yet.
            let src = unsafe { std::slice::from_raw_parts(data, size) };
            self.coders.host.compress(src, &mut scratch, stats);
        }
        scratch.release(stats);
    }
}

/// Period of the `NCCL_ZIP_STATS=1` lines.
pub const STATS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The sender's codecs: one adaptive policy for host chunks, one for device chunks.
struct Coders {
    host: Coder,
    dev: Coder,
}

/// Bytes a data stream writes in one run before its worker moves on to others:
/// about one chunk, so that one busy stream does not keep the worker's other
/// streams waiting for long.
const RUN_BUDGET: usize = 256 << 10;

/// Bytes a blocking writer writes before it gives the stream back (it may be
/// lent again at once): lends stay short, so that the few writers rotate among
/// the streams that want them.
const LENT_BUDGET: usize = 8 << 20;

/// A stream whose socket is full with at least this much left to write asks
/// for a blocking writer ([`Next::Lend`]); less is a refill or two.
const LEND_MIN: usize = 64 << 10;

/// After a lent send timed out (the peer takes bytes slower than the
/// writer's wait), the stream waits for room on its worker for this long
/// before it asks for a writer again.
const LEND_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// How far a data stream has come.
#[derive(Default)]
enum Setup {
    /// The non-blocking connect is in progress.
    #[default]
    Connecting,
    /// Connected; this many hello bytes written.
    Hello(usize),
    /// Waits for the receiver's [`STREAM_ACK`].
    Ack,
    /// Attached at both ends: carries chunks.
    Up,
}

/// What a data stream holds between runs.
struct TxState {
    setup: Setup,
    /// The stream's send machine: one chunk at a time, from NCCL's buffer or its
    /// staging (compressed frames, device chunks' wire bytes; grows to the
    /// largest, bounded by the codec's worst case for one chunk; host frames
    /// within the process's buffer budget).
    tx: StreamTx,
    /// The chunk the codec workers are compressing (its frame comes back in
    /// [`TxTask::compressed`], with the staging).
    compressing: Option<Task>,
    /// No blocking writer before this (a lent send timed out).
    no_lend_until: Option<std::time::Instant>,
}

/// A chunk back from the codec workers, with the stream's staging.
struct Compressed {
    staging: Staging,
    made: Made,
}

/// What the codec workers made of a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Made {
    /// Nothing: it goes raw, NCCL's (host) bytes as they are.
    Raw,
    /// Its wire bytes are the first `len` bytes of the staging: a compressed
    /// frame, or a device chunk's raw bytes.
    Staged { compressed: bool, len: usize },
    /// A device chunk that could not be read; the comm has failed.
    Failed,
}

/// What [`TxTask::encode`] made of a chunk.
enum Encoded {
    /// Ready to write.
    Out(ChunkOut),
    /// Handed to the codec workers: the stream waits, parked, for their kick.
    Compressing,
}

/// A data stream of a send comm, as a worker drives it.
struct TxTask {
    me: Weak<TxTask>,
    core: Weak<Core>,
    /// Kept here too, so the fd stays valid while a worker holds the task.
    sock: Arc<Socket>,
    who: usize,
    /// The comm's chunks, shared by its streams.
    queue: Receiver<Task>,
    coders: Arc<Coders>,
    codec: Arc<CommQueue>,
    /// Runs this stream again.
    kicker: Kicker,
    /// The codec workers' result for [`TxState::compressing`].
    compressed: Mutex<Option<Compressed>>,
    max_wire: usize,
    /// The process's buffer budget in bytes ([`crate::budget`]).
    buffer_cap: u64,
    lanes: usize,
    peer_timeout: std::time::Duration,
    hello: [u8; HELLO_SIZE],
    /// Found the queue empty: `isend` kicks it.
    parked: AtomicBool,
    /// `None` once the comm closed.
    state: Mutex<Option<TxState>>,
}

impl Driven for TxTask {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn run(&self) -> Next {
        self.run_on(false)
    }

    fn run_lent(&self) {
        self.run_on(true);
    }
}

impl TxTask {
    /// One run: on the stream's worker (`lent` false: non-blocking writes, at
    /// most [`RUN_BUDGET`]), or on a blocking writer (blocking writes, each at
    /// most [`LENT_WAIT`], at most [`LENT_BUDGET`]).
    fn run_on(&self, lent: bool) -> Next {
        let mut g = self.state.lock();
        let Some(st) = g.as_mut() else {
            return Next::Done;
        };
        let Some(core) = self.core.upgrade() else {
            return Next::Done;
        };
        if !matches!(st.setup, Setup::Up) {
            if core.stopped() {
                return Next::Done;
            }
            match self.setup(&core, &mut st.setup) {
                Ok(Some(next)) => return next,
                Ok(None) => {}
                Err(e) => {
                    core.fail(e);
                    return Next::Done;
                }
            }
        }
        let mut budget = if lent { LENT_BUDGET } else { RUN_BUDGET };
        loop {
            if lent && core.stopped() {
                // A failure or a close: the worker sees it when the stream is back.
                return Next::Yield;
            }
            if let Some(t) = &st.compressing {
                let Some(c) = self.compressed.lock().take() else {
                    return Next::Park; // the codec workers kick it when done
                };
                *st.tx.staging() = c.staging;
                let out = match c.made {
                    Made::Raw => self.out(t, None),
                    Made::Staged { compressed, len } => {
                        chunk_out(t, compressed, Payload::Staged, len)
                    }
                    Made::Failed => {
                        st.compressing = None;
                        continue; // the comm's requests already carry the error
                    }
                };
                st.compressing = None;
                if let Err(e) = st.tx.push(out) {
                    core.fail(e);
                    return Next::Done;
                }
            }
            if st.tx.is_idle() {
                let t = match self.queue.try_recv() {
                    Ok(t) => t,
                    Err(crossbeam_channel::TryRecvError::Disconnected) => return Next::Done,
                    Err(crossbeam_channel::TryRecvError::Empty) => {
                        self.parked.store(true, SeqCst);
                        fence(SeqCst);
                        // Queued meanwhile (its `isend` may have missed `parked`).
                        if self.queue.is_empty() {
                            // Nothing in flight: a lightly used comm holds no
                            // staging between messages.
                            if core.ring.idle() {
                                st.tx.release(&core.stats);
                            }
                            return Next::Park;
                        }
                        self.parked.store(false, SeqCst);
                        continue;
                    }
                };
                if core.check().is_err() {
                    continue; // the comm failed: its requests already carry the error
                }
                match self.encode(&core, st, &t) {
                    Ok(Encoded::Out(out)) => {
                        if let Err(e) = st.tx.push(out) {
                            core.fail(e);
                            return Next::Done;
                        }
                    }
                    Ok(Encoded::Compressing) => {
                        st.compressing = Some(t);
                        continue;
                    }
                    Err(e) => {
                        core.fail(e);
                        continue;
                    }
                }
            }
            let w = st.tx.want().expect("a chunk is queued");
            let r = send_chunk_part(&self.sock, w.hdr, w.payload, w.done, lent);
            match st.tx.wrote(r, &core.ring, &core.stats) {
                Ok(Wrote::Bytes {
                    n,
                    chunk_done,
                    full,
                }) => {
                    budget = budget.saturating_sub(n);
                    if chunk_done {
                        core.maybe_report();
                    }
                    if full && lent {
                        return Self::lent_send_timed_out(st);
                    }
                    if full {
                        // The socket's buffer is full: wait for room rather than
                        // ask again (an EPOLLOUT re-arm sees room that came
                        // meanwhile), here or, with bulk bytes left, on a
                        // blocking writer.
                        return self.wait_for_room(st);
                    }
                }
                Ok(Wrote::Blocked) if lent => return Self::lent_send_timed_out(st),
                Ok(Wrote::Blocked) => return self.wait_for_room(st),
                Err(e) => {
                    core.fail(e);
                    return Next::Done;
                }
            }
            if budget == 0 {
                // The socket may take more: no edge will say so.
                return Next::Yield;
            }
        }
    }

    /// A blocking writer's send waited its longest (the peer is slow): the
    /// stream waits for room on its worker, and is not lent for a while.
    fn lent_send_timed_out(st: &mut TxState) -> Next {
        st.no_lend_until = Some(std::time::Instant::now() + LEND_BACKOFF);
        Next::Writable
    }

    /// What a stream whose socket is full waits for: a blocking writer when
    /// bulk bytes are left (see `workers`' module doc), else room.
    fn wait_for_room(&self, st: &mut TxState) -> Next {
        let bulk = !self.queue.is_empty() || st.tx.left() >= LEND_MIN;
        if bulk
            && st
                .no_lend_until
                .is_none_or(|t| std::time::Instant::now() >= t)
        {
            st.no_lend_until = None;
            Next::Lend
        } else {
            Next::Writable
        }
    }

    /// Moves the stream's connect along; `Ok(None)` once it is up (attached at
    /// both ends), else what to wait for.
    fn setup(&self, core: &Arc<Core>, setup: &mut Setup) -> Result<Option<Next>> {
        let peer = core.peer;
        let s = &*self.sock;
        let io_err =
            |what: &str, e| Error::io(format!("{what} (data stream {} to {peer})", self.who), e);
        if let Setup::Connecting = setup {
            if !writable(s).map_err(|e| io_err("poll", e))? {
                return Ok(Some(Next::Writable));
            }
            if let Some(e) = s.take_error().map_err(|e| io_err("getsockopt", e))? {
                return Err(io_err("connect", e));
            }
            *setup = Setup::Hello(0);
        }
        if let Setup::Hello(done) = setup {
            while *done < HELLO_SIZE {
                match s.send_with_flags(
                    &self.hello[*done..],
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                ) {
                    Ok(k) => *done += k,
                    Err(e) if would_block(&e) => return Ok(Some(Next::Writable)),
                    Err(e) => return Err(io_err("handshake", e)),
                }
            }
            *setup = Setup::Ack;
        }
        if let Setup::Ack = setup {
            let mut b = [0u8; 1];
            match read_some(s, &mut b) {
                Ok(1) if b[0] == STREAM_ACK => {}
                Ok(1) => {
                    return Err(Error::Remote(format!(
                        "{peer} answered data stream {} with {:#x}",
                        self.who, b[0]
                    )))
                }
                Ok(_) => {
                    return Err(Error::Remote(format!(
                        "{peer} refused data stream {} (its comm is gone?)",
                        self.who
                    )))
                }
                Err(e) if would_block(&e) => return Ok(Some(Next::Readable)),
                Err(e) => return Err(io_err("handshake", e)),
            }
            // Blocking, with a bounded wait: every write on the worker says
            // MSG_DONTWAIT; a blocking writer's waits for room (`run_lent`).
            configure_data_socket(s, self.peer_timeout)
                .and_then(|()| s.set_write_timeout(Some(LENT_WAIT)))
                .map_err(|e| io_err("configure socket", e))?;
            if !core.attach(self.who, self.sock.clone()) {
                return Err(Error::Internal(format!(
                    "data stream {} attached twice",
                    self.who
                )));
            }
            *setup = Setup::Up;
        }
        Ok(None)
    }

    /// The wire form of chunk `t`: a host chunk is handed to the codec workers
    /// when the policy says compress and the budget grants the staging (the
    /// frame comes back later, see [`Encoded::Compressing`]), else NCCL's bytes
    /// as they are; a device chunk always goes to the codec workers, which read
    /// it through a lane into the staging (so the lane goes back at once).
    fn encode(&self, core: &Arc<Core>, st: &mut TxState, t: &Task) -> Result<Encoded> {
        let stats = &core.stats;
        let len = t.len as usize;
        let src = t.data + t.offset as usize;
        let Some(b) = &t.dev else {
            let host = &self.coders.host;
            // No room in the process's buffer budget: this chunk goes raw.
            if (t.compress || (len > 0 && host.wants(len, stats)))
                && st.tx.staging().try_grow(
                    crate::codec::max_compressed_size(len),
                    stats,
                    crate::budget::sender_cap(self.buffer_cap),
                )
            {
                self.compress_on_codec_worker(core, std::mem::take(st.tx.staging()), src, len)?;
                return Ok(Encoded::Compressing);
            }
            return Ok(Encoded::Out(self.out(t, None)));
        };
        self.device_on_codec_worker(core, std::mem::take(st.tx.staging()), b.clone(), src, len)?;
        Ok(Encoded::Compressing)
    }

    /// Queues device chunk `len` bytes at device address `src` on the codec
    /// workers: read through a lane and compressed by the kernels (or the CPU
    /// codec where the device has none) as the policy says, its wire bytes put in
    /// `staging`. A GPU copy or kernel then holds a codec worker, never the I/O
    /// worker that drives other comms' streams.
    fn device_on_codec_worker(
        &self,
        core: &Arc<Core>,
        mut staging: Staging,
        b: Arc<dyn Backend>,
        src: usize,
        len: usize,
    ) -> Result<()> {
        let (me, core, coders) = (self.me.clone(), core.clone(), self.coders.clone());
        let (kicker, max_wire, lanes) = (self.kicker.clone(), self.max_wire, self.lanes);
        let job = Box::new(move || {
            let stats = &core.stats;
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut dev_side =
                    DevSide::new(Dir::Send, max_wire, lanes, &stats.staging_bytes, || {
                        core.stopped()
                    });
                let (compressed, wire) =
                    dev_side.encode(&b, &coders.dev, src as u64, len, stats)?;
                let n = wire.len();
                staging.grow(n, stats);
                staging[..n].copy_from_slice(&wire);
                Ok::<_, Error>(Made::Staged { compressed, len: n })
            }))
            .unwrap_or_else(|_| {
                Err(Error::Internal(format!(
                    "reading a {len}-byte device chunk panicked"
                )))
            })
            .unwrap_or_else(|e| {
                core.fail(e);
                Made::Failed
            });
            if let Some(task) = me.upgrade() {
                *task.compressed.lock() = Some(Compressed { staging, made });
                kicker.kick();
            }
        });
        if self.codec.submit(job) {
            Ok(())
        } else {
            Err(Error::Internal("send comm closed".into()))
        }
    }

    /// Queues the compression of the `len` bytes at `src` (NCCL's buffer) into
    /// `staging` on the codec workers, which give the staging back with the frame
    /// in [`TxTask::compressed`] and kick the stream.
    fn compress_on_codec_worker(
        &self,
        core: &Arc<Core>,
        mut staging: Staging,
        src: usize,
        len: usize,
    ) -> Result<()> {
        let (me, core, coders) = (self.me.clone(), core.clone(), self.coders.clone());
        let kicker = self.kicker.clone();
        let job = Box::new(move || {
            // SAFETY: NCCL keeps the send buffer alive and unchanged until `test`
            // reports the request done, which is after this chunk is written; a
            // comm that closes first waits for this job (`CommQueue::close`).
            let payload: &[u8] = if len == 0 {
                &[] // the buffer may be NULL
            } else {
                unsafe { std::slice::from_raw_parts(src as *const u8, len) }
            };
            let frame = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                coders.host.compress(payload, &mut staging, &core.stats)
            }))
            .unwrap_or_else(|_| {
                tracing::warn!("compressing a {len}-byte chunk panicked, sending it raw");
                None
            });
            if let Some(task) = me.upgrade() {
                let made = frame.map_or(Made::Raw, |len| Made::Staged {
                    compressed: true,
                    len,
                });
                *task.compressed.lock() = Some(Compressed { staging, made });
                kicker.kick();
            }
        });
        if self.codec.submit(job) {
            Ok(())
        } else {
            Err(Error::Internal("send comm closed".into()))
        }
    }

    /// Chunk `t` on its way out: its frame in the staging (`Some(length)`) or,
    /// raw, NCCL's bytes as they are.
    fn out(&self, t: &Task, frame: Option<usize>) -> ChunkOut {
        match frame {
            Some(n) => chunk_out(t, true, Payload::Staged, n),
            None => chunk_out(
                t,
                false,
                Payload::Nccl(t.data + t.offset as usize),
                t.len as usize,
            ),
        }
    }
}

fn chunk_out(t: &Task, compressed: bool, payload: Payload, wire_len: usize) -> ChunkOut {
    ChunkOut {
        seq: t.seq,
        total: t.total,
        offset: t.offset,
        raw_len: t.len,
        wire_len: wire_len as u32,
        compressed,
        payload,
    }
}

impl SendComm {
    /// Makes the lanes this comm's streams can use at once on device `b` (from
    /// `regMr`, so that sends never allocate).
    pub fn prewarm_device(&self, b: &Arc<dyn Backend>) -> Result<()> {
        let max_wire = crate::codec_glue::max_wire(self.cfg.max_chunk);
        crate::gpu::pool::pool(b, Dir::Send, max_wire, self.cfg.gpu_lanes)
            .prewarm(self.cfg.nstreams)
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
        // stream keeps writing to a peer that no longer reads. (With none in
        // flight, every queued chunk has been written.)
        self.core.begin_close(!self.core.ring.idle());
        self.tx.take();
        // No codec worker reads NCCL's buffers for this comm from now on.
        self.codec.close();
        // Once a stream's state is gone no worker reads NCCL's buffers for it:
        // taking it waits for a run in progress.
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for (t, reg) in tasks {
            if let Some(mut st) = t.state.lock().take() {
                st.tx.release(&self.core.stats);
            }
            reg.close();
        }
        info!(
            "closed send comm to {}: {}",
            self.core.peer,
            self.core.stats.summary()
        );
    }
}
