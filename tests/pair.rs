//! Two ranks in two processes over loopback, through the built plugin loaded the
//! way NCCL loads it (`nccl-zip-perf`, src/bin). Each test has a hard time limit:
//! a hang kills the processes and fails the test.
//!
//! The plugin is `target/<profile>/[deps/]libnccl_net_zip.so`, found relative to this test
//! executable (cargo builds it with the library for every `cargo test`).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod support;
use support::plugin_so as plugin;

const PERF: &str = env!("CARGO_BIN_EXE_nccl-zip-perf");

/// A fresh directory for one test's handle files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-zip-pair-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Proc {
    name: String,
    child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

struct Done {
    name: String,
    status: ExitStatus,
    out: String,
    err: String,
}

impl Done {
    fn log(&self) -> String {
        format!(
            "--- {} ({}) stdout:\n{}--- stderr:\n{}",
            self.name, self.status, self.out, self.err
        )
    }
    fn assert_ok(&self) -> &Self {
        assert!(
            self.status.success(),
            "{} failed\n{}",
            self.name,
            self.log()
        );
        self
    }
}

fn pump(mut r: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

fn spawn(name: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut c = Command::new(PERF);
    c.args(args)
        .arg("--plugin")
        .arg(plugin())
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env_remove("NCCL_ZIP_NSTREAMS")
        .env_remove("NCCL_ZIP_COMPRESS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("spawn nccl-zip-perf");
    let (out, err) = (Arc::default(), Arc::default());
    let readers = vec![
        pump(child.stdout.take().unwrap(), Arc::clone(&out)),
        pump(child.stderr.take().unwrap(), Arc::clone(&err)),
    ];
    Proc {
        name: name.into(),
        child,
        out,
        err,
        readers,
    }
}

impl Proc {
    /// Waits for exit; past `limit` the process is killed and the test fails.
    fn wait(mut self, limit: Duration) -> Done {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                panic!(
                    "{} still running after {limit:?} (hang)\nstdout:\n{}\nstderr:\n{}",
                    self.name,
                    self.out.lock().unwrap(),
                    self.err.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Done {
            name: self.name.clone(),
            status,
            out: self.out.lock().unwrap().clone(),
            err: self.err.lock().unwrap().clone(),
        }
    }

    /// Waits until stdout contains `needle`.
    fn wait_for(&mut self, needle: &str, limit: Duration) {
        let t = Instant::now();
        while !self.out.lock().unwrap().contains(needle) {
            if let Some(s) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({s}) before printing {needle:?}\n{}\n{}",
                    self.name,
                    self.out.lock().unwrap(),
                    self.err.lock().unwrap()
                );
            }
            assert!(
                t.elapsed() < limit,
                "{} never printed {needle:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A failing test must not leave a rank running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const LIMIT: Duration = Duration::from_secs(60);

/// One receiver and one sender with the same schedule; both must succeed.
fn transfer(name: &str, schedule: &[&str], env: &[(&str, &str)]) -> (Done, Done) {
    let d = scratch(name);
    let h = d.join("handle");
    let h = h.to_str().unwrap();
    let mut common = vec!["--handle-file", h, "--check-leaks", "--timeout", "50"];
    common.extend_from_slice(schedule);
    let mut ra = vec!["recv"];
    ra.extend(&common);
    let mut sa = vec!["send"];
    sa.extend(&common);
    let r = spawn(&format!("{name}/recv"), &ra, env);
    let s = spawn(&format!("{name}/send"), &sa, env);
    let s = s.wait(LIMIT);
    let r = r.wait(LIMIT);
    r.assert_ok();
    s.assert_ok();
    for p in [&r, &s] {
        assert!(p.out.contains("LEAKS none"), "{}", p.log());
    }
    (r, s)
}

/// As [`transfer`], with each rank's own environment.
fn transfer2(
    name: &str,
    schedule: &[&str],
    env_recv: &[(&str, &str)],
    env_send: &[(&str, &str)],
) -> (Done, Done) {
    let d = scratch(name);
    let h = d.join("handle");
    let h = h.to_str().unwrap();
    let mut common = vec!["--handle-file", h, "--check-leaks", "--timeout", "50"];
    common.extend_from_slice(schedule);
    let mut ra = vec!["recv"];
    ra.extend(&common);
    let mut sa = vec!["send"];
    sa.extend(&common);
    let r = spawn(&format!("{name}/recv"), &ra, env_recv);
    let s = spawn(&format!("{name}/send"), &sa, env_send);
    let s = s.wait(LIMIT);
    let r = r.wait(LIMIT);
    r.assert_ok();
    s.assert_ok();
    (r, s)
}

/// Ranks that differ in checksum setting or chunk size work, bit-exact, in
/// both directions (each setting is the sender's choice, stated on the wire).
#[test]
fn peers_with_different_checksum_and_chunk_settings_work() {
    let sched = [
        "--size-range",
        "0:4M",
        "--count",
        "40",
        "--seed",
        "91",
        "--data",
        "bf16",
    ];
    for (i, (a, b)) in [
        (("NCCL_ZIP_CHECKSUM", "1"), ("NCCL_ZIP_CHECKSUM", "0")),
        (("NCCL_ZIP_CHECKSUM", "0"), ("NCCL_ZIP_CHECKSUM", "1")),
        (
            ("NCCL_ZIP_CHUNK_SIZE", "64K"),
            ("NCCL_ZIP_CHUNK_SIZE", "1M"),
        ),
        (
            ("NCCL_ZIP_CHUNK_SIZE", "1M"),
            ("NCCL_ZIP_CHUNK_SIZE", "64K"),
        ),
        (("NCCL_ZIP_NSTREAMS", "2"), ("NCCL_ZIP_NSTREAMS", "8")),
    ]
    .into_iter()
    .enumerate()
    {
        let on = ("NCCL_ZIP_COMPRESS", "on");
        let (r, _) = transfer2(&format!("differ-{i}"), &sched, &[a, on], &[b, on]);
        assert_received(&r, 40);
    }
}

fn assert_received(r: &Done, n: usize) {
    let want = format!("OK recv {n} messages");
    assert!(r.out.contains(&want), "missing {want:?}\n{}", r.log());
}

#[test]
fn random_sizes_up_to_4m_bit_exact_no_leaks() {
    let sched = [
        "--size-range",
        "0:4M",
        "--count",
        "2500",
        "--seed",
        "11",
        "--inflight",
        "8",
    ];
    let (r, _) = transfer("random", &sched, &[]);
    assert_received(&r, 2500);
}

#[test]
fn odd_sizes_into_larger_receives() {
    // Receives posted larger than the message (normal in NCCL): test() must
    // report the sent size, and nothing past the message may be written.
    let sizes = "0,1,2,3,7,17,63,64,65,4095,4096,4097,32767,32769,131071,131072,131073,524287,1048577,4194303,4194304";
    let sched = [
        "--sizes",
        sizes,
        "--count",
        "420",
        "--recv-size",
        "4194321",
        "--seed",
        "5",
    ];
    let (r, _) = transfer("odd", &sched, &[]);
    assert_received(&r, 420);
}

#[test]
fn one_stream() {
    let sched = ["--size-range", "0:4M", "--count", "1000", "--seed", "21"];
    let (r, _) = transfer("ns1", &sched, &[("NCCL_ZIP_NSTREAMS", "1")]);
    assert_received(&r, 1000);
}

#[test]
fn eight_streams() {
    let sched = ["--size-range", "0:4M", "--count", "1000", "--seed", "22"];
    let (r, _) = transfer("ns8", &sched, &[("NCCL_ZIP_NSTREAMS", "8")]);
    assert_received(&r, 1000);
}

#[test]
fn compression_off_bf16_data() {
    let sched = [
        "--size-range",
        "0:4M",
        "--count",
        "1000",
        "--seed",
        "23",
        "--data",
        "bf16",
    ];
    let (r, _) = transfer("off", &sched, &[("NCCL_ZIP_COMPRESS", "off")]);
    assert_received(&r, 1000);
}

/// Issue 5: the same two-process dlopen run, compressed. `on` must really compress
/// float data (the receiver's close line counts compressed chunks); every data kind
/// must arrive bit-exact, including random bytes (sent raw) and all-zero data.
#[test]
fn compressed_on_and_auto_bit_exact_across_dtypes() {
    for mode in ["on", "auto"] {
        for (i, data) in ["bf16", "fp16", "fp32", "random", "zero"]
            .into_iter()
            .enumerate()
        {
            let seed = (40 + i).to_string();
            let sched = [
                "--size-range",
                "0:4M",
                "--count",
                "60",
                "--seed",
                &seed,
                "--data",
                data,
            ];
            let env = [
                ("NCCL_ZIP_COMPRESS", mode),
                ("NCCL_ZIP_CHECKSUM", "1"),
                ("NCCL_DEBUG", "INFO"),
            ];
            let (r, _) = transfer(&format!("zip-{mode}-{data}"), &sched, &env);
            assert_received(&r, 60);
            if mode == "on" && matches!(data, "bf16" | "fp16" | "fp32" | "zero") {
                let line = r
                    .err
                    .lines()
                    .find(|l| l.contains("closed recv comm"))
                    .unwrap_or_default()
                    .to_string();
                let n: u64 = line
                    .split("chunks compressed ")
                    .nth(1)
                    .and_then(|t| t.split_whitespace().next())
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                assert!(
                    n > 0,
                    "{mode}/{data}: no compressed chunk arrived: {line:?}\n{}",
                    r.log()
                );
            }
        }
    }
}

/// The count after `key` in the receiver's close summary ("... key N ...").
fn close_count(r: &Done, key: &str) -> u64 {
    r.err
        .lines()
        .find(|l| l.contains("closed recv comm"))
        .and_then(|l| l.split(key).nth(1))
        .and_then(|t| {
            t.split(|c: char| !c.is_ascii_digit())
                .find(|t| !t.is_empty())
        })
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// CUDA buffers (`--mem cuda`, registered NCCL_PTR_CUDA) across two processes on
/// the emulated device: the device path with kernels and without, bit-exact.
#[test]
fn cuda_buffers_emulated_bit_exact() {
    for emu in ["1", "nokernels"] {
        for (mode, data) in [("on", "bf16"), ("auto", "random"), ("on", "fp32")] {
            let sched = [
                "--size-range",
                "0:4M",
                "--count",
                "40",
                "--seed",
                "61",
                "--data",
                data,
                "--mem",
                "cuda",
            ];
            let env = [
                ("NCCL_ZIP_GPU_EMULATE", emu),
                ("NCCL_ZIP_COMPRESS", mode),
                ("NCCL_ZIP_CHECKSUM", "1"),
                ("NCCL_DEBUG", "INFO"),
            ];
            let (r, _) = transfer(&format!("cuda-{emu}-{mode}-{data}"), &sched, &env);
            assert_received(&r, 40);
            assert!(
                close_count(&r, "device ") > 0,
                "{emu}/{mode}/{data}: no chunk went through the device path\n{}",
                r.log()
            );
            if data != "random" {
                assert!(
                    close_count(&r, "chunks compressed ") > 0,
                    "{emu}/{mode}/{data}: nothing compressed\n{}",
                    r.log()
                );
            }
        }
    }
}

#[test]
fn compressed_odd_sizes() {
    let sizes = "0,1,2,3,5,17,4095,4096,4097,8083,12345,65535,65537,131071,524289,1048575,4194303";
    let sched = [
        "--sizes",
        sizes,
        "--count",
        "51",
        "--seed",
        "47",
        "--data",
        "bf16",
        "--recv-size",
        "4M",
    ];
    let (r, _) = transfer("zip-odd", &sched, &[("NCCL_ZIP_COMPRESS", "on")]);
    assert_received(&r, 51);
}

#[test]
fn thirty_two_in_flight_small_messages() {
    let sched = [
        "--size-range",
        "0:64K",
        "--count",
        "4000",
        "--seed",
        "24",
        "--inflight",
        "32",
        "--data",
        "fp32",
    ];
    let (r, _) = transfer("if32", &sched, &[]);
    assert_received(&r, 4000);
}

#[test]
fn one_process_interleaves_connect_and_accept() {
    // listen, then connect and accept one non-blocking step each per round, in
    // one thread: a connect or accept that waited for the other would hang here.
    let p = spawn(
        "loop",
        &[
            "loop",
            "--size-range",
            "0:1M",
            "--count",
            "500",
            "--check-leaks",
            "--timeout",
            "50",
        ],
        &[],
    );
    let d = p.wait(LIMIT);
    d.assert_ok();
    assert!(
        d.out.contains("OK recv 500 messages") && d.out.contains("LEAKS none"),
        "{}",
        d.log()
    );
}

// --- The checker itself must be able to fail -------------------------------

#[test]
fn checker_catches_wrong_bytes_and_wrong_sizes() {
    let d = scratch("neg");
    let h = d.join("h");
    let h = h.to_str().unwrap();
    // Different seeds: same sizes, different bytes.
    let r = spawn(
        "neg/recv",
        &[
            "recv",
            "--handle-file",
            h,
            "--sizes",
            "1000",
            "--count",
            "4",
            "--seed",
            "1",
            "--timeout",
            "30",
        ],
        &[],
    );
    let s = spawn(
        "neg/send",
        &[
            "send",
            "--handle-file",
            h,
            "--sizes",
            "1000",
            "--count",
            "4",
            "--seed",
            "2",
            "--timeout",
            "30",
        ],
        &[],
    );
    let _ = s.wait(LIMIT);
    let r = r.wait(LIMIT);
    assert!(
        !r.status.success() && r.err.contains("bytes differ"),
        "{}",
        r.log()
    );

    let h2 = d.join("h2");
    let h2 = h2.to_str().unwrap();
    let r = spawn(
        "neg2/recv",
        &[
            "recv",
            "--handle-file",
            h2,
            "--sizes",
            "100",
            "--count",
            "1",
            "--recv-size",
            "200",
            "--timeout",
            "30",
        ],
        &[],
    );
    let s = spawn(
        "neg2/send",
        &[
            "send",
            "--handle-file",
            h2,
            "--sizes",
            "101",
            "--count",
            "1",
            "--timeout",
            "30",
        ],
        &[],
    );
    let _ = s.wait(LIMIT);
    let r = r.wait(LIMIT);
    assert!(
        !r.status.success() && r.err.contains("test() reported 101 bytes, 100 were sent"),
        "{}",
        r.log()
    );
}

// --- Failure paths ----------------------------------------------------------

fn now_ns() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        .to_string()
}

/// Kills one rank mid-stream with SIGKILL; the other must report ncclRemoteError
/// (6) within a few seconds, clean up, and leave no thread or fd behind.
fn peer_killed(name: &str, kill_sender: bool) {
    let d = scratch(name);
    let h = d.join("handle");
    let trig = d.join("trigger");
    let (h, trig_s) = (h.to_str().unwrap(), trig.to_str().unwrap());
    // Far more data than can move before the kill; the timeout bounds it anyway.
    let sched = ["--sizes", "1M", "--count", "1000000", "--timeout", "40"];
    let survivor_extra = [
        "--expect-error",
        "remote",
        "--check-leaks",
        "--trigger-file",
        trig_s,
    ];
    let mut ra = vec!["recv", "--handle-file", h];
    ra.extend(&sched);
    let mut sa = vec!["send", "--handle-file", h];
    sa.extend(&sched);
    if kill_sender {
        ra.extend(&survivor_extra);
    } else {
        sa.extend(&survivor_extra);
    }
    let mut r = spawn(&format!("{name}/recv"), &ra, &[]);
    let mut s = spawn(&format!("{name}/send"), &sa, &[]);
    r.wait_for("CONNECTED", LIMIT);
    s.wait_for("CONNECTED", LIMIT);
    std::thread::sleep(Duration::from_millis(500)); // mid-stream
    std::fs::write(&trig, now_ns()).unwrap();
    let killed_at = Instant::now();
    let (victim, survivor) = if kill_sender {
        (&mut s, r)
    } else {
        (&mut r, s)
    };
    victim.kill();
    let done = survivor.wait(Duration::from_secs(20));
    let took = killed_at.elapsed();
    done.assert_ok();
    assert!(
        done.out.contains("EXPECTED-ERROR ncclRemoteError (6)") && done.out.contains("LEAKS none"),
        "{}",
        done.log()
    );
    assert!(
        done.err.contains("NCCL WARN"),
        "no WARN line explains the failure\n{}",
        done.log()
    );
    assert!(
        took < Duration::from_secs(5),
        "survivor needed {took:?}\n{}",
        done.log()
    );
}

#[test]
fn sender_killed_receiver_gets_remote_error() {
    peer_killed("kill-send", true);
}

#[test]
fn receiver_killed_sender_gets_remote_error() {
    peer_killed("kill-recv", false);
}

#[test]
fn strangers_on_the_listen_port_do_not_disturb_the_real_peer() {
    let d = scratch("strangers");
    let h = d.join("handle");
    let h = h.to_str().unwrap();
    let sched = [
        "--size-range",
        "0:1M",
        "--count",
        "300",
        "--seed",
        "31",
        "--check-leaks",
        "--timeout",
        "40",
    ];
    let mut ra = vec!["recv", "--handle-file", h];
    ra.extend(&sched);
    let r = spawn("strangers/recv", &ra, &[]);
    // Garbage and a wrong secret must be rejected; the silent one stays connected
    // while the real peer connects and transfers (and is dropped at closeListen).
    let silent = spawn(
        "silent",
        &[
            "stranger",
            "--handle-file",
            h,
            "--mode",
            "silent",
            "--hold-ms",
            "4000",
        ],
        &[],
    );
    for mode in ["garbage", "bad-secret"] {
        spawn(
            mode,
            &[
                "stranger",
                "--handle-file",
                h,
                "--mode",
                mode,
                "--hold-ms",
                "200",
            ],
            &[],
        )
        .wait(LIMIT)
        .assert_ok();
    }
    // Give the listener time to read and reject both before the real peer comes.
    let t = Instant::now();
    while r.err.lock().unwrap().matches("rejected connection").count() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "strangers were not rejected:\n{}",
            r.err.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut sa = vec!["send", "--handle-file", h];
    sa.extend(&sched);
    let s = spawn("strangers/send", &sa, &[]).wait(LIMIT);
    let r = r.wait(LIMIT);
    s.assert_ok();
    r.assert_ok();
    assert_received(&r, 300);
    assert!(r.out.contains("LEAKS none"), "{}", r.log());
    let warns: Vec<&str> = r
        .err
        .lines()
        .filter(|l| l.contains("NCCL WARN") && l.contains("rejected connection"))
        .collect();
    assert!(warns.iter().any(|l| l.contains("bad magic")), "{}", r.log());
    assert!(
        warns.iter().any(|l| l.contains("wrong secret")),
        "{}",
        r.log()
    );
    let silent = silent.wait(LIMIT);
    silent.assert_ok();
}

#[test]
fn oversize_message_is_invalid_usage_naming_both_sizes() {
    let d = scratch("oversize");
    let h = d.join("handle");
    let h = h.to_str().unwrap();
    let r = spawn(
        "oversize/recv",
        &[
            "recv",
            "--handle-file",
            h,
            "--sizes",
            "5000",
            "--count",
            "1",
            "--recv-size",
            "1000",
            "--expect-error",
            "invalid-usage",
            "--check-leaks",
            "--timeout",
            "30",
        ],
        &[],
    );
    let s = spawn(
        "oversize/send",
        &[
            "send",
            "--handle-file",
            h,
            "--sizes",
            "5000",
            "--count",
            "1",
            "--timeout",
            "30",
        ],
        &[],
    );
    let r = r.wait(LIMIT);
    let _ = s.wait(LIMIT); // the sender may or may not see an error; it must end
    r.assert_ok();
    assert!(
        r.out.contains("EXPECTED-ERROR ncclInvalidUsage (5)") && r.out.contains("LEAKS none"),
        "{}",
        r.log()
    );
    assert!(
        r.err
            .lines()
            .any(|l| l.contains("NCCL WARN") && l.contains("5000") && l.contains("1000")),
        "no WARN names both sizes\n{}",
        r.log()
    );
}
