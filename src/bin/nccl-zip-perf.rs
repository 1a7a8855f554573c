//! nccl-zip-perf: loads the built plugin exactly as NCCL does and drives it like
//! NCCL's proxy thread, as two processes (or one, `loop`). It checks every
//! delivered byte, the sizes `test()` reports, error codes on failure paths, and
//! that closing leaves no thread or fd behind; with `--bench` it measures
//! throughput per message size, and `--baseline tcp` measures a plain
//! single-socket TCP transfer of the same schedule. `--mem cuda` puts the buffers in
//! GPU memory (or, under `NCCL_ZIP_GPU_EMULATE`, the plugin's emulated device
//! memory) and registers them `NCCL_PTR_CUDA` (mem.rs). Run with `--help`.

#[path = "nccl-zip-perf/bench.rs"]
mod bench;
#[path = "nccl-zip-perf/cli.rs"]
mod cli;
#[path = "nccl-zip-perf/data.rs"]
mod data;
#[path = "nccl-zip-perf/latency.rs"]
mod latency;
#[path = "nccl-zip-perf/mem.rs"]
mod mem;
#[path = "nccl-zip-perf/net.rs"]
mod net;
#[path = "nccl-zip-perf/pipe.rs"]
mod pipe;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench::BenchClock;
use cli::{MemKind, Opts, Role, StrangerMode};
use data::{offset, schedule, Msg, Payloads, Rng};
use mem::Mem;
use nccl_net_zip::ffi::abi::NCCL_PTR_CUDA;
use nccl_net_zip::proto::wire::{Handle, Hello};
use net::{Comm, Net};
use pipe::{Buffers, Fail, Pipe, PlainSender};

const EXIT_FAIL: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_TIMEOUT: u8 = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let o = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nccl-zip-perf: {e}\n(nccl-zip-perf --help lists the options)");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let code = match o.role {
        Role::Stranger => stranger(&o),
        _ if o.latency && o.baseline_tcp => baseline_latency(&o),
        _ if o.baseline_tcp => baseline(&o),
        _ => run_plugin(&o),
    };
    ExitCode::from(code)
}

/// A hard deadline for the whole run: everything stops by itself.
struct Deadline(Instant);
impl Deadline {
    fn check(&self, phase: &str) -> Result<(), Fail> {
        if Instant::now() > self.0 {
            Err(Fail::Timeout(phase.to_string()))
        } else {
            Ok(())
        }
    }
}

fn idle(o: &Opts) {
    if o.poll_sleep_us > 0 {
        std::thread::sleep(Duration::from_micros(o.poll_sleep_us));
    } else {
        std::thread::yield_now();
    }
}

/// Threads and fds of the process, less the plugin's process-wide TCP I/O workers
/// (threads named `zip-io*`, each with an epoll fd and an eventfd) and codec
/// workers (`zip-codec*`, no fd): they are started once and live as long as the
/// process, by design (the library is linked `-z nodelete`), whatever the comms
/// do.
fn census() -> (usize, usize) {
    let entries = |d: &str| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    let tasks = entries("/proc/self/task");
    let names: Vec<String> = tasks
        .iter()
        .map(|t| std::fs::read_to_string(t.join("comm")).unwrap_or_default())
        .collect();
    let workers = names.iter().filter(|c| c.starts_with("zip-io")).count();
    // Codec workers and blocking writers: process-wide pools that outlive comms.
    let pooled = names
        .iter()
        .filter(|c| c.starts_with("zip-codec") || c.starts_with("zip-wr"))
        .count();
    let threads = tasks.len() - workers - pooled;
    let fds = entries("/proc/self/fd");
    let anon = |kind: &str| {
        fds.iter()
            .filter(|f| std::fs::read_link(f).is_ok_and(|l| l.to_string_lossy() == kind))
            .count()
    };
    let worker_fds = workers
        .min(anon("anon_inode:[eventpoll]"))
        .min(anon("anon_inode:[eventfd]"))
        * 2;
    // The plugin's listeners (one per device address, shared by every comm) also
    // live as long as the process: listening sockets are not counted.
    let listening: std::collections::HashSet<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| {
            t.lines()
                .skip(1)
                .filter_map(|l| {
                    let c: Vec<&str> = l.split_whitespace().collect();
                    (c.get(3) == Some(&"0A")).then(|| c.get(9).map(|i| format!("socket:[{i}]")))?
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let listeners = fds
        .iter()
        .filter(|f| std::fs::read_link(f).is_ok_and(|l| listening.contains(&*l.to_string_lossy())))
        .count();
    (threads, fds.len() - worker_fds - listeners)
}

/// Every open fd as `N -> target`: what a leak report names (a failed census is
/// otherwise two counts, and a leak seen once under load cannot be looked at again).
fn fd_listing() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| {
                    let target = std::fs::read_link(e.path())
                        .map(|l| l.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    format!("{} -> {target}", e.file_name().to_string_lossy())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp.{}", path.display(), std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn wait_for_file(path: &Path, dl: &Deadline) -> Result<Vec<u8>, Fail> {
    loop {
        if let Ok(b) = std::fs::read(path) {
            return Ok(b);
        }
        dl.check(&format!("waiting for {}", path.display()))?;
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The plugin this binary ships with: an installed tree's `../lib/libnccl-net-zip.so`
/// (PREFIX/bin and PREFIX/lib), then `libnccl-net-zip.so` beside the binary (a
/// release directory), then `libnccl_net_zip.so` beside it (cargo's target dir).
/// The first that exists; the last if none does, so the error names it.
fn default_plugin() -> PathBuf {
    let exe = std::env::current_exe().ok();
    let dir = exe.as_deref().and_then(|e| e.parent());
    let candidates = plugin_candidates(dir);
    candidates
        .iter()
        .find(|p| p.is_file())
        .or(candidates.last())
        .cloned()
        .unwrap_or_else(|| "libnccl_net_zip.so".into())
}

fn plugin_candidates(exe_dir: Option<&Path>) -> Vec<PathBuf> {
    match exe_dir {
        Some(d) => vec![
            d.join("../lib/libnccl-net-zip.so"),
            d.join("libnccl-net-zip.so"),
            d.join("libnccl_net_zip.so"),
        ],
        None => vec!["libnccl_net_zip.so".into()],
    }
}

/// Largest posted receive: `--recv-size` or the largest message.
fn recv_cap(o: &Opts, msgs: &[Msg]) -> usize {
    o.recv_size
        .unwrap_or_else(|| msgs.iter().map(|m| m.size).max().unwrap_or(0))
}

fn send_cap(msgs: &[Msg]) -> usize {
    msgs.iter().map(|m| m.size).max().unwrap_or(0)
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// How long after the `--trigger-file` time (unix ns) this moment is.
fn since_trigger(o: &Opts) -> Option<f64> {
    let s = std::fs::read_to_string(o.trigger_file.as_ref()?).ok()?;
    let t: u128 = s.trim().parse().ok()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some((now as f64 - t as f64) / 1e6)
}

/// Everything the run opened, closed in NCCL's order on every path.
struct Open<'a> {
    net: &'a Net,
    listen: Comm,
    send: Option<Pipe<'a>>,
    recv: Option<Pipe<'a>>,
    send_comm: Comm,
    recv_comm: Comm,
}

impl Open<'_> {
    fn close(&mut self) -> bool {
        let mut ok = true;
        for p in [self.send.as_mut(), self.recv.as_mut()]
            .into_iter()
            .flatten()
        {
            ok &= p.dereg().is_ok();
        }
        if !self.send_comm.is_null() {
            ok &= self.net.close_send(self.send_comm).is_ok();
        }
        if !self.recv_comm.is_null() {
            ok &= self.net.close_recv(self.recv_comm).is_ok();
        }
        if !self.listen.is_null() {
            ok &= self.net.close_listen(self.listen).is_ok();
            self.listen = std::ptr::null_mut();
        }
        ok
    }
}

fn run_plugin(o: &Opts) -> u8 {
    let t0 = Instant::now();
    let dl = Deadline(t0 + o.timeout);
    // Device memory first: NCCL has its CUDA context before it loads a net plugin,
    // and the context's threads and fds must not count as the plugin's leaks.
    let mem = match Mem::open(o.mem) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("nccl-zip-perf: {e}");
            return EXIT_FAIL;
        }
    };
    println!("{}", mem.describe());
    let path = o.plugin.clone().unwrap_or_else(default_plugin);
    let net = match Net::open(&path) {
        Ok(n) => {
            println!("loaded {}", path.display());
            n
        }
        Err(e) => {
            eprintln!("nccl-zip-perf: {e}");
            return EXIT_FAIL;
        }
    };
    let before = census();
    let before_fds = fd_listing();
    let msgs = schedule(o);
    let wire = bench::Wire::start(o);
    let mut st = Open {
        net: &net,
        listen: std::ptr::null_mut(),
        send: None,
        recv: None,
        send_comm: std::ptr::null_mut(),
        recv_comm: std::ptr::null_mut(),
    };
    let result = drive(o, &net, &mem, &msgs, &dl, &mut st);
    let last_progress = [st.send.as_ref(), st.recv.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| p.last_progress)
        .max();
    let summaries: Vec<String> = [st.send.as_ref(), st.recv.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| p.clock.summary())
        .collect();
    let payload = [st.send.as_ref(), st.recv.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| p.clock.total_bytes())
        .max()
        .unwrap_or(0);
    if o.exit_without_close {
        std::process::exit(if result.is_ok() { 0 } else { 1 });
    }
    let closed_ok = st.close();
    drop(st);
    if let (Some(w), Ok(())) = (&wire, &result) {
        w.report(if o.role == Role::Send { "send" } else { "recv" }, payload);
    }

    let mut code = 0;
    match (&result, o.expect_error) {
        (Ok(()), None) => {
            for s in summaries {
                println!("OK {s}");
            }
        }
        (Ok(()), Some(want)) => {
            eprintln!(
                "nccl-zip-perf: FAIL: expected {} but every call succeeded",
                want.map_or("an error".to_string(), |c| format!("error {c}"))
            );
            code = EXIT_FAIL;
        }
        (Err(Fail::Nccl(e)), Some(want)) if want.is_none_or(|c| c == e.code as u32) => {
            let mut line = format!(
                "EXPECTED-ERROR {:?} ({}) from {} after {:.1} ms since start",
                e.code,
                e.code as u32,
                e.call,
                (e.at - t0).as_secs_f64() * 1e3
            );
            if let Some(lp) = last_progress {
                line += &format!(
                    ", {:.1} ms after the last completed request",
                    (e.at.saturating_duration_since(lp)).as_secs_f64() * 1e3
                );
            }
            if let Some(tr) = since_trigger(o) {
                line += &format!(", {:.1} ms after the trigger", tr - ms_since(e.at));
            }
            println!("{line}");
        }
        (Err(Fail::Timeout(p)), _) => {
            eprintln!(
                "nccl-zip-perf: FAIL: timed out after {:?} while {p}",
                o.timeout
            );
            code = EXIT_TIMEOUT;
        }
        (Err(e), _) => {
            eprintln!("nccl-zip-perf: FAIL: {e}");
            code = EXIT_FAIL;
        }
    }
    if !closed_ok && result.is_ok() {
        eprintln!("nccl-zip-perf: FAIL: closing failed");
        code = EXIT_FAIL;
    }
    if o.check_leaks {
        let after = census();
        if after != before {
            eprintln!(
                "nccl-zip-perf: FAIL: leak: before init {} threads / {} fds, after closing {} threads / {} fds",
                before.0, before.1, after.0, after.1
            );
            // the fds opened since (the census itself left out pools and listeners)
            for f in fd_listing().iter().filter(|f| !before_fds.contains(f)) {
                eprintln!("nccl-zip-perf: open since init: {f}");
            }
            if code == 0 {
                code = EXIT_FAIL;
            }
        } else {
            println!(
                "LEAKS none ({} threads, {} fds before init and after closing)",
                after.0, after.1
            );
        }
    }
    println!("WARNS {}", net::warns_logged());
    code
}

fn drive<'a>(
    o: &Opts,
    net: &'a Net,
    mem: &Mem,
    msgs: &'a [Msg],
    dl: &Deadline,
    st: &mut Open<'a>,
) -> Result<(), Fail> {
    net.init()?;
    let ndev = net.devices()?;
    println!("plugin {} with {ndev} device(s)", net.name());
    for d in 0..ndev {
        let p = net.properties(d)?;
        let name = if p.name.is_null() {
            "<null>".into()
        } else {
            // SAFETY: the plugin's device names are NUL-terminated and live forever.
            unsafe { std::ffi::CStr::from_ptr(p.name) }.to_string_lossy()
        };
        println!(
            "  dev {d}: {name} speed {} Mbps ptrSupport {:#x} maxRecvs {} maxComms {}",
            p.speed, p.ptrSupport, p.maxRecvs, p.maxComms
        );
        if p.maxRecvs < 1 || p.ptrSupport & nccl_net_zip::ffi::abi::NCCL_PTR_HOST as i32 == 0 {
            return Err(Fail::Check(format!(
                "device {d}: properties unusable by NCCL (maxRecvs {}, ptrSupport {:#x})",
                p.maxRecvs, p.ptrSupport
            )));
        }
        if d == o.dev && mem.kind() == MemKind::Cuda && p.ptrSupport & NCCL_PTR_CUDA as i32 == 0 {
            return Err(Fail::Check(format!(
                "--mem cuda: device {d} ptrSupport {:#x} lacks NCCL_PTR_CUDA ({:#x}): NCCL would never give this plugin GPU buffers (set NCCL_ZIP_GPU=on)",
                p.ptrSupport, NCCL_PTR_CUDA
            )));
        }
    }
    let (want_send, want_recv) = match o.role {
        Role::Send => (true, false),
        Role::Recv => (false, true),
        _ => (true, true),
    };
    let mut handle = [0u8; 128];
    if want_recv {
        st.listen = net.listen(o.dev, &mut handle)?;
        if let Some(f) = &o.handle_file {
            write_atomically(f, &handle)
                .map_err(|e| Fail::Check(format!("writing {}: {e}", f.display())))?;
        }
    }
    let peer_file = match o.role {
        Role::Send => o.handle_file.as_ref(),
        Role::Bidir => o.peer_handle_file.as_ref(),
        _ => None,
    };
    if let Some(f) = peer_file {
        let b = wait_for_file(f, dl)?;
        if b.len() != 128 {
            return Err(Fail::Check(format!(
                "handle file holds {} bytes, not 128",
                b.len()
            )));
        }
        handle.copy_from_slice(&b);
    }
    // Connect and accept: one non-blocking step each per round, interleaved, as
    // NCCL's proxy does; neither may wait for the other.
    let t = Instant::now();
    let (mut steps_c, mut steps_a) = (0u64, 0u64);
    while (want_send && st.send_comm.is_null()) || (want_recv && st.recv_comm.is_null()) {
        if want_send && st.send_comm.is_null() {
            st.send_comm = net.connect(o.dev, &mut handle)?;
            steps_c += 1;
        }
        if want_recv && st.recv_comm.is_null() {
            st.recv_comm = net.accept(st.listen)?;
            steps_a += 1;
        }
        dl.check("connecting")?;
        idle(o);
    }
    if matches!(o.role, Role::Recv | Role::Bidir) {
        // NCCL closes the listen comm once its peer is connected.
        net.close_listen(st.listen)?;
        st.listen = std::ptr::null_mut();
    }
    println!(
        "CONNECTED in {:.1} ms ({steps_c} connect calls, {steps_a} accept calls)",
        ms_since(t)
    );
    let _ = std::io::stdout().flush();
    if o.latency {
        latency::plugin(o, net, st.send_comm, st.recv_comm)?;
        return Ok(());
    }

    if want_send {
        st.send = Some(Pipe::new(
            net,
            st.send_comm,
            true,
            msgs,
            send_cap(msgs),
            o,
            mem,
        )?);
    }
    if want_recv {
        st.recv = Some(Pipe::new(
            net,
            st.recv_comm,
            false,
            msgs,
            recv_cap(o, msgs),
            o,
            mem,
        )?);
    }
    loop {
        let mut progress = false;
        let mut finished = true;
        for p in [st.send.as_mut(), st.recv.as_mut()].into_iter().flatten() {
            if !p.finished() {
                progress |= p.step()?;
                finished &= p.finished();
            }
        }
        if finished {
            return Ok(());
        }
        if !progress {
            dl.check("transferring")?;
            idle(o);
        }
    }
}

// ---------------------------------------------------------------------------
// Baseline: one blocking TCP socket, 4-byte size then payload, TCP_NODELAY (what
// NCCL's Socket transport does with its defaults).
// ---------------------------------------------------------------------------

/// First IPv4 address of the interface NCCL_SOCKET_IFNAME names (by prefix).
fn iface_ipv4() -> Option<Ipv4Addr> {
    let spec = std::env::var("NCCL_SOCKET_IFNAME").ok()?;
    let spec = spec.trim_start_matches('=');
    if spec.starts_with('^') {
        return None;
    }
    let prefix = spec.split(',').next()?.split(':').next()?.to_string();
    nix::ifaddrs::getifaddrs().ok()?.find_map(|a| {
        if !a.interface_name.starts_with(&prefix) {
            return None;
        }
        a.address?.as_sockaddr_in().map(|s| s.ip())
    })
}

fn baseline(o: &Opts) -> u8 {
    let t0 = Instant::now();
    let dl = Deadline(t0 + o.timeout);
    let msgs = schedule(o);
    let wire = bench::Wire::start(o);
    let r = match o.role {
        Role::Recv => baseline_recv(o, &msgs, &dl),
        Role::Send => baseline_send(o, &msgs, &dl),
        _ => unreachable!("cli rejects other roles"),
    };
    match r {
        Ok(summary) => {
            if let Some(w) = &wire {
                let payload = msgs.iter().map(|m| m.size as u64).sum();
                w.report(if o.role == Role::Send { "send" } else { "recv" }, payload);
            }
            println!("OK {summary}");
            0
        }
        Err(Fail::Timeout(p)) => {
            eprintln!("nccl-zip-perf: FAIL: timed out while {p}");
            EXIT_TIMEOUT
        }
        Err(e) => {
            eprintln!("nccl-zip-perf: FAIL: {e}");
            EXIT_FAIL
        }
    }
}

fn baseline_latency(o: &Opts) -> u8 {
    let ip: IpAddr = match o.bind.as_deref().map(str::parse) {
        Some(Ok(ip)) => ip,
        Some(Err(_)) => {
            eprintln!("nccl-zip-perf: --bind: not an IP address");
            return EXIT_USAGE;
        }
        None => iface_ipv4().unwrap_or(Ipv4Addr::LOCALHOST).into(),
    };
    match latency::baseline(o, ip, o.one_write) {
        Ok(_) => {
            println!("OK baseline latency over {ip}");
            0
        }
        Err(Fail::Timeout(p)) => {
            eprintln!("nccl-zip-perf: FAIL: timed out while {p}");
            EXIT_TIMEOUT
        }
        Err(e) => {
            eprintln!("nccl-zip-perf: FAIL: {e}");
            EXIT_FAIL
        }
    }
}

fn io_fail(what: &str) -> impl Fn(std::io::Error) -> Fail + '_ {
    move |e| Fail::Check(format!("{what}: {e}"))
}

fn baseline_recv(o: &Opts, msgs: &[Msg], dl: &Deadline) -> Result<String, Fail> {
    let ip: IpAddr = match &o.bind {
        Some(b) => b
            .parse()
            .map_err(|_| Fail::Check(format!("--bind {b}: not an IP address")))?,
        None => iface_ipv4().unwrap_or(Ipv4Addr::LOCALHOST).into(),
    };
    let l = TcpListener::bind((ip, 0)).map_err(io_fail("bind"))?;
    let addr = l.local_addr().map_err(io_fail("local_addr"))?;
    let f = o.handle_file.as_ref().expect("cli");
    write_atomically(f, format!("tcp {addr}\n").as_bytes()).map_err(io_fail("handle file"))?;
    l.set_nonblocking(true).map_err(io_fail("nonblocking"))?;
    let mut s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                dl.check("accepting")?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(io_fail("accept")(e)),
        }
    };
    s.set_nonblocking(false).map_err(io_fail("blocking"))?;
    s.set_nodelay(true).map_err(io_fail("nodelay"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io_fail("timeout"))?;
    println!("CONNECTED baseline tcp {addr}");
    let cap = recv_cap(o, msgs);
    let mut bufs = Buffers::new(o.inflight, cap.max(send_cap(msgs)));
    let payloads = Payloads::new(o, send_cap(msgs));
    let mut clock = BenchClock::new(o, "recv", "tcp");
    clock.start();
    for (i, m) in msgs.iter().enumerate() {
        let mut sz = [0u8; 4];
        s.read_exact(&mut sz).map_err(io_fail("read size"))?;
        let n = u32::from_le_bytes(sz) as usize;
        if n != m.size || n > cap {
            return Err(Fail::Check(format!(
                "message {i}: size {n}, expected {} (cap {cap})",
                m.size
            )));
        }
        let p = bufs.prepare_recv(i, m, o.seed, !o.bench)?;
        // SAFETY: the buffer holds offset + cap + guard bytes.
        let dst = unsafe { std::slice::from_raw_parts_mut(p, n) };
        s.read_exact(dst).map_err(io_fail("read payload"))?;
        let want = o.verify.then(|| payloads.get(m));
        bufs.check_recv(i, m, o.seed, want)?;
        clock.completed(m, msgs.get(i + 1));
        dl.check("receiving")?;
    }
    Ok(clock.summary())
}

fn baseline_send(o: &Opts, msgs: &[Msg], dl: &Deadline) -> Result<String, Fail> {
    let f = o.handle_file.as_ref().expect("cli");
    let text = String::from_utf8_lossy(&wait_for_file(f, dl)?).to_string();
    let addr: SocketAddr = text
        .trim()
        .strip_prefix("tcp ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| Fail::Check(format!("{} is not a baseline handle", f.display())))?;
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io_fail("connect"))?;
    s.set_nodelay(true).map_err(io_fail("nodelay"))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))
        .map_err(io_fail("timeout"))?;
    println!("CONNECTED baseline tcp {addr}");
    let mut ps = PlainSender::new(o, send_cap(msgs));
    let mut clock = BenchClock::new(o, "send", "tcp");
    clock.start();
    for (i, m) in msgs.iter().enumerate() {
        let p = ps.bufs.load(i, m, o.seed, &ps.payloads)?;
        // SAFETY: load() placed m.size bytes at p.
        let data = unsafe { std::slice::from_raw_parts(p, m.size) };
        s.write_all(&(m.size as u32).to_le_bytes())
            .map_err(io_fail("write size"))?;
        s.write_all(data).map_err(io_fail("write payload"))?;
        clock.completed(m, msgs.get(i + 1));
        dl.check("sending")?;
    }
    Ok(clock.summary())
}

// ---------------------------------------------------------------------------
// Stranger: someone else on a shared node connecting to the listen port.
// ---------------------------------------------------------------------------

fn stranger(o: &Opts) -> u8 {
    let dl = Deadline(Instant::now() + o.timeout);
    let f = o.handle_file.as_ref().expect("cli");
    let bytes = match wait_for_file(f, &dl) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("nccl-zip-perf: stranger: {e}");
            return EXIT_TIMEOUT;
        }
    };
    let Ok(hb) = <[u8; 128]>::try_from(bytes.as_slice()) else {
        eprintln!("nccl-zip-perf: stranger: handle file is not 128 bytes");
        return EXIT_FAIL;
    };
    let h = match Handle::decode(&hb) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("nccl-zip-perf: stranger: {e}");
            return EXIT_FAIL;
        }
    };
    let mut s = match TcpStream::connect_timeout(&h.addr, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nccl-zip-perf: stranger: connect {}: {e}", h.addr);
            return EXIT_FAIL;
        }
    };
    let mode = o.mode.expect("cli");
    let payload: Vec<u8> = match mode {
        StrangerMode::Silent => Vec::new(),
        StrangerMode::Garbage => {
            let mut r = Rng::new(o.seed ^ 0x6A5B);
            (0..4096).map(|_| r.next_u64() as u8).collect()
        }
        StrangerMode::BadSecret => Hello {
            secret: h.secret ^ 0x5EC2E7,
            conn_id: Rng::new(o.seed).next_u64(),
            stream: 0,
            nstreams: 1,
            max_chunk: 256 << 10,
        }
        .encode()
        .to_vec(),
    };
    if let Err(e) = s.write_all(&payload) {
        // The listener may already have dropped us: that is its right.
        eprintln!("nccl-zip-perf: stranger: write: {e}");
    }
    println!(
        "STRANGER {mode:?} connected to {} and sent {} bytes",
        h.addr,
        payload.len()
    );
    let _ = std::io::stdout().flush();
    std::thread::sleep(o.hold);
    0
}

#[allow(dead_code)]
fn _uses(m: &Msg, seed: u64) -> usize {
    offset(seed, m.key)
}
