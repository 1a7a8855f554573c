//! Adaptive compression, per connection: decides for each chunk whether to run the
//! codec. Pure logic (the clock is passed in), unit-tested.
//!
//! Three gates, cheapest first:
//! 1. **Size.** Chunks below [`MIN_COMPRESS_BYTES`] go raw.
//! 2. **Static cost model.** The stream threads overlap: while one compresses a
//!    chunk, others send. With an aggregate codec throughput `C` (one thread's
//!    rate, in wall time per chunk, times the streams) and a link rate `L`,
//!    compressed traffic moves `min(C, L * r)` bytes per second against `L` raw.
//!    Compression can pay only when the ratio `r >= MIN_RATIO` and
//!    `C > L * COST_MARGIN`. Otherwise chunks go raw for [`REPROBE_EVERY`] chunks,
//!    then the codec is probed again. This gate keeps fast links and
//!    incompressible data off the codec.
//! 3. **Measured throughput.** The model cannot see everything that competes for
//!    the CPU: the receiver's decoder, the kernel's TCP stack, the training job.
//!    So the policy runs epochs of [`EPOCH_CHUNKS`] chunks in one mode and measures
//!    the rate at which the sender takes raw bytes. In steady state that is the
//!    pipeline's throughput, backpressure from a slow receiver or link included.
//!    The faster mode runs. The first epoch is raw (the uncompressed baseline,
//!    never slower than `off`), the second compressed. Then one epoch in
//!    [`EXPLORE_EPOCHS`] runs the other mode, so that a change in the link, the
//!    data or the load is noticed; each exploration that confirms the choice
//!    doubles that interval, up to [`MAX_EXPLORE_EPOCHS`] when the other mode
//!    measured more than [`ABORT_GAP`] slower (else up to four times the base).
//!    An epoch whose mode is already [`ABORT_GAP`] slower than the other mode's
//!    measurement after [`ABORT_AFTER`] chunks ends there: the early rate only
//!    flatters a mode just switched to (socket buffers still absorb, or still
//!    drain the other mode's bytes), so an early verdict of "slower" is safe, and a
//!    CPU-bound codec costs 16 chunks per exploration instead of 64. An epoch that
//!    spans an idle gap (no chunk for [`IDLE`]) measures the application, not us,
//!    and is discarded.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::CompressMode;

/// Chunks below this go raw: a frame header and a codec call cost more than they save.
pub const MIN_COMPRESS_BYTES: usize = 4096;
/// Below this ratio compression does not pay, whatever the link.
pub const MIN_RATIO: f64 = 1.03;
/// Chunks sent raw before compression is tried again after it stopped paying.
pub const REPROBE_EVERY: u32 = 64;
/// Codec throughput must beat the link by this factor before compression is used.
pub const COST_MARGIN: f64 = 1.25;
/// Chunks per measurement epoch (16 MiB at 256 KiB chunks: larger than what socket
/// buffers absorb, so an epoch measures the pipeline, not a buffer).
pub const EPOCH_CHUNKS: u32 = 64;
/// One epoch in this many runs the mode that measured slower (at first).
pub const EXPLORE_EPOCHS: u32 = 12;
/// Longest interval between explorations, reached by doubling while explorations
/// keep confirming a choice with a gap over [`ABORT_GAP`] (256 epochs of 64
/// chunks of 256 KiB: 4 GiB, a few seconds at the link rates where that happens).
pub const MAX_EXPLORE_EPOCHS: u32 = 256;
/// An epoch ends early once its mode measures this much slower than the other's.
pub const ABORT_GAP: f64 = 1.5;
/// Chunks an epoch runs before it may end early.
pub const ABORT_AFTER: u32 = 16;
/// Raw must measure this much faster than compression to take over.
pub const RAW_MARGIN: f64 = 1.1;
/// A gap this long between two chunks means the application paused.
pub const IDLE: Duration = Duration::from_millis(50);
const ALPHA: f64 = 0.25;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Compress,
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
    left: u32,
    start: Instant,
    last: Instant,
    bytes: u64,
    idle: bool,
    /// Measured throughput per mode, bytes per second.
    thr: [Option<f64>; 2],
    /// Epochs of the faster mode before the next exploration.
    until_explore: u32,
    /// The current interval between explorations (doubles while confirmed).
    interval: u32,
    /// The mode chosen before the running exploration, when this epoch explores.
    exploring: Option<Mode>,
}

#[derive(Debug)]
struct State {
    ratio: f64,
    /// Codec throughput of one thread, bytes per (wall) second.
    codec_bps: f64,
    bypass_left: u32,
    epoch: Option<Epoch>,
}

#[derive(Debug)]
pub struct Policy {
    mode: CompressMode,
    /// Link bytes per second.
    link_bps: f64,
    /// How many threads compress at once: the streams.
    parallel: f64,
    state: Mutex<State>,
}

impl Policy {
    /// `link_mbps`: the link's speed; `streams`: threads that compress and share it.
    pub fn new(mode: CompressMode, link_mbps: u64, streams: usize) -> Policy {
        Policy {
            mode,
            link_bps: link_mbps as f64 * 1e6 / 8.0,
            parallel: streams.max(1) as f64,
            // Optimistic start, so the first chunks probe the codec.
            state: Mutex::new(State {
                ratio: 1.4,
                codec_bps: 2e9,
                bypass_left: 0,
                epoch: None,
            }),
        }
    }

    pub fn decide(&self, len: usize) -> Decision {
        self.decide_at(len, Instant::now())
    }

    /// [`Policy::decide`] with the clock passed in.
    pub fn decide_at(&self, len: usize, now: Instant) -> Decision {
        match self.mode {
            CompressMode::Off => return Decision::RawBypass,
            _ if len < MIN_COMPRESS_BYTES => return Decision::RawSmall,
            CompressMode::On => return Decision::Compress,
            CompressMode::Auto => {}
        }
        let mut s = self.state.lock();
        if s.bypass_left > 0 {
            s.bypass_left -= 1;
            return Decision::RawBypass;
        }
        if !self.pays_now(&s) {
            s.bypass_left = REPROBE_EVERY;
            return Decision::RawBypass;
        }
        let e = s.epoch.get_or_insert_with(|| Epoch {
            mode: Mode::Raw,
            left: EPOCH_CHUNKS,
            start: now,
            last: now,
            bytes: 0,
            idle: false,
            thr: [None, None],
            until_explore: EXPLORE_EPOCHS,
            interval: EXPLORE_EPOCHS,
            exploring: None,
        });
        if now.saturating_duration_since(e.last) > IDLE {
            e.idle = true;
        }
        e.last = now;
        if e.left == 0 || Self::losing(e, now) {
            Self::next_epoch(e, now);
        }
        e.left -= 1;
        e.bytes += len as u64;
        match e.mode {
            Mode::Compressed => Decision::Compress,
            Mode::Raw => Decision::RawBypass,
        }
    }

    /// True when the running epoch has gone [`ABORT_AFTER`] chunks and its rate so
    /// far is [`ABORT_GAP`] below the other mode's measurement.
    fn losing(e: &Epoch, now: Instant) -> bool {
        let done = EPOCH_CHUNKS - e.left;
        let Some(other) = e.thr[e.mode.other() as usize] else {
            return false;
        };
        let secs = now.saturating_duration_since(e.start).as_secs_f64();
        done >= ABORT_AFTER && !e.idle && secs > 0.0 && e.bytes as f64 / secs * ABORT_GAP < other
    }

    /// Closes the current epoch's measurement and picks the next epoch's mode.
    fn next_epoch(e: &mut Epoch, now: Instant) {
        let secs = now.saturating_duration_since(e.start).as_secs_f64();
        if !e.idle && secs > 0.0 {
            let t = e.bytes as f64 / secs;
            let m = &mut e.thr[e.mode as usize];
            *m = Some(m.map_or(t, |old| old + ALPHA * (t - old)));
        }
        e.mode = match e.thr {
            [_, None] => Mode::Raw,
            [None, _] => Mode::Compressed,
            [Some(c), Some(r)] => {
                // Hysteresis: the static model already said compression can pay, so
                // raw must measure clearly faster to take over; a noisy epoch
                // (another process stealing the CPU) should not flip the mode.
                let best = if c * RAW_MARGIN >= r {
                    Mode::Compressed
                } else {
                    Mode::Raw
                };
                let gap = c.max(r) / c.min(r).max(1.0);
                if let Some(before) = e.exploring.take() {
                    // An exploration ended: a confirmed choice is explored less
                    // often, a changed one as often as at first.
                    e.interval = if best == before {
                        let cap = if gap > ABORT_GAP {
                            MAX_EXPLORE_EPOCHS
                        } else {
                            4 * EXPLORE_EPOCHS
                        };
                        (e.interval * 2).min(cap)
                    } else {
                        EXPLORE_EPOCHS
                    };
                    e.until_explore = e.interval;
                }
                if e.until_explore == 0 {
                    e.exploring = Some(best);
                    best.other()
                } else {
                    e.until_explore -= 1;
                    best
                }
            }
        };
        e.left = EPOCH_CHUNKS;
        e.start = now;
        e.bytes = 0;
        e.idle = false;
    }

    /// The static gate with the current estimates.
    fn pays_now(&self, s: &State) -> bool {
        Self::pays(s.ratio, s.codec_bps * self.parallel, self.link_bps)
    }

    /// `codec_bps`: aggregate codec throughput; `link_bps`: the link's.
    fn pays(ratio: f64, codec_bps: f64, link_bps: f64) -> bool {
        ratio >= MIN_RATIO && codec_bps > link_bps * COST_MARGIN
    }

    /// Feeds back one compressed chunk: `raw` bytes became `wire` bytes in
    /// `codec_ns` of wall time.
    pub fn record(&self, raw: usize, wire: usize, codec_ns: u64) {
        if raw == 0 {
            return;
        }
        let r = raw as f64 / wire.max(1) as f64;
        let bps = raw as f64 * 1e9 / codec_ns.max(1) as f64;
        let mut s = self.state.lock();
        s.ratio += ALPHA * (r - s.ratio);
        s.codec_bps += ALPHA * (bps - s.codec_bps);
    }

    pub fn ratio_estimate(&self) -> f64 {
        self.state.lock().ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn measured_throughput_picks_the_faster_mode_and_keeps_exploring() {
        let p = Policy::new(CompressMode::Auto, 10 * GBIT, 4);
        let mut t = Instant::now();
        // Link-bound: compressed moves 1.5x the raw bytes per second.
        let share = simulate(&p, &mut t, 1.5e9, 1.0e9, 64 * 40, 64 * 24);
        assert!(
            share > 0.85 && share < 1.0,
            "link-bound: compressed share {share}"
        );
        // CPU-bound (the codec is the bottleneck): raw is 2.5x faster. It flips,
        // and explorations of compression end after ABORT_AFTER chunks and grow
        // rarer, but never stop.
        let share = simulate(&p, &mut t, 0.5e9, 1.25e9, 64 * 60, 64 * 30);
        assert!(share < 0.02, "cpu-bound: compressed share {share}");
        let long = 64 * (MAX_EXPLORE_EPOCHS as usize + 8);
        let share = simulate(&p, &mut t, 0.5e9, 1.25e9, long, long);
        assert!(
            share > 0.0 && share < 0.005,
            "cpu-bound, steady: compressed share {share}"
        );
        // The link slows down (or the data gets more compressible): an exploration
        // notices, and compression takes over again.
        let share = simulate(&p, &mut t, 1.5e9, 0.5e9, long, 64 * 40);
        assert!(share > 0.85, "link-bound again: compressed share {share}");
    }

    #[test]
    fn learning_starts_raw_and_a_slow_codec_costs_little() {
        // A fast link and a CPU-bound codec (the host path on 100 Gbit/s, or the
        // unshaped demo): from a fresh policy, the first epoch is raw, the first
        // compressed epoch ends after ABORT_AFTER chunks, and over 2048 chunks
        // (512 MiB) few chunks are compressed.
        let p = Policy::new(CompressMode::Auto, 10 * GBIT, 4);
        let mut t = Instant::now();
        let first = simulate(&p, &mut t, 0.8e9, 2.2e9, EPOCH_CHUNKS as usize, 64);
        assert_eq!(first, 0.0, "the first epoch is raw");
        let share = simulate(&p, &mut t, 0.8e9, 2.2e9, 2048 - 64, 2048 - 64);
        // Whole 64-chunk learning epochs gave 6.5% here (two of them).
        let most = 0.03;
        assert!(
            share > 0.0 && share <= most,
            "cpu-bound from the start: compressed share {share} (at most {most})"
        );
    }

    #[test]
    fn idle_gaps_do_not_count_as_slow_epochs() {
        let p = Policy::new(CompressMode::Auto, 10 * GBIT, 4);
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
        let p = Policy::new(CompressMode::Off, 2 * GBIT, 4);
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
        let p = Policy::new(CompressMode::On, 2 * GBIT, 4);
        assert_eq!(p.decide(100), Decision::RawSmall);
        assert_eq!(p.decide(1 << 20), Decision::Compress);
    }

    #[test]
    fn incompressible_data_is_bypassed_then_reprobed() {
        let p = Policy::new(CompressMode::Auto, 2 * GBIT, 4);
        let mut t = Instant::now();
        // Link-bound and compressible: compression runs.
        let share = simulate(&p, &mut t, 1.5e9, 1.0e9, 64 * 4, 64);
        assert!(share > 0.9, "compressible: compressed share {share}");
        for _ in 0..20 {
            p.record(1 << 20, (1 << 20) + 24, 200_000);
        }
        assert_eq!(p.decide_at(1 << 20, t), Decision::RawBypass);
        let raw = (0..REPROBE_EVERY)
            .filter(|_| p.decide_at(1 << 20, t) == Decision::RawBypass)
            .count();
        assert_eq!(raw as u32, REPROBE_EVERY);
        // The ratio estimate stays low, so the re-probe keeps bypassing until data changes.
        assert_eq!(p.decide_at(1 << 20, t), Decision::RawBypass);
        for _ in 0..REPROBE_EVERY {
            p.decide_at(1 << 20, t);
        }
        for _ in 0..20 {
            p.record(1 << 20, 700_000, 200_000);
        }
        assert_eq!(p.decide_at(1 << 20, t), Decision::Compress);
    }

    #[test]
    fn cost_model_links_and_codec_speed() {
        // 2 GB/s codec, ratio 1.5: pays on 2 Gbit/s, not on a 400 Gbit/s link.
        assert!(Policy::pays(1.5, 2e9, 2e9 / 8.0));
        assert!(!Policy::pays(1.5, 2e9, 400e9 / 8.0));
        // Incompressible data never pays, however fast the codec.
        assert!(!Policy::pays(1.01, 100e9, 1e6));
        // Streams compress in parallel: 0.8 GB/s per thread beats a 10 Gbit/s
        // link with two streams, not with one.
        let one = Policy::new(CompressMode::Auto, 10 * GBIT, 1);
        let two = Policy::new(CompressMode::Auto, 10 * GBIT, 2);
        for p in [&one, &two] {
            for _ in 0..20 {
                p.record(1 << 20, 700_000, 1_310_000); // 0.8 GB/s
            }
        }
        assert!(!one.pays_now(&one.state.lock()));
        assert!(two.pays_now(&two.state.lock()));
        // A slow codec loses even on a modest link.
        let p = Policy::new(CompressMode::Auto, 100 * GBIT, 1);
        for _ in 0..20 {
            p.record(1 << 20, 700_000, 5_000_000); // 0.2 GB/s
        }
        assert!(!p.pays_now(&p.state.lock()));
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
    }
}
