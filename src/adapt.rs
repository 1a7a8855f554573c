//! Adaptive compression, per connection: decides for each chunk whether to run the
//! codec. Pure logic (the clock is passed in), unit-tested.
//!
//! Three gates, cheapest first:
//! 1. **Size.** Chunks below [`MIN_COMPRESS_BYTES`] go raw.
//! 2. **Static cost model.** Compression can pay only when the ratio
//!    `r >= MIN_RATIO` and, when the user gave the link's speed `L`
//!    (`NCCL_ZIP_LINK_MBPS`), the codec's aggregate throughput `C` (one thread's
//!    rate in its own CPU time, times the streams up to the cores) beats
//!    `L * COST_MARGIN`. Otherwise chunks go raw for [`REPROBE_EVERY`] chunks, then
//!    one chunk goes through the codec again (each probe that still finds no
//!    gain doubles the wait, up to [`MAX_REPROBE_EVERY`] chunks). A device's
//!    nominal speed is not used (issue 21: a veth says 10 Gbit/s whatever
//!    shapes it, and a shared uplink is slower than its port); without it,
//!    fast links are kept off the codec by the measurement below: compression
//!    is not explored while raw already sends faster than `C * COST_MARGIN`.
//! 3. **Measured throughput.** The model cannot see everything that competes for
//!    the CPU: the receiver's decoder, the kernel's TCP stack, the training job.
//!    So the policy runs epochs of [`EPOCH_BYTES`] (and at least [`MIN_EPOCH`])
//!    in one mode and measures the rate at which the sender takes raw bytes,
//!    plus what the process
//!    received meanwhile ([`RECEIVED`]): when nodes send to each other, the
//!    decoding this comm's compression causes at the peer slows what the peer
//!    sends back. In steady state that is the
//!    pipeline's throughput, backpressure from a slow receiver or link included.
//!    The faster mode runs. Now and then an epoch runs the other mode, so that a
//!    change in the link, the data or the load that makes it faster is noticed:
//!    after [`EXPLORE_EPOCHS`] epochs (four times that when it measured more than
//!    1.5x slower), and each time it confirms the choice, twice as long after, up
//!    to [`MAX_EXPLORE_EPOCHS`]. Only an exploration switches modes, and it is
//!    judged against the running mode on both sides: A, the other mode B (two
//!    epochs: the first settles, as the buffers still hold A's bytes), then A
//!    twice; B takes over if it beats the A epoch before it and the A epoch
//!    after it by its margin ([`SWITCH_MARGIN`] for compression,
//!    [`RAW_MARGIN`] for raw). The A epoch after it is, for compressed A, the
//!    better of the two: the pipelines still carry raw B's effects (a receive
//!    backlog), which penalise one of them, not both; for raw A the second:
//!    the first fills the buffers compression left with room. On a shared
//!    machine conditions change between epochs (other tenants, the peer's own
//!    mode), and comparing a fresh figure with one many epochs old let noise
//!    carry CPU-bound runs into compression (issue 21, 4 GiB both ways); a step
//!    change moves B and one of its neighbours together. When the running
//!    mode's average falls behind the other's older figure, the exploration
//!    comes after one more epoch. In steady state explorations then cost about
//!    `(gap - 1) / 97` of the throughput, where `gap` is how many times slower the
//!    explored mode is: 0.5% at 1.45x, 2% at 3x. An exploration that measures
//!    [`CUT_FACTOR`] times slower than the running mode a quarter of the way
//!    into its settling epoch ends there: even the buffers' start did not help
//!    it (compression where the codec is the bottleneck, raw where the link
//!    is). On the unshaped veth this cut a 1 GiB run's learning cost from
//!    2.1% to 0.8% (simulation). A compressed trial is cut only in its
//!    measured epoch: its settling epoch, after raw ones, can be slow for the
//!    switch's sake alone (see `Policy::hopeless_exploration`), and where
//!    the cores cannot carry compression the CPU bound keeps it from being
//!    tried.
//!    A measured raw epoch also bounds what compression could move with the
//!    node's cores (the CPU time of the plugin's worker threads, the codec's
//!    speed and the ratio, and where the peer sends too, the decode that
//!    compression costs at the peer); where even that bound stays below
//!    [`SWITCH_MARGIN`], compression is neither learned nor explored (see
//!    `Policy::next_epoch`). Where it stays below [`TIGHT_ROOM`] the cores
//!    may be what limits: raw trials are not cut short, and compression's
//!    first figure gets no head start over raw's.
//!    An epoch that
//!    spans an idle gap (no chunk for [`IDLE`]) measures the application, not us,
//!    and is discarded.
//!
//!    Learning measures raw, then compression, each after an epoch that only
//!    settles (compression's is cut short where it is hopeless). A comm's
//!    first epoch measures its start, not a mode: the buffers take bytes at
//!    memory speed, and a peer that starts later sends nothing back yet. On
//!    2 Gbit/s both ways a compressed start measured 0.35 to 1.0 GB/s against
//!    a steady 0.7, and where it measured low, raw ran for a quarter of the
//!    run. A mode's first epoch after a switch is flattered while socket
//!    buffers still have room, and compression's after raw epochs measures
//!    raw's rate while it drains the raw bytes the buffers hold. When the
//!    static model finds the codec [`CONFIDENT`] times faster than the link
//!    (the user gave its speed), learning starts compressed instead and raw is
//!    measured after [`LEARN_EPOCHS`] compressed epochs. A traced run:
//!    `NCCL_DEBUG=TRACE` prints one line per epoch.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::CompressMode;

/// Chunks below this go raw: a frame header and a codec call cost more than they save.
pub const MIN_COMPRESS_BYTES: usize = 4096;
/// Below this ratio compression does not pay, whatever the link.
pub const MIN_RATIO: f64 = 1.03;
/// Chunks sent raw before compression is tried again after it stopped paying.
pub const REPROBE_EVERY: u32 = 64;
/// Each probe that finds compression still not paying doubles the chunks sent
/// raw before the next one, up to this many (256 MiB of 256 KiB chunks). On
/// incompressible traffic a probe every 65 chunks puts 1.5% of the bytes
/// through the encoder for nothing, one every 1,025 chunks 0.1% (issue 21's
/// CPU-bound cell: both ways, unshaped, random bytes). A probe that finds it
/// paying starts over at [`REPROBE_EVERY`].
pub const MAX_REPROBE_EVERY: u32 = 1024;
/// Codec throughput must beat the link by this factor before compression is used.
pub const COST_MARGIN: f64 = 1.25;
/// Bytes per measurement epoch, whatever the chunk size (16 MiB: 64 chunks of
/// 256 KiB): more than the send buffers of four TCP streams hold by default, so
/// that an epoch mostly measures the pipeline, not a buffer. (10 MiB measured
/// better on the simulated 2 Gbit/s link but flipped to compression on the
/// unshaped veth, whose send and receive buffers hold some 40 MiB.)
pub const EPOCH_BYTES: u64 = 16 << 20;
/// The shortest epoch: one of [`EPOCH_BYTES`] that went by faster goes on until
/// this much time has passed (and an exploration is cut no earlier than a
/// quarter of it). Where the pipeline moves several GB/s (an unshaped link
/// between two nodes' cores), 16 MiB take 4-5 ms, a scheduler time slice or
/// two, and single epochs measured 1.8-6.5 GB/s within one run (session 16,
/// traced, both ways unshaped): comparing such figures made explorations
/// switch into compression on noise. With 10 ms, both ways unshaped went from
/// auto/off 0.913 to 1.004 (20 shuffled rounds, same rounds, the compressed
/// share from about 30% to 5%; `bench/results/adapt-min-epoch-2026-11-26-s16.md`).
/// Slower pipelines are not affected: 16 MiB take 64 ms at 2 Gbit/s. (20 ms
/// cost the simulated 2 Gbit/s cells a little, through learning's first,
/// buffer-filled epochs.)
pub const MIN_EPOCH: Duration = Duration::from_millis(10);
/// Epochs of the faster mode before the slower one is first explored again.
pub const EXPLORE_EPOCHS: u32 = 12;
/// The longest run of the faster mode between two explorations: the interval
/// doubles each time an exploration confirms the choice (1.5 GiB of traffic at
/// 16 MiB epochs; some 6 s on a 2 Gbit/s link).
pub const MAX_EXPLORE_EPOCHS: u32 = 96;
const _: () = assert!(4 * EXPLORE_EPOCHS <= MAX_EXPLORE_EPOCHS);
/// A codec at least this many times faster than the link (static model) delays
/// raw's first measurement until [`LEARN_EPOCHS`] compressed epochs ran.
pub const CONFIDENT: f64 = 4.0;
/// Compressed epochs before raw is first measured, for a confident codec.
pub const LEARN_EPOCHS: u32 = 3;
/// Compression must measure this much faster than raw to take over.
pub const SWITCH_MARGIN: f64 = 1.05;
/// Raw must measure this much faster than compression to take over.
pub const RAW_MARGIN: f64 = 1.1;
/// A gap this long between two chunks means the application paused.
pub const IDLE: Duration = Duration::from_millis(50);
/// An exploration of compression is cut short once it measures this many times
/// slower than raw (see [`Policy::hopeless_exploration`]).
pub const CUT_FACTOR: f64 = 1.25;
/// A CPU bound (see `Policy::next_epoch`) below this says the node's cores,
/// not the link, may be what limits: compression could move at most this many
/// times raw's figure. There, a raw trial that measures [`CUT_FACTOR`] times
/// slower than compression is draining compressed bytes, not measuring raw,
/// and is not cut; and compression's first figure gets no head start over
/// raw's. On noisy cores the bound reads high (time the core gave other work
/// is not the process's): both ways at 10 Gbit/s on simulated cores left 70%
/// of their time by other work, where compression moves 0.745x, it read
/// 1.07-1.27x.
pub const TIGHT_ROOM: f64 = 1.5;
const ALPHA: f64 = 0.25;
/// The codec speed a policy assumes before it measured one (bytes per second of
/// one core), and the least its CPU bound takes it at.
const PRIOR_CODEC_BPS: f64 = 2e9;
/// The weight of an exploration's figure.
const EXPLORE_ALPHA: f64 = 0.5;

/// Bytes this process received (placed in the application's buffers, decoded),
/// on all its comms. A policy's epoch figure adds what arrived during the epoch
/// to what the comm sent: when two nodes send to each other, compressing costs
/// the receiving node decode time that it would have spent sending, and that
/// shows only in what comes back.
#[derive(Debug, Default)]
pub struct Meter {
    bytes: std::sync::atomic::AtomicU64,
}

impl Meter {
    pub fn add(&self, n: u64) {
        self.bytes
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The process's [`Meter`], fed by every receive path.
pub static RECEIVED: Meter = Meter {
    bytes: std::sync::atomic::AtomicU64::new(0),
};

/// The CPU time a node has used, for the policy's CPU bound
/// (`Policy::next_epoch`): the plugin's own worker threads' in the plugin
/// ([`count_this_thread`]), a simulated node's core time in the tests.
///
/// Not the process's: NCCL's proxy thread (and `nccl-zip-perf`'s driver)
/// calls `test()` in a loop and keeps a core busy whatever moves, so the
/// process's CPU time says nothing about what sending costs. Measured that
/// way, one way at 10 Gbit/s on the VM, where compression pays 1.2x, the bound
/// kept 9 of 10 runs raw.
#[derive(Debug)]
pub enum CpuClock {
    OwnThreads,
    #[cfg(test)]
    Counted(std::sync::atomic::AtomicU64),
}

impl CpuClock {
    /// Nanoseconds used so far.
    pub fn ns(&self) -> u64 {
        match self {
            CpuClock::OwnThreads => {
                let clocks = OWN_THREADS.lock().unwrap_or_else(|p| p.into_inner());
                clocks
                    .iter()
                    .filter_map(|&c| crate::stats::clock_ns(nix::time::ClockId::from_raw(c)))
                    .sum()
            }
            #[cfg(test)]
            CpuClock::Counted(n) => n.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    #[cfg(test)]
    pub fn add(&self, ns: u64) {
        if let CpuClock::Counted(n) = self {
            n.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The plugin's [`CpuClock`].
pub static PLUGIN_CPU: CpuClock = CpuClock::OwnThreads;

/// The CPU clocks of the threads that move and code a TCP comm's bytes (I/O
/// workers, blocking writers, codec workers): they block when idle, so their
/// CPU time is the work. Threads that poll (IB progress) are not counted;
/// without counted threads the bound sees only the encode and stays far
/// above its margin on a node of several cores.
static OWN_THREADS: std::sync::Mutex<Vec<libc::clockid_t>> = std::sync::Mutex::new(Vec::new());

/// Counts the calling thread's CPU time in [`PLUGIN_CPU`] (a worker thread
/// calls it once when it starts; the plugin's workers live as long as the
/// process).
pub fn count_this_thread() {
    let mut c: libc::clockid_t = 0;
    // SAFETY: pthread_self() is the calling thread; `c` is a valid out pointer.
    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut c) } == 0 {
        OWN_THREADS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c);
    }
}

/// What the CPU bound of an epoch needs besides the epoch itself.
#[derive(Clone, Copy, Debug)]
struct CpuView {
    /// The node's CPU time now, nanoseconds.
    ns: u64,
    /// The cores the node may use.
    cores: f64,
    /// The compression ratio, and the codec's speed on one core (bytes of input
    /// per second of its CPU time; infinite when it runs on a device), once a
    /// chunk went through the codec; `None` before.
    codec: Option<(f64, f64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Compress,
    /// Raw would be chosen, but this one chunk goes through the codec to measure
    /// it: the data or the codec may have changed. Only
    /// [`Policy::decide_or_probe`] says so; [`Policy::decide`] says `Compress`.
    Probe,
    /// Too small to be worth it.
    RawSmall,
    /// Off, compression would not pay (static model), or raw measured faster.
    RawBypass,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Compressed = 0,
    Raw = 1,
}

impl Mode {
    fn other(self) -> Mode {
        match self {
            Mode::Compressed => Mode::Raw,
            Mode::Raw => Mode::Compressed,
        }
    }
}

#[derive(Debug)]
struct Epoch {
    mode: Mode,
    start: Instant,
    last: Instant,
    bytes: u64,
    idle: bool,
    /// Measured throughput per mode, bytes per second.
    thr: [Option<f64>; 2],
    /// Epochs of the faster mode before the next exploration.
    until_explore: u32,
    /// The interval the last exploration set (doubles while explorations confirm).
    explore_every: u32,
    /// The current epoch explores the mode that measured slower (B of A, B, A, A).
    exploring: bool,
    /// What the epoch before the exploration (the first A) measured.
    before: Option<f64>,
    /// The A epochs after B: the first A's and B's figures.
    confirm: Option<(Option<f64>, Option<f64>)>,
    /// A epochs after B still to run before the one compared with B.
    skip: u32,
    /// What the A epoch right after B measured.
    after_skip: Option<f64>,
    /// The first choice between measured modes is made.
    decided: bool,
    /// Compressed epochs measured so far.
    c_epochs: u32,
    /// The received meter at the epoch's start.
    rx_start: u64,
    /// The node's CPU time at the epoch's start, nanoseconds.
    cpu_start: u64,
    /// The last measured raw epoch's CPU bound: how many times raw's figure
    /// compression could move at most with the cores the node has (see
    /// [`Policy::next_epoch`]); `None` before one was measured with a codec
    /// figure.
    cpu_room: Option<f64>,

    /// The epoch fills buffers after a switch and is not measured.
    settling: bool,
    /// This comm's own send rate in raw epochs (bytes per second): the codec
    /// cannot beat it when it is faster than the codec itself.
    raw_own: Option<f64>,
}

impl Epoch {
    /// The last CPU bound says compression could move less than `x` times
    /// raw's figure (no bound yet: not below).
    fn room_below(&self, x: f64) -> bool {
        self.cpu_room.is_some_and(|r| r < x)
    }
}

#[derive(Debug)]
struct State {
    ratio: f64,
    /// Codec throughput of one thread, bytes per second of the codec's own time
    /// (the thread's CPU time on a core; the wall time on a device).
    codec_bps: f64,
    bypass_left: u32,
    /// The next bypass window's length: [`REPROBE_EVERY`], doubled by each
    /// probe that still does not pay, up to [`MAX_REPROBE_EVERY`].
    reprobe_every: u32,
    /// Chunks [`Policy::record`] has seen: the first one's ratio replaces the
    /// optimistic prior instead of being averaged with it.
    recorded: u32,
    /// The fastest chunk the codec coded, bytes per second of its own time:
    /// the CPU bound takes the codec at its best (a bound for compression).
    best_bps: f64,
    /// The codec runs on a device ([`Policy::record_device`]): its time is not
    /// the node's cores'.
    device: bool,
    /// The comm's first chunk large enough went through the codec as a probe,
    /// so that learning's CPU bound has a ratio and a codec speed.
    probed: bool,
    /// The bypass window ended: the next chunk goes through the codec, so the
    /// estimates are fresh when the gate is checked again.
    probe: bool,
    epoch: Option<Epoch>,
}

#[derive(Debug)]
pub struct Policy {
    mode: CompressMode,
    /// Link bytes per second, when the user said (`NCCL_ZIP_LINK_MBPS`). A
    /// device's nominal speed is no such figure: the bottleneck may be a shaped,
    /// shared or oversubscribed path far slower than the port.
    link_bps: Option<f64>,
    /// How many threads compress at once: the streams, at most the cores.
    parallel: f64,
    /// What this process receives ([`RECEIVED`] in the plugin).
    received: &'static Meter,
    /// The node's CPU time ([`PLUGIN_CPU`] in the plugin), and the cores it
    /// may use.
    cpu: &'static CpuClock,
    cores: f64,
    state: Mutex<State>,
}

impl Policy {
    /// `link_mbps`: the link's speed if the user gave it; `streams`: threads that
    /// compress and share it.
    pub fn new(mode: CompressMode, link_mbps: Option<u64>, streams: usize) -> Policy {
        // Unit tests drive policies with simulated clocks, and the process's
        // CPU time (other tests' threads included) means nothing against them:
        // their CPU clock stays at 0 (the bound then counts only the encode).
        #[cfg(test)]
        static CPU: CpuClock = CpuClock::Counted(std::sync::atomic::AtomicU64::new(0));
        #[cfg(not(test))]
        let cpu = &PLUGIN_CPU;
        #[cfg(test)]
        let cpu = &CPU;
        Policy::with_meter(mode, link_mbps, streams, &RECEIVED, cpu)
    }

    fn with_meter(
        mode: CompressMode,
        link_mbps: Option<u64>,
        streams: usize,
        received: &'static Meter,
        cpu: &'static CpuClock,
    ) -> Policy {
        // The cores this process may run on (its affinity mask and cgroup quota).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Policy {
            mode,
            link_bps: link_mbps.map(|m| m as f64 * 1e6 / 8.0),
            received,
            cpu,
            cores: cores as f64,
            // Streams compress in parallel only as far as there are cores.
            parallel: streams.max(1).min(cores) as f64,
            // Optimistic start, so the first chunks probe the codec.
            state: Mutex::new(State {
                ratio: 1.4,
                codec_bps: PRIOR_CODEC_BPS,
                bypass_left: 0,
                reprobe_every: REPROBE_EVERY,
                recorded: 0,
                best_bps: 0.0,
                device: false,
                probed: false,
                probe: false,
                epoch: None,
            }),
        }
    }

    /// The policy of one simulated node (tests): no link-speed hint, one core,
    /// the node's own received meter and CPU clock.
    #[cfg(test)]
    fn for_sim(mode: CompressMode, received: &'static Meter, cpu: &'static CpuClock) -> Policy {
        let mut p = Policy::with_meter(mode, None, 4, received, cpu);
        p.parallel = 1.0;
        p.cores = 1.0;
        p
    }

    pub fn decide(&self, len: usize) -> Decision {
        self.decide_at(len, Instant::now())
    }

    /// [`Policy::decide`], telling a probe from a chunk compressed because it
    /// pays: a caller may measure the probe where it is cheaper and send the
    /// chunk raw (the inline stream, see `transport/tcp/send.rs`).
    pub fn decide_or_probe(&self, len: usize) -> Decision {
        self.decision_at(len, Instant::now())
    }

    #[cfg(test)]
    fn decide_or_probe_at(&self, len: usize, now: Instant) -> Decision {
        self.decision_at(len, now)
    }

    /// [`Policy::decide`] with the clock passed in.
    pub fn decide_at(&self, len: usize, now: Instant) -> Decision {
        match self.decision_at(len, now) {
            Decision::Probe => Decision::Compress,
            d => d,
        }
    }

    fn decision_at(&self, len: usize, now: Instant) -> Decision {
        match self.mode {
            CompressMode::Off => return Decision::RawBypass,
            _ if len < MIN_COMPRESS_BYTES => return Decision::RawSmall,
            CompressMode::On => return Decision::Compress,
            CompressMode::Auto => {}
        }
        let mut s = self.state.lock();
        if s.bypass_left > 0 {
            s.bypass_left -= 1;
            s.probe = s.bypass_left == 0;
            return Decision::RawBypass;
        }
        if !self.pays(s.ratio, s.codec_bps) {
            if std::mem::take(&mut s.probe) {
                // One chunk through the codec: the data or the codec may have
                // changed, and only a compressed chunk tells.
                return Decision::Probe;
            }
            let every = s.reprobe_every;
            tracing::debug!(
                "adapt: raw for {every} chunks: ratio {:.3}, codec {:.3} GB/s x {} threads, link {}",
                s.ratio,
                s.codec_bps / 1e9,
                self.parallel,
                self.link_bps
                    .map_or("not given".to_string(), |l| format!("{:.3} GB/s", l / 1e9))
            );
            s.bypass_left = every;
            s.reprobe_every = every.saturating_mul(2).min(MAX_REPROBE_EVERY);
            return Decision::RawBypass;
        }
        s.probe = false;
        s.reprobe_every = REPROBE_EVERY;
        if s.recorded == 0 && !std::mem::replace(&mut s.probed, true) {
            // The comm's first chunk goes through the codec: learning's CPU
            // bound needs the data's ratio and the codec's speed before
            // compression's first epoch (see [`Policy::next_epoch`]).
            return Decision::Probe;
        }
        let codec = s.codec_bps * self.parallel;
        let rx = self.received.get();
        // The codec as the CPU bound takes it: at its fastest, and not on the
        // cores at all on a device.
        let one = if s.device {
            f64::INFINITY
        } else {
            s.best_bps.max(PRIOR_CODEC_BPS)
        };
        let codec_seen = (s.recorded > 0).then_some((s.ratio, one));
        // The CPU clock is read only where an epoch starts or ends.
        let view = || CpuView {
            ns: self.cpu.ns(),
            cores: self.cores,
            codec: codec_seen,
        };
        // A codec far faster than a link the user described: compression
        // will almost surely win, and raw is measured only once buffers are
        // full (see below).
        let confident = self.link_bps.is_some_and(|l| codec >= CONFIDENT * l);
        let e = s.epoch.get_or_insert_with(|| Epoch {
            // Learning starts raw (see [`Policy::next_epoch`]), or compressed
            // for a confident codec.
            mode: if confident {
                Mode::Compressed
            } else {
                Mode::Raw
            },
            start: now,
            last: now,
            bytes: 0,
            idle: false,
            thr: [None, None],
            until_explore: EXPLORE_EPOCHS,
            explore_every: EXPLORE_EPOCHS,
            exploring: false,
            before: None,
            confirm: None,
            skip: 0,
            after_skip: None,
            decided: false,
            c_epochs: 0,
            rx_start: rx,
            cpu_start: view().ns,
            cpu_room: None,
            // The comm's first epoch measures its start (a peer that starts
            // sending later, buffers with room), not a mode.
            settling: !confident,
            raw_own: None,
        });
        if now.saturating_duration_since(e.last) > IDLE {
            e.idle = true;
        }
        e.last = now;
        let cut = Self::hopeless_exploration(e, now, rx);
        let long = || now.saturating_duration_since(e.start) >= MIN_EPOCH;
        if (e.bytes >= EPOCH_BYTES && long()) || cut {
            Self::next_epoch(e, now, rx, view(), confident, codec, cut);
        }
        e.bytes += len as u64;
        match e.mode {
            Mode::Compressed => Decision::Compress,
            Mode::Raw => Decision::RawBypass,
        }
    }

    /// An exploration (or learning's compressed epoch) that, a quarter of the
    /// way into an epoch (raw: its settling epoch; compression: its measured
    /// one), moves less than the other mode's figure divided by
    /// [`CUT_FACTOR`]: for compression, the codec, not the link, is the
    /// bottleneck, and the rest of the epoch would only cost time.
    ///
    /// Raw explorations are cut by the same rule, and that is not always right:
    /// for its first quarter raw moves only as fast as the buffers drain the
    /// compressed bytes they hold, about compression's figure divided by the
    /// ratio, whether the link or the codec is the bottleneck. On a link that
    /// is the right verdict; where the codec is the bottleneck (one way,
    /// unshaped, session 17's traces) raw is cut at a drain figure, compression
    /// keeps running, and a run that learning put into compression can stay
    /// there. Judging raw only after it settled did not help on the VM (the
    /// drain of ~40 MiB of socket buffers outlasts one epoch) and cost the
    /// link-bound cells (`bench/results/adapt-drain-2026-11-26-s17.md`).
    /// Raw is not cut where the CPU bound is below [`TIGHT_ROOM`]: there the
    /// bound itself says raw cannot be that much slower.
    fn hopeless_exploration(e: &Epoch, now: Instant, rx: u64) -> bool {
        // Explorations, and learning's compressed epochs after raw's.
        let trial = e.exploring || e.thr[Mode::Compressed as usize].is_none();
        let elapsed = now.saturating_duration_since(e.start);
        // A compressed trial is cut only in its measured epoch. Right after raw
        // epochs, its settling epoch finds the buffers full of raw's bytes,
        // and that alone can make it slow: one way at 10 Gbit/s on the VM,
        // where compression pays 1.27x, a quarter into learning's compressed
        // epoch read 0.4-0.8 GB/s against raw's 1.2-1.4, and 1.5-2.5 once the
        // epoch ran to its end. The sender's worker threads were 94-98% busy
        // meanwhile, so their CPU time cannot tell the switch from a codec that
        // is too slow (the sockets, full, probably take the frames in small
        // pieces, a wakeup and a syscall each). Where the cores cannot carry
        // compression at all, the CPU bound keeps it from being tried
        // ([`Policy::next_epoch`]).
        let settling_compression = e.mode == Mode::Compressed && e.settling;
        if !trial
            || settling_compression
            || e.idle
            || e.bytes < EPOCH_BYTES / 4
            || elapsed < MIN_EPOCH / 4
        {
            return false;
        }
        let Some(other) = e.thr[e.mode.other() as usize] else {
            return false;
        };
        // Raw, where the cores may be what limits: a raw trial far slower
        // than compression drains compressed bytes; the bound says raw is not
        // that much slower (both ways on noisy simulated cores, such cuts kept
        // runs compressed where compression moves 0.745x of raw).
        if e.mode == Mode::Raw && e.room_below(TIGHT_ROOM) {
            return false;
        }
        let secs = elapsed.as_secs_f64();
        let moved = (e.bytes + rx.saturating_sub(e.rx_start)) as f64;
        secs > 0.0 && moved / secs * CUT_FACTOR < other
    }

    /// Closes the current epoch's measurement and picks the next epoch's mode.
    /// `confident`: the static model says the codec is [`CONFIDENT`] times the
    /// link or more.
    /// `rx`: the received meter now; `codec`: the codec's throughput, all
    /// threads together.
    /// `cut`: the epoch ends early, a hopeless exploration.
    ///
    /// **CPU bound.** A measured raw epoch also says how much compression could
    /// move at most with the node's cores: it took `U` of CPU time (the
    /// plugin's worker threads', [`CpuClock`]) in `T` seconds on `K` cores to send `S` bytes on
    /// this comm. Compressed, the work that scales with wire bytes (the send
    /// and receive paths, copies) shrinks by the ratio `r` at best, and the
    /// encode adds `S / C` (`C`: the codec's best speed on one core; nothing on
    /// a device), so the same traffic needs at least `U / r + S / C`, and
    /// compression moves at most `K·T / (U / r + S / C)` times raw's figure.
    ///
    /// Where the peer sends too (`R` bytes received meanwhile), the decode
    /// this node's compression causes at the peer takes the peer's cores from
    /// what it sends back, which the epoch's figure counts: the bound adds
    /// `min(S, R) / C` (the v2 decoder runs at about the encoder's speed on one
    /// core, 3.2 against 3.3 GB/s on the VM's bf16 weights). Two nodes sending
    /// to each other are alike (a ring, an all-to-all), so the same term also
    /// stands for the decode this node will do once its peer compresses. One
    /// way (`R` about 0) the receiver's cores do nothing else, and nothing is
    /// added. Without it the bound of both ways unshaped on the VM read
    /// 0.44-1.22x from epoch to epoch, and each read above the margin let
    /// compression in, where it moves 0.54x of raw (issue 21).
    ///
    /// Everything else left out (this node's decode, the codec's slower
    /// chunks, other comms' encodes) would only lower it: where it stays below
    /// [`SWITCH_MARGIN`], compression cannot win, and it is neither learned nor
    /// explored (raw epochs keep measuring the bound). That is the case where
    /// the node's cores, not the link, limit raw: one way unshaped on the VM,
    /// where learning and explorations were most of what `auto` lost against
    /// `off` (issue 21). Where the link limits raw the cores idle and the
    /// bound is far above the margin. Steal time (a shared VM) is not the
    /// process's, so it only raises the bound.
    #[allow(clippy::too_many_arguments)]
    fn next_epoch(
        e: &mut Epoch,
        now: Instant,
        rx: u64,
        cpu: CpuView,
        confident: bool,
        codec: f64,
        cut: bool,
    ) {
        if e.mode == Mode::Compressed && !e.idle {
            e.c_epochs += 1;
        }
        let secs = now.saturating_duration_since(e.start).as_secs_f64();
        let received = rx.saturating_sub(e.rx_start);
        let mut measured = None;
        // A settling epoch cut short as hopeless (raw's: compression's are not
        // cut while they settle) measured enough: raw moved far less than
        // compression even while the buffers drained compressed bytes.
        if !e.idle && (!e.settling || cut) && secs > 0.0 {
            // What this node moved: sent on this comm, and received.
            let t = (e.bytes + received) as f64 / secs;
            measured = Some(t);
            if e.mode == Mode::Raw {
                let own = e.bytes as f64 / secs;
                e.raw_own = Some(e.raw_own.map_or(own, |o| o + ALPHA * (own - o)));
                // Not from a settling epoch cut short: its sender was blocked
                // on buffers full of compressed bytes, and its CPU time is
                // mostly idle (bounds of 2.0-2.4x on the VM, both ways
                // unshaped, where 0.4-1.2x is the rule).
                if let Some((ratio, one)) = cpu.codec.filter(|_| !e.settling) {
                    let used = cpu.ns.saturating_sub(e.cpu_start) as f64 / 1e9;
                    // The encode, and the decode it causes at the peer where
                    // the peer sends too (`received`): see the doc above.
                    let coded = e.bytes + received.min(e.bytes);
                    let need = used / ratio.max(1.0) + coded as f64 / one;
                    e.cpu_room = (need > 0.0).then(|| cpu.cores * secs / need);
                }
            }
            // An exploration weighs more than a regular epoch: it is the only news
            // of that mode since the last one, which may be many epochs old.
            let alpha = if e.exploring { EXPLORE_ALPHA } else { ALPHA };
            let m = &mut e.thr[e.mode as usize];
            *m = Some(m.map_or(t, |old| old + alpha * (t - old)));
        }
        let was = e.mode;
        let learning = was == Mode::Compressed && e.thr[was as usize].is_none();
        if e.settling && (e.exploring || learning) && measured.is_none() {
            // An exploration, or learning's compressed epoch, settled; the
            // measured epoch of the same mode follows.
            e.settling = false;
            Self::log_epoch(e, was, measured);
            Self::restart(e, now, rx, cpu.ns);
            return;
        }
        let cpu_hopeless = e.room_below(SWITCH_MARGIN);
        e.mode = match e.thr {
            [None, _] if confident => Mode::Compressed,
            // Not confident: learning measured raw first (its first epoch
            // settled), then compression, whose first epoch settles while the
            // buffers drain raw bytes (its measured epoch is cut short if
            // hopeless).
            // Where the CPU bound says compression cannot win, raw goes on, and
            // every raw epoch measures the bound again.
            [None, Some(_)] if cpu_hopeless => Mode::Raw,
            [None, Some(_)] => Mode::Compressed,
            [None, None] => Mode::Raw,
            // Raw's first epoch is measured once [`LEARN_EPOCHS`] compressed ones
            // have filled the socket buffers, when the codec is far faster than
            // the link; otherwise at once. A raw epoch that starts while buffers
            // still have room is taken up at memory speed and looks several times
            // faster than the link, and the policy then runs raw for many epochs
            // before the average forgets it.
            [_, None] if confident && e.c_epochs < LEARN_EPOCHS => Mode::Compressed,
            // Otherwise raw's first epoch only fills the buffers (not measured:
            // see `settling`), and the one after it is measured.
            [_, None] => Mode::Raw,
            [Some(c), Some(r)] => Self::choose(e, was, measured, c, r, codec, cpu_hopeless),
        };
        Self::log_epoch(e, was, measured);
        Self::start_epoch(e, now, rx, cpu.ns, confident);
    }

    /// Whether `mode`, measured at `t`, beats the other mode measured at
    /// `other`. Hysteresis both ways, so that a noisy epoch does not flip the
    /// mode: compression must measure [`SWITCH_MARGIN`] faster to take over,
    /// raw [`RAW_MARGIN`]. Raw's margin is the wider because its epochs right
    /// after compressed ones are flattered where the core is nearly saturated:
    /// the core that was encoding drains the receive backlog at a rate no raw
    /// epoch sustains. (Letting compression take over while measuring up to
    /// 1/[`RAW_MARGIN`] slower, as before, let noise carry CPU-bound runs into
    /// compression, where it loses.)
    fn beats(mode: Mode, t: f64, other: f64) -> bool {
        match mode {
            Mode::Compressed => t > other * SWITCH_MARGIN,
            Mode::Raw => t > other * RAW_MARGIN,
        }
    }

    /// The next epoch's mode once both modes have figures (`c`, `r`: their
    /// averages), after an epoch of mode `was` that measured `measured`.
    ///
    /// A switch is decided only by an exploration: the running mode (A), the
    /// other one (B), A twice. B takes over if it beats the A epoch before it
    /// and the A epoch after it (compressed A: the better of the two; raw A:
    /// the second, as the first fills buffers compression left with room).
    /// The figures of two modes measured at different times differ
    /// by whatever changed in between (other tenants of the machine, the peer's
    /// own mode, which decides what this node decodes), and on a shared machine
    /// that is more than the margin: comparing a fresh figure with an old one
    /// let `auto` drift into compression where it loses (issue 21, 4 GiB both
    /// ways). A step change in conditions between two of the three epochs
    /// lifts or lowers B and one A epoch together, so it cannot make B win.
    /// `cpu_hopeless`: the CPU bound says compression cannot win.
    #[allow(clippy::too_many_arguments)]
    fn choose(
        e: &mut Epoch,
        was: Mode,
        measured: Option<f64>,
        c: f64,
        r: f64,
        codec: f64,
        cpu_hopeless: bool,
    ) -> Mode {
        // The mode the averages favour, the running one unless the other beats it.
        let thr = |m: Mode| if m == Mode::Compressed { c } else { r };
        let best = if Self::beats(was.other(), thr(was.other()), thr(was)) {
            was.other()
        } else {
            was
        };
        // Exploring a mode that measured far slower is expensive: do it less
        // often, and less often still each time an exploration confirms the
        // choice (it is still done, so a change is noticed). An exploration
        // costs about `gap - 1` epochs: the interval grows with it (2% of the
        // time at first, less as it doubles).
        let gap = c.max(r) / c.min(r).max(1.0);
        let base = ((50.0 * (gap - 1.0)).ceil() as u32).clamp(EXPLORE_EPOCHS, 4 * EXPLORE_EPOCHS);
        if !std::mem::replace(&mut e.decided, true) {
            // Both modes have their first figure, measured one after the other:
            // nothing old to distrust yet. Compression keeps the lead unless raw
            // beats it by [`RAW_MARGIN`]: its first epoch also paid for the
            // comm's start (data streams opening, empty pipelines), and a raw
            // first choice would stand until the first exploration, after
            // [`EXPLORE_EPOCHS`] (on a 2 Gbit/s link both ways, 18% of a 1 GiB
            // run went raw). That exploration confirms this early choice soon.
            // Not where the cores may be what limits ([`TIGHT_ROOM`]): there
            // the start was not the link's, and compression that measured up
            // to 10% slower would run until an exploration, which may find
            // the buffers full of compressed bytes.
            let compress = if e.room_below(TIGHT_ROOM) {
                Self::beats(Mode::Compressed, c, r)
            } else {
                !Self::beats(Mode::Raw, r, c)
            };
            return if compress {
                Mode::Compressed
            } else {
                Mode::Raw
            };
        }
        if std::mem::take(&mut e.exploring) {
            // B is done: A again, to compare B with A before and after it. Not
            // the first A epoch after B: the pipelines still carry B's effects
            // (the receive backlog, the peer still decoding what B sent), which
            // flatter or penalise it; on the VM, 4 GiB both ways at 10 Gbit/s,
            // that let compressed explorations win where compression loses.
            e.confirm = Some((e.before, measured));
            e.skip = 1;
            return was.other();
        }
        if e.confirm.is_some() && e.skip > 0 {
            e.skip -= 1;
            e.after_skip = measured;
            return was;
        }
        if let Some((before, b)) = e.confirm.take() {
            let explored = was.other();
            // The A epochs around B that measured something (no allocation: this
            // runs on the thread that calls isend).
            // Raw after a compressed exploration: only the second, settled
            // epoch. Where compression is held back by the sender's core, it
            // leaves the socket buffers with room, and the first raw epoch after
            // it fills them at memory speed (one way at 10 Gbit/s with the
            // current codec, simulated: 1.68 GB/s against raw's steady 1.25 and
            // compression's 1.57, so compression, 1.24x faster than raw, lost
            // every exploration and ran 31% of the run; the better of the two
            // raw epochs kept it out).
            let after = match (e.after_skip.take(), measured) {
                (Some(x), Some(y)) if explored == Mode::Raw => Some(x.max(y)),
                (_, Some(y)) => Some(y),
                (x, None) => x,
            };
            let neighbours = || [before, after].into_iter().flatten();
            let n = neighbours().count();
            let Some(b) = b.filter(|_| n > 0) else {
                // An idle epoch measured nothing: the interval stands.
                e.until_explore = e.explore_every;
                return was;
            };
            let a = neighbours().sum::<f64>() / n as f64;
            // Both modes' figures are now the fresh ones.
            e.thr[explored as usize] = Some(b);
            e.thr[was as usize] = Some(a);
            return if neighbours().all(|a| Self::beats(explored, b, a)) {
                e.explore_every = base;
                e.until_explore = base;
                explored
            } else {
                // The exploration confirmed the choice.
                e.explore_every = (e.explore_every * 2).clamp(base, MAX_EXPLORE_EPOCHS);
                e.until_explore = e.explore_every;
                was
            };
        }
        // Raw already sends faster than the codec can encode: a compressed epoch
        // cannot win, so it is not explored (raw epochs keep checking; this
        // holds on fast links).
        // Nor while the CPU bound says it cannot.
        let hopeless = best == Mode::Raw
            && (cpu_hopeless || e.raw_own.is_some_and(|o| o > codec * COST_MARGIN));
        // The running mode fell behind the other's (older) figure: explore the
        // other one soon rather than at the end of the interval. Not at once:
        // this epoch is the one that fell behind, a low figure chosen for being
        // low, and would flatter B as its first neighbour.
        if best != was && measured.is_some() {
            e.until_explore = e.until_explore.min(1);
        }
        if e.until_explore == 0 && !hopeless {
            e.exploring = true;
            e.before = measured;
            return was.other();
        }
        if e.until_explore == 0 {
            e.until_explore = e.explore_every;
        } else {
            e.until_explore -= 1;
        }
        was
    }

    fn log_epoch(e: &Epoch, was: Mode, measured: Option<f64>) {
        let gbs = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.3}", v / 1e9));
        // Formatted only where it is printed.
        let line = || {
            format!(
                "adapt: {was:?} epoch took {} GB/s; compressed {} GB/s, raw {} GB/s; CPU bound {}; next {:?}{}",
                gbs(measured),
                gbs(e.thr[0]),
                gbs(e.thr[1]),
                e.cpu_room.map_or("-".to_string(), |x| format!("{x:.2}x")),
                e.mode,
                if e.exploring { " (explores)" } else { "" }
            )
        };
        // The simulations' trace: `ADAPT_TRACE=1 cargo test --release --lib
        // adapt:: -- --nocapture` prints every epoch.
        #[cfg(test)]
        if std::env::var_os("ADAPT_TRACE").is_some() {
            eprintln!("{}", line());
        }
        tracing::debug!("{}", line());
    }

    /// Starts the next epoch, in `e.mode`.
    fn start_epoch(e: &mut Epoch, now: Instant, rx: u64, cpu_ns: u64, confident: bool) {
        // Raw's first epoch ever starts while the buffers still have room after a
        // compressed start that did not fill them: it would be taken up at memory
        // speed and look several times faster than the link. It only settles.
        // (After the confident delay the buffers are full already.)
        let raw_first = e.mode == Mode::Raw && e.thr[Mode::Raw as usize].is_none() && !e.settling;
        // Compression tried after raw epochs (learning, or an exploration) first
        // drains the raw bytes the buffers hold, and measures about raw's
        // figure where the link is the bottleneck: on 2 Gbit/s both ways such
        // explorations kept raw running a quarter of a run. Its first epoch
        // settles (and its measured epoch is cut short where compression is
        // hopeless).
        let compressed_first =
            e.mode == Mode::Compressed && e.thr[Mode::Compressed as usize].is_none();
        e.settling = e.exploring || (!confident && (raw_first || compressed_first));
        Self::restart(e, now, rx, cpu_ns);
    }

    /// The epoch's measurement starts over at `now`: the received meter at
    /// `rx`, the node's CPU clock at `cpu_ns`.
    fn restart(e: &mut Epoch, now: Instant, rx: u64, cpu_ns: u64) {
        e.start = now;
        e.rx_start = rx;
        e.cpu_start = cpu_ns;
        e.bytes = 0;
        e.idle = false;
    }

    /// The static gate: the data compresses, and the codec (all threads) beats
    /// the link by [`COST_MARGIN`] when the user gave the link's speed.
    fn pays(&self, ratio: f64, codec_bps: f64) -> bool {
        gate(ratio, codec_bps * self.parallel, self.link_bps)
    }

    /// Feeds back one compressed chunk: `raw` bytes became `wire` bytes in
    /// `codec_ns` of the codec's own time: the encoding thread's CPU time for the
    /// CPU codec (wall time would count the time other threads, such as this
    /// node's receivers and decoders, took the core), the wall time of a device
    /// encode.
    pub fn record(&self, raw: usize, wire: usize, codec_ns: u64) {
        if raw == 0 {
            return;
        }
        let r = raw as f64 / wire.max(1) as f64;
        let bps = raw as f64 * 1e9 / codec_ns.max(1) as f64;
        let mut s = self.state.lock();
        if s.recorded == 0 {
            // The prior ratio only makes the first chunk go through the codec;
            // the first chunk's is the first real one (random bytes took ten
            // chunks to average the prior's 1.4 down below `MIN_RATIO`). The
            // speed keeps its prior: a first chunk also pays one-time costs
            // (tables, a device's first launch).
            s.ratio = r;
        } else {
            s.ratio += ALPHA * (r - s.ratio);
        }
        s.codec_bps += ALPHA * (bps - s.codec_bps);
        s.best_bps = s.best_bps.max(bps);
        s.recorded = s.recorded.saturating_add(1);
    }

    /// [`Policy::record`] for a device's codec: `ns` is the encode's wall time,
    /// not the node's cores' (the CPU bound then counts no encode).
    pub fn record_device(&self, raw: usize, wire: usize, ns: u64) {
        self.state.lock().device = true;
        self.record(raw, wire, ns);
    }

    pub fn ratio_estimate(&self) -> f64 {
        self.state.lock().ratio
    }
}

/// The static gate's rule, shared by [`Policy`] and [`predicted_speedup`]: the
/// data compresses, and, where the link's speed is known, the codec on all its
/// threads (`codec_total_bps`) beats the link by [`COST_MARGIN`].
fn gate(ratio: f64, codec_total_bps: f64, link_bps: Option<f64>) -> bool {
    ratio >= MIN_RATIO && link_bps.is_none_or(|l| codec_total_bps > l * COST_MARGIN)
}

/// The static cost model's prediction of the speedup over raw, for tools that
/// answer "will it help?" before a job runs (`nccl-zip probe`): the same rule as
/// [`Policy`]'s gate. `codec_bps`: one thread's codec throughput (bytes per
/// second of input); it runs on `min(streams, cores)` threads at once, as
/// [`Policy::new`] assumes; `link_bps`: the link's bytes per second. Compressed
/// traffic moves `min(C, L * ratio)` against `L` raw; where the gate says
/// compression does not pay, chunks go raw and the answer is 1.
pub fn predicted_speedup(
    ratio: f64,
    codec_bps: f64,
    streams: usize,
    cores: usize,
    link_bps: f64,
) -> f64 {
    let c = codec_bps * streams.max(1).min(cores.max(1)) as f64;
    if link_bps <= 0.0 || !gate(ratio, c, Some(link_bps)) {
        return 1.0;
    }
    c.min(link_bps * ratio) / link_bps
}

#[cfg(test)]
mod before_21;
#[cfg(test)]
mod two_nodes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicted_speedup_follows_the_gate() {
        let l = 25e9 / 8.0;
        // Codec far faster than the link: link-bound, the ratio is the speedup.
        assert!((predicted_speedup(1.5, 2e9, 4, 8, l) - 1.5).abs() < 1e-9);
        // Codec-bound: 4 threads x 0.8 GB/s = 3.2 GB/s against 3.125 GB/s,
        // below the margin: raw.
        assert_eq!(predicted_speedup(1.5, 0.8e9, 4, 8, l), 1.0);
        // Codec-bound but paying: min(C, L r) / L with C = 4 x 1 GB/s.
        assert!((predicted_speedup(1.5, 1e9, 4, 8, l) - 4e9 / l).abs() < 1e-9);
        // Cores cap the threads, streams too.
        assert_eq!(predicted_speedup(1.5, 1e9, 4, 1, l), 1.0);
        assert_eq!(predicted_speedup(1.5, 1e9, 1, 8, l), 1.0);
        // Too little ratio never pays.
        assert_eq!(predicted_speedup(1.02, 1e12, 4, 8, l), 1.0);
    }

    const GBIT: u64 = 1000;

    /// Drives the policy with a simulated pipeline whose throughput depends on the
    /// mode: `comp` and `raw` bytes per second. Returns the share of compressed
    /// chunks among the last `tail` decisions.
    fn simulate(p: &Policy, t: &mut Instant, comp: f64, raw: f64, n: usize, tail: usize) -> f64 {
        let chunk = 256 << 10;
        let mut compressed = 0;
        for i in 0..n {
            let d = p.decide_at(chunk, *t);
            let rate = if d == Decision::Compress {
                p.record(chunk, chunk * 2 / 3, 100_000);
                compressed += (i >= n - tail) as usize;
                comp
            } else {
                raw
            };
            *t += Duration::from_secs_f64(chunk as f64 / rate);
        }
        compressed as f64 / tail as f64
    }

    /// A pipeline with a send buffer, for the transients the plain [`simulate`]
    /// cannot show: compressing costs `chunk / codec` seconds of CPU, the buffer
    /// (`buf` bytes, the streams' socket buffers together) drains at `link` bytes
    /// per second, and a chunk waits for room. Returns the compressed share of the
    /// last `tail` chunks and the throughput (raw bytes per second until the last
    /// byte has left the buffer).
    #[allow(clippy::too_many_arguments)]
    fn simulate_buffered(
        p: &Policy,
        chunk: usize,
        codec: f64,
        link: f64,
        ratio: f64,
        buf: f64,
        n: usize,
        tail: usize,
    ) -> (f64, f64) {
        let mut t = Instant::now();
        let t0 = t;
        let (mut queued, mut compressed) = (0.0f64, 0);
        let advance = |t: &mut Instant, queued: &mut f64, dt: f64| {
            *t += Duration::from_secs_f64(dt);
            *queued = (*queued - link * dt).max(0.0);
        };
        for i in 0..n {
            let wire = if p.decide_at(chunk, t) == Decision::Compress {
                let wire = chunk as f64 / ratio;
                let ns = (chunk as f64 / codec * 1e9) as u64;
                p.record(chunk, wire as usize, ns);
                compressed += (i >= n - tail) as usize;
                advance(&mut t, &mut queued, chunk as f64 / codec);
                wire
            } else {
                chunk as f64
            };
            if queued + wire > buf {
                let wait = (queued + wire - buf) / link;
                advance(&mut t, &mut queued, wait);
            }
            queued += wire;
        }
        // Done when the last byte has left the buffer.
        let secs = t.duration_since(t0).as_secs_f64() + queued / link;
        (compressed as f64 / tail as f64, (n * chunk) as f64 / secs)
    }

    #[test]
    fn buffered_pipelines_pick_the_faster_mode() {
        const MIB: f64 = 1048576.0;
        let off = |chunk: usize, link: f64, n: usize| {
            let p = Policy::new(CompressMode::Off, Some(10 * GBIT), 4);
            simulate_buffered(&p, chunk, 1.0, link, 1.0, 16.0 * MIB, n, n).1
        };
        // (chunk, link, codec, chunks): link-bound 2 Gbit/s and 10 Gbit/s runs of
        // 96 MiB and 512 MiB, and a CPU-bound fast link, with 16 MiB of buffers.
        // The policy of 566b425 (64-chunk epochs, raw measured right after the
        // first compressed epoch) gave 1.29-1.39x link-bound and 0.92-0.97x
        // CPU-bound here; this one 1.38-1.45x and 0.92x.
        const K: usize = 1024;
        // The nominal link speed the cost model is given: the shaped links' own
        // (the demo passes NCCL_ZIP_LINK_MBPS), a veth's 10 Gbit/s when unshaped.
        for (chunk, link, nominal, codec, n, want_faster) in [
            (256 * K, 0.25e9, 2 * GBIT, 1.0e9, 384, true),
            (128 * K, 0.25e9, 2 * GBIT, 1.0e9, 768, true),
            (256 * K, 0.25e9, 2 * GBIT, 1.0e9, 2048, true),
            (256 * K, 1.25e9, 10 * GBIT, 2.5e9, 2048, true),
            (256 * K, 2.3e9, 10 * GBIT, 0.8e9, 2048, false),
            (128 * K, 2.3e9, 10 * GBIT, 0.8e9, 4096, false),
        ] {
            let p = Policy::new(CompressMode::Auto, Some(nominal), 4);
            let (share, rate) = simulate_buffered(&p, chunk, codec, link, 1.5, 16.0 * MIB, n, n);
            let vs_off = rate / off(chunk, link, n);
            eprintln!(
                "chunk {chunk} link {link:e} codec {codec:e} chunks {n}: compressed {share:.3}, {vs_off:.3}x off"
            );
            if want_faster {
                assert!(
                    vs_off > 1.35,
                    "link-bound: {vs_off:.3}x off, compressed {share:.3}"
                );
            } else {
                assert!(
                    vs_off > 0.9,
                    "cpu-bound: {vs_off:.3}x off, compressed {share:.3}"
                );
            }
        }
    }

    #[test]
    fn measured_throughput_picks_the_faster_mode_and_keeps_exploring() {
        let p = Policy::new(CompressMode::Auto, Some(10 * GBIT), 4);
        let mut t = Instant::now();
        // Link-bound: compressed moves 1.5x the raw bytes per second.
        let share = simulate(&p, &mut t, 1.5e9, 1.0e9, 64 * 40, 64 * 24);
        assert!(
            share > 0.85 && share < 1.0,
            "link-bound: compressed share {share}"
        );
        // CPU-bound (the codec is the bottleneck): raw is 2.5x faster. It flips,
        // and explores compression again within the longest interval (the tail
        // spans more than [`MAX_EXPLORE_EPOCHS`]).
        let share = simulate(&p, &mut t, 0.5e9, 1.25e9, 64 * 200, 64 * 100);
        assert!(
            share > 0.0 && share < 0.15,
            "cpu-bound: compressed share {share}"
        );
    }

    /// Long runs: explorations of the slower mode must cost little once the
    /// choice has been confirmed a few times.
    #[test]
    fn steady_state_exploration_costs_little() {
        const MIB: f64 = 1048576.0;
        const K: usize = 1024;
        // The nominal link speeds are the demo's: 2 Gbit/s shaped, a veth's
        // 10 Gbit/s unshaped (the static model then lets the codec be measured).
        let run = |mode, link: f64, codec: f64, n: usize| {
            let nominal = if link < 1e9 { 2 * GBIT } else { 10 * GBIT };
            let p = Policy::new(mode, Some(nominal), 4);
            simulate_buffered(&p, 256 * K, codec, link, 1.45, 16.0 * MIB, n, n).1
        };
        // 4 GiB link-bound (2 Gbit/s, codec 4x the link) and CPU-bound (codec
        // 0.8 GB/s on a 2.3 GB/s link): auto against the better fixed mode.
        let n = 16384;
        let link_bound =
            run(CompressMode::Auto, 0.25e9, 1e9, n) / run(CompressMode::On, 0.25e9, 1e9, n);
        let cpu_bound =
            run(CompressMode::Auto, 2.3e9, 0.8e9, n) / run(CompressMode::Off, 2.3e9, 0.8e9, n);
        eprintln!("4 GiB: link-bound auto/on {link_bound:.4}, cpu-bound auto/off {cpu_bound:.4}");
        assert!(link_bound > 0.99, "link-bound: auto/on {link_bound:.4}");
        assert!(cpu_bound > 0.98, "cpu-bound: auto/off {cpu_bound:.4}");
    }

    /// An exploration of compression on a CPU-bound pipeline (compression 2.5x
    /// slower than raw) runs its settling epoch and stops a quarter of the way
    /// into its measured one, and so does learning's first compressed epoch
    /// (raw was measured first). (Raw explorations are cut a quarter into their
    /// settling epoch; see [`Policy::hopeless_exploration`].)
    #[test]
    fn slow_explorations_are_cut_short() {
        let p = Policy::new(CompressMode::Auto, None, 4);
        let mut t = Instant::now();
        let chunk = 256usize << 10;
        let per_epoch = (EPOCH_BYTES / chunk as u64) as usize;
        // (compressed?) per chunk over 2 GiB, CPU-bound.
        let mut runs = Vec::new();
        let mut run = 0usize;
        for _ in 0..8 * 1024 {
            let d = p.decide_at(chunk, t);
            let rate = if d == Decision::Compress {
                p.record(chunk, chunk * 2 / 3, 100_000);
                run += 1;
                0.5e9
            } else {
                if run > 0 {
                    runs.push(run);
                }
                run = 0;
                1.25e9
            };
            t += Duration::from_secs_f64(chunk as f64 / rate);
        }
        eprintln!("compressed runs (chunks): {runs:?}");
        assert!(runs.len() >= 3, "explorations happened: {runs:?}");
        // (the comm's first chunk is a probe, a run of one)
        for r in &runs[1..] {
            assert!(
                (per_epoch..=per_epoch + per_epoch / 4 + 1).contains(r),
                "an exploration ran {r} chunks (epoch {per_epoch}): {runs:?}"
            );
        }
    }

    /// A pipeline that moves 8 GB/s passes [`EPOCH_BYTES`] in 2 ms: its
    /// epochs last [`MIN_EPOCH`] instead, so learning's two raw epochs (one
    /// settles, one is measured) take at least twice that before compression is
    /// first tried.
    #[test]
    fn fast_pipelines_measure_epochs_of_at_least_min_epoch() {
        let p = Policy::new(CompressMode::Auto, None, 4);
        let mut t = Instant::now();
        let t0 = t;
        let chunk = 256usize << 10;
        let mut raw_chunks = 0usize;
        loop {
            match p.decide_or_probe_at(chunk, t) {
                Decision::Compress => break,
                // The comm's first chunk measures the codec: far faster than
                // the pipeline, or the CPU bound keeps compression out (at 8
                // GB/s a 2 GB/s codec would need four cores).
                Decision::Probe => p.record(chunk, chunk * 2 / 3, 1_000),
                _ => raw_chunks += 1,
            }
            t += Duration::from_secs_f64(chunk as f64 / 8e9);
            assert!(raw_chunks < 100_000, "compression never tried");
        }
        let took = t.duration_since(t0);
        let per_epoch = (EPOCH_BYTES / chunk as u64) as usize;
        assert!(
            took >= 2 * MIN_EPOCH && raw_chunks > 2 * per_epoch,
            "learning's raw epochs took {took:?}, {raw_chunks} chunks"
        );
    }

    /// The interval between explorations grows only while they confirm the
    /// choice: once the other mode gets faster, it is noticed within the longest
    /// interval and taken.
    #[test]
    fn a_mode_that_got_faster_is_noticed_within_the_longest_interval() {
        let p = Policy::new(CompressMode::Auto, Some(10 * GBIT), 4);
        let mut t = Instant::now();
        // CPU-bound for a long time: raw runs, explorations back off.
        let share = simulate(&p, &mut t, 0.5e9, 1.25e9, 64 * 600, 64 * 300);
        assert!(share < 0.05, "cpu-bound: compressed share {share}");
        // The CPU frees up: compression now moves 1.5x raw. Within the longest
        // interval (and a few epochs to learn) compression takes over.
        let epochs = MAX_EXPLORE_EPOCHS as usize + 8;
        simulate(&p, &mut t, 1.875e9, 1.25e9, 64 * epochs, 64);
        let share = simulate(&p, &mut t, 1.875e9, 1.25e9, 64 * 24, 64 * 24);
        assert!(share > 0.9, "after the change: compressed share {share}");
    }

    #[test]
    fn idle_gaps_do_not_count_as_slow_epochs() {
        let p = Policy::new(CompressMode::Auto, Some(10 * GBIT), 4);
        let mut t = Instant::now();
        simulate(&p, &mut t, 1.5e9, 1.0e9, 64 * 30, 64);
        // Compressed epochs with a long pause in each: without the idle rule they
        // would measure far slower than raw and flip the choice.
        for _ in 0..64 * 10 {
            let d = p.decide_at(256 << 10, t);
            t += if d == Decision::Compress {
                Duration::from_millis(200)
            } else {
                Duration::from_micros(256)
            };
        }
        let share = simulate(&p, &mut t, 1.5e9, 1.0e9, 64 * 12, 64 * 10);
        assert!(share > 0.85, "compressed share {share}");
    }

    #[test]
    fn off_and_small_never_compress() {
        let p = Policy::new(CompressMode::Off, Some(2 * GBIT), 4);
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
        let p = Policy::new(CompressMode::On, Some(2 * GBIT), 4);
        assert_eq!(p.decide(100), Decision::RawSmall);
        assert_eq!(p.decide(1 << 20), Decision::Compress);
    }

    #[test]
    fn incompressible_data_is_bypassed_then_reprobed() {
        let p = Policy::new(CompressMode::Auto, Some(2 * GBIT), 4);
        assert_eq!(p.decide(1 << 20), Decision::Compress);
        for _ in 0..20 {
            p.record(1 << 20, (1 << 20) + 24, 200_000);
        }
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
        let raw = (0..REPROBE_EVERY)
            .filter(|_| p.decide(1 << 20) == Decision::RawBypass)
            .count();
        assert_eq!(raw as u32, REPROBE_EVERY);
        // Then one chunk goes through the codec: only a compressed chunk can show
        // that the data changed. Still incompressible: raw again, each time
        // twice as long, up to `MAX_REPROBE_EVERY` chunks.
        let mut every = REPROBE_EVERY;
        for _ in 0..8 {
            assert_eq!(p.decide(1 << 20), Decision::Compress);
            p.record(1 << 20, (1 << 20) + 24, 200_000);
            every = (every * 2).min(MAX_REPROBE_EVERY);
            for _ in 0..=every {
                assert_eq!(p.decide(1 << 20), Decision::RawBypass);
            }
        }
        assert_eq!(every, MAX_REPROBE_EVERY);
        // The data changed: the next probe sees it, and compression resumes.
        assert_eq!(p.decide(1 << 20), Decision::Compress);
        p.record(1 << 20, 700_000, 200_000);
        assert_eq!(p.decide(1 << 20), Decision::Compress);
        assert_eq!(p.state.lock().reprobe_every, REPROBE_EVERY);
    }

    #[test]
    fn the_first_chunk_replaces_the_optimistic_prior() {
        // (A codec far faster than the link the user gave: learning starts
        // compressed.)
        let p = Policy::new(CompressMode::Auto, Some(2 * GBIT), 4);
        assert_eq!(p.decide(1 << 20), Decision::Compress);
        p.record(1 << 20, (1 << 20) + 24, 200_000);
        // One incompressible chunk, not ten, closes the gate.
        assert!(p.ratio_estimate() < MIN_RATIO);
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
    }

    #[test]
    fn cost_model_links_and_codec_speed() {
        // 2 GB/s codec, ratio 1.5: pays on 2 Gbit/s, not on a 400 Gbit/s link.
        let at = |mbps| Policy::new(CompressMode::Auto, Some(mbps), 1);
        assert!(at(2 * GBIT).pays(1.5, 2e9));
        assert!(!at(400 * GBIT).pays(1.5, 2e9));
        // Incompressible data never pays, however fast the codec.
        assert!(!at(1).pays(1.01, 100e9));
        // Without a link speed from the user, the codec's speed is no reason to
        // stay raw: what each mode moves is measured instead.
        assert!(Policy::new(CompressMode::Auto, None, 1).pays(1.5, 1e6));
        // Streams compress in parallel: 0.8 GB/s per thread beats a 10 Gbit/s
        // link with two streams, not with one.
        let one = Policy::new(CompressMode::Auto, Some(10 * GBIT), 1);
        let two = Policy::new(CompressMode::Auto, Some(10 * GBIT), 2);
        for p in [&one, &two] {
            for _ in 0..20 {
                p.record(1 << 20, 700_000, 1_310_000); // 0.8 GB/s
            }
        }
        assert_eq!(one.decide(1 << 20), Decision::RawBypass);
        // Not the gate: the chunk is sent raw for `REPROBE_EVERY` chunks.
        assert_eq!(one.state.lock().bypass_left, REPROBE_EVERY);
        // (Two streams run in parallel only with two cores.)
        if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
            // The gate lets the policy measure both modes (learning starts
            // raw: the codec is not `CONFIDENT` times the link).
            assert_eq!(two.decide(1 << 20), Decision::RawBypass);
            assert_eq!(two.state.lock().bypass_left, 0);
            assert!(two.state.lock().epoch.is_some());
        }
        // A slow codec loses even on a modest link.
        let p = Policy::new(CompressMode::Auto, Some(100 * GBIT), 1);
        for _ in 0..20 {
            p.record(1 << 20, 700_000, 5_000_000); // 0.2 GB/s
        }
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
    }

    /// Issue 21's two failures, on the policy before the fix (446206e) in the
    /// two-node simulation, both directions, bf16, no link-speed hint (the old
    /// gate then took a veth's nominal 10 Gbit/s): 1. on a 2 Gbit/s link `auto`
    /// leaves most of the gain behind; 2. on 10 Gbit/s, where the core is the
    /// bottleneck, it compresses and loses. Pinned ranks (one core: the old
    /// gate counted `min(streams, cores)` = 1 thread) with two slightly unequal
    /// cores, and unpinned (4 threads). The current policy passes the same runs.
    #[test]
    fn two_nodes_before_21_fails_where_the_issue_measured_and_now_passes() {
        use two_nodes::*;
        const MIB: f64 = 1048576.0;
        let mut fails = Vec::new();
        for (name, link, parallel, b_codec) in [
            ("pinned 2gbit", GBIT2, 1, 0.97),
            ("pinned 10gbit", GBIT10, 1, 0.97),
            ("unpinned 10gbit", GBIT10, 4, 1.0),
        ] {
            let g = |which, m| run_with(which, m, true, BF16, link, 512.0 * MIB, b_codec);
            let on = g(Which::Now, CompressMode::On).goodput;
            let off = g(Which::Now, CompressMode::Off).goodput;
            let old = g(Which::Before { parallel }, CompressMode::Auto);
            let now = g(Which::Now, CompressMode::Auto);
            let (old_off, old_best) = (old.goodput / off, old.goodput / on.max(off));
            let (now_off, now_best) = (now.goodput / off, now.goodput / on.max(off));
            eprintln!(
                "{name:15}: on/off {:.3}; before: auto/off {old_off:.3} auto/best {old_best:.3} (compressed {:.2?}); now: auto/off {now_off:.3} auto/best {now_best:.3}",
                on / off,
                old.compressed_dir
            );
            if old_off >= 0.97 && old_best >= 0.95 {
                fails.push(format!(
                    "{name}: the old policy passes ({old_off:.3}, {old_best:.3})"
                ));
            }
            if now_off < 0.97 || now_best < 0.95 {
                fails.push(format!(
                    "{name}: the policy fails ({now_off:.3}, {now_best:.3})"
                ));
            }
        }
        assert!(fails.is_empty(), "{fails:#?}");
    }

    /// The CPU bound of a raw epoch on a saturated core (one core, the codec at
    /// 2 GB/s and 1.5x): `T / (U / r + S / C)` one way, and with as much
    /// received as sent, the peer's decode `min(S, R) / C` added.
    #[test]
    fn cpu_bound_counts_the_peers_decode_where_the_peer_sends() {
        const CHUNK: usize = 256 << 10;
        let step = Duration::from_micros(200);
        let mut rooms = Vec::new();
        for both in [false, true] {
            let (meter, cpu) = two_nodes::sim_node();
            let p = Policy::for_sim(CompressMode::Auto, meter, cpu);
            let mut t = Instant::now();
            // The comm's probe, then learning's settling raw epoch and its
            // measured one (64 chunks each); the 130th call closes the latter.
            for _ in 0..2 + 2 * 64 {
                if p.decide_at(CHUNK, t) == Decision::Compress {
                    p.record(CHUNK, CHUNK * 2 / 3, CHUNK as u64 / 2);
                }
                cpu.add(step.as_nanos() as u64);
                if both {
                    meter.add(CHUNK as u64);
                }
                t += step;
            }
            let room = p.state.lock().epoch.as_ref().and_then(|e| e.cpu_room);
            rooms.push(room.expect("a measured raw epoch"));
        }
        let secs = 64.0 * step.as_secs_f64();
        let sent = 64.0 * CHUNK as f64;
        let one_way = secs / (secs / 1.5 + sent / 2e9);
        let both = secs / (secs / 1.5 + 2.0 * sent / 2e9);
        assert!((rooms[0] - one_way).abs() < 1e-4, "{rooms:?} vs {one_way}");
        assert!((rooms[1] - both).abs() < 1e-4, "{rooms:?} vs {both}");
    }

    /// Issue 21: two nodes, one core each, sending to each other (or one to the
    /// other) over {2, 10} Gbit/s and an unshaped link, bf16 and random data, no
    /// link-speed hint. `auto` against `off` and the better of `on` and `off`.
    #[test]
    fn two_nodes_auto_never_slower_and_keeps_the_gain() {
        use two_nodes::*;
        const MIB: f64 = 1048576.0;
        let bytes = 1024.0 * MIB;
        let mut fails = Vec::new();
        for both in [false, true] {
            for (lname, link) in [("2gbit", GBIT2), ("10gbit", GBIT10), ("none", UNSHAPED)] {
                for (dname, costs) in [("bf16", BF16), ("bf16-fast", BF16_FAST), ("random", RANDOM)]
                {
                    let g = |m| run(m, both, costs, link, bytes);
                    let (auto, on, off) = (
                        g(CompressMode::Auto),
                        g(CompressMode::On),
                        g(CompressMode::Off),
                    );
                    let vs_off = auto.goodput / off.goodput;
                    let vs_best = auto.goodput / on.goodput.max(off.goodput);
                    let dir = if both { "both" } else { "one " };
                    eprintln!(
                        "{dir} {lname:6} {dname:6}: auto/off {vs_off:.3} auto/best {vs_best:.3} on/off {:.3} (auto compressed {:.2}, off {:.3} GB/s)",
                        on.goodput / off.goodput,
                        auto.compressed,
                        off.goodput / 1e9
                    );
                    if vs_off < 0.97 || vs_best < 0.95 {
                        fails.push(format!(
                            "{dir} {lname} {dname}: auto/off {vs_off:.3}, auto/best {vs_best:.3}"
                        ));
                    }
                    // Where the node's core limits raw and compression loses
                    // (the CPU bound, [`Policy::next_epoch`]), neither learning
                    // nor explorations compress: before the bound they took
                    // 1-4% of the bytes here. (Incompressible data is probed
                    // now and then, whatever the bound: the ratio gate.)
                    let loses = on.goodput < 0.9 * off.goodput && costs.ratio > 1.0;
                    if loses && auto.compressed > 0.001 {
                        fails.push(format!(
                            "{dir} {lname} {dname}: compression loses, auto compressed {:.4}",
                            auto.compressed
                        ));
                    }
                }
            }
        }
        assert!(fails.is_empty(), "{fails:#?}");
    }

    /// Item 4 of issue 21: device chunks (the GPU codec, on SMs shared with the
    /// training job) follow the same measurement. A device left whole to the codec
    /// makes compression pay even where the core is the bottleneck (fewer wire
    /// bytes through the TCP path); one the training job keeps 97% of makes it a
    /// loss. `auto` must find both, without a link-speed hint.
    #[test]
    fn two_nodes_device_codec_follows_the_measurement() {
        use two_nodes::*;
        const MIB: f64 = 1048576.0;
        let gpu = |share| Costs {
            enc: 1.0 / 20e9,
            dec: 1.0 / 30e9,
            on_device: true,
            gpu_share: share,
            ..BF16
        };
        let mut fails = Vec::new();
        for (both, link, share) in [
            (true, GBIT2, 1.0),
            (true, UNSHAPED, 1.0),
            (true, GBIT2, 0.03),
            (true, UNSHAPED, 0.03),
            (false, GBIT10, 0.1),
        ] {
            let g = |m| run(m, both, gpu(share), link, 512.0 * MIB);
            let (auto, on, off) = (
                g(CompressMode::Auto),
                g(CompressMode::On),
                g(CompressMode::Off),
            );
            let vs_off = auto.goodput / off.goodput;
            let vs_best = auto.goodput / on.goodput.max(off.goodput);
            eprintln!(
                "device share {share} link {link:e} both {both}: auto/off {vs_off:.3} auto/best {vs_best:.3} on/off {:.3} (compressed {:.2})",
                on.goodput / off.goodput,
                auto.compressed
            );
            if vs_off < 0.97 || vs_best < 0.95 {
                fails.push(format!(
                    "share {share} link {link:e} both {both}: {vs_off:.3} / {vs_best:.3}"
                ));
            }
        }
        assert!(fails.is_empty(), "{fails:#?}");
    }

    /// One noisy cell of the matrix: `seeds` runs of auto, on and off, 1 GiB
    /// each way, bf16, cores noisy by `amp` at both time scales ([`two_nodes::Noise`]).
    /// Returns (auto/best, auto/off) per seed, each sorted, and auto's compressed
    /// share (a -> b) per seed, in seed order.
    fn noisy_cell(both: bool, link: f64, amp: f64, seeds: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        use two_nodes::*;
        const MIB: f64 = 1048576.0;
        let (mut vs_best, mut vs_off, mut share) = (Vec::new(), Vec::new(), Vec::new());
        for seed in 0..seeds {
            let noise = Some(Noise {
                slow: amp,
                fast: amp,
                seed,
            });
            let g = |m| run_noisy(Which::Now, m, both, BF16, link, 1024.0 * MIB, 1.0, noise);
            let (auto, on, off) = (
                g(CompressMode::Auto),
                g(CompressMode::On),
                g(CompressMode::Off),
            );
            vs_best.push(auto.goodput / on.goodput.max(off.goodput));
            vs_off.push(auto.goodput / off.goodput);
            share.push(auto.compressed_dir[0]);
        }
        vs_best.sort_by(f64::total_cmp);
        vs_off.sort_by(f64::total_cmp);
        (vs_best, vs_off, share)
    }

    /// The simulated matrix's cells on noisy cores (`two_nodes::Noise`): both
    /// ways?, the link's name and speed, and the share of the better mode the
    /// median must keep at the test's noise.
    const NOISY_CELLS: [(bool, &str, f64, f64); 5] = [
        (true, "10gbit", two_nodes::GBIT10, 0.95),
        (true, "none", two_nodes::UNSHAPED, 0.95),
        (true, "2gbit", two_nodes::GBIT2, 0.98),
        (false, "none", two_nodes::UNSHAPED, 0.95),
        (false, "2gbit", two_nodes::GBIT2, 0.95),
    ];

    /// Issue 21, 4 GiB both ways on the VM: `auto` drifted into compression
    /// where the core is the bottleneck (48% and 32% compressed, auto/off 0.83
    /// and 0.76). Cores shared with other work (noise at two time scales, as a
    /// shared VM has) reproduce it: the policy that compared a fresh figure with
    /// an old one and let compression win while 9% slower gave auto/off 0.90–0.96
    /// with 10–60% compressed at 4 GiB. Sixteen seeds of the same noise per
    /// cell: the median meets the issue's bar, and no run falls far below it.
    /// Both ways at 2 Gbit/s, where on this noise compression still pays 1.33–
    /// 1.46x, the median must keep 98% of the better mode: the policy of
    /// session 12 (learning started compressed, explorations measured in one
    /// epoch and judged against the second A epoch after them) kept 97.1%
    /// (minimum 92.7%); this one keeps 98.6% (minimum 94.5%).
    #[test]
    fn two_nodes_on_noisy_cores_do_not_drift() {
        let mut fails = Vec::new();
        for (both, lname, link, keep) in NOISY_CELLS {
            let dir = if both { "both" } else { "one " };
            let (vs_best, vs_off, share) = noisy_cell(both, link, 0.3, 16);
            let (best, off, min) = (
                vs_best[vs_best.len() / 2],
                vs_off[vs_off.len() / 2],
                vs_best[0],
            );
            eprintln!(
                "noisy {dir} {lname:6}: median auto/best {best:.3}, auto/off {off:.3}; min auto/best {min:.3}; compressed shares {share:.2?}"
            );
            // The issue's bar on the median; no run far below it.
            if best < keep || off < 0.97 || min < 0.93 {
                fails.push(format!(
                    "{dir} {lname}: median auto/best {best:.3}, auto/off {off:.3}; min auto/best {min:.3}"
                ));
            }
        }
        assert!(fails.is_empty(), "{fails:#?}");
    }

    /// Not a check: prints the noisy cells at heavier noise (`NOISE_AMP`,
    /// default 0.5; 32 seeds), the open part of issue 21. The VM's traced runs
    /// swing 0.7-2.6 GB/s from epoch to epoch within one run, more than the
    /// 0.3 the test above uses. At 0.5, both ways CPU-bound (10 Gbit/s and
    /// unshaped) read a median auto/off of 0.963-0.967 and some seeds run
    /// most of the run compressed (session 17):
    /// `NOISE_AMP=0.5 cargo test --release --lib noisy_sweep -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn noisy_sweep() {
        let amp = std::env::var("NOISE_AMP")
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or(0.5);
        for (both, lname, link, _) in NOISY_CELLS {
            let (vs_best, vs_off, share) = noisy_cell(both, link, amp, 32);
            eprintln!(
                "noise {amp} {} {lname:6}: auto/best median {:.3} min {:.3}; auto/off median {:.3} min {:.3}; compressed shares {share:.2?}",
                if both { "both" } else { "one " },
                vs_best[vs_best.len() / 2],
                vs_best[0],
                vs_off[vs_off.len() / 2],
                vs_off[0],
            );
        }
    }
}
