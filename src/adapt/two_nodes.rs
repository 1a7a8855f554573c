//! A deterministic simulation of two nodes that send to each other, for the
//! adaptive policy (issue 21). Each node has one core (its CPU budget) shared by
//! its outgoing pipeline (encode when the policy says so, then the TCP send path)
//! and its incoming one (the TCP receive path, then decode). Each direction has
//! its own link capacity, a socket send buffer before the link and a receive
//! buffer after it. Time advances in steps of [`DT`]; in a step a busy core is
//! shared between its two pipelines by their runnable threads (see [`STREAMS`]).
//!
//! The policy sees what it sees in the plugin: `decide_at` when a stream thread
//! takes the next chunk, `record` after an encode with the codec's time, and the
//! node's [`Meter`] of received bytes (decoded into the application's buffer).
//! [`Which::Before`] runs the policy before issue 21 instead, fed the encodes'
//! wall time as that one was.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::before_21::OldPolicy;
use super::{CpuClock, Decision, Meter, Policy};
use crate::config::CompressMode;

/// Simulation step.
const DT: f64 = 20e-6;
/// The sender's chunks (1 MiB messages cut for 4 streams).
const CHUNK: f64 = 256.0 * 1024.0;
/// The streams' socket buffers together, each side.
const BUF: f64 = 16.0 * 1048576.0;

/// What moving a byte costs a core, and what the codec does to the data.
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    /// Core seconds to encode one raw byte.
    pub enc: f64,
    /// Core seconds to decode into one raw byte.
    pub dec: f64,
    /// Core seconds per wire byte: send path (syscall, copy, TCP).
    pub tx: f64,
    /// Core seconds per wire byte: receive path.
    pub rx: f64,
    /// Raw bytes per wire byte when compressed.
    pub ratio: f64,
    /// Where the codec runs: the node's core, or a device of its own (GPU: the
    /// codec's time is then not the core's, and `gpu_share` of it is ours).
    pub on_device: bool,
    /// Device only: the share of the device the training job leaves the codec.
    pub gpu_share: f64,
}

/// bf16 weights on one core of a 2 GHz Xeon: codec 2 GB/s each way at 1.5x, and
/// a TCP path that moves raw data at 0.675 GB/s each way on one core (so that,
/// as measured in issue 21, `on` gives 1.50x `off` on a 2 Gbit/s link and 0.745x
/// where the core is the bottleneck).
pub const BF16: Costs = Costs {
    enc: 1.0 / 2.0e9,
    dec: 1.0 / 2.0e9,
    tx: 0.74e-9,
    rx: 0.74e-9,
    ratio: 1.5,
    on_device: false,
    gpu_share: 1.0,
};

/// bf16 weights with the codec of 2026-11-27 on the VM the matrix runs on
/// (`bench/results/adapt-matrix-2026-11-27-s22.md`): encode 3.3 and decode 3.2
/// GB/s on one core (`codec_bench`, real bf16 weights, v2), and a TCP path
/// that moves 2 GB/s of raw data per core. On a 10 Gbit/s link `on` then gives
/// 1.24x `off` one way (1.27x measured), where [`BF16`] says compression loses.
pub const BF16_FAST: Costs = Costs {
    enc: 1.0 / 3.3e9,
    dec: 1.0 / 3.2e9,
    tx: 0.5e-9,
    rx: 0.5e-9,
    ..BF16
};

/// Random bytes: the codec finds nothing (stored frames), quickly.
pub const RANDOM: Costs = Costs {
    enc: 1.0 / 6.0e9,
    dec: 1.0 / 13.0e9,
    ratio: 1.0,
    ..BF16
};

/// Link rates, bytes per second per direction.
pub const GBIT2: f64 = 0.25e9;
pub const GBIT10: f64 = 1.25e9;
/// An unshaped veth: far more than one core moves.
pub const UNSHAPED: f64 = 8.0e9;

#[derive(Clone, Copy)]
struct Seg {
    wire: f64,
    raw: f64,
    compressed: bool,
}

/// Per-byte work of a segment, in core (or device) seconds, at the receiver.
fn in_work(c: &Costs, s: &Seg) -> (f64, f64) {
    let dec = if s.compressed { s.raw * c.dec } else { 0.0 };
    (s.wire * c.rx, dec)
}

struct Chunk {
    raw: f64,
    wire: f64,
    compressed: bool,
    /// Codec seconds left (core or device).
    enc_left: f64,
    /// Core seconds the encode has used so far.
    enc_cpu: f64,
    /// Send-path core seconds left; run once the buffer has room.
    tx_left: f64,
    started: f64,
    encoded: bool,
}

/// One direction: the sender's pipeline, the buffers and link, the receiver's.
/// Which policy the senders run.
#[derive(Clone, Copy, Debug)]
pub enum Which {
    /// The current one ([`Policy`], no link-speed hint).
    Now,
    /// The one before issue 21 ([`OldPolicy`]), with the nominal speed of a
    /// veth (10 Gbit/s) for the link and `parallel` = min(streams, cores).
    Before { parallel: usize },
}

enum SimPolicy {
    Now(Policy),
    Before(OldPolicy),
}

impl SimPolicy {
    fn decide_at(&self, len: usize, now: Instant) -> Decision {
        match self {
            SimPolicy::Now(p) => p.decide_at(len, now),
            SimPolicy::Before(p) => p.decide_at(len, now),
        }
    }

    /// `codec_ns`: the codec's own time (core time, or a device encode's wall
    /// time); `wall_ns`: the encode's wall time.
    fn record(&self, raw: usize, wire: usize, codec_ns: u64, wall_ns: u64, on_device: bool) {
        match self {
            SimPolicy::Now(p) if on_device => p.record_device(raw, wire, codec_ns),
            SimPolicy::Now(p) => p.record(raw, wire, codec_ns),
            SimPolicy::Before(p) => p.record(raw, wire, wall_ns),
        }
    }
}

struct Dir {
    policy: SimPolicy,
    costs: Costs,
    link: f64,
    /// Raw bytes the application still has to hand over.
    left: f64,
    cur: Option<Chunk>,
    sendq: VecDeque<Seg>,
    sendq_bytes: f64,
    recvq: VecDeque<Seg>,
    recvq_bytes: f64,
    /// Core and device seconds spent on the head of `recvq` so far.
    head_cpu: f64,
    head_dev: f64,
    /// Device seconds the receiver used in this step.
    dev_used: f64,
    delivered: f64,
    total: f64,
    done_at: Option<f64>,
    compressed_raw: f64,
}

impl Dir {
    fn new(
        which: Which,
        mode: CompressMode,
        meter: &'static Meter,
        cpu: &'static CpuClock,
        costs: Costs,
        link: f64,
        total: f64,
    ) -> Dir {
        let policy = match which {
            Which::Now => SimPolicy::Now(Policy::for_sim(mode, meter, cpu)),
            Which::Before { parallel } => SimPolicy::Before(OldPolicy::new(mode, 10_000, parallel)),
        };
        Dir {
            policy,
            costs,
            link,
            left: total,
            cur: None,
            sendq: VecDeque::new(),
            sendq_bytes: 0.0,
            recvq: VecDeque::new(),
            recvq_bytes: 0.0,
            head_cpu: 0.0,
            head_dev: 0.0,
            dev_used: 0.0,
            delivered: 0.0,
            total,
            done_at: None,
            compressed_raw: 0.0,
        }
    }

    /// Whether the sender's core is in the middle of an encode.
    fn encoding(&self) -> bool {
        !self.costs.on_device && self.cur.as_ref().is_some_and(|c| !c.encoded)
    }

    /// Runs the sender's pipeline for `cpu` core seconds (and `DT` of device
    /// time) at simulated time `t`; the core seconds it used.
    fn run_out(&mut self, mut cpu: f64, t: f64, t0: Instant) -> f64 {
        let start = cpu;
        let mut dev = DT * self.costs.gpu_share;
        loop {
            if self.cur.is_none() {
                if self.left <= 0.0 {
                    break;
                }
                let raw = self.left.min(CHUNK);
                self.left -= raw;
                // The pipeline runs after the receiver in a step: its clock is
                // the step's start plus all the core time used so far.
                let now = t0 + Duration::from_secs_f64(t + DT - cpu);
                let compressed = self.policy.decide_at(raw as usize, now) == Decision::Compress;
                let c = &self.costs;
                let wire = if compressed { raw / c.ratio } else { raw };
                self.cur = Some(Chunk {
                    raw,
                    wire,
                    compressed,
                    enc_left: if compressed { raw * c.enc } else { 0.0 },
                    enc_cpu: 0.0,
                    tx_left: wire * c.tx,
                    started: t + DT - cpu,
                    encoded: !compressed,
                });
            }
            let on_device = self.costs.on_device;
            let ch = self.cur.as_mut().expect("set above");
            if !ch.encoded {
                let budget = if on_device { &mut dev } else { &mut cpu };
                let used = ch.enc_left.min(*budget);
                *budget -= used;
                ch.enc_left -= used;
                if !on_device {
                    ch.enc_cpu += used;
                }
                if ch.enc_left > 1e-15 {
                    break;
                }
                ch.encoded = true;
                // The encode's wall time: a device's ends with the step.
                let wall = if on_device { t + DT } else { t + DT - cpu } - ch.started;
                // The codec's own time as the plugin measures it: the thread's
                // CPU time on the core, the wall time of a device encode.
                let ns = if on_device { wall } else { ch.enc_cpu } * 1e9;
                self.policy.record(
                    ch.raw as usize,
                    ch.wire as usize,
                    ns.max(1.0) as u64,
                    (wall * 1e9).max(1.0) as u64,
                    on_device,
                );
            }
            if self.sendq_bytes + ch.wire > BUF.max(ch.wire) {
                break; // blocked on a full socket buffer
            }
            let used = ch.tx_left.min(cpu);
            cpu -= used;
            ch.tx_left -= used;
            if ch.tx_left > 1e-15 {
                break;
            }
            let ch = self.cur.take().expect("present");
            self.sendq.push_back(Seg {
                wire: ch.wire,
                raw: ch.raw,
                compressed: ch.compressed,
            });
            self.sendq_bytes += ch.wire;
            if ch.compressed {
                self.compressed_raw += ch.raw;
            }
        }
        start - cpu
    }

    /// The link moves bytes from the send buffer to the receive buffer.
    fn run_link(&mut self) {
        let mut budget = (self.link * DT).min(BUF - self.recvq_bytes);
        while budget > 0.0 {
            let Some(head) = self.sendq.front_mut() else {
                break;
            };
            let part = head.wire.min(budget);
            let raw = head.raw * part / head.wire;
            let seg = Seg {
                wire: part,
                raw,
                compressed: head.compressed,
            };
            head.wire -= part;
            head.raw -= raw;
            if head.wire <= 1e-9 {
                self.sendq.pop_front();
            }
            self.sendq_bytes -= part;
            self.recvq_bytes += part;
            budget -= part;
            self.recvq.push_back(seg);
        }
    }

    /// Core seconds the receiver could use now (at most `cap`).
    fn in_demand(&self, cap: f64) -> f64 {
        let mut d = -self.head_cpu;
        for s in &self.recvq {
            let (cpu, dec) = in_work(&self.costs, s);
            d += cpu + if self.costs.on_device { 0.0 } else { dec };
            if d >= cap {
                return cap;
            }
        }
        d.max(0.0)
    }

    /// Runs the receiver for `cpu` core seconds (and `DT` of device time); the
    /// core seconds it used.
    fn run_in(&mut self, mut cpu: f64, t: f64, meter: &Meter) -> f64 {
        let start = cpu;
        let mut dev = DT * self.costs.gpu_share - self.dev_used;
        while let Some(head) = self.recvq.front().copied() {
            let (c, d) = in_work(&self.costs, &head);
            let (need_cpu, need_dev) = if self.costs.on_device {
                (c, d)
            } else {
                (c + d, 0.0)
            };
            let c_used = (need_cpu - self.head_cpu).max(0.0).min(cpu);
            let d_used = (need_dev - self.head_dev).max(0.0).min(dev.max(0.0));
            cpu -= c_used;
            dev -= d_used;
            self.dev_used += d_used;
            self.head_cpu += c_used;
            self.head_dev += d_used;
            if self.head_cpu < need_cpu - 1e-15 || self.head_dev < need_dev - 1e-15 {
                break;
            }
            self.head_cpu = 0.0;
            self.head_dev = 0.0;
            self.recvq.pop_front();
            self.recvq_bytes -= head.wire;
            self.delivered += head.raw;
            meter.add(head.raw as u64);
        }
        if self.done_at.is_none() && self.delivered >= self.total - 1.0 {
            self.done_at = Some(t + DT);
        }
        start - cpu
    }
}

/// How a node's core is shared between its two pipelines when both can run,
/// as Linux's scheduler (EEVDF, 6.6 and later) shares it between threads: in
/// proportion to the runnable threads. While the sender has chunks to encode,
/// its [`STREAMS`] stream threads encode at once and outweigh the receive path
/// [`STREAMS`] to 1; otherwise the two get half each. A receive thread woken by
/// data gets no more than its share: a thread that slept keeps only the lag it
/// had when it went to sleep, and the running one keeps the core to the end of
/// its slice. The receive path also takes what the sender leaves unused.
/// (A model that let a woken receiver preempt each encode made the encodes'
/// wall time 3x their core time, closed the old policy's static gate at once in
/// every cell and hid failure 2 of issue 21.)
const STREAMS: f64 = 4.0;

/// A simulated node's received [`Meter`] and counted [`CpuClock`], for a
/// policy's lifetime (a few bytes leaked per node).
pub fn sim_node() -> (&'static Meter, &'static CpuClock) {
    (
        Box::leak(Box::default()),
        Box::leak(Box::new(CpuClock::Counted(Default::default()))),
    )
}

/// One run's result.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Sum over the directions of raw bytes / seconds to deliver them all.
    pub goodput: f64,
    /// Share of the raw bytes sent compressed.
    pub compressed: f64,
    /// The same per direction (a to b, b to a).
    pub compressed_dir: [f64; 2],
}

/// Node `a` sends `bytes` to node `b`, and with `both` `b` sends as much to `a`
/// at the same time; `costs` and `link` per direction, every sender in `mode`.
pub fn run(mode: CompressMode, both: bool, costs: Costs, link: f64, bytes: f64) -> Outcome {
    run_with(Which::Now, mode, both, costs, link, bytes, 1.0)
}

/// [`run`] with the policy `which`, and node `b`'s codec `b_codec` times as
/// fast as `a`'s (two cores of one machine are seldom equal: a busy sibling
/// thread, a cache shared with a neighbour).
pub fn run_with(
    which: Which,
    mode: CompressMode,
    both: bool,
    costs: Costs,
    link: f64,
    bytes: f64,
    b_codec: f64,
) -> Outcome {
    run_noisy(which, mode, both, costs, link, bytes, b_codec, None)
}

/// Other work on a node's core, as a shared VM has it (other tenants, the
/// hypervisor, the kernel's softirqs): each node's core is left a share of
/// each step that changes at two time scales, independently per node. A slow
/// share is drawn every [`Noise::SLOW`] from `[1 - slow, 1]` (the run-to-run
/// spread the matrix's `off2/off` column shows), a fast one every
/// [`Noise::FAST`] from `[1 - fast, 1]` (epoch to epoch: an epoch is 16 MiB,
/// tens of milliseconds). Seeded: a run is repeatable.
#[derive(Clone, Copy, Debug)]
pub struct Noise {
    pub slow: f64,
    pub fast: f64,
    pub seed: u64,
}

impl Noise {
    pub const SLOW: f64 = 0.5;
    pub const FAST: f64 = 0.005;
}

/// Each node's share of its core, per step.
struct Steal {
    rng: StdRng,
    noise: Noise,
    slow: [(f64, f64); 2],
    fast: [(f64, f64); 2],
}

impl Steal {
    fn new(noise: Noise) -> Steal {
        Steal {
            rng: StdRng::seed_from_u64(noise.seed),
            noise,
            slow: [(f64::NEG_INFINITY, 1.0); 2],
            fast: [(f64::NEG_INFINITY, 1.0); 2],
        }
    }

    /// Node `node`'s share of its core at time `t`.
    fn share(&mut self, node: usize, t: f64) -> f64 {
        let Noise { slow, fast, .. } = self.noise;
        let rng = &mut self.rng;
        let mut draw = |cur: &mut (f64, f64), every: f64, amp: f64| {
            if t >= cur.0 + every {
                *cur = (t, 1.0 - amp * rng.gen::<f64>());
            }
            cur.1
        };
        draw(&mut self.slow[node], Noise::SLOW, slow)
            * draw(&mut self.fast[node], Noise::FAST, fast)
    }
}

/// [`run_with`] on noisy cores (`noise`; `None`: each node has its core to itself).
#[allow(clippy::too_many_arguments)]
pub fn run_noisy(
    which: Which,
    mode: CompressMode,
    both: bool,
    costs: Costs,
    link: f64,
    bytes: f64,
    b_codec: f64,
    noise: Option<Noise>,
) -> Outcome {
    let costs_b = Costs {
        enc: costs.enc / b_codec,
        ..costs
    };
    // What each node received, and its core time.
    let (node_a, node_b) = (sim_node(), sim_node());
    let meters = [node_a.0, node_b.0];
    let cpus = [node_a.1, node_b.1];
    // dirs[0]: a -> b, dirs[1]: b -> a.
    let mut dirs = [
        Dir::new(which, mode, meters[0], cpus[0], costs, link, bytes),
        Dir::new(
            which,
            mode,
            meters[1],
            cpus[1],
            costs_b,
            link,
            if both { bytes } else { 0.0 },
        ),
    ];
    if !both {
        dirs[1].done_at = Some(0.0);
    }
    let t0 = Instant::now();
    let mut t = 0.0;
    let mut steal = noise.map(Steal::new);
    while dirs.iter().any(|d| d.done_at.is_none()) {
        assert!(t < 600.0, "simulation does not finish");
        // Each node runs its receiver (the other direction's end) and its sender.
        #[allow(clippy::needless_range_loop)]
        for node in 0..2 {
            let (out, inn) = (node, 1 - node);
            let core = DT * steal.as_mut().map_or(1.0, |s| s.share(node, t));
            let in_want = dirs[inn].in_demand(core);
            let w_out = if dirs[out].encoding() { STREAMS } else { 1.0 };
            let in_share = in_want.min(core / (1.0 + w_out));
            let used_in = dirs[inn].run_in(in_share, t, meters[node]);
            let out_share = core - used_in;
            let used_out = dirs[out].run_out(out_share, t, t0);
            // What the sender left unused goes to the receiver.
            let rest = out_share - used_out;
            let used_rest = if rest > 0.0 {
                dirs[inn].run_in(rest, t, meters[node])
            } else {
                0.0
            };
            // The node's CPU time, as the process's clock counts it.
            cpus[node].add(((used_in + used_out + used_rest) * 1e9) as u64);
        }
        for d in dirs.iter_mut() {
            d.run_link();
            d.dev_used = 0.0;
        }
        t += DT;
    }
    let active: Vec<&Dir> = dirs.iter().filter(|d| d.total > 0.0).collect();
    let goodput = active
        .iter()
        .map(|d| d.total / d.done_at.expect("done"))
        .sum();
    let compressed = active.iter().map(|d| d.compressed_raw).sum::<f64>()
        / active.iter().map(|d| d.total).sum::<f64>();
    let share = |d: &Dir| d.compressed_raw / d.total.max(1.0);
    Outcome {
        goodput,
        compressed,
        compressed_dir: [share(&dirs[0]), share(&dirs[1])],
    }
}
