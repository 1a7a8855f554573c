//! Command line (clap derive); `--help` lists every option with its default.

use clap::{Parser, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Recv,
    Send,
    Loop,
    /// Sends to and receives from another `bidir` process at once.
    Bidir,
    Stranger,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataKind {
    Random,
    Zero,
    Bf16,
    Fp16,
    Fp32,
    /// `file:PATH`: the bytes of a real tensor file (tiled to the needed length).
    File,
}

/// `--mem`: where the send and receive buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
    Cuda,
}

impl MemKind {
    pub fn name(self) -> &'static str {
        match self {
            MemKind::Host => "host",
            MemKind::Cuda => "cuda",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrangerMode {
    Garbage,
    Silent,
    BadSecret,
}

#[derive(Clone, Debug)]
pub struct Opts {
    pub role: Role,
    pub handle_file: Option<PathBuf>,
    /// `bidir`: where the peer publishes its handle.
    pub peer_handle_file: Option<PathBuf>,
    pub plugin: Option<PathBuf>,
    pub sizes: Option<Vec<usize>>,
    pub size_range: Option<(usize, usize)>,
    pub count: usize,
    pub seed: u64,
    pub data: DataKind,
    /// With `DataKind::File`.
    pub data_file: Option<std::path::PathBuf>,
    pub sigma: f64,
    pub recv_size: Option<usize>,
    pub verify: bool,
    pub mem: MemKind,
    pub dev: i32,
    pub inflight: usize,
    pub poll_sleep_us: u64,
    pub bench: bool,
    pub latency: bool,
    pub warmup: usize,
    pub baseline_tcp: bool,
    /// `--baseline tcp-onewrite` (latency only).
    pub one_write: bool,
    pub bind: Option<String>,
    pub wire_iface: Option<String>,
    pub check_leaks: bool,
    /// Exit right after the run, with comms open (a job that never destroys its
    /// communicators): tests the stats file's exit record.
    pub exit_without_close: bool,
    /// `Some(None)`: any error; `Some(Some(code))`: that ncclResult_t value.
    pub expect_error: Option<Option<u32>>,
    pub trigger_file: Option<PathBuf>,
    pub timeout: Duration,
    pub mode: Option<StrangerMode>,
    pub hold: Duration,
}

/// "4096", "64K", "4M", "1G", "256KiB" → bytes (binary multiples, `parse-size`).
pub fn parse_size(s: &str) -> Result<usize, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("bad size {s:?}"))
}

/// A plain number is seconds (the old form); otherwise `humantime` ("90s", "2m", "1m30s").
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(n) => Ok(Duration::from_secs(n)),
        Err(_) => humantime::parse_duration(s).map_err(|e| format!("bad duration {s:?}: {e}")),
    }
}

pub fn error_code(name: &str) -> Result<Option<u32>, String> {
    Ok(Some(match name {
        "any" => return Ok(None),
        "system" => 2,
        "internal" => 3,
        "invalid-argument" => 4,
        "invalid-usage" => 5,
        "remote" => 6,
        _ => return Err(format!("--expect-error {name}: unknown error name")),
    }))
}

/// What `--version` prints: the crate version and the commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NZC_GIT_COMMIT"),
    ")"
);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RoleArg {
    /// Listen, publish the handle, accept, receive, verify.
    Recv,
    /// Wait for the handle, connect, send.
    Send,
    /// Both sides in one thread (connect/accept interleaved).
    Loop,
    /// Both directions at once with another bidir process: publish this side's
    /// handle in --handle-file, connect to the one in --peer-handle-file, send to
    /// the peer while receiving from it (a 2-rank ring step); BENCH lines for both.
    Bidir,
    /// A hostile peer: connects with --mode garbage|silent|bad-secret.
    Stranger,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum MemArg {
    Host,
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BaselineArg {
    Tcp,
    TcpOnewrite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Garbage,
    Silent,
    BadSecret,
}

/// Drives the plugin (libnccl-net-zip.so) the way NCCL's proxy does.
#[derive(Parser, Debug)]
#[command(name = "nccl-zip-perf", version = VERSION, max_term_width = 100)]
struct Cli {
    /// recv|send need --handle-file; loop runs both sides in one thread.
    #[arg(value_enum)]
    role: RoleArg,
    #[arg(long, value_name = "F")]
    handle_file: Option<PathBuf>,
    /// bidir: where the peer publishes its handle.
    #[arg(long, value_name = "G")]
    peer_handle_file: Option<PathBuf>,

    // --- Schedule (both sides must agree)
    /// Message sizes, cycled over --count messages (K/M/G suffixes: binary).
    #[arg(long, value_name = "A,B,...", value_delimiter = ',', value_parser = parse_size, help_heading = "Schedule (both sides must agree)")]
    sizes: Option<Vec<usize>>,
    /// Seeded log-uniform random sizes, including MIN and MAX and odd sizes.
    #[arg(
        long,
        value_name = "MIN:MAX",
        help_heading = "Schedule (both sides must agree)"
    )]
    size_range: Option<String>,
    /// Messages (with --bench: timed messages per size).
    #[arg(
        long,
        default_value_t = 1000,
        help_heading = "Schedule (both sides must agree)"
    )]
    count: usize,
    #[arg(
        long,
        default_value_t = 1,
        help_heading = "Schedule (both sides must agree)"
    )]
    seed: u64,
    /// Payload: random|zero|bf16|fp16|fp32|file:PATH; float kinds are Gaussian values.
    #[arg(
        long,
        default_value = "random",
        help_heading = "Schedule (both sides must agree)"
    )]
    data: String,
    /// Standard deviation of the Gaussian data.
    #[arg(
        long,
        default_value_t = 0.02,
        help_heading = "Schedule (both sides must agree)"
    )]
    sigma: f64,

    // --- Receiver
    /// Capacity posted with each irecv [default: the largest size].
    #[arg(long, value_name = "N", value_parser = parse_size, help_heading = "Receiver")]
    recv_size: Option<usize>,
    /// Do not compare bytes (sizes are still checked).
    #[arg(long, help_heading = "Receiver")]
    no_verify: bool,

    // --- Plugin driving
    /// Memory the buffers live in and are registered as. cuda: device memory on CUDA
    /// device 0 (NCCL_PTR_CUDA); with NCCL_ZIP_GPU_EMULATE=1|nokernels, host memory
    /// registered NCCL_PTR_CUDA (no GPU needed).
    #[arg(
        long,
        value_enum,
        default_value = "host",
        help_heading = "Plugin driving"
    )]
    mem: MemArg,
    /// The .so to dlopen [default: ../lib/libnccl-net-zip.so from this binary, then
    /// libnccl-net-zip.so and libnccl_net_zip.so beside it].
    #[arg(long, value_name = "PATH", help_heading = "Plugin driving")]
    plugin: Option<PathBuf>,
    /// Device index.
    #[arg(long, default_value_t = 0, help_heading = "Plugin driving")]
    dev: i32,
    /// Requests in flight, 1..32.
    #[arg(long, default_value_t = 8, help_heading = "Plugin driving")]
    inflight: usize,
    /// Sleep when a poll made no progress (0: yield).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Plugin driving"
    )]
    poll_sleep_us: u64,

    // --- Benchmark
    /// Loop role: one message in flight, isend to recv done, per size (p50/p10/p99 us
    /// over --count); with --baseline tcp, one non-blocking socket pair polled by the
    /// same thread; --baseline tcp-onewrite: size and payload in one write and one read.
    #[arg(long, help_heading = "Benchmark")]
    latency: bool,
    /// Per-size throughput (GB/s, Gbit/s); sizes from --sizes.
    #[arg(long, help_heading = "Benchmark")]
    bench: bool,
    /// Untimed messages before each size.
    #[arg(long, default_value_t = 8, help_heading = "Benchmark")]
    warmup: usize,
    /// Single-socket TCP (4-byte size + payload, TCP_NODELAY) instead of the plugin.
    #[arg(long, value_enum, help_heading = "Benchmark")]
    baseline: Option<BaselineArg>,
    /// Baseline receiver address [default: first IPv4 of NCCL_SOCKET_IFNAME, else 127.0.0.1].
    #[arg(long, value_name = "IP", help_heading = "Benchmark")]
    bind: Option<String>,
    /// Report /sys/class/net/IF/statistics bytes per size [default: NCCL_SOCKET_IFNAME if an interface].
    #[arg(long, value_name = "IF", help_heading = "Benchmark")]
    wire_iface: Option<String>,

    // --- Checks
    /// Threads and fds after all closes must equal those before init (the plugin's
    /// process-wide I/O workers, zip-io*, their epoll/eventfd handles, and its codec
    /// workers, zip-codec*, not counted).
    #[arg(long, help_heading = "Checks")]
    check_leaks: bool,
    /// Exit right after the run without closing any comm (as a job that never
    /// destroys its communicators).
    #[arg(long, help_heading = "Checks")]
    exit_without_close: bool,
    /// Succeed only if a call returns that error: remote|invalid-usage|invalid-argument|system|internal|any.
    #[arg(long, value_name = "ERR", help_heading = "Checks")]
    expect_error: Option<String>,
    /// File holding the trigger time (unix ns); errors report the delay from it.
    #[arg(long, value_name = "F", help_heading = "Checks")]
    trigger_file: Option<PathBuf>,
    /// Hard limit for the whole run: seconds, or a duration such as 2m.
    #[arg(long, value_name = "SECS", default_value = "120", value_parser = parse_secs, help_heading = "Checks")]
    timeout: Duration,

    // --- Stranger
    #[arg(long, value_enum, help_heading = "Stranger")]
    mode: Option<ModeArg>,
    /// How long the stranger holds its connection, in ms.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 500,
        help_heading = "Stranger"
    )]
    hold_ms: u64,
}

impl Opts {
    /// Parses `args` (the program name first). `Err` is a usage error; `--help` and
    /// `--version` print and exit 0 here, as clap does.
    pub fn parse(args: &[String]) -> Result<Opts, String> {
        let c = match Cli::try_parse_from(args) {
            Ok(c) => c,
            Err(e) => e.exit(),
        };
        let size_range = match &c.size_range {
            None => None,
            Some(v) => {
                let (lo, hi) = v
                    .split_once(':')
                    .ok_or_else(|| format!("--size-range {v}: expected MIN:MAX"))?;
                let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
                if lo > hi {
                    return Err(format!("--size-range {v}: MIN > MAX"));
                }
                Some((lo, hi))
            }
        };
        let (data, data_file) = match c.data.as_str() {
            "random" => (DataKind::Random, None),
            "zero" => (DataKind::Zero, None),
            "bf16" => (DataKind::Bf16, None),
            "fp16" => (DataKind::Fp16, None),
            "fp32" => (DataKind::Fp32, None),
            d if d.starts_with("file:") => (DataKind::File, Some(d["file:".len()..].into())),
            d => {
                return Err(format!(
                    "--data {d}: expected random|zero|bf16|fp16|fp32|file:PATH"
                ))
            }
        };
        if !(c.sigma > 0.0 && c.sigma.is_finite()) {
            return Err(format!("--sigma {}: expected a positive number", c.sigma));
        }
        let o = Opts {
            role: match c.role {
                RoleArg::Recv => Role::Recv,
                RoleArg::Send => Role::Send,
                RoleArg::Loop => Role::Loop,
                RoleArg::Bidir => Role::Bidir,
                RoleArg::Stranger => Role::Stranger,
            },
            handle_file: c.handle_file,
            peer_handle_file: c.peer_handle_file,
            plugin: c.plugin,
            sizes: c.sizes,
            size_range,
            count: c.count,
            seed: c.seed,
            data,
            data_file,
            sigma: c.sigma,
            recv_size: c.recv_size,
            verify: !c.no_verify,
            mem: match c.mem {
                MemArg::Host => MemKind::Host,
                MemArg::Cuda => MemKind::Cuda,
            },
            dev: c.dev,
            inflight: c.inflight,
            poll_sleep_us: c.poll_sleep_us,
            bench: c.bench,
            latency: c.latency,
            warmup: c.warmup,
            baseline_tcp: c.baseline.is_some(),
            one_write: c.baseline == Some(BaselineArg::TcpOnewrite),
            bind: c.bind,
            wire_iface: c.wire_iface,
            check_leaks: c.check_leaks,
            exit_without_close: c.exit_without_close,
            expect_error: c.expect_error.as_deref().map(error_code).transpose()?,
            trigger_file: c.trigger_file,
            timeout: c.timeout,
            mode: c.mode.map(|m| match m {
                ModeArg::Garbage => StrangerMode::Garbage,
                ModeArg::Silent => StrangerMode::Silent,
                ModeArg::BadSecret => StrangerMode::BadSecret,
            }),
            hold: Duration::from_millis(c.hold_ms),
        };
        if !(1..=32).contains(&o.inflight) {
            return Err(format!("--inflight {}: must be 1..=32", o.inflight));
        }
        if o.role != Role::Loop && o.handle_file.is_none() {
            return Err("--handle-file is required for this role".into());
        }
        if (o.role == Role::Bidir) != o.peer_handle_file.is_some() {
            return Err("--peer-handle-file goes with the bidir role, which needs it".into());
        }
        if o.role == Role::Bidir && (o.baseline_tcp || o.latency) {
            return Err("bidir drives the plugin: it excludes --baseline and --latency".into());
        }
        if o.role == Role::Stranger && o.mode.is_none() {
            return Err("stranger needs --mode".into());
        }
        if o.sizes.is_some() && o.size_range.is_some() {
            return Err("--sizes and --size-range exclude each other".into());
        }
        if o.bench && (o.sizes.is_none() || o.warmup == 0) {
            return Err("--bench needs --sizes and --warmup of at least 1".into());
        }
        if o.latency && (o.role != Role::Loop || o.sizes.is_none() || o.bench || o.count == 0) {
            return Err("--latency needs the loop role, --sizes and a --count of at least 1, and excludes --bench".into());
        }
        if o.one_write && !o.latency {
            return Err("--baseline tcp-onewrite is for --latency".into());
        }
        if o.latency && o.mem != MemKind::Host {
            return Err("--latency measures host memory only".into());
        }
        if o.baseline_tcp && o.role == Role::Loop && !o.latency {
            return Err("--baseline tcp needs separate recv and send processes".into());
        }
        if o.baseline_tcp && o.mem != MemKind::Host {
            return Err("--baseline tcp moves host memory only: it excludes --mem cuda".into());
        }
        if let Some(s) = o.sizes.as_ref().into_iter().flatten().max() {
            if *s > 1 << 30 {
                return Err(format!("size {s}: NCCL's v8 API allows at most 1 GiB"));
            }
        }
        Ok(o)
    }
}
