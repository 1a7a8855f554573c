//! Command line: hand-rolled (the binary may only use the library's dependencies).

use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
nccl-zip-perf: drives the built plugin (libnccl_net_zip.so) the way NCCL's proxy does.

USAGE:
  nccl-zip-perf recv     --handle-file F [options]   listen, publish the handle, accept, receive, verify
  nccl-zip-perf send     --handle-file F [options]   wait for the handle, connect, send
  nccl-zip-perf loop     [options]                   both sides in one thread (connect/accept interleaved)
  nccl-zip-perf stranger --handle-file F --mode garbage|silent|bad-secret [--hold-ms N]

Schedule (both sides must agree):
  --sizes A,B,...        message sizes, cycled over --count messages (K/M suffixes allowed)
  --size-range MIN:MAX   seeded log-uniform random sizes, including MIN and MAX and odd sizes
  --count N              messages (with --bench: timed messages per size)       [1000]
  --seed S                                                                          [1]
  --data random|zero|bf16|fp16|fp32   payload; float kinds are Gaussian values      [random]
  --sigma X              standard deviation of the Gaussian data                   [0.02]
Receiver:
  --recv-size N          capacity posted with each irecv                   [largest size]
  --no-verify            do not compare bytes (sizes are still checked)
Plugin driving:
  --mem host|cuda        memory the buffers live in and are registered as (regMr type) [host]
                         cuda: device memory on CUDA device 0, registered NCCL_PTR_CUDA; with
                         NCCL_ZIP_GPU_EMULATE=1|nokernels, host memory registered NCCL_PTR_CUDA
                         (the plugin's emulated device memory; no GPU needed)
  --plugin PATH          the .so to dlopen        [libnccl_net_zip.so beside this binary]
  --dev N                device index                                              [0]
  --inflight N           requests in flight, 1..32                                 [8]
  --poll-sleep-us N      sleep when a poll made no progress (0: yield)             [0]
Benchmark:
  --latency              loop role: one message in flight, isend to recv done, per size
                         (p50/p10/p99 us over --count); with --baseline tcp, one non-blocking
                         socket pair polled by the same thread (NCCL Socket without helper threads:
                         size, then payload); --baseline tcp-onewrite: both in one write and one read
  --bench                per-size throughput (GB/s, Gbit/s); sizes from --sizes
  --warmup N             untimed messages before each size                         [8]
  --baseline tcp         single-socket TCP (4-byte size + payload, TCP_NODELAY) instead of the plugin
  --bind IP              baseline receiver address        [first IPv4 of NCCL_SOCKET_IFNAME, else 127.0.0.1]
  --wire-iface IF        report /sys/class/net/IF/statistics bytes per size [NCCL_SOCKET_IFNAME if an interface]
Checks:
  --check-leaks          threads and fds after all closes must equal those before init
                         (the plugin's process-wide I/O workers, zip-io*, not counted)
  --expect-error remote|invalid-usage|invalid-argument|system|internal|any
                         succeed only if a call returns that error
  --trigger-file F       file holding the trigger time (unix ns); errors report the delay from it
  --timeout SECS         hard limit for the whole run                              [120]
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Recv,
    Send,
    Loop,
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
    /// `Some(None)`: any error; `Some(Some(code))`: that ncclResult_t value.
    pub expect_error: Option<Option<u32>>,
    pub trigger_file: Option<PathBuf>,
    pub timeout: Duration,
    pub mode: Option<StrangerMode>,
    pub hold: Duration,
}

/// "4096", "64K", "4M" → bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("bad size {s:?}"))
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

impl Opts {
    pub fn parse(args: &[String]) -> Result<Opts, String> {
        let role = match args.first().map(String::as_str) {
            Some("recv") => Role::Recv,
            Some("send") => Role::Send,
            Some("loop") => Role::Loop,
            Some("stranger") => Role::Stranger,
            Some(r) => return Err(format!("unknown role {r:?}")),
            None => return Err("missing role".into()),
        };
        let mut o = Opts {
            role,
            handle_file: None,
            plugin: None,
            sizes: None,
            size_range: None,
            count: 1000,
            seed: 1,
            data: DataKind::Random,
            data_file: None,
            sigma: 0.02,
            recv_size: None,
            verify: true,
            mem: MemKind::Host,
            dev: 0,
            inflight: 8,
            poll_sleep_us: 0,
            bench: false,
            latency: false,
            warmup: 8,
            baseline_tcp: false,
            one_write: false,
            bind: None,
            wire_iface: None,
            check_leaks: false,
            expect_error: None,
            trigger_file: None,
            timeout: Duration::from_secs(120),
            mode: None,
            hold: Duration::from_millis(500),
        };
        let mut it = args[1..].iter();
        while let Some(a) = it.next() {
            let mut val = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            let num = |v: String| {
                v.parse::<u64>()
                    .map_err(|_| format!("{a}: bad number {v:?}"))
            };
            match a.as_str() {
                "--handle-file" => o.handle_file = Some(val()?.into()),
                "--plugin" => o.plugin = Some(val()?.into()),
                "--sizes" => {
                    o.sizes = Some(
                        val()?
                            .split(',')
                            .map(parse_size)
                            .collect::<Result<Vec<_>, _>>()?,
                    )
                }
                "--size-range" => {
                    let v = val()?;
                    let (lo, hi) = v
                        .split_once(':')
                        .ok_or_else(|| format!("--size-range {v}: expected MIN:MAX"))?;
                    let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
                    if lo > hi {
                        return Err(format!("--size-range {v}: MIN > MAX"));
                    }
                    o.size_range = Some((lo, hi));
                }
                "--count" => o.count = num(val()?)? as usize,
                "--seed" => o.seed = num(val()?)?,
                "--data" => {
                    o.data = match val()?.as_str() {
                        "random" => DataKind::Random,
                        "zero" => DataKind::Zero,
                        "bf16" => DataKind::Bf16,
                        "fp16" => DataKind::Fp16,
                        "fp32" => DataKind::Fp32,
                        d if d.starts_with("file:") => {
                            o.data_file = Some(d["file:".len()..].into());
                            DataKind::File
                        }
                        d => {
                            return Err(format!(
                                "--data {d}: expected random|zero|bf16|fp16|fp32|file:PATH"
                            ))
                        }
                    }
                }
                "--sigma" => {
                    let v = val()?;
                    o.sigma = v
                        .parse()
                        .ok()
                        .filter(|s: &f64| *s > 0.0 && s.is_finite())
                        .ok_or_else(|| format!("--sigma {v}: expected a positive number"))?
                }
                "--recv-size" => o.recv_size = Some(parse_size(&val()?)?),
                "--no-verify" => o.verify = false,
                "--mem" => {
                    o.mem = match val()?.as_str() {
                        "host" => MemKind::Host,
                        "cuda" => MemKind::Cuda,
                        m => return Err(format!("--mem {m}: expected host|cuda")),
                    }
                }
                "--dev" => o.dev = num(val()?)? as i32,
                "--inflight" => o.inflight = num(val()?)? as usize,
                "--poll-sleep-us" => o.poll_sleep_us = num(val()?)?,
                "--bench" => o.bench = true,
                "--latency" => o.latency = true,
                "--warmup" => o.warmup = num(val()?)? as usize,
                "--baseline" => match val()?.as_str() {
                    "tcp" => o.baseline_tcp = true,
                    "tcp-onewrite" => (o.baseline_tcp, o.one_write) = (true, true),
                    b => return Err(format!("--baseline {b}: expected tcp|tcp-onewrite")),
                },
                "--bind" => o.bind = Some(val()?),
                "--wire-iface" => o.wire_iface = Some(val()?),
                "--check-leaks" => o.check_leaks = true,
                "--expect-error" => o.expect_error = Some(error_code(&val()?)?),
                "--trigger-file" => o.trigger_file = Some(val()?.into()),
                "--timeout" => o.timeout = Duration::from_secs(num(val()?)?),
                "--mode" => {
                    o.mode = Some(match val()?.as_str() {
                        "garbage" => StrangerMode::Garbage,
                        "silent" => StrangerMode::Silent,
                        "bad-secret" => StrangerMode::BadSecret,
                        m => return Err(format!("--mode {m}: expected garbage|silent|bad-secret")),
                    })
                }
                "--hold-ms" => o.hold = Duration::from_millis(num(val()?)?),
                "-h" | "--help" => return Err(String::new()),
                _ => return Err(format!("unknown option {a:?}")),
            }
        }
        if !(1..=32).contains(&o.inflight) {
            return Err(format!("--inflight {}: must be 1..=32", o.inflight));
        }
        if o.role != Role::Loop && o.handle_file.is_none() {
            return Err("--handle-file is required for this role".into());
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
