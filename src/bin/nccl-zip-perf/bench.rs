//! Throughput per message size: the clock starts when a size's warm-up messages
//! are done and stops when its last timed message completes; the pipeline stays
//! full across the boundary. [`Wire`] reads the interface's byte counters over a
//! whole run (per block they would not line up with completions: bytes of later
//! messages are already in flight), which shows what actually crossed the wire
//! per payload byte (it will matter once compression lands).

use std::time::Instant;

use crate::cli::Opts;
use crate::data::Msg;

pub struct BenchClock {
    enabled: bool,
    role: &'static str,
    transport: &'static str,
    mem: &'static str,
    count: usize,
    started: Option<Instant>,
    block: Option<Instant>,
    total_bytes: u64,
    total_msgs: u64,
}

/// (rx_bytes, tx_bytes) of an interface, as seen from this network namespace.
pub fn wire_counters(iface: &str) -> Option<(u64, u64)> {
    let rd = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{f}"))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    Some((rd("rx_bytes")?, rd("tx_bytes")?))
}

/// `--wire-iface`, else NCCL_SOCKET_IFNAME when it names one existing interface.
pub fn wire_iface(o: &Opts) -> Option<String> {
    let name = o.wire_iface.clone().or_else(|| {
        let v = std::env::var("NCCL_SOCKET_IFNAME").ok()?;
        let v = v.trim_start_matches('=');
        (!v.starts_with('^') && !v.contains(',')).then(|| v.to_string())
    })?;
    wire_counters(&name).map(|_| name)
}

impl BenchClock {
    pub fn new(o: &Opts, role: &'static str, transport: &'static str) -> BenchClock {
        BenchClock {
            enabled: o.bench,
            role,
            transport,
            mem: o.mem.name(),
            count: o.count,
            started: None,
            block: None,
            total_bytes: 0,
            total_msgs: 0,
        }
    }

    pub fn start(&mut self) {
        self.started.get_or_insert_with(Instant::now);
    }

    /// Message `m` completed; `next` is the one after it in the schedule.
    pub fn completed(&mut self, m: &Msg, next: Option<&Msg>) {
        self.total_bytes += m.size as u64;
        self.total_msgs += 1;
        if !self.enabled {
            return;
        }
        let last_of_block = next.is_none_or(|n| n.block != m.block);
        if m.warmup && next.is_some_and(|n| !n.warmup && n.block == m.block) {
            self.block = Some(Instant::now());
        } else if !m.warmup && last_of_block {
            let Some(t0) = self.block.take() else {
                return;
            };
            let secs = t0.elapsed().as_secs_f64();
            let bytes = (m.size * self.count) as f64;
            let gbps = bytes / secs / 1e9;
            let line = format!(
                "BENCH transport={} role={} mem={} size={} count={} secs={:.6} GBps={:.3} Gbps={:.3}",
                self.transport,
                self.role,
                self.mem,
                m.size,
                self.count,
                secs,
                gbps,
                gbps * 8.0
            );
            println!("{line}");
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// One summary line for a whole run.
    pub fn summary(&self) -> String {
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        format!(
            "{} {} messages, {} bytes in {:.3} s ({:.3} GB/s)",
            self.role,
            self.total_msgs,
            self.total_bytes,
            secs,
            if secs > 0.0 {
                self.total_bytes as f64 / secs / 1e9
            } else {
                0.0
            }
        )
    }
}

/// Interface byte counters at the start of a run.
pub struct Wire {
    iface: String,
    start: (u64, u64),
}

impl Wire {
    /// Call before listen/connect, so every byte of the run is counted.
    pub fn start(o: &Opts) -> Option<Wire> {
        let iface = wire_iface(o)?;
        let start = wire_counters(&iface)?;
        Some(Wire { iface, start })
    }

    /// `WIRE` line: bytes the interface saw during the run per payload byte
    /// (receiver: rx; sender: tx; on lo both are all traffic).
    pub fn report(&self, role: &str, payload: u64) {
        let Some((rx, tx)) = wire_counters(&self.iface) else {
            return;
        };
        let (rx, tx) = (rx - self.start.0, tx - self.start.1);
        let main = if role == "recv" { rx } else { tx };
        println!(
            "WIRE iface={} role={role} rx={rx} tx={tx} payload={payload} wire_per_payload={:.4}",
            self.iface,
            main as f64 / payload.max(1) as f64
        );
    }
}
