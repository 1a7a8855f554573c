//! The adaptive policy as it was before issue 21 (commit 446206e), for the
//! two-node simulation only: the simulation must show the failures the issue
//! measured on this policy, and their absence on the current one. Kept to what
//! decides: the same constants, gates and epoch rule, without the tracing.
//!
//! What differs from the current policy, and matters in the runs:
//! - the static gate uses the device's nominal speed when the user gave none
//!   (a veth: 10 Gbit/s), against one thread's codec rate times
//!   `min(streams, cores)`;
//! - the codec's rate is the wall time of an encode, which counts the time other
//!   threads (this node's receive path, the other encoders) held the core;
//! - once the gate closes it never reopens: after [`REPROBE_EVERY`] raw chunks it
//!   re-checks the same estimates, which only a compressed chunk updates;
//! - an epoch's figure is the rate at which this comm's sender took raw bytes:
//!   the decoding its compression costs the peer is not in it;
//! - raw's first epoch after the compressed start is measured at once.

use std::time::Instant;

use parking_lot::Mutex;

use super::{
    Decision, ALPHA, CONFIDENT, COST_MARGIN, EPOCH_BYTES, EXPLORE_ALPHA, EXPLORE_EPOCHS, IDLE,
    LEARN_EPOCHS, MAX_EXPLORE_EPOCHS, MIN_COMPRESS_BYTES, MIN_RATIO, RAW_MARGIN, REPROBE_EVERY,
};
use crate::config::CompressMode;

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
    thr: [Option<f64>; 2],
    until_explore: u32,
    explore_every: u32,
    exploring: bool,
    c_epochs: u32,
}

#[derive(Debug)]
struct State {
    ratio: f64,
    /// One thread's codec rate, raw bytes per second of wall time.
    codec_bps: f64,
    bypass_left: u32,
    epoch: Option<Epoch>,
}

/// The policy of 446206e.
#[derive(Debug)]
pub struct OldPolicy {
    mode: CompressMode,
    link_bps: f64,
    parallel: f64,
    state: Mutex<State>,
}

impl OldPolicy {
    /// `link_mbps`: the user's figure, else the device's nominal speed;
    /// `parallel`: `min(streams, cores)` as the plugin computed it.
    pub fn new(mode: CompressMode, link_mbps: u64, parallel: usize) -> OldPolicy {
        OldPolicy {
            mode,
            link_bps: link_mbps as f64 * 1e6 / 8.0,
            parallel: parallel.max(1) as f64,
            state: Mutex::new(State {
                ratio: 1.4,
                codec_bps: 2e9,
                bypass_left: 0,
                epoch: None,
            }),
        }
    }

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
        if !(s.ratio >= MIN_RATIO && s.codec_bps * self.parallel > self.link_bps * COST_MARGIN) {
            s.bypass_left = REPROBE_EVERY;
            return Decision::RawBypass;
        }
        let confident = s.codec_bps * self.parallel >= CONFIDENT * self.link_bps;
        let e = s.epoch.get_or_insert(Epoch {
            mode: Mode::Compressed,
            start: now,
            last: now,
            bytes: 0,
            idle: false,
            thr: [None, None],
            until_explore: EXPLORE_EPOCHS,
            explore_every: EXPLORE_EPOCHS,
            exploring: false,
            c_epochs: 0,
        });
        if now.saturating_duration_since(e.last) > IDLE {
            e.idle = true;
        }
        e.last = now;
        if e.bytes >= EPOCH_BYTES {
            Self::next_epoch(e, now, confident);
        }
        e.bytes += len as u64;
        match e.mode {
            Mode::Compressed => Decision::Compress,
            Mode::Raw => Decision::RawBypass,
        }
    }

    fn next_epoch(e: &mut Epoch, now: Instant, confident: bool) {
        if e.mode == Mode::Compressed && !e.idle {
            e.c_epochs += 1;
        }
        let secs = now.saturating_duration_since(e.start).as_secs_f64();
        let mut measured = None;
        if !e.idle && secs > 0.0 {
            // This comm's own send rate only.
            let t = e.bytes as f64 / secs;
            measured = Some(t);
            let alpha = if e.exploring { EXPLORE_ALPHA } else { ALPHA };
            let m = &mut e.thr[e.mode as usize];
            *m = Some(m.map_or(t, |old| old + alpha * (t - old)));
        }
        let was = e.mode;
        e.mode = match e.thr {
            [None, _] => Mode::Compressed,
            [_, None] if confident && e.c_epochs < LEARN_EPOCHS => Mode::Compressed,
            [_, None] => Mode::Raw,
            [Some(c), Some(r)] => {
                let best = if c * RAW_MARGIN >= r {
                    Mode::Compressed
                } else {
                    Mode::Raw
                };
                let gap = c.max(r) / c.min(r).max(1.0);
                let base = if gap > 1.5 {
                    4 * EXPLORE_EPOCHS
                } else {
                    EXPLORE_EPOCHS
                };
                let explored = std::mem::take(&mut e.exploring);
                let won = measured.is_some_and(|t| match was {
                    Mode::Compressed => t * RAW_MARGIN >= r,
                    Mode::Raw => c * RAW_MARGIN < t,
                });
                if measured.is_none() {
                    if explored {
                        e.until_explore = e.explore_every;
                    }
                } else if explored && !won {
                    e.explore_every = (e.explore_every * 2).clamp(base, MAX_EXPLORE_EPOCHS);
                    e.until_explore = e.explore_every;
                } else if explored || best != was {
                    e.explore_every = base;
                    e.until_explore = base;
                }
                if e.until_explore == 0 {
                    e.exploring = true;
                    best.other()
                } else {
                    e.until_explore -= 1;
                    best
                }
            }
        };
        e.start = now;
        e.bytes = 0;
        e.idle = false;
    }

    /// `codec_ns`: the encode's wall time.
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
}
