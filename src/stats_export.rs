//! `NCCL_ZIP_STATS_FILE`: what the plugin did, as JSON lines a tool can read.
//!
//! Every live comm registers itself ([`register`]); a comm that closes folds its
//! counters into its peer's totals ([`retire`]), so a peer's line covers closed
//! and open comms alike. One `zip-stats` thread appends a record every
//! `NCCL_ZIP_STATS_INTERVAL_MS` (default 10 s; 0: none), and an `atexit` handler
//! appends the last one when the process exits, also when NCCL never destroyed
//! its comms (a job that ends without `ncclCommDestroy`). Each record is one
//! `"kind":"process"` line, then one `"kind":"peer"` line per (peer, direction),
//! then, with `NCCL_ZIP_STATS_PER_COMM=1`, one `"kind":"comm"` line per live comm.
//! The path takes `%h` (host name) and `%p` (pid), as `NCCL_DEBUG_FILE` does.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;

use crate::stats::{Stats, HELD};

/// A comm whose counters the stats file reports.
pub trait CommStats: Send + Sync {
    fn comm_stats(&self) -> &Stats;
    fn peer(&self) -> SocketAddr;
    /// "send" or "recv".
    fn kind(&self) -> &'static str;
    /// "tcp" or "ib".
    fn transport(&self) -> &'static str;
}

/// Counters summed over comms (one peer and direction, or one comm).
#[derive(Serialize, Default, Clone, Debug, PartialEq)]
pub struct Totals {
    pub comms: u64,
    pub messages: u64,
    pub raw_bytes: u64,
    pub wire_bytes: u64,
    pub ratio: f64,
    pub chunks_compressed: u64,
    pub chunks_raw: u64,
    pub chunks_bypassed: u64,
    pub codec_cpu_s: f64,
    /// TCP data streams of these comms (opened on demand; a closed comm counts
    /// those it had at close).
    pub data_streams: u64,
    /// Times these comms found the process's buffer budget spent and went raw.
    pub budget_refusals: u64,
}

impl Totals {
    fn add(&mut self, s: &Stats) {
        self.comms += 1;
        self.messages += s.messages.load(Relaxed);
        self.raw_bytes += s.raw_bytes.load(Relaxed);
        self.wire_bytes += s.wire_bytes.load(Relaxed);
        self.chunks_compressed += s.chunks_compressed.load(Relaxed);
        self.chunks_raw += s.chunks_raw.load(Relaxed);
        self.chunks_bypassed += s.bypassed.load(Relaxed);
        self.codec_cpu_s += s.codec_cpu_ns.load(Relaxed) as f64 / 1e9;
        self.data_streams += s.streams.load(Relaxed);
        self.budget_refusals += s.budget_refusals.load(Relaxed);
    }
    fn merge(&mut self, o: &Totals) {
        self.comms += o.comms;
        self.messages += o.messages;
        self.raw_bytes += o.raw_bytes;
        self.wire_bytes += o.wire_bytes;
        self.chunks_compressed += o.chunks_compressed;
        self.chunks_raw += o.chunks_raw;
        self.chunks_bypassed += o.chunks_bypassed;
        self.codec_cpu_s += o.codec_cpu_s;
        self.data_streams += o.data_streams;
        self.budget_refusals += o.budget_refusals;
    }
    fn finish(mut self) -> Self {
        self.ratio = if self.wire_bytes > 0 {
            self.raw_bytes as f64 / self.wire_bytes as f64
        } else {
            1.0
        };
        self
    }
}

type Key = (String, &'static str, &'static str); // peer IP, send|recv, tcp|ib

struct Registry {
    live: Vec<(u64, Weak<dyn CommStats>)>,
    next_id: u64,
    /// Closed comms, summed per peer and direction.
    retired: BTreeMap<Key, Totals>,
}

static REG: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    next_id: 1,
    retired: BTreeMap::new(),
});

fn key(c: &dyn CommStats) -> Key {
    (c.peer().ip().to_string(), c.kind(), c.transport())
}

/// Makes a new comm visible to the stats file; returns its id.
pub fn register(c: Weak<dyn CommStats>) -> u64 {
    let mut r = REG.lock();
    r.live.retain(|(_, w)| w.strong_count() > 0);
    let id = r.next_id;
    r.next_id += 1;
    r.live.push((id, c));
    id
}

/// Called by a closing comm (from its `Drop`, when it can no longer be
/// upgraded): its counters join its peer's totals.
pub fn retire(c: &dyn CommStats) {
    let k = key(c);
    let mut r = REG.lock();
    r.retired.entry(k).or_default().add(c.comm_stats());
}

#[derive(Serialize)]
struct ProcessLine {
    kind: &'static str,
    ts: f64,
    host: String,
    pid: u32,
    #[serde(rename = "final")]
    last: bool,
    version: &'static str,
    comms_open: u64,
    io_threads: u64,
    io_workers: u64,
    /// Blocking writers the I/O workers lend window-limited send streams to.
    io_writers: u64,
    /// Codec workers (`transport::tcp::codec_workers`); their codec time is in
    /// `codec_cpu_s`.
    codec_threads: u64,
    /// TCP data streams open now (sockets besides each comm's inline stream).
    tcp_data_streams: u64,
    staging_bytes: u64,
    /// Compression buffers reserved against the process's budget (`crate::budget`).
    budget_bytes: u64,
    decode_table_bytes: u64,
    gpu_lanes: u64,
    codec_cpu_s: f64,
    process_threads: Option<u64>,
    process_fds: Option<u64>,
    process_rss_kib: Option<u64>,
    totals: Totals,
}

#[derive(Serialize)]
struct PeerLine<'a> {
    kind: &'static str,
    ts: f64,
    pid: u32,
    peer: &'a str,
    dir: &'static str,
    transport: &'static str,
    #[serde(flatten)]
    totals: Totals,
}

#[derive(Serialize)]
struct CommLine {
    kind: &'static str,
    ts: f64,
    pid: u32,
    comm: u64,
    peer: String,
    dir: &'static str,
    transport: &'static str,
    #[serde(flatten)]
    totals: Totals,
}

/// One record: the lines described in the module documentation.
pub fn record(last: bool, per_comm: bool) -> String {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let pid = std::process::id();
    let (mut peers, comms) = {
        let r = REG.lock();
        let mut peers = r.retired.clone();
        let mut comms = vec![];
        for (id, w) in &r.live {
            if let Some(c) = w.upgrade() {
                let mut t = Totals::default();
                t.add(c.comm_stats());
                peers.entry(key(&*c)).or_default().merge(&t);
                if per_comm {
                    comms.push((*id, key(&*c), t));
                }
            }
        }
        (peers, comms)
    };
    let mut all = Totals::default();
    for t in peers.values() {
        all.merge(t);
    }
    let p = ProcessLine {
        kind: "process",
        ts,
        host: hostname(),
        pid,
        last,
        version: env!("CARGO_PKG_VERSION"),
        comms_open: HELD.comms.load(Relaxed),
        io_threads: HELD.io_threads.load(Relaxed),
        io_workers: HELD.io_workers.load(Relaxed),
        io_writers: HELD.io_writers.load(Relaxed),
        codec_threads: HELD.codec_workers.load(Relaxed),
        tcp_data_streams: HELD.data_streams.load(Relaxed),
        staging_bytes: HELD.staging_bytes.load(Relaxed),
        budget_bytes: crate::budget::BUFFERS.used(),
        decode_table_bytes: HELD.decode_tables.load(Relaxed),
        gpu_lanes: HELD.gpu_lanes.load(Relaxed),
        codec_cpu_s: HELD.codec_cpu_ns.load(Relaxed) as f64 / 1e9,
        process_threads: crate::stats::process_threads(),
        process_fds: crate::stats::open_fds(),
        process_rss_kib: crate::stats::process_rss_kib(),
        totals: all.finish(),
    };
    let mut out = serde_json::to_string(&p).unwrap_or_default() + "\n";
    for ((peer, dir, transport), t) in std::mem::take(&mut peers) {
        let l = PeerLine {
            kind: "peer",
            ts,
            pid,
            peer: &peer,
            dir,
            transport,
            totals: t.finish(),
        };
        out += &(serde_json::to_string(&l).unwrap_or_default() + "\n");
    }
    for (id, (peer, dir, transport), t) in comms {
        let l = CommLine {
            kind: "comm",
            ts,
            pid,
            comm: id,
            peer,
            dir,
            transport,
            totals: t.finish(),
        };
        out += &(serde_json::to_string(&l).unwrap_or_default() + "\n");
    }
    out
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `%h` and `%p` in the path, as NCCL_DEBUG_FILE takes them.
pub fn expand_path(p: &str) -> String {
    p.replace("%h", &hostname())
        .replace("%p", &std::process::id().to_string())
}

struct Writer {
    path: String,
    per_comm: bool,
    /// Serializes appends (the periodic thread and the exit handler).
    lock: Mutex<()>,
}

static WRITER: OnceLock<Arc<Writer>> = OnceLock::new();

impl Writer {
    fn append(&self, last: bool) {
        let _g = self.lock.lock();
        let rec = record(last, self.per_comm);
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(rec.as_bytes()));
        if let Err(e) = r {
            tracing::info!(
                "nccl-net-zip: cannot write the stats file {}: {e}",
                self.path
            );
        }
    }
}

extern "C" fn at_exit() {
    // Never unwinds into libc's exit path.
    let _ = std::panic::catch_unwind(|| {
        if let Some(w) = WRITER.get() {
            w.append(true);
        }
    });
}

/// Starts the stats file once per process (later calls, e.g. from NCCL
/// 2.28+'s repeated `init`, do nothing). The library is linked `-z nodelete`,
/// so the exit handler and the thread stay mapped.
pub fn start(path: &str, interval: Duration, per_comm: bool) {
    let mut first = false;
    let w = WRITER.get_or_init(|| {
        first = true;
        Arc::new(Writer {
            path: expand_path(path),
            per_comm,
            lock: Mutex::new(()),
        })
    });
    if !first {
        return;
    }
    // SAFETY: registers a plain function with no captured state.
    unsafe { libc::atexit(at_exit) };
    if !interval.is_zero() {
        let w = w.clone();
        let _ = std::thread::Builder::new()
            .name("zip-stats".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                w.append(false);
            });
    }
    tracing::info!(
        target: crate::log::BANNER,
        "nccl-net-zip: stats file {} (a record every {:?} and at exit)",
        w.path,
        interval
    );
}
