//! Counters of comms and of the whole plugin, cheap enough for the data path
//! (relaxed atomics), and the counted staging buffers. Shared by every transport.

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
    /// Messages that went whole on the inline stream (written and read by NCCL's
    /// thread; counted in `chunks_raw` too).
    pub chunks_inline: AtomicU64,
    /// Chunks staged through a device lane (CUDA buffers).
    pub chunks_device: AtomicU64,
    /// Times an IB comm found the process's buffer budget spent and went raw
    /// (`transport::ib::budget`).
    pub budget_refusals: AtomicU64,
    /// Time spent in the codec, nanoseconds.
    pub codec_ns: AtomicU64,
    /// CPU time the host codec took on the threads that ran it, nanoseconds.
    pub codec_cpu_ns: AtomicU64,
    /// Bytes of staging memory this comm's threads hold now.
    pub staging_bytes: AtomicU64,
    /// TCP data streams up now (opened on demand, besides the inline stream).
    pub streams: AtomicU64,
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
            "messages {} raw {} B wire {} B ratio {:.3} chunks compressed {} raw {} (bypass {}, inline {}, device {}) codec {:.1} ms (CPU {:.1} ms) staging {} KiB streams {} budget refusals {}",
            self.messages.load(Relaxed),
            raw,
            wire,
            ratio,
            self.chunks_compressed.load(Relaxed),
            self.chunks_raw.load(Relaxed),
            self.bypassed.load(Relaxed),
            self.chunks_inline.load(Relaxed),
            self.chunks_device.load(Relaxed),
            self.codec_ns.load(Relaxed) as f64 / 1e6,
            self.codec_cpu_ns.load(Relaxed) as f64 / 1e6,
            self.staging_bytes.load(Relaxed) >> 10,
            self.streams.load(Relaxed),
            self.budget_refusals.load(Relaxed)
        )
    }
}

/// What the whole plugin holds right now, across comms.
#[derive(Default, Debug)]
pub struct Held {
    pub comms: AtomicU64,
    pub io_threads: AtomicU64,
    /// The process-wide I/O workers that drive every comm's data streams.
    pub io_workers: AtomicU64,
    /// The process-wide blocking writers that I/O workers lend window-limited
    /// send streams to (`transport::tcp::workers`), started on first need.
    pub io_writers: AtomicU64,
    /// The process-wide codec workers that compress and decompress every TCP
    /// comm's chunks (`transport::tcp::codec_workers`).
    pub codec_workers: AtomicU64,
    /// TCP data streams (sockets besides each comm's inline stream) open now.
    pub data_streams: AtomicU64,
    pub staging_bytes: AtomicU64,
    /// Free TCP staging buffers kept for reuse (`transport::tcp::pool`).
    pub pooled_bytes: AtomicU64,
    /// GPU lanes (pinned staging + CUDA stream) in the shared pools.
    pub gpu_lanes: AtomicU64,
    /// Decode tables the receivers keep across chunks (`codec_glue::ChunkDecoder`).
    pub decode_tables: AtomicU64,
    /// CPU time the host codec took, all comms together, nanoseconds (only grows).
    pub codec_cpu_ns: AtomicU64,
}

pub static HELD: Held = Held {
    comms: AtomicU64::new(0),
    io_threads: AtomicU64::new(0),
    io_workers: AtomicU64::new(0),
    io_writers: AtomicU64::new(0),
    codec_workers: AtomicU64::new(0),
    data_streams: AtomicU64::new(0),
    staging_bytes: AtomicU64::new(0),
    pooled_bytes: AtomicU64::new(0),
    gpu_lanes: AtomicU64::new(0),
    decode_tables: AtomicU64::new(0),
    codec_cpu_ns: AtomicU64::new(0),
};

impl Held {
    /// Bytes of memory the plugin's pools and comms hold for data: staging and
    /// decode tables (GPU lanes are counted apart, as lanes).
    pub fn pool_bytes(&self) -> u64 {
        self.staging_bytes.load(Relaxed)
            + self.pooled_bytes.load(Relaxed)
            + self.decode_tables.load(Relaxed)
    }

    pub fn summary(&self) -> String {
        format!(
            "plugin holds {} comms ({} TCP data streams), {} I/O threads (+ {} shared workers, {} blocking writers, {} codec workers), {} KiB staging (+ {} KiB free for reuse), {} KiB decode tables, {} GPU lanes; codec CPU {:.3} s; process {} threads, {} fds",
            self.comms.load(Relaxed),
            self.data_streams.load(Relaxed),
            self.io_threads.load(Relaxed),
            self.io_workers.load(Relaxed),
            self.io_writers.load(Relaxed),
            self.codec_workers.load(Relaxed),
            self.staging_bytes.load(Relaxed) >> 10,
            self.pooled_bytes.load(Relaxed) >> 10,
            self.decode_tables.load(Relaxed) >> 10,
            self.gpu_lanes.load(Relaxed),
            self.codec_cpu_ns.load(Relaxed) as f64 / 1e9,
            process_threads().map_or("?".into(), |n| n.to_string()),
            open_fds().map_or("?".into(), |n| n.to_string()),
        )
    }
}

/// Threads of this process (`Threads:` in /proc/self/status).
pub fn process_threads() -> Option<u64> {
    proc_status_field("Threads:")
}

/// Resident memory of this process in KiB (`VmRSS:` in /proc/self/status).
pub fn process_rss_kib() -> Option<u64> {
    proc_status_field("VmRSS:")
}

fn proc_status_field(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// File descriptors this process has open (entries of /proc/self/fd, less the
/// one reading it).
pub fn open_fds() -> Option<u64> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(n.saturating_sub(1))
}

/// CPU time of the calling thread, nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// A clock's reading, nanoseconds (`None` when the clock cannot be read, such
/// as a thread's CPU clock after the thread ended).
pub fn clock_ns(clock: nix::time::ClockId) -> Option<u64> {
    nix::time::clock_gettime(clock)
        .ok()
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Adds the CPU time since `t0` (from [`thread_cpu_ns`]) to a comm's codec
/// counter and the plugin's.
pub fn add_codec_cpu(stats: &Stats, t0: u64) {
    let d = thread_cpu_ns().saturating_sub(t0);
    stats.codec_cpu_ns.fetch_add(d, Relaxed);
    HELD.codec_cpu_ns.fetch_add(d, Relaxed);
}

/// `n` bytes of staging memory held elsewhere (pinned or device-mapped), counted in
/// a comm's stats and in [`HELD`] for as long as this value lives.
pub struct Charge<'a> {
    n: u64,
    comm: &'a AtomicU64,
}

impl<'a> Charge<'a> {
    pub fn new(comm: &'a AtomicU64, n: u64) -> Self {
        comm.fetch_add(n, Relaxed);
        HELD.staging_bytes.fetch_add(n, Relaxed);
        Charge { n, comm }
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.comm.fetch_sub(self.n, Relaxed);
        HELD.staging_bytes.fetch_sub(self.n, Relaxed);
    }
}

/// `n` bytes of staging memory owned by the same object as `stats` (an IB comm's
/// registered buffers): counted in `stats` and, while this value lives, in [`HELD`].
pub struct OwnedCharge(u64);

impl OwnedCharge {
    pub fn new(stats: &Stats, n: u64) -> Self {
        stats.staging_bytes.fetch_add(n, Relaxed);
        HELD.staging_bytes.fetch_add(n, Relaxed);
        OwnedCharge(n)
    }
}

impl Drop for OwnedCharge {
    fn drop(&mut self) {
        HELD.staging_bytes.fetch_sub(self.0, Relaxed);
    }
}

/// A per-thread staging buffer whose size is counted in its comm's stats and in
/// [`HELD`]. It only grows to the largest chunk it has carried (bounded by the
/// comm's chunk size) and is given back when the I/O thread ends.
pub struct Staging<'a> {
    buf: Vec<u8>,
    comm: &'a AtomicU64,
}

impl<'a> Staging<'a> {
    pub fn new(comm: &'a AtomicU64) -> Self {
        Staging {
            buf: Vec::new(),
            comm,
        }
    }

    /// The first `n` bytes, growing the buffer if needed.
    pub fn get(&mut self, n: usize) -> &mut [u8] {
        if self.buf.len() < n {
            let grow = (n - self.buf.len()) as u64;
            self.buf.resize(n, 0);
            self.comm.fetch_add(grow, Relaxed);
            HELD.staging_bytes.fetch_add(grow, Relaxed);
        }
        &mut self.buf[..n]
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        let n = self.buf.len() as u64;
        self.comm.fetch_sub(n, Relaxed);
        HELD.staging_bytes.fetch_sub(n, Relaxed);
    }
}
