//! Receive comm: `irecv` posts a buffer for the next message; each stream's
//! receive machine ([`StreamRx`]) reads chunk headers, finds the posted receive
//! for the chunk's message, checks that it fits, and reads the payload straight
//! into NCCL's buffer (or decodes it there).
//!
//! The data streams are driven by the process's shared I/O workers
//! ([`super::workers`]) with non-blocking reads, and hand compressed frames to
//! the codec workers ([`super::codec_workers`]) to decode, parked until the frame
//! is done; the inline stream is driven by NCCL's own thread from `test`. Both run [`pump_rx`]. A stream whose next chunk belongs to
//! a receive not posted yet parks until `irecv` kicks it.
//!
//! A stream that ends cleanly between chunks is a peer that closed; once every
//! stream has ended, or the streams left all hold later messages than a pending
//! receive, pending receives fail with a remote error. Anything else unexpected
//! fails the comm at once.

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use socket2::Socket;
use tracing::info;

use super::codec_workers::{codec_workers, with_thread_decoder, CommQueue};
use super::core::{Core, RxLimits};
use super::listen::{Attach, STREAM_ACK};
use super::sock::configure_data_socket;
use super::stream::{DeviceChunk, Frame, Role, StreamRx, Want};
use super::workers::{workers, Driven, Kicker, Next, Registration};
use crate::codec_glue::decode_chunk;
use crate::config::Config;
use crate::devpath::{gpu_decode, Lanes};
use crate::error::{Error, Result};
use crate::gpu::pool::{Dir, LaneGuard};
use crate::gpu::Backend;
use crate::proto::slots::{Lookup, Slot, NSLOTS};

pub struct RecvComm {
    core: Arc<Core>,
    /// Largest compressed chunk of the peer (lane staging size) and lane pool size.
    max_wire: usize,
    lanes: usize,
    /// The data streams that are up, each registered with a worker.
    streams: Arc<RxStreams>,
    /// This comm's jobs for the codec workers.
    codec: Arc<CommQueue>,
    /// Takes this comm out of the listener's table when it closes.
    pub(super) remove: Option<super::listen::Remove>,
}

/// A data stream and its place in a worker.
type Stream = (Arc<RxTask>, Registration);

/// A receive comm's data streams: they come when the sender opens them, sorted
/// to this comm by the listener ([`Attach`]).
struct RxStreams {
    core: Weak<Core>,
    lim: RxLimits,
    max_chunk: usize,
    peer_timeout: std::time::Duration,
    io_threads: Option<usize>,
    codec: Arc<CommQueue>,
    /// `None` once the comm closed.
    tasks: Mutex<Option<Vec<Stream>>>,
}

impl Attach for RxStreams {
    fn attach(&self, who: usize, sock: Socket) -> bool {
        let mut g = self.tasks.lock();
        let (Some(tasks), Some(core)) = (g.as_mut(), self.core.upgrade()) else {
            return false;
        };
        if core.stopped() {
            return false;
        }
        let setup = configure_data_socket(&sock, self.peer_timeout)
            .and_then(|()| sock.set_nonblocking(true));
        if let Err(e) = setup {
            tracing::warn!("data stream {who} from {}: {e}", core.peer);
            return false;
        }
        let sock = Arc::new(sock);
        if !core.attach(who, sock.clone()) {
            return false;
        }
        let make = |kicker| {
            Arc::new_cyclic(|me| RxTask {
                me: me.clone(),
                core: self.core.clone(),
                sock: sock.clone(),
                who,
                lim: self.lim,
                parked: AtomicBool::new(false),
                codec: self.codec.clone(),
                kicker,
                decoded: Mutex::new(None),
                state: Mutex::new(Some(RxState {
                    rx: StreamRx::new(Role::Data, core.peer, self.max_chunk, self.lim.format)
                        .with_budget(self.lim.buffer_cap),
                    lanes: None,
                })),
            })
        };
        let (task, reg) = match workers(self.io_threads).and_then(|w| w.register_with(make)) {
            Ok(r) => r,
            Err(e) => {
                core.fail(e);
                return false;
            }
        };
        tasks.push((task, reg));
        // The sender writes on this stream only once it reads this byte; a fresh
        // socket's buffer always takes it.
        if let Err(e) = sock.send_with_flags(&[STREAM_ACK], libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        {
            core.fail(Error::io(
                format!("data stream {who} from {}", core.peer),
                e,
            ));
            return false;
        }
        true
    }
}

impl RecvComm {
    /// A comm on `inline` (the inline stream, which carries the connection's
    /// first messages), whose sender may open up to `nstreams` data streams later
    /// (the listener gives them to the returned [`Attach`]). `max_chunk` is the
    /// sender's (from its hello); it bounds a chunk and an inline message.
    /// `format`: the codec frame format the sender writes at most (its hello).
    pub(super) fn new(
        inline: Socket,
        nstreams: usize,
        peer: SocketAddr,
        max_chunk: usize,
        format: u8,
        cfg: Arc<Config>,
    ) -> Result<(RecvComm, Weak<dyn Attach>)> {
        configure_data_socket(&inline, cfg.peer_timeout)
            .map_err(|e| Error::io("configure socket", e))?;
        let max_wire = crate::codec_glue::max_wire(max_chunk);
        let lanes = cfg.gpu_lanes;
        let lim = RxLimits {
            max_chunk,
            max_wire,
            lanes,
            buffer_cap: crate::budget::cap(cfg.buffer_mb),
            format,
        };
        let core = Core::new(
            nstreams,
            inline,
            peer,
            "recv from",
            cfg.stats.then_some(super::send::STATS_EVERY),
            Some(lim),
        )?;
        workers(cfg.io_threads)?;
        let codec = codec_workers(cfg.codec_threads)?.queue();
        let streams = Arc::new(RxStreams {
            core: Arc::downgrade(&core),
            lim,
            max_chunk,
            peer_timeout: cfg.peer_timeout,
            io_threads: cfg.io_threads,
            codec: codec.clone(),
            tasks: Mutex::new(Some(Vec::new())),
        });
        let weak: Weak<dyn Attach> = Arc::downgrade(&streams) as Weak<dyn Attach>;
        info!("recv comm from {peer}: the inline stream, up to {nstreams} data streams on demand");
        Ok((
            RecvComm {
                core,
                max_wire,
                lanes,
                streams,
                codec,
                remove: None,
            },
            weak,
        ))
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
        // The slot is free, so no stream reads this entry until `post` below
        // publishes the request (the ring's lock orders the two).
        *self.core.devs[seq as usize % NSLOTS].lock() = dev;
        let slot = ring
            .post(None, 0, Some((buf as usize, cap)))
            .map(|(_, s)| s);
        // Data streams that hold a header for a receive not posted: go on. (Pairs
        // with the fence in `RxTask::run`: either it sees this post, or we see
        // that it parked.)
        fence(SeqCst);
        if let Some(tasks) = self.streams.tasks.lock().as_ref() {
            for (t, reg) in tasks {
                if t.parked.swap(false, SeqCst) {
                    reg.kick();
                }
            }
        }
        // A small message may already wait on the inline stream.
        self.core.poke();
        Ok(slot)
    }

    /// Makes the lanes this comm's streams can use at once on device `b` (from
    /// `regMr`, so that receives never allocate).
    pub fn prewarm_device(&self, b: &Arc<dyn Backend>) -> Result<()> {
        crate::gpu::pool::pool(b, Dir::Recv, self.max_wire, self.lanes)
            .prewarm(self.core.socks.len() + 1) // + 1: the inline stream's reader
                                                // (every data stream counted, up or not)
    }

    /// This comm's failure report (one WARN per comm).
    pub fn report(&self) -> &crate::proto::slots::Report {
        self.core.ring.report()
    }

    /// This comm's counters.
    pub fn stats(&self) -> &crate::stats::Stats {
        &self.core.stats
    }
}

impl Drop for RecvComm {
    fn drop(&mut self) {
        // Out of the listener's table first (its lock is taken before ours when
        // it attaches a stream): no stream attaches from now on.
        self.remove.take();
        self.core.begin_close(true);
        // No codec worker writes NCCL's buffers for this comm from now on.
        self.codec.close();
        // Once a stream's state is gone no worker touches NCCL's buffers for it:
        // taking it waits for a run in progress.
        let tasks = self.streams.tasks.lock().take().unwrap_or_default();
        for (t, reg) in tasks {
            if let Some(mut st) = t.state.lock().take() {
                st.rx.release(&self.core.stats);
            }
            reg.close();
        }
        info!(
            "closed recv comm from {}: {}",
            self.core.peer,
            self.core.stats.summary()
        );
    }
}

/// A stream's receive machine, and the lanes that move its chunks bound for
/// device memory.
pub(super) struct RxState {
    rx: StreamRx,
    lanes: Option<Lanes>,
}

/// A data stream of a receive comm, as a worker drives it.
struct RxTask {
    me: Weak<RxTask>,
    core: Weak<Core>,
    /// Kept here too, so the fd stays valid while a worker holds the task.
    sock: Arc<Socket>,
    who: usize,
    lim: RxLimits,
    /// Holds a header whose receive is not posted: `irecv` kicks it.
    parked: AtomicBool,
    codec: Arc<CommQueue>,
    /// Runs this stream again.
    kicker: Kicker,
    /// A frame back from the codec workers, and how its decoding went.
    decoded: Mutex<Option<(Frame, Result<()>)>>,
    /// `None` once the comm closed.
    state: Mutex<Option<RxState>>,
}

impl RxTask {
    /// Queues the decoding of `frame` on the codec workers, which put it in
    /// [`RxTask::decoded`] and kick the stream.
    fn decode_on_codec_worker(&self, core: &Arc<Core>, frame: Frame) -> Result<()> {
        self.on_codec_worker(core, frame, "the decoder", |frame, core| {
            with_thread_decoder(|d| frame.decode(d, &core.stats))
        })
    }

    /// Queues device chunk `seq`'s placement (`frame`, through `lane`) on the
    /// codec workers, which hand the frame back and kick the stream.
    fn place_on_codec_worker(
        &self,
        core: &Arc<Core>,
        frame: Frame,
        mut lane: LaneGuard,
        seq: u64,
    ) -> Result<()> {
        self.on_codec_worker(core, frame, "placing a device chunk", move |frame, core| {
            let c = frame
                .device_chunk(seq)
                .ok_or_else(|| Error::Internal("a host frame as a device chunk".into()))?;
            place_on_device(&mut lane, &c, &core.stats)
        })
    }

    /// Runs `work` on `frame` on the codec workers (a panic is an error of
    /// `what`), then puts the frame and the result in [`RxTask::decoded`] and
    /// kicks the stream.
    fn on_codec_worker(
        &self,
        core: &Arc<Core>,
        frame: Frame,
        what: &'static str,
        work: impl FnOnce(&Frame, &Core) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let (me, core, kicker) = (self.me.clone(), core.clone(), self.kicker.clone());
        let job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&frame, &core)))
                .unwrap_or_else(|_| Err(Error::Internal(format!("{what} panicked"))));
            if let Some(task) = me.upgrade() {
                *task.decoded.lock() = Some((frame, r));
                kicker.kick();
            }
        });
        if self.codec.submit(job) {
            Ok(())
        } else {
            Err(Error::Internal("recv comm closed".into()))
        }
    }
}

impl Driven for RxTask {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn run(&self) -> Next {
        let mut g = self.state.lock();
        let Some(st) = g.as_mut() else {
            return Next::Done;
        };
        let Some(core) = self.core.upgrade() else {
            return Next::Done;
        };
        if core.stopped() {
            return Next::Done;
        }
        if let Some((frame, r)) = self.decoded.lock().take() {
            if let Err(e) = st.rx.frame_done(frame, r, &core.ring, &core.stats) {
                core.fail(e);
                return Next::Done;
            }
        }
        let offload = |f| self.decode_on_codec_worker(&core, f);
        let offload_device = |f, lane, seq| self.place_on_codec_worker(&core, f, lane, seq);
        loop {
            // Before any ask of the budget: a release after this wakes a refusal.
            let seen = crate::budget::releases();
            let r = pump_rx(
                &self.sock,
                &core,
                self.who,
                st,
                self.lim,
                RUN_BUDGET,
                Some(&offload),
                Some(&offload_device),
            );
            return match r {
                Ok(Stop::Drained) => Next::Readable,
                Ok(Stop::Yield) => Next::Yield,
                // The codec workers kick it.
                Ok(Stop::Decoding) => Next::Park,
                Ok(Stop::LaneBusy) => Next::Retry,
                // Woken when a reservation is given back.
                Ok(Stop::Budget) => {
                    let kicker = self.kicker.clone();
                    crate::budget::wake_on_release(seen, Box::new(move || kicker.kick()));
                    Next::Park
                }
                Ok(Stop::Ended) => Next::Done,
                Ok(Stop::Posted(seq)) => {
                    self.parked.store(true, SeqCst);
                    fence(SeqCst);
                    // Posted meanwhile (its `irecv` may have missed `parked`).
                    if !matches!(core.ring.lookup(seq), Lookup::NotYet) {
                        self.parked.store(false, SeqCst);
                        continue;
                    }
                    Next::Park
                }
                Err(e) => {
                    if !core.closing() {
                        core.fail(e);
                    }
                    Next::Done
                }
            };
        }
    }
}

/// Bytes a data stream reads in one run before its worker moves on to others:
/// about one chunk, so that one busy stream does not keep the worker's other
/// streams unread for long.
const RUN_BUDGET: usize = 256 << 10;

/// Why [`pump_rx`] stopped.
pub(super) enum Stop {
    /// The socket has nothing more now (`EAGAIN` or a short read).
    Drained,
    /// The run read its share of bytes; the socket may have more.
    Yield,
    /// The next chunk's receive (message `seq`) is not posted.
    Posted(u64),
    /// A chunk for device memory waits for a free lane.
    LaneBusy,
    /// A frame is out on the codec workers, who kick the stream when it is done.
    Decoding,
    /// The next chunk waits for room in the process's buffer budget.
    Budget,
    /// The stream ended cleanly (the comm was told).
    Ended,
}

/// Drives stream `who`'s receive machine with non-blocking reads of `sock` until
/// the socket is empty, a chunk must wait, or about `budget` bytes were read (so
/// that one busy stream does not hold its worker from the others; the socket
/// still has bytes, so it is ready again at once). Never blocks, never waits for
/// a lane. Frames go to `offload` (the codec workers), or are decoded here.
pub(super) fn pump_rx(
    sock: &Socket,
    core: &Core,
    who: usize,
    st: &mut RxState,
    lim: RxLimits,
    mut budget: usize,
    offload: Option<&dyn Fn(Frame) -> Result<()>>,
    offload_device: Option<&dyn Fn(Frame, LaneGuard, u64) -> Result<()>>,
) -> Result<Stop> {
    let peer = core.peer;
    let io_err = |e| Error::io(format!("receive from {peer} (stream {who})"), e);
    let (ring, stats) = (&core.ring, &core.stats);
    loop {
        let want = st.rx.want(ring, core, stats)?;
        if !matches!(want, Want::Posted(_)) {
            ring.producer_waits(who, None);
        }
        match want {
            // Out of budget only where the stream waits for bytes anyway (a staged
            // device chunk must be placed first: no socket event would bring the
            // stream back for it).
            Want::Read(_) if budget == 0 => return Ok(Stop::Yield),
            Want::Read(buf) => match (buf.len(), read_some(sock, buf)) {
                (_, Ok(0)) => {
                    st.rx.eof()?;
                    core.stream_ended(who);
                    return Ok(Stop::Ended);
                }
                (asked, Ok(n)) => {
                    st.rx.advance(n, ring, stats)?;
                    if st.rx.at_boundary() {
                        core.maybe_report();
                    }
                    budget = budget.saturating_sub(n);
                    if n < asked {
                        // The socket's queue is empty: another read would only
                        // say so (a system call per wake-up saved; where one
                        // stream's window is the limit, each is on the path of
                        // the window's round trip). The item being read is not
                        // complete, so nothing waits on this run. A FIN that
                        // came with these bytes is remembered by the worker.
                        return Ok(Stop::Drained);
                    }
                }
                (_, Err(e)) if would_block(&e) => return Ok(Stop::Drained),
                (_, Err(e)) => return Err(io_err(e)),
            },
            // Not posted yet: the header waits, and so does the socket, unless no
            // other stream can bring the pending receives.
            Want::Posted(seq) => {
                return match ring.producer_waits(who, Some(seq)) {
                    Some(seq) => Err(core.stalled(seq)),
                    None => Ok(Stop::Posted(seq)),
                }
            }
            Want::Device(c) => {
                if c.raw_len > 0 {
                    let b = core.devs[c.seq as usize % NSLOTS]
                        .lock()
                        .clone()
                        .ok_or_else(|| Error::Internal("device chunk without a device".into()))?;
                    let lanes = st
                        .lanes
                        .get_or_insert_with(|| Lanes::new(Dir::Recv, lim.max_wire, lim.lanes));
                    // Never wait for a lane (the pool was prewarmed for this
                    // comm's readers): all busy, try again soon.
                    let Some(mut lane) = lanes.try_take(&b)? else {
                        return Ok(Stop::LaneBusy);
                    };
                    stats.add(&stats.chunks_device, 1);
                    // The copy (and decode) to the device on the codec workers,
                    // not on this thread, which drives other comms' streams.
                    if let Some(device) = offload_device {
                        let seq = c.seq;
                        device(st.rx.take_device()?, lane, seq)?;
                        return Ok(Stop::Decoding);
                    }
                    place_on_device(&mut lane, &c, stats)?;
                }
                st.rx.device_done(ring, stats)?;
            }
            Want::Decode => match offload {
                Some(f) => {
                    f(st.rx.take_frame()?)?;
                    return Ok(Stop::Decoding);
                }
                None => st.rx.decode_here(ring, stats)?,
            },
            Want::Decoding => return Ok(Stop::Decoding),
            Want::Budget => return Ok(Stop::Budget),
        }
    }
}

/// Copies a staged chunk to its device buffer through `lane`, decoding it there
/// (GPU) or on the CPU first when the device has no kernels.
pub(super) fn place_on_device(
    lane: &mut crate::gpu::pool::LaneGuard,
    c: &DeviceChunk,
    stats: &crate::stats::Stats,
) -> Result<()> {
    let wire = c.wire.len();
    if !c.compressed {
        lane.staging(c.raw_len)?.copy_from_slice(c.wire);
        return lane.upload(c.dst, c.raw_len);
    }
    if lane.kernels() {
        lane.staging(wire)?.copy_from_slice(c.wire);
        gpu_decode(lane, wire, c.dst, c.raw_len, stats)
    } else {
        let mut out = vec![0u8; c.raw_len];
        decode_chunk(c.wire, &mut out, stats)?;
        lane.upload_from(c.dst, &out)
    }
}

impl RxState {
    /// The inline stream's state (`inline.rs`).
    pub(super) fn inline(peer: SocketAddr, lim: RxLimits) -> RxState {
        RxState {
            rx: StreamRx::new(Role::Inline, peer, lim.max_chunk, lim.format)
                .with_budget(lim.buffer_cap),
            lanes: None,
        }
    }
}

/// Whether `e` means "try again later".
pub(super) fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// One non-blocking read.
pub(super) fn read_some(s: &Socket, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: u8 and MaybeUninit<u8> have the same layout, and recv only writes.
    let b = unsafe {
        std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<MaybeUninit<u8>>(), buf.len())
    };
    s.recv_with_flags(b, libc::MSG_DONTWAIT)
}
