//! Adaptive compression, per connection: decides for each chunk whether running the
//! codec pays, from a size threshold, the recent compression ratio, and a cost model
//! of codec speed against link speed. Pure logic (times are passed in), unit-tested.
//!
//! The stream threads overlap: while one compresses a chunk, others are sending.
//! With an aggregate codec throughput `C` and a link rate `L`, compressed traffic
//! moves `min(C, L * r)` bytes per second against `L` raw. `C` is one thread's rate,
//! measured in wall time per chunk, times the streams: wall time, because a thread
//! that waits for a core (the machine is busy with training, or other comms) makes
//! the codec slower in fact, and the policy must see it. Compression can pay only when
//! `r >= MIN_RATIO` and `C > L * COST_MARGIN`. Data that stops compressing (ratio
//! below [`MIN_RATIO`]) is sent raw for [`REPROBE_EVERY`] chunks, then probed again;
//! so is data whose codec cannot keep up with the link.
//!
//! That model cannot see everything that competes for the CPU: the receiver's
//! decoder, the kernel's TCP stack, the training job. So a second gate measures what
//! each mode really costs: the wall time from taking a chunk to having written it
//! (codec plus send, which includes TCP backpressure from a slow receiver), per raw
//! byte, as an average for compressed chunks and one for raw chunks. Compression runs
//! unless raw measures cheaper by [`RAW_MARGIN`]; the other mode is tried every
//! [`EXPLORE_EVERY`] chunks so that a change in the link, the data or the load is
//! noticed.

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
const ALPHA: f64 = 0.25;
/// One chunk in this many runs the mode the measurements do not prefer.
pub const EXPLORE_EVERY: u64 = 16;
/// Raw must measure this much cheaper than compression before it takes over. A
/// raw chunk that lands in free socket buffer space costs almost nothing even on a
/// saturated link, so raw's measurements flatter it; the margin and a slow average
/// keep that from flipping a link-bound connection back and forth.
pub const RAW_MARGIN: f64 = 1.25;
const COST_ALPHA: f64 = 0.05;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Compress,
    /// Too small to be worth it.
    RawSmall,
    /// Off, or recent data did not pay (bypass).
    RawBypass,
}

/// How a chunk was sent, for [`Policy::record_cost`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Compressed,
    Raw,
}

#[derive(Debug)]
struct State {
    ratio: f64,
    /// Codec throughput of one thread, bytes per (wall) second.
    codec_bps: f64,
    bypass_left: u32,
    /// Measured ns per raw byte from taking a chunk to having written it, per mode.
    cost_compressed: Option<f64>,
    cost_raw: Option<f64>,
    /// Auto decisions that passed the static gate.
    n: u64,
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
                cost_compressed: None,
                cost_raw: None,
                n: 0,
            }),
        }
    }

    pub fn decide(&self, len: usize) -> Decision {
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
        if !Self::pays(s.ratio, s.codec_bps * self.parallel, self.link_bps) {
            s.bypass_left = REPROBE_EVERY;
            return Decision::RawBypass;
        }
        s.n += 1;
        let explore = s.n % EXPLORE_EVERY == 0;
        let compress = match (s.cost_compressed, s.cost_raw) {
            // Learn both costs first: every fourth chunk raw until raw has a figure.
            (_, None) => s.n % 4 != 0,
            (None, Some(_)) => true,
            (Some(c), Some(r)) => (c < r * RAW_MARGIN) != explore,
        };
        if compress {
            Decision::Compress
        } else {
            Decision::RawBypass
        }
    }

    /// Feeds back what one chunk cost end to end: `ns` of wall time from taking it to
    /// having written it, `raw` bytes of data.
    pub fn record_cost(&self, how: Sent, raw: usize, ns: u64) {
        if self.mode != CompressMode::Auto || raw < MIN_COMPRESS_BYTES {
            return;
        }
        let c = ns as f64 / raw as f64;
        let mut s = self.state.lock();
        let slot = match how {
            Sent::Compressed => &mut s.cost_compressed,
            Sent::Raw => &mut s.cost_raw,
        };
        *slot = Some(slot.map_or(c, |old| old + COST_ALPHA * (c - old)));
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

    #[test]
    fn measured_costs_pick_the_faster_mode_and_keep_exploring() {
        let p = Policy::new(CompressMode::Auto, 10 * GBIT, 4);
        let chunk = 256 << 10;
        // Compression looks fine to the static model, but measured end to end it
        // is 3x slower than raw (e.g. the CPU is the bottleneck, not the link).
        let mut compressed = 0;
        for _ in 0..400 {
            match p.decide(chunk) {
                Decision::Compress => {
                    compressed += 1;
                    p.record(chunk, chunk * 2 / 3, 200_000);
                    p.record_cost(Sent::Compressed, chunk, 3 * 800_000);
                }
                _ => p.record_cost(Sent::Raw, chunk, 800_000),
            }
        }
        // Mostly raw, but still exploring compression now and then.
        assert!(
            compressed > 400 / EXPLORE_EVERY as usize / 2 && compressed < 400 / 8,
            "{compressed}"
        );
        // Now the link is the bottleneck: raw costs 3x compressed. It flips back.
        let mut late = 0;
        for i in 0..400 {
            match p.decide(chunk) {
                Decision::Compress => {
                    late += (i >= 200) as usize;
                    p.record(chunk, chunk * 2 / 3, 200_000);
                    p.record_cost(Sent::Compressed, chunk, 800_000);
                }
                _ => p.record_cost(Sent::Raw, chunk, 3 * 800_000),
            }
        }
        assert!(late > 200 - 200 / EXPLORE_EVERY as usize - 2, "{late}");
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
        assert_eq!(p.decide(1 << 20), Decision::Compress);
        for _ in 0..20 {
            p.record(1 << 20, (1 << 20) + 24, 200_000);
        }
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
        let raw = (0..REPROBE_EVERY)
            .filter(|_| p.decide(1 << 20) == Decision::RawBypass)
            .count();
        assert_eq!(raw as u32, REPROBE_EVERY);
        // The ratio estimate stays low, so the re-probe keeps bypassing until data changes.
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
        for _ in 0..REPROBE_EVERY {
            p.decide(1 << 20);
        }
        for _ in 0..20 {
            p.record(1 << 20, 700_000, 200_000);
        }
        assert_eq!(p.decide(1 << 20), Decision::Compress);
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
        assert_eq!(one.decide(1 << 20), Decision::RawBypass);
        assert_eq!(two.decide(1 << 20), Decision::Compress);
        // A slow codec loses even on a modest link.
        let p = Policy::new(CompressMode::Auto, 100 * GBIT, 1);
        for _ in 0..20 {
            p.record(1 << 20, 700_000, 5_000_000); // 0.2 GB/s
        }
        assert_eq!(p.decide(1 << 20), Decision::RawBypass);
    }
}
