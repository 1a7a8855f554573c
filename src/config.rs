//! Configuration from the environment. Every variable is documented in README.md.
//!
//! Variables are read once, at `init`, so the hot path never touches the environment.

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
    /// `NCCL_ZIP_STATS=1`: periodic INFO lines with per-comm stats.
    pub stats: bool,
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
    /// Most process-wide TCP I/O workers (`NCCL_ZIP_IO_THREADS`; None: sized from
    /// the affinity mask and the local ranks, see `transport::tcp::workers`).
    pub io_threads: Option<usize>,
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
            ib_hca: None,
            ib_gid_index: None,
            compress: CompressMode::Auto,
            dtype: DtypeHint::Auto,
            nstreams: 4,
            max_chunk: 256 << 10,
            min_chunk: 32 << 10,
            inline_max: 64 << 10,
            handshake_timeout: Duration::from_secs(30),
            peer_timeout: Duration::from_secs(10),
            socket_ifname: None,
            socket_family: None,
            checksum: false,
            stats: false,
            link_mbps: None,
            gpu: false,
            gpu_emulate: crate::gpu::Emulation::Off,
            gpu_lanes: 16,
            io_threads: None,
        }
    }
}

/// Upper bounds that keep memory and thread counts sane whatever the user sets.
pub const MAX_STREAMS: usize = 16;
pub const MAX_CHUNK_LIMIT: usize = 4 << 20;
/// `NCCL_ZIP_IB_QPS` upper bound (the bootstrap accepts at most this many).
pub const MAX_IB_QPS: usize = 16;

impl Config {
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses from any key → value lookup (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Config::default();
        let bad = |k: &str, v: &str, want: &str| {
            Error::InvalidArgument(format!("{k}={v}: expected {want}"))
        };
        if let Some(v) = get("NCCL_ZIP_COMPRESS") {
            c.compress = match v.to_ascii_lowercase().as_str() {
                "auto" | "" => CompressMode::Auto,
                "on" | "1" | "true" => CompressMode::On,
                "off" | "0" | "false" => CompressMode::Off,
                _ => return Err(bad("NCCL_ZIP_COMPRESS", &v, "auto|on|off")),
            };
        }
        if let Some(v) = get("NCCL_ZIP_DTYPE").filter(|v| !v.is_empty()) {
            c.dtype = DtypeHint::parse(&v).ok_or_else(|| {
                bad(
                    "NCCL_ZIP_DTYPE",
                    &v,
                    "auto|bf16|fp16|fp32|fp8e4m3|fp8e5m2|raw",
                )
            })?;
        }
        let num = |k: &str, lo: usize, hi: usize| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => match parse_size(&v) {
                    Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                    _ => Err(bad(
                        k,
                        &v,
                        &format!("a number in {lo}..={hi} (K/M suffix allowed)"),
                    )),
                },
            }
        };
        if let Some(n) = num("NCCL_ZIP_NSTREAMS", 1, MAX_STREAMS)? {
            c.nstreams = n;
        }
        if let Some(n) = num("NCCL_ZIP_CHUNK_SIZE", 4096, MAX_CHUNK_LIMIT)? {
            c.max_chunk = n;
        }
        if let Some(n) = num("NCCL_ZIP_MIN_CHUNK", 512, MAX_CHUNK_LIMIT)? {
            c.min_chunk = n;
        }
        if let Some(n) = num("NCCL_ZIP_HANDSHAKE_TIMEOUT_MS", 10, 3_600_000)? {
            c.handshake_timeout = Duration::from_millis(n as u64);
        }
        if let Some(n) = num("NCCL_ZIP_PEER_TIMEOUT_MS", 1000, 3_600_000)? {
            c.peer_timeout = Duration::from_millis(n as u64);
        }
        if let Some(n) = num("NCCL_ZIP_LINK_MBPS", 1, 100_000_000)? {
            c.link_mbps = Some(n as u64);
        }
        if let Some(v) = get("NCCL_ZIP_TRANSPORT") {
            c.transport = match v.to_ascii_lowercase().as_str() {
                "auto" | "" => TransportChoice::Auto,
                "ib" => TransportChoice::Ib,
                "tcp" => TransportChoice::Tcp,
                _ => return Err(bad("NCCL_ZIP_TRANSPORT", &v, "auto|ib|tcp")),
            };
        }
        if let Some(n) = num("NCCL_ZIP_IB_QPS", 1, MAX_IB_QPS)? {
            c.ib_qps = n;
        }
        if let Some(n) = num("NCCL_ZIP_IB_STAGE_SLOTS", 1, 32)? {
            c.ib_stage_slots = n;
        }
        if let Some(n) = num("NCCL_ZIP_IB_STAGE_BYTES", 64 << 10, 64 << 20)? {
            c.ib_stage_bytes = n;
        }
        c.ib_hca = get("NCCL_IB_HCA").filter(|s| !s.is_empty());
        if let Some(v) = get("NCCL_IB_GID_INDEX").filter(|s| !s.is_empty()) {
            c.ib_gid_index = Some(
                v.trim()
                    .parse::<u8>()
                    .map_err(|_| bad("NCCL_IB_GID_INDEX", &v, "a number in 0..=255"))?,
            );
        }
        if let Some(n) = num("NCCL_ZIP_INLINE_MAX", 0, MAX_CHUNK_LIMIT)? {
            c.inline_max = n;
        }
        c.min_chunk = c.min_chunk.min(c.max_chunk);
        c.inline_max = c.inline_max.min(c.max_chunk);
        c.socket_ifname = get("NCCL_SOCKET_IFNAME").filter(|s| !s.is_empty());
        if let Some(v) = get("NCCL_SOCKET_FAMILY") {
            c.socket_family = match v.as_str() {
                "AF_INET" => Some(Family::V4),
                "AF_INET6" => Some(Family::V6),
                "" => None,
                _ => return Err(bad("NCCL_SOCKET_FAMILY", &v, "AF_INET|AF_INET6")),
            };
        }
        c.io_threads = num("NCCL_ZIP_IO_THREADS", 1, 256)?;
        if let Some(n) = num("NCCL_ZIP_GPU_LANES", 1, 256)? {
            c.gpu_lanes = n;
        }
        if let Some(v) = get("NCCL_ZIP_GPU") {
            c.gpu = match v.to_ascii_lowercase().as_str() {
                "auto" | "on" | "1" => true,
                "off" | "0" | "" => false,
                _ => return Err(bad("NCCL_ZIP_GPU", &v, "on|off")),
            };
        }
        if let Some(v) = get("NCCL_ZIP_GPU_EMULATE") {
            c.gpu_emulate = crate::gpu::Emulation::parse(&v)
                .ok_or_else(|| bad("NCCL_ZIP_GPU_EMULATE", &v, "0|1|nokernels"))?;
        }
        if c.gpu_emulate != crate::gpu::Emulation::Off {
            c.gpu = true;
        }
        let flag = |k: &str| {
            get(k)
                .map(|v| matches!(v.as_str(), "1" | "on" | "true" | "yes"))
                .unwrap_or(false)
        };
        c.checksum = flag("NCCL_ZIP_CHECKSUM");
        c.stats = flag("NCCL_ZIP_STATS");
        Ok(c)
    }
}

/// "4096", "64K", "1M" → bytes.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
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
        ] {
            let e = cfg(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }
}
