//! Configuration from the environment. Every variable is documented in README.md.
//!
//! Variables are read once, at `init`, so the hot path never touches the environment.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};

/// `NCCL_ZIP_COMPRESS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompressMode {
    /// Compress when the adaptive policy predicts a gain (default).
    Auto,
    /// Always run the codec (it still falls back to raw per block when coding does not pay).
    On,
    /// Never compress: a plain multi-stream TCP transport.
    Off,
}

/// `NCCL_ZIP_DTYPE`: overrides the codec's dtype detection.
pub use nccl_zip_codec::DtypeHint;

/// `NCCL_ZIP_TRANSPORT`: which transport moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// InfiniBand/RoCE verbs when an active port is found, else TCP.
    Auto,
    /// Verbs only; no usable device is an init error.
    Ib,
    /// Multi-stream TCP only. The default until the verbs path has run on RDMA
    /// hardware: a training job must not be the first thing to exercise it.
    Tcp,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub transport: TransportChoice,
    /// RC queue pairs per IB connection (`NCCL_ZIP_IB_QPS`).
    pub ib_qps: usize,
    /// IB receive staging slots = credits (`NCCL_ZIP_IB_STAGE_SLOTS`).
    pub ib_stage_slots: usize,
    /// Bytes per IB staging slot (`NCCL_ZIP_IB_STAGE_BYTES`).
    pub ib_stage_bytes: usize,
    /// Cap in MiB on all comms' compression buffers together
    /// (`NCCL_ZIP_BUFFER_MB`; None: see `crate::budget`).
    pub buffer_mb: Option<u64>,
    /// `NCCL_IB_HCA` (NCCL's syntax).
    pub ib_hca: Option<String>,
    /// `NCCL_IB_GID_INDEX`.
    pub ib_gid_index: Option<u8>,
    pub compress: CompressMode,
    pub dtype: DtypeHint,
    /// TCP streams per comm (`NCCL_ZIP_NSTREAMS`).
    pub nstreams: usize,
    /// Largest piece of a message sent as one unit on one stream (`NCCL_ZIP_CHUNK_SIZE`).
    pub max_chunk: usize,
    /// Messages below this are never split (`NCCL_ZIP_MIN_CHUNK`).
    pub min_chunk: usize,
    /// Host messages up to this size that go raw are written and read by NCCL's
    /// thread on the inline stream (`NCCL_ZIP_INLINE_MAX`; 0: never). At most
    /// `max_chunk`.
    pub inline_max: usize,
    /// How long a half-open incoming connection may sit before it is dropped
    /// (`NCCL_ZIP_HANDSHAKE_TIMEOUT_MS`).
    pub handshake_timeout: Duration,
    /// Dead-peer detection: TCP keepalive and `TCP_USER_TIMEOUT` (`NCCL_ZIP_PEER_TIMEOUT_MS`).
    pub peer_timeout: Duration,
    /// Interface selection (`NCCL_SOCKET_IFNAME`, NCCL's own syntax).
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY=AF_INET|AF_INET6`.
    pub socket_family: Option<Family>,
    /// Add a CRC32C to every compressed frame (`NCCL_ZIP_CHECKSUM`).
    pub checksum: bool,
    /// The highest codec frame format this process writes (`NCCL_ZIP_FORMAT`,
    /// docs/FORMAT.md): a send comm writes the lower of this and what its
    /// receiver decodes (`codec_glue::agree_format`).
    pub format: u8,
    /// The version-2 encoder's effort (`NCCL_ZIP_EFFORT=full|fast`, docs/FORMAT.md
    /// §V2.11); version 1 ignores it.
    pub effort: nccl_zip_codec::Effort,
    /// `NCCL_ZIP_STATS=1`: periodic INFO lines with per-comm stats.
    pub stats: bool,
    /// `NCCL_ZIP_STATS_FILE`: JSON lines of the process's and each peer's
    /// counters (`%h` host name, `%p` pid), see `stats::export`.
    pub stats_file: Option<String>,
    /// `NCCL_ZIP_STATS_INTERVAL_MS`: how often the stats file gets a record
    /// (0: only at exit).
    pub stats_interval: Duration,
    /// `NCCL_ZIP_STATS_PER_COMM=1`: per-comm records in the stats file too.
    pub stats_per_comm: bool,
    /// The link speed the cost model assumes (`NCCL_ZIP_LINK_MBPS`); by default the
    /// device's speed from /sys. Set it when the real bottleneck is elsewhere
    /// (a shaped or shared link).
    pub link_mbps: Option<u64>,
    /// `NCCL_ZIP_GPU=on|off`: offer `NCCL_PTR_CUDA` (GPU buffers, compressed by
    /// the GPU kernels) when a CUDA device is present. Off by default until the
    /// device path has been validated on a GPU (as TCP stays the default transport
    /// until verbs have run on RDMA hardware); `NCCL_ZIP_GPU_EMULATE` implies on.
    pub gpu: bool,
    /// `NCCL_ZIP_GPU_EMULATE=1|nokernels`: testing without a GPU.
    pub gpu_emulate: crate::gpu::Emulation,
    /// GPU lanes per device and direction, shared by all comms (`NCCL_ZIP_GPU_LANES`).
    pub gpu_lanes: usize,
    /// Most SMs one GPU codec launch may use (`NCCL_ZIP_GPU_SMS`).
    pub gpu_sms: u32,
    /// Largest block (log2 bytes) the GPU decoder takes (`NCCL_ZIP_GPU_DECODE_BLOCK_LOG2`).
    pub gpu_decode_block_log2: u32,
    /// Kernels read and write pinned staging directly (`NCCL_ZIP_GPU_ZEROCOPY`).
    pub gpu_zerocopy: bool,
    /// Compile the kernels with NVRTC instead of loading the fatbin (`NCCL_ZIP_GPU_FORCE_NVRTC`).
    pub gpu_force_nvrtc: bool,
    /// `NCCL_ZIP_GPU_KERNELS=on|off` (default on): with GPU buffers, compress with the
    /// GPU kernels, or copy each chunk to host and run the CPU codec (no kernel
    /// launched from the plugin's threads).
    pub gpu_kernels: bool,
    /// How long a GPU lane's stream may take to drain before the lane and its comm
    /// fail (`NCCL_ZIP_GPU_TIMEOUT_MS`; default 60 s).
    pub gpu_timeout_ms: Option<u64>,
    /// NCCL's `NCCL_DMABUF_ENABLE` (default 1): whether NCCL itself registers GPU
    /// buffers through DMA-BUF.
    pub nccl_dmabuf_enable: bool,
    /// Most process-wide TCP I/O workers (`NCCL_ZIP_IO_THREADS`; None: sized from
    /// the affinity mask and the local ranks, see `transport::tcp::workers`).
    pub io_threads: Option<usize>,
    /// Most process-wide codec workers, which compress and decompress TCP chunks
    /// (`NCCL_ZIP_CODEC_THREADS`; None: sized from the affinity mask and the
    /// local ranks, see `transport::tcp::codec_workers`).
    pub codec_threads: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            transport: TransportChoice::Tcp,
            ib_qps: 2,
            ib_stage_slots: 8,
            ib_stage_bytes: 512 << 10,
            buffer_mb: None,
            ib_hca: None,
            ib_gid_index: None,
            compress: CompressMode::Auto,
            dtype: DtypeHint::Auto,
            nstreams: DEFAULT_NSTREAMS,
            max_chunk: 256 << 10,
            min_chunk: 32 << 10,
            inline_max: 64 << 10,
            handshake_timeout: Duration::from_secs(30),
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            socket_ifname: None,
            socket_family: None,
            checksum: false,
            format: 1,
            effort: nccl_zip_codec::Effort::Full,
            stats: false,
            link_mbps: None,
            gpu: false,
            gpu_emulate: crate::gpu::Emulation::Off,
            gpu_lanes: 16,
            gpu_sms: 16,
            gpu_decode_block_log2: 16,
            gpu_zerocopy: false,
            gpu_timeout_ms: None,
            gpu_kernels: true,
            gpu_force_nvrtc: false,
            nccl_dmabuf_enable: true,
            io_threads: None,
            codec_threads: None,
            stats_file: None,
            stats_interval: Duration::from_secs(10),
            stats_per_comm: false,
        }
    }
}

/// `NCCL_ZIP_PEER_TIMEOUT_MS` default. A dead peer must be told from a fabric
/// hiccup: NCCL's IB transport retries a stalled link for about 30 s
/// (`NCCL_IB_TIMEOUT` 20 × `NCCL_IB_RETRY_CNT` 7) and its Socket transport has no
/// keepalive at all, while PyTorch's watchdog waits 10 minutes by default. Two
/// minutes rides out anything IB itself survives and still fails the job with
/// our error (naming the peer) long before the watchdog kills it.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(120);

/// Upper bounds that keep memory and thread counts sane whatever the user sets.
pub const MAX_STREAMS: usize = 16;
/// TCP data streams per comm unless `NCCL_ZIP_NSTREAMS` says otherwise.
pub const DEFAULT_NSTREAMS: usize = 4;
pub const MAX_CHUNK_LIMIT: usize = 4 << 20;
/// `NCCL_ZIP_IB_QPS` upper bound (the bootstrap accepts at most this many).
pub const MAX_IB_QPS: usize = 16;

impl Config {
    /// Parses the process environment. Called once, by `init`.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses from any key → value lookup (tests pass a map). Every variable the
    /// plugin honours is read here and nowhere else; the first bad value is an
    /// error naming the variable, the value and what was expected. An empty value
    /// means "unset", as in NCCL.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut c = Config::default();
        let bad = |k: &str, v: &str, want: &str| {
            Error::InvalidArgument(format!("{k}={v}: expected {want}"))
        };
        if let Some(v) = get("NCCL_ZIP_COMPRESS") {
            c.compress = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => CompressMode::Auto,
                s => match parse_bool(s) {
                    Some(true) => CompressMode::On,
                    Some(false) => CompressMode::Off,
                    None => return Err(bad("NCCL_ZIP_COMPRESS", &v, "auto|on|off")),
                },
            };
        }
        if let Some(v) = get("NCCL_ZIP_DTYPE") {
            c.dtype = DtypeHint::parse(v.trim()).ok_or_else(|| {
                bad(
                    "NCCL_ZIP_DTYPE",
                    &v,
                    "auto|bf16|fp16|fp32|fp8e4m3|fp8e5m2|raw",
                )
            })?;
        }
        // A byte count: a number with an optional K/M/G suffix (powers of 2).
        let size = |k: &str, lo: usize, hi: usize| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => match parse_size(&v) {
                    Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(bad(
                        k,
                        &v,
                        &format!("a byte count in {lo}..={hi} (K/M suffix allowed)"),
                    )),
                },
            }
        };
        // A plain count or duration: digits only, no suffix.
        let int = |k: &str, lo: u64, hi: u64, what: &str| -> Result<Option<u64>> {
            match get(k) {
                None => Ok(None),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(bad(k, &v, &format!("{what} in {lo}..={hi}, digits only"))),
                },
            }
        };
        let boolean = |k: &str| -> Result<Option<bool>> {
            match get(k) {
                None => Ok(None),
                Some(v) => parse_bool(&v)
                    .map(Some)
                    .ok_or_else(|| bad(k, &v, "1|0|true|false|yes|no|on|off")),
            }
        };
        if let Some(n) = int("NCCL_ZIP_NSTREAMS", 1, MAX_STREAMS as u64, "a number")? {
            c.nstreams = n as usize;
        }
        if let Some(n) = size("NCCL_ZIP_CHUNK_SIZE", 4096, MAX_CHUNK_LIMIT)? {
            c.max_chunk = n;
        }
        if let Some(n) = size("NCCL_ZIP_MIN_CHUNK", 512, MAX_CHUNK_LIMIT)? {
            c.min_chunk = n;
        }
        if let Some(n) = int(
            "NCCL_ZIP_HANDSHAKE_TIMEOUT_MS",
            10,
            3_600_000,
            "milliseconds",
        )? {
            c.handshake_timeout = Duration::from_millis(n);
        }
        if let Some(n) = int("NCCL_ZIP_PEER_TIMEOUT_MS", 1000, 3_600_000, "milliseconds")? {
            c.peer_timeout = Duration::from_millis(n);
        }
        if let Some(n) = int("NCCL_ZIP_LINK_MBPS", 1, 100_000_000, "Mbit/s")? {
            c.link_mbps = Some(n);
        }
        if let Some(v) = get("NCCL_ZIP_TRANSPORT") {
            c.transport = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => TransportChoice::Auto,
                "ib" => TransportChoice::Ib,
                "tcp" => TransportChoice::Tcp,
                _ => return Err(bad("NCCL_ZIP_TRANSPORT", &v, "auto|ib|tcp")),
            };
        }
        if let Some(n) = int("NCCL_ZIP_IB_QPS", 1, MAX_IB_QPS as u64, "a number")? {
            c.ib_qps = n as usize;
        }
        if let Some(n) = int("NCCL_ZIP_IB_STAGE_SLOTS", 1, 32, "a number")? {
            c.ib_stage_slots = n as usize;
        }
        if let Some(n) = size("NCCL_ZIP_IB_STAGE_BYTES", 64 << 10, 64 << 20)? {
            c.ib_stage_bytes = n;
        }
        if let Some(n) = int("NCCL_ZIP_BUFFER_MB", 0, 1 << 20, "MiB")? {
            c.buffer_mb = Some(n);
        }
        c.ib_hca = get("NCCL_IB_HCA");
        if let Some(v) = get("NCCL_IB_GID_INDEX") {
            // NCCL's own default is -1: "choose" (as unset).
            c.ib_gid_index = match v.trim().parse::<i64>() {
                Ok(-1) => None,
                Ok(n) if (0..=255).contains(&n) => Some(n as u8),
                _ => {
                    return Err(bad(
                        "NCCL_IB_GID_INDEX",
                        &v,
                        "-1 (choose) or a GID index in 0..=255",
                    ))
                }
            };
        }
        if let Some(n) = size("NCCL_ZIP_INLINE_MAX", 0, MAX_CHUNK_LIMIT)? {
            c.inline_max = n;
        }
        c.min_chunk = c.min_chunk.min(c.max_chunk);
        c.inline_max = c.inline_max.min(c.max_chunk);
        c.socket_ifname = get("NCCL_SOCKET_IFNAME");
        if let Some(v) = get("NCCL_SOCKET_FAMILY") {
            c.socket_family = match v.trim() {
                "AF_INET" => Some(Family::V4),
                "AF_INET6" => Some(Family::V6),
                _ => return Err(bad("NCCL_SOCKET_FAMILY", &v, "AF_INET|AF_INET6")),
            };
        }
        c.io_threads = int("NCCL_ZIP_IO_THREADS", 1, 256, "a number")?.map(|n| n as usize);
        c.codec_threads = int("NCCL_ZIP_CODEC_THREADS", 1, 256, "a number")?.map(|n| n as usize);
        if let Some(n) = int("NCCL_ZIP_GPU_LANES", 1, 256, "a number")? {
            c.gpu_lanes = n as usize;
        }
        if let Some(v) = get("NCCL_ZIP_GPU") {
            // `auto` is `on`: CUDA is offered only where a device is present anyway.
            c.gpu = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => true,
                s => parse_bool(s).ok_or_else(|| bad("NCCL_ZIP_GPU", &v, "on|off|auto"))?,
            };
        }
        if let Some(v) = get("NCCL_ZIP_GPU_EMULATE") {
            c.gpu_emulate = crate::gpu::Emulation::parse(v.trim())
                .ok_or_else(|| bad("NCCL_ZIP_GPU_EMULATE", &v, "0|1|nokernels"))?;
        }
        if c.gpu_emulate != crate::gpu::Emulation::Off {
            c.gpu = true;
        }
        if let Some(n) = int("NCCL_ZIP_GPU_SMS", 1, 4096, "a number of SMs")? {
            c.gpu_sms = n as u32;
        }
        if let Some(n) = int(
            "NCCL_ZIP_GPU_DECODE_BLOCK_LOG2",
            12,
            20,
            "log2 of a block size",
        )? {
            c.gpu_decode_block_log2 = n as u32;
        }
        if let Some(b) = boolean("NCCL_ZIP_GPU_ZEROCOPY")? {
            c.gpu_zerocopy = b;
        }
        if let Some(b) = boolean("NCCL_ZIP_GPU_FORCE_NVRTC")? {
            c.gpu_force_nvrtc = b;
        }
        if let Some(b) = boolean("NCCL_ZIP_GPU_KERNELS")? {
            c.gpu_kernels = b;
        }
        c.gpu_timeout_ms = int("NCCL_ZIP_GPU_TIMEOUT_MS", 100, 3_600_000, "milliseconds")?;
        if let Some(n) = int(
            "NCCL_ZIP_FORMAT",
            1,
            crate::codec::format::VERSION_2 as u64,
            "a codec frame format",
        )? {
            c.format = n as u8;
        }
        if let Some(v) = get("NCCL_ZIP_EFFORT") {
            c.effort = nccl_zip_codec::Effort::parse(v.trim())
                .ok_or_else(|| bad("NCCL_ZIP_EFFORT", &v, "full|fast"))?;
        }
        if let Some(b) = boolean("NCCL_ZIP_CHECKSUM")? {
            c.checksum = b;
        }
        if let Some(b) = boolean("NCCL_ZIP_STATS")? {
            c.stats = b;
        }
        if let Some(v) = get("NCCL_ZIP_STATS_FILE") {
            let v = v.trim().to_string();
            if !v.is_empty() {
                c.stats_file = Some(v);
            }
        }
        if let Some(n) = int("NCCL_ZIP_STATS_INTERVAL_MS", 0, 86_400_000, "milliseconds")? {
            c.stats_interval = Duration::from_millis(n);
        }
        if let Some(b) = boolean("NCCL_ZIP_STATS_PER_COMM")? {
            c.stats_per_comm = b;
        }
        // NCCL's own variable, read exactly as NCCL reads it (never an error).
        c.nccl_dmabuf_enable =
            crate::transport::ib::dmabuf::nccl_dmabuf_enable(get("NCCL_DMABUF_ENABLE").as_deref());
        Ok(c)
    }

    /// Every setting that differs from its default, as `NAME=value`, for the
    /// banner `init` logs.
    pub fn non_defaults(&self) -> Vec<String> {
        let d = Config::default();
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}={a}"));
            }
        };
        macro_rules! field {
            ($name:literal, $f:ident) => {
                cmp($name, format!("{:?}", self.$f), format!("{:?}", d.$f))
            };
        }
        field!("NCCL_ZIP_TRANSPORT", transport);
        field!("NCCL_ZIP_IB_QPS", ib_qps);
        field!("NCCL_ZIP_IB_STAGE_SLOTS", ib_stage_slots);
        field!("NCCL_ZIP_IB_STAGE_BYTES", ib_stage_bytes);
        field!("NCCL_ZIP_BUFFER_MB", buffer_mb);
        field!("NCCL_IB_HCA", ib_hca);
        field!("NCCL_IB_GID_INDEX", ib_gid_index);
        field!("NCCL_ZIP_COMPRESS", compress);
        field!("NCCL_ZIP_DTYPE", dtype);
        field!("NCCL_ZIP_NSTREAMS", nstreams);
        field!("NCCL_ZIP_CHUNK_SIZE", max_chunk);
        field!("NCCL_ZIP_MIN_CHUNK", min_chunk);
        field!("NCCL_ZIP_INLINE_MAX", inline_max);
        field!("NCCL_ZIP_HANDSHAKE_TIMEOUT_MS", handshake_timeout);
        field!("NCCL_ZIP_PEER_TIMEOUT_MS", peer_timeout);
        field!("NCCL_SOCKET_IFNAME", socket_ifname);
        field!("NCCL_SOCKET_FAMILY", socket_family);
        field!("NCCL_ZIP_CHECKSUM", checksum);
        field!("NCCL_ZIP_FORMAT", format);
        field!("NCCL_ZIP_EFFORT", effort);
        field!("NCCL_ZIP_STATS", stats);
        field!("NCCL_ZIP_STATS_FILE", stats_file);
        field!("NCCL_ZIP_STATS_INTERVAL_MS", stats_interval);
        field!("NCCL_ZIP_STATS_PER_COMM", stats_per_comm);
        field!("NCCL_ZIP_LINK_MBPS", link_mbps);
        field!("NCCL_ZIP_GPU", gpu);
        field!("NCCL_ZIP_GPU_EMULATE", gpu_emulate);
        field!("NCCL_ZIP_GPU_LANES", gpu_lanes);
        field!("NCCL_ZIP_GPU_SMS", gpu_sms);
        field!("NCCL_ZIP_GPU_DECODE_BLOCK_LOG2", gpu_decode_block_log2);
        field!("NCCL_ZIP_GPU_ZEROCOPY", gpu_zerocopy);
        field!("NCCL_ZIP_GPU_TIMEOUT_MS", gpu_timeout_ms);
        field!("NCCL_ZIP_GPU_KERNELS", gpu_kernels);
        field!("NCCL_ZIP_GPU_FORCE_NVRTC", gpu_force_nvrtc);
        field!("NCCL_DMABUF_ENABLE", nccl_dmabuf_enable);
        field!("NCCL_ZIP_IO_THREADS", io_threads);
        field!("NCCL_ZIP_CODEC_THREADS", codec_threads);
        out
    }
}

static CURRENT: OnceLock<Arc<Config>> = OnceLock::new();

/// The configuration `init` parsed. Code that runs without `init` (tools, tests
/// that use the library directly) gets the environment parsed on first use, with
/// defaults if a value is bad (the plugin itself never gets there: `init`
/// installs its configuration first).
pub fn current() -> Arc<Config> {
    CURRENT
        .get_or_init(|| Arc::new(Config::from_env().unwrap_or_default()))
        .clone()
}

/// Makes `cfg` what [`current`] returns, unless something already read it.
pub fn install(cfg: Arc<Config>) {
    let _ = CURRENT.set(cfg);
}

/// NCCL's `NCCL_DEBUG`, as the most detailed level worth formatting (NCCL's
/// logger filters again). Read when the log bridge is installed, before the
/// rest of the configuration, so that configuration errors can be logged.
pub fn nccl_debug_level() -> tracing::Level {
    match std::env::var("NCCL_DEBUG")
        .unwrap_or_default()
        .trim()
        .to_ascii_uppercase()
        .as_str()
    {
        "TRACE" => tracing::Level::TRACE,
        "INFO" => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    }
}

/// `1|0|true|false|yes|no|on|off`, any case.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// "4096", "64K", "1M", "1G" → bytes.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_and_overrides() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.compress, CompressMode::Auto);
        assert_eq!(c.nstreams, 4);
        let c = cfg(&[
            ("NCCL_ZIP_COMPRESS", "off"),
            ("NCCL_ZIP_NSTREAMS", "8"),
            ("NCCL_ZIP_CHUNK_SIZE", "1M"),
        ])
        .unwrap();
        assert_eq!(c.compress, CompressMode::Off);
        assert_eq!(c.nstreams, 8);
        assert_eq!(c.max_chunk, 1 << 20);
        assert_eq!(
            cfg(&[("NCCL_ZIP_DTYPE", "BF16")]).unwrap().dtype,
            DtypeHint::Bf16
        );
        assert_eq!(cfg(&[]).unwrap().transport, TransportChoice::Tcp);
        assert!(!cfg(&[]).unwrap().gpu, "GPU buffers stay off by default");
        assert!(cfg(&[("NCCL_ZIP_GPU", "on")]).unwrap().gpu);
        assert!(cfg(&[("NCCL_ZIP_GPU_EMULATE", "1")]).unwrap().gpu);
        assert_eq!(
            cfg(&[("NCCL_ZIP_GPU_TIMEOUT_MS", "5000")])
                .unwrap()
                .gpu_timeout_ms,
            Some(5000)
        );
        assert!(!cfg(&[("NCCL_ZIP_GPU_KERNELS", "off")]).unwrap().gpu_kernels);
        assert!(cfg(&[]).unwrap().gpu_kernels);
        assert_eq!(
            cfg(&[("NCCL_ZIP_TRANSPORT", "auto")]).unwrap().transport,
            TransportChoice::Auto
        );
        let c = cfg(&[
            ("NCCL_ZIP_TRANSPORT", "IB"),
            ("NCCL_ZIP_IB_QPS", "4"),
            ("NCCL_ZIP_IB_STAGE_BYTES", "1M"),
            ("NCCL_IB_GID_INDEX", "3"),
        ])
        .unwrap();
        assert_eq!(c.transport, TransportChoice::Ib);
        assert_eq!(
            (c.ib_qps, c.ib_stage_bytes, c.ib_gid_index),
            (4, 1 << 20, Some(3))
        );
        assert_eq!(
            cfg(&[("NCCL_ZIP_TRANSPORT", "tcp")]).unwrap().transport,
            TransportChoice::Tcp
        );
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("NCCL_ZIP_COMPRESS", "maybe"),
            ("NCCL_ZIP_NSTREAMS", "0"),
            ("NCCL_ZIP_NSTREAMS", "99"),
            ("NCCL_ZIP_CHUNK_SIZE", "x"),
            ("NCCL_ZIP_TRANSPORT", "rdma"),
            ("NCCL_ZIP_IB_QPS", "0"),
            ("NCCL_ZIP_IB_QPS", "17"),
            ("NCCL_ZIP_IB_STAGE_SLOTS", "33"),
            ("NCCL_ZIP_IB_STAGE_BYTES", "1K"),
            ("NCCL_ZIP_GPU", "maybe"),
            ("NCCL_ZIP_GPU_EMULATE", "2"),
            ("NCCL_ZIP_GPU_LANES", "0"),
            ("NCCL_ZIP_NSTREAMS", "999"),
            ("NCCL_ZIP_NSTREAMS", "4K"),
            ("NCCL_ZIP_HANDSHAKE_TIMEOUT_MS", "30K"),
            ("NCCL_ZIP_PEER_TIMEOUT_MS", "1M"),
            ("NCCL_ZIP_CHECKSUM", "2"),
            ("NCCL_ZIP_FORMAT", "0"),
            ("NCCL_ZIP_FORMAT", "3"),
            ("NCCL_ZIP_FORMAT", "v2"),
            ("NCCL_ZIP_EFFORT", "max"),
            ("NCCL_ZIP_STATS", "maybe"),
            ("NCCL_ZIP_STATS_INTERVAL_MS", "5s"),
            ("NCCL_ZIP_STATS_PER_COMM", "sometimes"),
            ("NCCL_ZIP_GPU_SMS", "x"),
            ("NCCL_ZIP_GPU_DECODE_BLOCK_LOG2", "24"),
            ("NCCL_ZIP_GPU_ZEROCOPY", "y"),
            ("NCCL_ZIP_GPU_FORCE_NVRTC", "2"),
            ("NCCL_ZIP_GPU_TIMEOUT_MS", "10"),
            ("NCCL_ZIP_GPU_KERNELS", "maybe"),
            ("NCCL_ZIP_GPU_TIMEOUT_MS", "5s"),
            ("NCCL_IB_GID_INDEX", "-2"),
            ("NCCL_IB_GID_INDEX", "256"),
            ("NCCL_ZIP_CHUNK_SIZE", "-4K"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }

    #[test]
    fn booleans_take_the_usual_spellings() {
        for (v, want) in [
            ("1", true),
            ("true", true),
            ("YES", true),
            ("On", true),
            ("0", false),
            ("false", false),
            ("no", false),
            ("OFF", false),
        ] {
            let c = cfg(&[
                ("NCCL_ZIP_CHECKSUM", v),
                ("NCCL_ZIP_STATS", v),
                ("NCCL_ZIP_GPU_ZEROCOPY", v),
                ("NCCL_ZIP_GPU_FORCE_NVRTC", v),
            ])
            .unwrap();
            assert_eq!(
                (c.checksum, c.stats, c.gpu_zerocopy, c.gpu_force_nvrtc),
                (want, want, want, want),
                "{v}"
            );
        }
        assert_eq!(
            cfg(&[("NCCL_ZIP_COMPRESS", "yes")]).unwrap().compress,
            CompressMode::On
        );
        assert!(cfg(&[("NCCL_ZIP_GPU", "auto")]).unwrap().gpu);
        assert!(!cfg(&[("NCCL_ZIP_GPU", "no")]).unwrap().gpu);
    }

    #[test]
    fn nccl_defaults_and_empty_values_mean_unset() {
        // NCCL's own default for the GID index is -1: choose.
        assert_eq!(
            cfg(&[("NCCL_IB_GID_INDEX", "-1")]).unwrap().ib_gid_index,
            None
        );
        assert_eq!(
            cfg(&[("NCCL_IB_GID_INDEX", "0")]).unwrap().ib_gid_index,
            Some(0)
        );
        let c = cfg(&[("NCCL_ZIP_NSTREAMS", ""), ("NCCL_ZIP_CHECKSUM", " ")]).unwrap();
        assert_eq!((c.nstreams, c.checksum), (4, false));
        assert!(
            !cfg(&[("NCCL_DMABUF_ENABLE", "0")])
                .unwrap()
                .nccl_dmabuf_enable
        );
    }

    #[test]
    fn durations_are_plain_milliseconds_and_gpu_knobs_parse() {
        let c = cfg(&[
            ("NCCL_ZIP_HANDSHAKE_TIMEOUT_MS", "1500"),
            ("NCCL_ZIP_PEER_TIMEOUT_MS", "60000"),
            ("NCCL_ZIP_GPU_SMS", "8"),
            ("NCCL_ZIP_GPU_DECODE_BLOCK_LOG2", "14"),
        ])
        .unwrap();
        assert_eq!(c.handshake_timeout, Duration::from_millis(1500));
        assert_eq!(c.peer_timeout, Duration::from_secs(60));
        assert_eq!((c.gpu_sms, c.gpu_decode_block_log2), (8, 14));
        assert_eq!(cfg(&[]).unwrap().format, 1);
        assert_eq!(cfg(&[("NCCL_ZIP_FORMAT", "2")]).unwrap().format, 2);
        assert_eq!(cfg(&[]).unwrap().effort, nccl_zip_codec::Effort::Full);
        assert_eq!(
            cfg(&[("NCCL_ZIP_EFFORT", "Fast")]).unwrap().effort,
            nccl_zip_codec::Effort::Fast
        );
        assert_eq!(cfg(&[]).unwrap().peer_timeout, DEFAULT_PEER_TIMEOUT);
    }

    #[test]
    fn non_defaults_list_exactly_what_differs() {
        assert!(cfg(&[]).unwrap().non_defaults().is_empty());
        let c = cfg(&[
            ("NCCL_ZIP_NSTREAMS", "4"),
            ("NCCL_ZIP_CHECKSUM", "1"),
            ("NCCL_ZIP_COMPRESS", "off"),
        ])
        .unwrap();
        assert_eq!(
            c.non_defaults(),
            vec!["NCCL_ZIP_COMPRESS=Off", "NCCL_ZIP_CHECKSUM=true"]
        );
    }
}
