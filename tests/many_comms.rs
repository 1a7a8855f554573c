//! Thousands of comms in one process (issue 20): what a lightly used comm costs,
//! that bulk comms still grow their data streams meanwhile, and that opening and
//! closing comms leaves nothing behind. One test in its own binary: it reads
//! process-wide figures (/proc/self/status, /proc/self/fd) and the plugin's `HELD`.
//!
//! `MANY_COMMS_BULK` comm pairs (default 4) carry 4 MiB messages in a loop; once
//! they run, `MANY_COMMS_PAIRS` (default 200) more pairs are opened, each carrying
//! one 64 KiB message (the inline path). Checked: the process's threads stay
//! within 4 × usable CPUs + 32 (the shared I/O workers drive every comm's data
//! streams); a lightly used comm costs at most 2 fds and 48 KiB of resident
//! memory (the growth while the light pairs opened, over their comms; the bulk
//! comms were already running, so their staging is in the baseline); every bulk
//! comm opened all its data streams, a light comm one at most (its message went
//! compressed), and idle light comms hold no staging; after
//! `MANY_COMMS_CYCLES` (default 500) connect/close cycles, comms, I/O threads,
//! data streams, staging, decode tables, threads and fds are back where they were.
//!
//! The full figure (1,000 pairs, 5,000 cycles):
//!
//!   MANY_COMMS_PAIRS=1000 MANY_COMMS_CYCLES=5000 \
//!     cargo test --release --test many_comms -- --nocapture

mod inproc_util;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use inproc_util::{bf16_gaussian, pair};
use nccl_net_zip::proto::slots::Slot;
use nccl_net_zip::stats::{open_fds, process_rss_kib, process_threads, HELD};
use nccl_net_zip::transport::tcp::workers::usable_cpus;
use nccl_net_zip::transport::tcp::{RecvComm, SendComm};

fn env(k: &str, default: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Sends `msg` on `s`, receives it on `r`, and checks it.
fn transfer(s: &SendComm, r: &RecvComm, msg: &[u8]) {
    let mut buf = vec![0xEEu8; msg.len()];
    transfer_into(s, r, msg, &mut buf);
}

/// [`transfer`] into `buf` (as long as `msg`).
fn transfer_into(s: &SendComm, r: &RecvComm, msg: &[u8], buf: &mut [u8]) {
    buf.fill(0xEE);
    let rq: *const Slot = r.irecv(buf.as_mut_ptr(), buf.len(), None).unwrap().unwrap();
    let sq: *const Slot = s.isend(msg.as_ptr(), msg.len(), None).unwrap().unwrap();
    // SAFETY: the slots are in the comms' rings, alive for this call.
    let (rq, sq) = unsafe { (&*rq, &*sq) };
    let t0 = Instant::now();
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        if sent.is_none() {
            sent = sq.test().unwrap();
        }
        if got.is_none() {
            got = rq.test().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "transfer stuck");
        std::thread::yield_now();
    }
    assert_eq!(got, Some(msg.len()));
    assert!(buf == msg, "message differs");
}

fn settle(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: {}",
            HELD.summary()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn thousands_of_comms_cost_little_and_leave_nothing_behind() {
    raise_open_file_limit();
    std::env::set_var("NCCL_ZIP_COMPRESS", "auto");
    let pairs_n = env("MANY_COMMS_PAIRS", 200);
    let bulk_n = env("MANY_COMMS_BULK", 4);
    let cycles = env("MANY_COMMS_CYCLES", 500);
    let cpus = usable_cpus();

    // Warm up: the plugin, its shared workers and listener, the logger.
    drop(pair());
    settle("warm-up close", || HELD.comms.load(Relaxed) == 0);
    let threads_start = process_threads().unwrap();
    // Blocking writers start on first need (bulk traffic below) and stay, a
    // pool bounded by the workers' count like the workers themselves.
    let writers_start = HELD.io_writers.load(Relaxed);
    let fds_start = open_fds().unwrap();
    let rss_start = process_rss_kib().unwrap();

    // Bulk traffic first, so that its buffers and staging are in the baseline.
    let small = bf16_gaussian(1, 64 << 10, 0.02);
    let big = bf16_gaussian(2, 4 << 20, 0.02);
    let bulk: Vec<(SendComm, RecvComm)> = (0..bulk_n).map(|_| pair()).collect();
    let stop = AtomicBool::new(false);
    let rounds = AtomicUsize::new(0);
    let mut peak_threads = 0;
    let (mut fds0, mut rss0, mut threads0) = (0, 0, 0);
    let (mut fds1, mut rss1, mut threads1) = (0, 0, 0);
    let mut light: Vec<(SendComm, RecvComm)> = Vec::with_capacity(pairs_n);
    let mut open_s = 0.0;
    std::thread::scope(|sc| {
        for (s, r) in &bulk {
            let (big, stop, rounds) = (&big, &stop, &rounds);
            sc.spawn(move || {
                let mut buf = vec![0u8; big.len()];
                let mut n = 0;
                while n < 2 || !stop.load(Relaxed) {
                    transfer_into(s, r, big, &mut buf);
                    n += 1;
                    if n == 2 {
                        rounds.fetch_add(1, Relaxed);
                    }
                }
            });
        }
        settle("bulk comms running", || rounds.load(Relaxed) == bulk_n);
        threads0 = process_threads().unwrap();
        fds0 = open_fds().unwrap();
        rss0 = process_rss_kib().unwrap();
        let t_open = Instant::now();
        for _ in 0..pairs_n {
            let (s, r) = pair();
            transfer(&s, &r, &small);
            light.push((s, r));
            peak_threads = peak_threads.max(process_threads().unwrap());
        }
        open_s = t_open.elapsed().as_secs_f64();
        threads1 = process_threads().unwrap();
        fds1 = open_fds().unwrap();
        rss1 = process_rss_kib().unwrap();
        peak_threads = peak_threads.max(threads1);
        stop.store(true, Relaxed);
    });
    let comms = 2 * pairs_n as u64;
    let per_comm = |now: u64, then: u64| now.saturating_sub(then) as f64 / comms.max(1) as f64;
    let (fds_per, kib_per) = (per_comm(fds1, fds0), per_comm(rss1, rss0));
    let nstreams = nccl_net_zip::config::Config::from_env().unwrap().nstreams;
    println!(
        "{pairs_n} light pairs beside {bulk_n} bulk pairs, {cpus} usable CPUs: light pairs opened in {open_s:.1} s; \
         threads {threads_start} -> {threads0} (bulk running) -> {threads1} (peak {peak_threads}, bound {}); \
         per light comm: {fds_per:.2} fds, {kib_per:.1} KiB resident; bulk: {} KiB resident, {} fds in all; {}",
        4 * cpus + 32,
        rss0.saturating_sub(rss_start),
        fds0.saturating_sub(fds_start),
        HELD.summary()
    );
    assert_eq!(HELD.comms.load(Relaxed), comms + 2 * bulk_n as u64);
    assert!(
        peak_threads as usize <= 4 * cpus + 32,
        "{peak_threads} threads with {cpus} usable CPUs: {}",
        HELD.summary()
    );
    // No comm holds a thread of its own.
    assert_eq!(HELD.io_threads.load(Relaxed), 0, "{}", HELD.summary());
    assert!(fds_per <= 2.0, "{fds_per:.2} fds per light comm");
    assert!(kib_per <= 48.0, "{kib_per:.1} KiB per light comm");
    // A light comm opened one data stream at most (its 64 KiB message goes
    // compressed when the policy says so, raw on the inline stream otherwise);
    // bulk comms opened all of theirs, at both ends.
    let light_streams: usize = light.iter().map(|(s, _)| s.streams_opened()).sum();
    for (s, r) in &light {
        assert!(s.streams_opened() <= 1);
        assert!(r.stats().streams.load(Relaxed) <= 1);
    }
    for (s, r) in &bulk {
        assert_eq!(s.streams_up(), nstreams, "{}", s.stats().summary());
        assert_eq!(r.stats().streams.load(Relaxed), nstreams as u64);
    }
    assert_eq!(
        HELD.data_streams.load(Relaxed),
        2 * (bulk_n * nstreams + light_streams) as u64
    );
    // Idle comms give their staging back (to the shared free list).
    let light_held = || -> u64 {
        light
            .iter()
            .flat_map(|(s, r)| [s.stats(), r.stats()])
            .map(|st| st.staging_bytes.load(Relaxed))
            .sum()
    };
    settle("light comms' staging given back", || light_held() == 0);
    println!(
        "light comms with a data stream: {light_streams} of {pairs_n} pairs; staging they hold: {} B",
        light_held()
    );
    drop(light);
    drop(bulk);
    settle("close", || HELD.comms.load(Relaxed) == 0);

    // Connect and close, again and again: nothing may pile up.
    let t_cycles = Instant::now();
    for _ in 0..cycles {
        let (s, r) = pair();
        transfer(&s, &r, &small[..4096]);
    }
    let cycles_s = t_cycles.elapsed().as_secs_f64();
    settle("comms after the cycles", || HELD.comms.load(Relaxed) == 0);
    settle("I/O threads after the cycles", || {
        HELD.io_threads.load(Relaxed) == 0
    });
    let writers = HELD.io_writers.load(Relaxed) - writers_start;
    assert!(
        writers <= HELD.io_workers.load(Relaxed),
        "{}",
        HELD.summary()
    );
    settle("threads after the cycles", || {
        process_threads().unwrap() <= threads_start + writers
    });
    settle("fds after the cycles", || open_fds().unwrap() <= fds_start);
    assert_eq!(HELD.data_streams.load(Relaxed), 0, "{}", HELD.summary());
    assert_eq!(HELD.staging_bytes.load(Relaxed), 0, "{}", HELD.summary());
    assert_eq!(HELD.decode_tables.load(Relaxed), 0, "{}", HELD.summary());
    println!(
        "{cycles} connect/transfer/close cycles in {cycles_s:.1} s: threads {}, fds {} (before: {threads_start}, {fds_start}; blocking writers started since: {writers}); resident memory {} KiB (at the start: {rss_start} KiB)",
        process_threads().unwrap(),
        open_fds().unwrap(),
        process_rss_kib().unwrap()
    );
}
