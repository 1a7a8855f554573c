//! NCCL generations as test profiles: the built plugin, loaded with `dlopen`
//! (`RTLD_NOW|RTLD_LOCAL`) and called through its exported `ncclNetPlugin_v8`
//! vtable the way each NCCL generation calls it (DESIGN.md §2a). Nothing here
//! uses the crate: only the C ABI, so these tests survive any rewrite behind it.
//!
//! Each profile runs in a child process of its own (this test binary, run again
//! with `NZ_PROFILE=<name>`), because `init` is once per process and the
//! library, linked `-z nodelete`, stays mapped after `dlclose`.
//!
//! The library is `NCCL_ZIP_PLUGIN_SO` when set (to check a release artifact:
//! `NCCL_ZIP_PLUGIN_SO=/opt/nccl-net-zip/lib/libnccl-net-zip.so cargo test
//! --test nccl_profiles`), else the one cargo built for this run.

use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

mod support;

// ---------------------------------------------------------------------------
// The v8 ABI, written out here from NCCL's plugin contract.

type Logger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);
type P = *mut c_void;

#[repr(C)]
struct NetV8 {
    name: *const c_char,
    init: unsafe extern "C" fn(Option<Logger>) -> c_int,
    devices: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_properties: unsafe extern "C" fn(c_int, *mut [u64; 8]) -> c_int,
    listen: unsafe extern "C" fn(c_int, P, *mut P) -> c_int,
    connect: unsafe extern "C" fn(c_int, P, *mut P, *mut P) -> c_int,
    accept: unsafe extern "C" fn(P, *mut P, *mut P) -> c_int,
    reg_mr: unsafe extern "C" fn(P, P, usize, c_int, *mut P) -> c_int,
    reg_mr_dma_buf: unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, *mut P) -> c_int,
    dereg_mr: unsafe extern "C" fn(P, P) -> c_int,
    isend: unsafe extern "C" fn(P, P, c_int, c_int, P, *mut P) -> c_int,
    irecv: unsafe extern "C" fn(P, c_int, *mut P, *mut c_int, *mut c_int, *mut P, *mut P) -> c_int,
    iflush: unsafe extern "C" fn(P, c_int, *mut P, *mut c_int, *mut P, *mut P) -> c_int,
    test: unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> c_int,
    close_send: unsafe extern "C" fn(P) -> c_int,
    close_recv: unsafe extern "C" fn(P) -> c_int,
    close_listen: unsafe extern "C" fn(P) -> c_int,
    get_device_mr: unsafe extern "C" fn(P, P, *mut P) -> c_int,
    irecv_consumed: unsafe extern "C" fn(P, c_int, P) -> c_int,
}

// SAFETY: an immutable table of function pointers and a static name.
unsafe impl Sync for NetV8 {}

const PTR_HOST: c_int = 1;
const HANDLE: usize = 128;

extern "C" {
    // tools/profile_logger.c
    fn nz_profile_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
    fn nz_profile_warns() -> c_ulong;
    fn nz_profile_warns_init() -> c_ulong;
    fn nz_profile_infos_init() -> c_ulong;
}

fn warns() -> u64 {
    unsafe { nz_profile_warns() as u64 }
}

fn so_path() -> PathBuf {
    std::env::var_os("NCCL_ZIP_PLUGIN_SO")
        .map(PathBuf::from)
        .unwrap_or_else(support::plugin_so)
}

/// The plugin, loaded as NCCL loads it.
struct Lib {
    lib: libloading::os::unix::Library,
    v: &'static NetV8,
}

impl Lib {
    fn open() -> Lib {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        let lib = unsafe { Library::open(Some(so_path()), RTLD_NOW | RTLD_LOCAL) }
            .expect("dlopen the plugin");
        let v: &'static NetV8 = unsafe {
            let s = lib
                .get::<*const NetV8>(b"ncclNetPlugin_v8\0")
                .expect("ncclNetPlugin_v8");
            &**s
        };
        Lib { lib, v }
    }

    fn init(&self) -> c_int {
        unsafe { (self.v.init)(Some(nz_profile_logger as Logger)) }
    }

    fn ndev(&self) -> c_int {
        let mut n = -1;
        let r = unsafe { (self.v.devices)(&mut n) };
        assert_eq!(r, 0, "devices()");
        n
    }

    fn close(self) {
        self.lib.close().expect("dlclose");
    }
}

fn ok(r: c_int, what: &str) {
    assert_eq!(r, 0, "{what} returned {r}");
}

/// Connected comms of one process: listen, connect and accept interleaved as
/// NCCL's proxy does, with the device-handle pointers NCCL passes (NULL for
/// connect, a pointer to garbage for accept, which must come back NULL).
struct Pair {
    l: P,
    s: P,
    r: P,
}

fn pair(v: &NetV8) -> Pair {
    let mut handle = [0u8; HANDLE];
    let mut l = null_mut();
    ok(
        unsafe { (v.listen)(0, handle.as_mut_ptr() as P, &mut l) },
        "listen",
    );
    // NCCL copies the handle to the peer; the peer connects with its copy.
    let mut copy = handle;
    let (mut s, mut r): (P, P) = (null_mut(), null_mut());
    let t = Instant::now();
    while s.is_null() || r.is_null() {
        if s.is_null() {
            ok(
                unsafe { (v.connect)(0, copy.as_mut_ptr() as P, &mut s, null_mut()) },
                "connect",
            );
        }
        if r.is_null() {
            let mut dev: P = 1 as P;
            ok(unsafe { (v.accept)(l, &mut r, &mut dev) }, "accept");
            if !r.is_null() {
                assert!(dev.is_null(), "accept left the device handle at {dev:?}");
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "connect/accept did not finish"
        );
        std::thread::yield_now();
    }
    Pair { l, s, r }
}

fn close_pair(v: &NetV8, p: Pair) {
    unsafe {
        ok((v.close_send)(p.s), "closeSend");
        ok((v.close_recv)(p.r), "closeRecv");
        ok((v.close_listen)(p.l), "closeListen");
    }
}

/// bf16 values of a Gaussian-like spread: compressible.
fn bf16_data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let mut s = 0f32;
        for _ in 0..4 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s += (x >> 40) as f32 / (1u64 << 24) as f32;
        }
        let v = (s - 2.0) * 0.05;
        out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    out.truncate(n);
    out
}

fn reg(v: &NetV8, comm: P, buf: &mut [u8]) -> P {
    let mut mh = null_mut();
    ok(
        unsafe { (v.reg_mr)(comm, buf.as_mut_ptr() as P, buf.len(), PTR_HOST, &mut mh) },
        "regMr",
    );
    mh
}

fn isend(v: &NetV8, s: P, buf: &[u8], mh: P) -> P {
    let mut req: P = 1 as P; // NCCL's v8 shim leaves the request at 0x1
    let t = Instant::now();
    loop {
        ok(
            unsafe { (v.isend)(s, buf.as_ptr() as P, buf.len() as c_int, 0, mh, &mut req) },
            "isend",
        );
        if !req.is_null() {
            assert_ne!(req, 1 as P, "isend left the request at 0x1");
            return req;
        }
        assert!(t.elapsed() < Duration::from_secs(30));
    }
}

fn irecv(v: &NetV8, r: P, buf: &mut [u8], cap: c_int, mh: P) -> P {
    let mut req: P = 1 as P;
    let mut data = [buf.as_mut_ptr() as P];
    let mut sizes = [cap];
    let mut tags = [0 as c_int];
    let mut mhs = [mh];
    ok(
        unsafe {
            (v.irecv)(
                r,
                1,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        },
        "irecv",
    );
    assert!(!req.is_null() && req != 1 as P, "irecv request {req:?}");
    req
}

/// Tests until done; the size `test` reports.
fn wait(v: &NetV8, req: P) -> usize {
    let t = Instant::now();
    loop {
        let (mut done, mut size) = (0, -1);
        ok(unsafe { (v.test)(req, &mut done, &mut size) }, "test");
        if done == 1 {
            return size as usize;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "request never completed"
        );
    }
}

/// Sends `msgs` from `p.s` to `p.r` one at a time; checks every byte and size,
/// and calls irecvConsumed after each completed receive as NCCL 2.19+ does.
fn traffic(v: &NetV8, p: &Pair, msgs: usize, len: usize, seed: u64) {
    let mut rbuf = vec![0u8; len + 4096];
    let rmh = reg(v, p.r, &mut rbuf);
    for i in 0..msgs {
        let mut data = bf16_data(len - (i % 7) * 13, seed + i as u64);
        let smh = reg(v, p.s, &mut data);
        let rr = irecv(v, p.r, &mut rbuf, (len + 4096) as c_int, rmh);
        let sr = isend(v, p.s, &data, smh);
        assert_eq!(wait(v, sr), data.len());
        assert_eq!(wait(v, rr), data.len(), "message {i}: size");
        assert!(rbuf[..data.len()] == data[..], "message {i}: bytes differ");
        ok(unsafe { (v.irecv_consumed)(p.r, 1, rr) }, "irecvConsumed");
        ok(unsafe { (v.dereg_mr)(p.s, smh) }, "deregMr");
    }
    ok(unsafe { (v.dereg_mr)(p.r, rmh) }, "deregMr");
}

fn count_dir(d: &str) -> usize {
    std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Child side: one profile per process.

#[test]
fn profile_child() {
    let Ok(name) = std::env::var("NZ_PROFILE") else {
        return; // run by the parent tests below, not on its own
    };
    match name.as_str() {
        "init_twice" => init_twice(),
        "gen_2_20" => gen_2_20(),
        "failed_request_retested" => failed_request_retested(),
        "reload_without_init" => reload(false),
        "reload_with_init" => reload(true),
        "reinit_same_library" => reinit_same_library(),
        "regmr_concurrent_with_traffic" => regmr_concurrent_with_traffic(),
        "close_in_flight_and_leftovers" => close_in_flight_and_leftovers(),
        "protocol_mismatch" => protocol_mismatch(),
        other => panic!("unknown profile {other}"),
    }
    println!("PROFILE-OK {name}");
}

/// `init` twice (NCCL 2.28+ calls it per communicator): success both times;
/// prints devices and log counts for the parent to judge.
fn init_twice() {
    let lib = Lib::open();
    ok(lib.init(), "init");
    ok(lib.init(), "second init");
    let n = lib.ndev();
    println!("DEVICES {n}");
    println!(
        "WARNS {} WARNS_INIT {} INFOS_INIT {}",
        warns(),
        unsafe { nz_profile_warns_init() },
        unsafe { nz_profile_infos_init() }
    );
    if n > 0 {
        let mut props = [0u64; 8];
        ok(
            unsafe { (lib.v.get_properties)(0, &mut props) },
            "getProperties",
        );
    }
}

/// 2.20–2.21: init once, comms live until the process ends; the v8 shim's
/// request pre-set, sizes arrays, the 1 GiB limit, irecvConsumed.
fn gen_2_20() {
    let lib = Lib::open();
    ok(lib.init(), "init");
    assert!(lib.ndev() > 0);
    let v = lib.v;
    let p = pair(v);
    traffic(v, &p, 20, 256 << 10, 1);
    // The 1 GiB limit of the v8 API: refused with an error, request NULL.
    let small = [0u8; 64];
    let mut req: P = 1 as P;
    let r = unsafe {
        (v.isend)(
            p.s,
            small.as_ptr() as P,
            (1 << 30) + 1,
            0,
            null_mut(),
            &mut req,
        )
    };
    assert_ne!(r, 0, "isend above 1 GiB accepted");
    assert!(req.is_null(), "isend above 1 GiB left request {req:?}");
    // A receive posted for up to INT_MAX bytes takes a small message.
    let mut rbuf = vec![0u8; 4096];
    let rr = irecv(v, p.r, &mut rbuf, c_int::MAX, null_mut());
    let data = bf16_data(1000, 9);
    let sr = isend(v, p.s, &data, null_mut());
    assert_eq!(wait(v, sr), 1000);
    assert_eq!(wait(v, rr), 1000);
    assert!(rbuf[..1000] == data[..]);
    // All 32 request slots busy: the 33rd isend returns success and a NULL
    // request (not the 0x1 the v8 shim pre-set).
    let bufs: Vec<Vec<u8>> = (0..32).map(|i| bf16_data(4096, 100 + i)).collect();
    let sreqs: Vec<P> = bufs.iter().map(|b| isend(v, p.s, b, null_mut())).collect();
    let mut req: P = 1 as P;
    ok(
        unsafe { (v.isend)(p.s, bufs[0].as_ptr() as P, 4096, 0, null_mut(), &mut req) },
        "isend",
    );
    assert!(req.is_null(), "33rd isend: request {req:?}, expected NULL");
    let mut rbufs: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 4096]).collect();
    let rreqs: Vec<P> = rbufs
        .iter_mut()
        .map(|b| irecv(v, p.r, b, 4096, null_mut()))
        .collect();
    for (i, (s, r)) in sreqs.iter().zip(&rreqs).enumerate() {
        assert_eq!(wait(v, *s), 4096);
        assert_eq!(wait(v, *r), 4096);
        assert!(rbufs[i] == bufs[i], "message {i} differs");
    }
    close_pair(v, p);
    // A failed init never happened, and nothing warned.
    assert_eq!(warns(), 1, "only the 1 GiB isend may warn");
}

/// 2.20–2.25: a failed request is re-tested in a hot loop until the job
/// aborts. The same error every time; a handful of WARN lines at most.
fn failed_request_retested() {
    let lib = Lib::open();
    ok(lib.init(), "init");
    let v = lib.v;
    let p = pair(v);
    traffic(v, &p, 2, 64 << 10, 3);
    let before = warns();
    let mut rbuf = vec![0u8; 1 << 20];
    let rr = irecv(v, p.r, &mut rbuf, 1 << 20, null_mut());
    // The peer goes away while the receive is pending.
    ok(unsafe { (v.close_send)(p.s) }, "closeSend");
    let t = Instant::now();
    let first = loop {
        let (mut done, mut size) = (0, 0);
        let r = unsafe { (v.test)(rr, &mut done, &mut size) };
        if r != 0 {
            break r;
        }
        assert_eq!(done, 0, "a receive whose peer left completed");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the failure never surfaced"
        );
    };
    for _ in 0..20_000 {
        let (mut done, mut size) = (0, 0);
        let r = unsafe { (v.test)(rr, &mut done, &mut size) };
        assert_eq!(r, first, "a re-test returned another code");
    }
    let n = warns() - before;
    println!("WARN-LINES {n} over 20000 re-tests (code {first})");
    assert!(n <= 10, "{n} WARN lines over 20,000 re-tests");
    unsafe {
        ok((v.close_recv)(p.r), "closeRecv");
        ok((v.close_listen)(p.l), "closeListen");
    }
}

/// 2.22–2.23 (`with_init` false): dlclose after the last comm, and a reload
/// that never calls `init` again. 2.24+ (true): `init` after every reload.
fn reload(with_init: bool) {
    for round in 0..4 {
        let lib = Lib::open();
        if round == 0 || with_init {
            ok(lib.init(), "init");
        }
        assert!(lib.ndev() > 0, "round {round}: no devices");
        let p = pair(lib.v);
        traffic(lib.v, &p, 10, 128 << 10, round);
        close_pair(lib.v, p);
        lib.close();
        println!("ROUND {round} ok");
    }
}

/// 2.28+ with NCCL_NET_PLUGIN_REF_COUNT=1: the library stays loaded and
/// `init` runs again whenever no comm is alive.
fn reinit_same_library() {
    let lib = Lib::open();
    for round in 0..3 {
        ok(lib.init(), "init");
        assert!(lib.ndev() > 0);
        let p = pair(lib.v);
        traffic(lib.v, &p, 10, 128 << 10, 10 + round);
        close_pair(lib.v, p);
    }
    assert_eq!(warns(), 0);
}

/// 2.24+: the proxy service thread registers and deregisters memory on a comm
/// while the progress thread is in isend/test on the same comm.
fn regmr_concurrent_with_traffic() {
    let lib = Lib::open();
    ok(lib.init(), "init");
    let v = lib.v;
    let p = pair(v);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (s, r) = (p.s as usize, p.r as usize);
    let regs = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut buf = vec![0u8; 1 << 20];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for comm in [s as P, r as P] {
                    let mh = reg(v, comm, &mut buf);
                    ok(unsafe { (v.dereg_mr)(comm, mh) }, "deregMr");
                    regs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        traffic(v, &p, 100, 256 << 10, 77);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    println!(
        "REGISTRATIONS {}",
        regs.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(regs.load(std::sync::atomic::Ordering::Relaxed) > 0);
    close_pair(v, p);
}

/// ncclCommAbort: comms closed with requests in flight; a listen comm whose
/// connection never completed and a connect that never finished are never
/// closed by NCCL.
fn close_in_flight_and_leftovers() {
    let lib = Lib::open();
    ok(lib.init(), "init");
    let v = lib.v;
    // Requests in flight on both sides, then close.
    let p = pair(v);
    let mut rbufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 4 << 20]).collect();
    for b in rbufs.iter_mut() {
        irecv(v, p.r, b, 4 << 20, null_mut());
    }
    let q = pair(v);
    let big: Vec<Vec<u8>> = (0..8).map(|i| bf16_data(4 << 20, i)).collect();
    for b in &big {
        isend(v, q.s, b, null_mut());
    }
    let t = Instant::now();
    close_pair(v, p);
    close_pair(v, q);
    let took = t.elapsed();
    println!("CLOSE-IN-FLIGHT {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "close with requests in flight took {took:?}"
    );

    // Leftovers: a listen comm that never accepts and is never closed. The
    // peer's connect still finishes (NCCL closes that send comm at abort).
    std::thread::sleep(Duration::from_millis(200));
    let (fd0, th0) = (count_dir("/proc/self/fd"), count_dir("/proc/self/task"));
    let mut handle = [0u8; HANDLE];
    let mut l = null_mut();
    ok(
        unsafe { (v.listen)(0, handle.as_mut_ptr() as P, &mut l) },
        "listen",
    );
    let mut copy = handle;
    let mut s: P = null_mut();
    let t = Instant::now();
    while s.is_null() {
        ok(
            unsafe { (v.connect)(0, copy.as_mut_ptr() as P, &mut s, null_mut()) },
            "connect",
        );
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "connect needs the peer's accept"
        );
    }
    ok(unsafe { (v.close_send)(s) }, "closeSend");
    std::thread::sleep(Duration::from_millis(200));
    let (fd1, th1) = (count_dir("/proc/self/fd"), count_dir("/proc/self/task"));
    let (dfd, dth) = (fd1 as i64 - fd0 as i64, th1 as i64 - th0 as i64);
    println!("LEFTOVER fds {dfd} threads {dth}");
    assert!(dfd <= 1, "a listen comm left behind holds {dfd} fds");
    assert_eq!(dth, 0, "a listen comm left behind holds {dth} threads");
}

/// A peer whose handle says another protocol version: connect fails with an
/// error naming both versions (the parent checks the WARN), never a hang.
fn protocol_mismatch() {
    let lib = Lib::open();
    ok(lib.init(), "init");
    let v = lib.v;
    let mut handle = [0u8; HANDLE];
    let mut l = null_mut();
    ok(
        unsafe { (v.listen)(0, handle.as_mut_ptr() as P, &mut l) },
        "listen",
    );
    let ours = u16::from_le_bytes([handle[4], handle[5]]);
    let mut copy = handle;
    copy[4..6].copy_from_slice(&(ours - 1).to_le_bytes());
    let mut s: P = null_mut();
    let r = unsafe { (v.connect)(0, copy.as_mut_ptr() as P, &mut s, null_mut()) };
    assert_ne!(r, 0, "connect with another protocol version succeeded");
    assert!(s.is_null());
    println!("OURS v{ours} THEIRS v{}", ours - 1);
    ok(unsafe { (v.close_listen)(l) }, "closeListen");
}

// ---------------------------------------------------------------------------
// Parent side: one test per profile.

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(profile: &str, env: &[(&str, &str)]) -> Out {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "profile_child",
        "--exact",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("NZ_PROFILE", profile)
    .env("NCCL_SOCKET_IFNAME", "lo")
    .env("NCCL_ZIP_COMPRESS", "on")
    .env_remove("NCCL_ZIP_NSTREAMS")
    .env_remove("NCCL_ZIP_TRANSPORT")
    .env_remove("NCCL_DEBUG");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A hang fails the test instead of stalling CI.
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let out = Out {
        ok: o.status.success() && stdout.contains(&format!("PROFILE-OK {profile}")),
        stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert!(
        out.ok,
        "profile {profile} failed\n--- stdout\n{}\n--- stderr\n{}",
        out.stdout, out.stderr
    );
    out
}

fn field(out: &str, key: &str) -> u64 {
    out.split(&format!("{key} "))
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{out}"))
}

/// A plugin that cannot work returns success from init and reports 0 devices,
/// with exactly one WARN, visible under NCCL's default subsystem mask.
#[test]
fn init_never_fails() {
    for env in [
        vec![
            ("NCCL_ZIP_TRANSPORT", "ib"),
            ("NCCL_IB_HCA", "=no_such_hca"),
        ],
        vec![("NCCL_ZIP_NSTREAMS", "999")],
        vec![("NCCL_ZIP_COMPRESS", "maybe")],
        vec![("NCCL_ZIP_PEER_TIMEOUT_MS", "30K")],
        vec![("NCCL_SOCKET_IFNAME", "=no_such_interface")],
    ] {
        let o = run("init_twice", &env);
        let what = format!("{env:?}\n{}\n{}", o.stdout, o.stderr);
        assert_eq!(field(&o.stdout, "DEVICES"), 0, "{what}");
        assert_eq!(field(&o.stdout, "WARNS"), 1, "{what}");
        assert_eq!(field(&o.stdout, "WARNS_INIT"), 1, "{what}");
        let warn = o
            .stderr
            .lines()
            .find(|l| l.starts_with("NZLOG 2 "))
            .unwrap();
        let var = env.last().unwrap().0;
        let var = if var == "NCCL_IB_HCA" {
            "NCCL_ZIP_TRANSPORT"
        } else {
            var
        };
        assert!(warn.contains(var), "the WARN does not name {var}: {warn}");
    }
}

/// NCCL's own default value NCCL_IB_GID_INDEX=-1 is accepted; plain
/// NCCL_DEBUG=INFO shows the banner (NCCL_INIT among its flags).
#[test]
fn nccl_defaults_work_and_the_banner_shows() {
    let o = run(
        "init_twice",
        &[
            ("NCCL_IB_GID_INDEX", "-1"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_ZIP_CHECKSUM", "yes"),
        ],
    );
    assert!(field(&o.stdout, "DEVICES") > 0, "{}", o.stderr);
    assert_eq!(field(&o.stdout, "WARNS"), 0, "{}", o.stderr);
    let banner = o
        .stderr
        .lines()
        .find(|l| l.starts_with("NZLOG 3 0x11 ") && l.contains("commit"))
        .unwrap_or_else(|| panic!("no banner with NCCL_INIT|NCCL_NET:\n{}", o.stderr));
    for want in [
        "transport TCP",
        "GPU kernels",
        "compress=On",
        "NCCL_ZIP_CHECKSUM=true",
    ] {
        assert!(banner.contains(want), "banner lacks {want:?}: {banner}");
    }
}

#[test]
fn nccl_2_20_init_once_request_preset_limits_sizes_consumed() {
    run("gen_2_20", &[]);
}

#[test]
fn nccl_2_20_to_2_25_failed_request_retested_20000_times() {
    let o = run("failed_request_retested", &[]);
    assert!(field(&o.stdout, "WARN-LINES") <= 10);
}

#[test]
fn nccl_2_22_reload_without_init() {
    let o = run("reload_without_init", &[]);
    assert!(o.stdout.contains("ROUND 3 ok"));
}

#[test]
fn nccl_2_24_reload_with_init() {
    let o = run("reload_with_init", &[]);
    assert!(o.stdout.contains("ROUND 3 ok"));
}

#[test]
fn nccl_2_28_init_again_in_the_same_library() {
    run("reinit_same_library", &[]);
}

#[test]
fn nccl_2_24_regmr_concurrent_with_compressed_traffic() {
    run(
        "regmr_concurrent_with_traffic",
        &[("NCCL_ZIP_CHECKSUM", "1")],
    );
}

#[test]
fn abort_closes_in_flight_and_leftovers_hold_no_thread() {
    run("close_in_flight_and_leftovers", &[]);
}

#[test]
fn peers_of_another_protocol_version_fail_the_connect_naming_both() {
    let o = run("protocol_mismatch", &[]);
    let ours = o
        .stdout
        .split("OURS v")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let theirs = o
        .stdout
        .split("THEIRS v")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let warn = o
        .stderr
        .lines()
        .find(|l| l.starts_with("NZLOG 2 "))
        .expect("a WARN");
    assert!(
        warn.contains(&format!("v{ours}")) && warn.contains(&format!("v{theirs}")),
        "the WARN does not name both versions: {warn}"
    );
}
