//! Per-comm counters, cheap enough for the data path (relaxed atomics).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default, Debug)]
pub struct Stats {
    pub messages: AtomicU64,
    /// Uncompressed bytes handed to us (send) or delivered (recv).
    pub raw_bytes: AtomicU64,
    /// Payload bytes on the wire, excluding chunk headers.
    pub wire_bytes: AtomicU64,
    pub chunks_compressed: AtomicU64,
    pub chunks_raw: AtomicU64,
    /// Chunks the adaptive policy sent raw because compression was not paying.
    pub bypassed: AtomicU64,
    /// Time spent in the codec, nanoseconds.
    pub codec_ns: AtomicU64,
}

impl Stats {
    pub fn add(&self, c: &AtomicU64, v: u64) {
        c.fetch_add(v, Relaxed);
    }

    pub fn summary(&self) -> String {
        let raw = self.raw_bytes.load(Relaxed);
        let wire = self.wire_bytes.load(Relaxed);
        let ratio = if wire > 0 {
            raw as f64 / wire as f64
        } else {
            1.0
        };
        format!(
            "messages {} raw {} B wire {} B ratio {:.3} chunks compressed {} raw {} (bypass {}) codec {:.1} ms",
            self.messages.load(Relaxed),
            raw,
            wire,
            ratio,
            self.chunks_compressed.load(Relaxed),
            self.chunks_raw.load(Relaxed),
            self.bypassed.load(Relaxed),
            self.codec_ns.load(Relaxed) as f64 / 1e6
        )
    }
}
