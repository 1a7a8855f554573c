//! The IB comms end to end over the in-memory RC fabric: TCP bootstrap on
//! loopback, progress on the shared workers, NCCL-style request slots. Many messages
//! of 0 B..4 MiB (odd sizes too), 8 in flight, test() in posting order, checked
//! bit for bit, compressed (bf16) and raw; peer loss and oversize receives;
//! device buffers (GPUDirect RDMA) on the emulated GPU backend, and iflush.
//! No RDMA hardware is involved: this is the main evidence for the comm layer.

mod inproc_util;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inproc_util::pattern;
use nccl_net_zip::config::{CompressMode, DtypeHint};
use nccl_net_zip::error::Error;
use nccl_net_zip::gpu::{backend_for, Backend, Emulation, Lane};
use nccl_net_zip::proto::slots::Slot;
use nccl_net_zip::proto::wire::{self, HANDLE_SIZE};
use nccl_net_zip::transport::ib::comm::{
    IbConfig, IbConnect, IbHandle, IbListenComm, IbMr, IbRecvComm, IbSendComm,
};
use nccl_net_zip::transport::ib::mem_fabric::{MemFabric, MemOpener};
use nccl_net_zip::transport::ib::proto::Params;
use std::sync::atomic::Ordering::Relaxed;

fn cfg(mode: CompressMode, nqps: usize) -> Arc<IbConfig> {
    Arc::new(IbConfig {
        nqps,
        params: Params::default(),
        compress: mode,
        dtype: DtypeHint::Bf16,
        checksum: false,
        effort: nccl_zip_codec::Effort::Full,
        link_mbps: Some(100_000),
        handshake_timeout: Duration::from_secs(20),
        io_threads: None,
        format: 1,
        decodes: 2,
    })
}

/// Listens, then connects and accepts in turns, as NCCL's proxy thread does,
/// with the connect state kept behind the handle's stage area.
fn pair(cfg: Arc<IbConfig>) -> (IbSendComm, IbRecvComm) {
    pair_with(cfg.clone(), cfg)
}

/// [`pair`] with the listener's settings `lcfg` and the connector's `cfg`.
fn pair_with(lcfg: Arc<IbConfig>, cfg: Arc<IbConfig>) -> (IbSendComm, IbRecvComm) {
    let opener = Arc::new(MemOpener);
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut l = IbListenComm::bind(addr, opener.clone(), lcfg).unwrap();
    let mut handle = [0u8; HANDLE_SIZE];
    l.handle().encode(&mut handle);
    assert_eq!(
        wire::stage_get(&handle),
        None,
        "a fresh handle has no stage"
    );
    let (mut s, mut r) = (None, None);
    let t0 = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "bootstrap hung");
        if s.is_none() {
            let p = match wire::stage_get(&handle) {
                Some(p) => p as *mut IbConnect<MemFabric>,
                None => {
                    let h = IbHandle::decode(&handle).unwrap();
                    let st = IbConnect::start(&h, &*opener, &cfg).unwrap();
                    let p = Box::into_raw(Box::new(st));
                    wire::stage_set(&mut handle, Some(p as usize));
                    p
                }
            };
            // SAFETY: p came from Box::into_raw above and is reclaimed once below.
            if unsafe { (*p).progress() }.unwrap() {
                wire::stage_set(&mut handle, None);
                let st = unsafe { Box::from_raw(p) };
                s = Some(st.finish().unwrap());
            }
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
        std::thread::yield_now();
    }
    (s.unwrap(), r.unwrap())
}

/// Gaussian-ish bf16 values: compressible to about 0.67.
fn bf16(seed: u64, n: usize) -> Vec<u8> {
    inproc_util::bf16_gaussian(seed, n, 0.02)
}

fn wait(slot: *const Slot, what: &str) -> Result<usize, Error> {
    // SAFETY: the slot lives in its comm's ring, and the comm outlives the wait.
    let slot = unsafe { &*slot };
    let t0 = Instant::now();
    loop {
        match slot.test() {
            Ok(Some(n)) => return Ok(n),
            Ok(None) => {
                assert!(t0.elapsed() < Duration::from_secs(60), "{what} stuck");
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
}

const SIZES: [usize; 22] = [
    0,
    1,
    2,
    3,
    17,
    255,
    4095,
    4096,
    4097,
    8083,
    12345,
    65536,
    65536 + 7,
    131072,
    600 << 10,
    (512 << 10) + 1,
    1 << 20,
    (1 << 20) + 3,
    3 << 20,
    (4 << 20) - 1,
    4 << 20,
    777_777,
];

/// Sends every message, 8 in flight, testing in posting order, into fresh
/// registered buffers of `cap` bytes; checks sizes, bytes and the tail.
fn transfer(s: &IbSendComm, r: &IbRecvComm, msgs: &[Vec<u8>], cap: usize) {
    transfer_on(s, r, msgs, cap, None, None)
}

type Dev = Option<Arc<dyn Backend>>;

/// [`transfer`] with the send buffers in (emulated) device memory of `sdev` and
/// the receive buffers in device memory of `rdev`, when given.
fn transfer_on(s: &IbSendComm, r: &IbRecvComm, msgs: &[Vec<u8>], cap: usize, sdev: Dev, rdev: Dev) {
    let mut bufs: Vec<Vec<u8>> = msgs.iter().map(|_| vec![0xEEu8; cap]).collect();
    // SAFETY: the buffers outlive their registrations (dropped at the end).
    let smr: Vec<IbMr> = msgs
        .iter()
        .map(|m| unsafe { s.mrs().register(m.as_ptr() as *mut u8, m.len()) }.unwrap())
        .collect();
    let rmr: Vec<IbMr> = bufs
        .iter_mut()
        .map(|b| unsafe { r.mrs().register(b.as_mut_ptr(), b.len()) }.unwrap())
        .collect();
    for (w, window) in msgs.chunks(8).enumerate() {
        let mut reqs = Vec::new();
        for (k, m) in window.iter().enumerate() {
            let i = w * 8 + k;
            let rq = r
                .irecv(bufs[i].as_mut_ptr(), cap, Some(&rmr[i]), rdev.clone())
                .unwrap()
                .expect("slot") as *const Slot;
            let sq = s
                .isend(m.as_ptr(), m.len(), Some(&smr[i]), sdev.clone())
                .unwrap()
                .expect("slot") as *const Slot;
            reqs.push((i, sq, rq));
        }
        for (i, sq, rq) in reqs {
            assert_eq!(wait(sq, "send").unwrap(), msgs[i].len());
            let got = wait(rq, "recv").unwrap();
            assert_eq!(got, msgs[i].len(), "test() must report the true size");
            assert!(
                bufs[i][..got] == msgs[i][..],
                "message {i} ({got} B) differs"
            );
            assert!(
                bufs[i][got..].iter().all(|&b| b == 0xEE),
                "message {i} wrote past its end"
            );
        }
    }
}

#[test]
fn compressed_bf16_many_sizes_bit_exact() {
    // Staging as large as the largest message, so that every chunk's frame fits
    // (with the default 512 KiB a 4 MiB message sends most chunks raw).
    let mut c = (*cfg(CompressMode::On, 2)).clone();
    c.params.stage_bytes = 4 << 20;
    // And enough compression buffers: when all are in flight the sender sends
    // the next chunk raw rather than wait (see docs/IB.md).
    c.params.send_bufs = 64;
    let (s, r) = pair(Arc::new(c));
    let msgs: Vec<Vec<u8>> = (0..3)
        .flat_map(|round| SIZES.iter().map(move |&n| (round, n)))
        .map(|(round, n)| bf16(round * 100 + n as u64, n))
        .collect();
    transfer(&s, &r, &msgs, 4 << 20);
    let st = s.stats();
    let (raw, wire) = (st.raw_bytes.load(Relaxed), st.wire_bytes.load(Relaxed));
    let total: usize = msgs.iter().map(Vec::len).sum();
    assert_eq!(raw, total as u64);
    assert!(st.chunks_compressed.load(Relaxed) > 0, "nothing compressed");
    assert!(
        (wire as f64) < 0.85 * raw as f64,
        "wire {wire} B for {raw} B of bf16"
    );
    assert_eq!(
        r.stats().raw_bytes.load(Relaxed),
        total as u64,
        "the receiver delivered every byte"
    );
}

#[test]
fn compressed_with_default_staging_falls_back_to_raw_when_full() {
    let (s, r) = pair(cfg(CompressMode::On, 2));
    let msgs: Vec<Vec<u8>> = SIZES.iter().map(|&n| bf16(n as u64, n)).collect();
    transfer(&s, &r, &msgs, 4 << 20);
    let st = s.stats();
    assert!(st.chunks_compressed.load(Relaxed) > 0 && st.chunks_raw.load(Relaxed) > 0);
    assert!(st.wire_bytes.load(Relaxed) < st.raw_bytes.load(Relaxed));
}

#[test]
fn raw_random_bytes_every_qp_count() {
    for nqps in [1, 3, 4] {
        let (s, r) = pair(cfg(CompressMode::Off, nqps));
        let msgs: Vec<Vec<u8>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(i as u64 + 1, n))
            .collect();
        transfer(&s, &r, &msgs, 4 << 20);
        assert_eq!(s.stats().chunks_compressed.load(Relaxed), 0);
        assert_eq!(
            s.stats().wire_bytes.load(Relaxed),
            s.stats().raw_bytes.load(Relaxed)
        );
    }
}

#[test]
fn auto_mode_on_incompressible_data_still_delivers() {
    let (s, r) = pair(cfg(CompressMode::Auto, 2));
    let msgs: Vec<Vec<u8>> = (0..40)
        .map(|i| pattern(i, 100_000 + i as usize * 997))
        .collect();
    transfer(&s, &r, &msgs, 1 << 20);
}

#[test]
fn oversize_is_invalid_usage_naming_both_sizes() {
    let (s, r) = pair(cfg(CompressMode::On, 2));
    let msg = pattern(7, 5000);
    let mut buf = vec![0u8; 4096];
    let smr = unsafe { s.mrs().register(msg.as_ptr() as *mut u8, msg.len()) }.unwrap();
    let rmr = unsafe { r.mrs().register(buf.as_mut_ptr(), buf.len()) }.unwrap();
    let rq = r
        .irecv(buf.as_mut_ptr(), 4096, Some(&rmr), None)
        .unwrap()
        .unwrap() as *const Slot;
    let sq = s
        .isend(msg.as_ptr(), 5000, Some(&smr), None)
        .unwrap()
        .unwrap() as *const Slot;
    for (q, who) in [(rq, "recv"), (sq, "send")] {
        match wait(q, who) {
            Err(Error::InvalidUsage(m)) => {
                assert!(m.contains("5000") && m.contains("4096"), "{who}: {m}")
            }
            other => panic!("{who}: expected InvalidUsage, got {other:?}"),
        }
    }
    // Later requests get the error too.
    assert!(s.isend(msg.as_ptr(), 10, Some(&smr), None).is_err());
    assert!(
        buf.iter().all(|&b| b == 0),
        "nothing may land in a too-small buffer"
    );
}

#[test]
fn sender_loss_fails_posted_receives_with_remote_error() {
    let (s, r) = pair(cfg(CompressMode::Off, 2));
    let mut buf = vec![0u8; 1 << 16];
    let rmr = unsafe { r.mrs().register(buf.as_mut_ptr(), buf.len()) }.unwrap();
    let rq = r
        .irecv(buf.as_mut_ptr(), buf.len(), Some(&rmr), None)
        .unwrap()
        .unwrap() as *const Slot;
    std::thread::sleep(Duration::from_millis(20));
    drop(s);
    match wait(rq, "recv") {
        Err(Error::Remote(m)) => assert!(m.contains("closed") || m.contains("unreachable"), "{m}"),
        other => panic!("expected a remote error, got {other:?}"),
    }
    assert!(matches!(
        r.irecv(buf.as_mut_ptr(), 16, Some(&rmr), None),
        Err(Error::Remote(_))
    ));
}

#[test]
fn receiver_loss_fails_pending_sends_with_remote_error() {
    let (s, r) = pair(cfg(CompressMode::Off, 2));
    let msg = pattern(3, 300_000);
    let smr = unsafe { s.mrs().register(msg.as_ptr() as *mut u8, msg.len()) }.unwrap();
    // No receive posted: the send waits for a CTS that never comes.
    let sq = s
        .isend(msg.as_ptr(), msg.len(), Some(&smr), None)
        .unwrap()
        .unwrap() as *const Slot;
    std::thread::sleep(Duration::from_millis(20));
    drop(r);
    match wait(sq, "send") {
        Err(Error::Remote(m)) => assert!(m.contains("closed"), "{m}"),
        other => panic!("expected a remote error, got {other:?}"),
    }
}

#[test]
fn receiver_loss_mid_stream_fails_the_sender() {
    let (s, r) = pair(cfg(CompressMode::Off, 2));
    let msgs: Vec<Vec<u8>> = (0..4).map(|i| pattern(i, 1 << 20)).collect();
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 1 << 20]).collect();
    let smr: Vec<IbMr> = msgs
        .iter()
        .map(|m| unsafe { s.mrs().register(m.as_ptr() as *mut u8, m.len()) }.unwrap())
        .collect();
    let rmr: Vec<IbMr> = bufs
        .iter_mut()
        .map(|b| unsafe { r.mrs().register(b.as_mut_ptr(), b.len()) }.unwrap())
        .collect();
    // Two receives posted, four sends: the last two can never complete.
    for i in 0..2 {
        r.irecv(bufs[i].as_mut_ptr(), 1 << 20, Some(&rmr[i]), None)
            .unwrap()
            .unwrap();
    }
    let sq: Vec<*const Slot> = (0..4)
        .map(|i| {
            s.isend(msgs[i].as_ptr(), 1 << 20, Some(&smr[i]), None)
                .unwrap()
                .unwrap() as *const Slot
        })
        .collect();
    assert_eq!(wait(sq[0], "send 0").unwrap(), 1 << 20);
    drop(rmr);
    drop(r);
    assert!(matches!(wait(sq[3], "send 3"), Err(Error::Remote(_))));
}

#[test]
fn memory_handles_are_cached_and_checked() {
    let (s, r) = pair(cfg(CompressMode::Off, 1));
    let mut a = vec![1u8; 8192];
    let m1 = unsafe { s.mrs().register(a.as_mut_ptr(), a.len()) }.unwrap();
    let m2 = unsafe { s.mrs().register(a.as_mut_ptr(), a.len()) }.unwrap();
    assert_eq!(m1.mr(), m2.mr(), "same buffer, same registration");
    let m3 = unsafe { s.mrs().register(a.as_mut_ptr(), 4096) }.unwrap();
    assert_ne!(m1.mr().lkey, m3.mr().lkey);
    assert_eq!(s.mrs().live(), 2);
    drop((m1, m3));
    assert_eq!(s.mrs().live(), 1, "m2 keeps its registration alive");
    drop(m2);
    assert_eq!(s.mrs().live(), 0);
    // Requests must name a handle that covers them.
    let m = unsafe { s.mrs().register(a.as_mut_ptr(), 4096) }.unwrap();
    assert!(matches!(
        s.isend(a.as_ptr(), 8192, Some(&m), None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        s.isend(a.as_ptr(), 10, None, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        r.irecv(a.as_mut_ptr(), 10, None, None),
        Err(Error::InvalidArgument(_))
    ));
    // The comm is still healthy: a 0-byte message needs no handle.
    let rq = r
        .irecv(std::ptr::null_mut(), 0, None, None)
        .unwrap()
        .unwrap() as *const Slot;
    let sq = s.isend(std::ptr::null(), 0, None, None).unwrap().unwrap() as *const Slot;
    assert_eq!(wait(sq, "send").unwrap(), 0);
    assert_eq!(wait(rq, "recv").unwrap(), 0);
}

#[test]
fn handle_is_ib_and_rejects_tcp_handles() {
    let h = IbHandle {
        addr: "10.0.0.7:1234".parse().unwrap(),
        secret: 99,
        decodes: 2,
    };
    let mut b = [0u8; HANDLE_SIZE];
    h.encode(&mut b);
    wire::stage_set(&mut b, Some(0x1000));
    assert_eq!(IbHandle::decode(&b).unwrap(), h);
    let mut t = [0u8; HANDLE_SIZE];
    wire::Handle {
        addr: h.addr,
        secret: 99,
        decodes: 2,
    }
    .encode(&mut t);
    assert!(IbHandle::decode(&t).is_err());
    assert!(wire::Handle::decode(&b).is_err());
}

/// Waits (briefly) for the progress thread's copy of the counters to catch up.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn device_buffers_through_the_comms_every_mix_bit_exact() {
    let mut c = (*cfg(CompressMode::On, 2)).clone();
    c.params.stage_bytes = 4 << 20;
    c.params.send_bufs = 64;
    let c = Arc::new(c);
    let msgs: Vec<Vec<u8>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            if i % 3 == 2 {
                pattern(i as u64, n)
            } else {
                bf16(i as u64 + 50, n)
            }
        })
        .collect();
    for emu in [Emulation::Kernels, Emulation::NoKernels] {
        // One backend object per side, so each side's lanes are counted apart.
        let (sc, rc) = (Counted::new(emu), Counted::new(emu));
        let (sdev, rdev): (Arc<dyn Backend>, Arc<dyn Backend>) = (sc.clone(), rc.clone());
        let (s, r) = pair(c.clone());
        for (sd, rd) in [(true, true), (true, false), (false, true), (false, false)] {
            let name = format!("{emu:?} send on device {sd}, receive on device {rd}");
            let (ss, rs) = (s.stats(), r.stats());
            let before = |st: &nccl_net_zip::stats::Stats| {
                (
                    st.chunks_device.load(Relaxed),
                    st.chunks_compressed.load(Relaxed),
                    st.raw_bytes.load(Relaxed),
                    st.wire_bytes.load(Relaxed),
                )
            };
            let (s0, r0) = (before(ss), before(rs));
            transfer_on(
                &s,
                &r,
                &msgs,
                4 << 20,
                sd.then(|| sdev.clone()),
                rd.then(|| rdev.clone()),
            );
            let total: u64 = msgs.iter().map(|m| m.len() as u64).sum();
            eventually(&name, || rs.raw_bytes.load(Relaxed) - r0.2 == total);
            eventually(&name, || ss.raw_bytes.load(Relaxed) - s0.2 == total);
            let (s1, r1) = (before(ss), before(rs));
            assert_eq!(s1.0 > s0.0, sd, "{name}: sender device chunks {s1:?}");
            assert_eq!(r1.0 > r0.0, rd, "{name}: receiver device chunks {r1:?}");
            // Compressed device chunks went through a GPU lane (one per side,
            // kept while the comm lives).
            if sd {
                assert_eq!(sc.lanes.load(Relaxed), 1, "{name}: sender lanes");
            }
            if rd {
                assert_eq!(rc.lanes.load(Relaxed), 1, "{name}: receiver lanes");
            }
            let compressed = s1.1 - s0.1;
            assert!(compressed > 10, "{name}: {compressed} compressed chunks");
            assert_eq!(r1.1 - r0.1, compressed, "{name}");
            let (raw, wire) = (s1.2 - s0.2, s1.3 - s0.3);
            assert!(
                (wire as f64) < 0.85 * raw as f64,
                "{name}: wire {wire} B for {raw} B"
            );
        }
    }
}

/// The emulated backend, counting the lanes made and `flush_rdma_writes`.
struct Counted {
    inner: Arc<dyn Backend>,
    lanes: std::sync::atomic::AtomicUsize,
    flushes: std::sync::atomic::AtomicUsize,
}

impl Counted {
    fn new(emu: Emulation) -> Arc<Counted> {
        Arc::new(Counted {
            inner: backend_for(0, emu).unwrap(),
            lanes: Default::default(),
            flushes: Default::default(),
        })
    }
}

impl Backend for Counted {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn lane<'a>(
        &self,
        max_wire: usize,
        counter: &'a std::sync::atomic::AtomicU64,
    ) -> nccl_net_zip::error::Result<Box<dyn Lane + 'a>> {
        self.lanes.fetch_add(1, Relaxed);
        self.inner.lane(max_wire, counter)
    }
    fn flush_rdma_writes(&self) -> nccl_net_zip::error::Result<()> {
        self.flushes.fetch_add(1, Relaxed);
        Ok(())
    }
}

#[test]
fn iflush_flushes_device_receives_only() {
    let (s, r) = pair(cfg(CompressMode::Off, 2));
    let fc = Counted::new(Emulation::Kernels);
    let dev: Arc<dyn Backend> = fc.clone();
    // A raw message into device memory: the HCA wrote it (GDR), iflush flushes.
    let msgs = vec![pattern(1, 300_000)];
    transfer_on(&s, &r, &msgs, 1 << 20, None, Some(dev.clone()));
    r.flush(Some(&dev), 300_000).unwrap();
    assert_eq!(fc.flushes.load(Relaxed), 1);
    assert_eq!(fc.lanes.load(Relaxed), 0, "raw traffic needs no lane");
    // Host buffers and empty receives need nothing.
    r.flush(None, 300_000).unwrap();
    r.flush(Some(&dev), 0).unwrap();
    assert_eq!(fc.flushes.load(Relaxed), 1);
}

/// Issue 20: IB comms share a few progress workers. 100 pairs (200 comms), one
/// 64 KiB message each, add at most the workers' threads (before: a thread per
/// comm, 200 here); all still deliver, and closing them all returns.
#[test]
fn many_ib_comms_share_a_few_progress_threads() {
    use nccl_net_zip::stats::process_threads;
    use nccl_net_zip::transport::ib::progress;
    let cfg = cfg(CompressMode::On, 1);
    // One pair first: the workers start with the first comm.
    let first = pair(cfg.clone());
    let before = process_threads().unwrap();
    let pairs: Vec<(IbSendComm, IbRecvComm)> = (0..100).map(|_| pair(cfg.clone())).collect();
    let during = process_threads().unwrap();
    let workers = progress::running();
    eprintln!(
        "IB: 100 more comm pairs: threads {before} -> {during}; {workers} shared progress workers"
    );
    // Other tests of this binary may start threads meanwhile (the harness runs
    // them in parallel): allow a few, far below one per comm.
    assert!((1..=8).contains(&workers), "{workers} workers");
    assert!(
        during <= before + 8,
        "threads grew from {before} to {during} for 200 comms"
    );
    for (i, (s, r)) in pairs.iter().chain(std::iter::once(&first)).enumerate() {
        transfer(s, r, &[bf16(i as u64, 64 << 10)], 64 << 10);
    }
    let t0 = Instant::now();
    drop(pairs);
    drop(first);
    eprintln!("closed 202 IB comms in {:?}", t0.elapsed());
}

/// Issue 20: the IB comms' staging and frame buffers come from one bounded
/// budget. Here a budget of its own, sized for one pair: the first pair gets it
/// and compresses; a second pair opened meanwhile finds it spent and sends raw
/// (bit-exact, never waiting); once the first closes, a third pair compresses.
/// Nothing is reserved before a comm carries data.
#[test]
fn ib_buffers_come_from_a_bounded_budget() {
    use nccl_net_zip::budget::Budget;
    let budget: &'static Budget = Box::leak(Box::default());
    let mut c = (*cfg(CompressMode::On, 2)).clone();
    c.params.budget = budget;
    let p = &c.params;
    let one_pair = (p.stage_slots * p.stage_bytes
        + p.send_bufs * nccl_net_zip::codec_glue::max_wire(p.max_chunk)) as u64;
    c.params.buffer_cap = one_pair;
    let c = Arc::new(c);
    let msgs: Vec<Vec<u8>> = [1 << 20, 300_000, 64 << 10, 4097]
        .iter()
        .map(|&n| bf16(n as u64, n))
        .collect();
    let compressed = |s: &IbSendComm| s.stats().chunks_compressed.load(Relaxed);
    let refused = |s: &IbSendComm, r: &IbRecvComm| {
        s.stats().budget_refusals.load(Relaxed) + r.stats().budget_refusals.load(Relaxed)
    };

    let (s1, r1) = pair(c.clone());
    assert_eq!(budget.used(), 0, "nothing reserved before data");
    transfer(&s1, &r1, &msgs, 1 << 20);
    eventually("first pair compressed", || compressed(&s1) > 0);
    assert_eq!(budget.used(), one_pair);

    let (s2, r2) = pair(c.clone());
    transfer(&s2, &r2, &msgs, 1 << 20);
    eventually("second pair saw the budget spent", || refused(&s2, &r2) > 0);
    assert_eq!(compressed(&s2), 0, "no budget, no compression");
    assert_eq!(budget.used(), one_pair, "the second pair holds nothing");

    drop((s1, r1));
    assert_eq!(budget.used(), 0, "closing gives the budget back");
    let (s3, r3) = pair(c);
    transfer(&s3, &r3, &msgs, 1 << 20);
    eventually("third pair compressed", || compressed(&s3) > 0);
    eprintln!(
        "IB budget {} KiB: pair 1 compressed, pair 2 raw ({} refusals), pair 3 compressed after pair 1 closed",
        one_pair >> 10,
        refused(&s2, &r2)
    );
    drop((s2, r2, s3, r3));
    assert_eq!(budget.used(), 0);
}

/// Codec format agreement (issue 19 item 10): the connector writes the lower of
/// its `NCCL_ZIP_FORMAT` and what the listener's handle says it decodes, in both
/// orders. A sender that wrote above the agreement would fail the receive (its
/// decoder refuses such frames, see `ib_fabric`), so bit-exact compressed
/// transfers show the agreement is kept.
#[test]
fn peers_agree_on_the_lower_codec_format_both_orders() {
    let msgs: Vec<Vec<u8>> = [4096usize, 100_000, 1 << 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| bf16(i as u64 + 7, n))
        .collect();
    for (decodes, writes) in [(1u8, 2u8), (2, 1), (2, 2), (1, 1)] {
        let mut lc = (*cfg(CompressMode::On, 2)).clone();
        lc.decodes = decodes;
        let mut cc = (*cfg(CompressMode::On, 2)).clone();
        cc.format = writes;
        let (s, r) = pair_with(Arc::new(lc), Arc::new(cc));
        transfer(&s, &r, &msgs, 1 << 20);
        assert!(
            r.stats().chunks_compressed.load(Relaxed) > 0,
            "listener v{decodes}, connector v{writes}: nothing was compressed"
        );
    }
}

/// A connector that states a codec format above what the listener offered is
/// refused, and `accept` says why; an older peer's record (0 there) means v1.
#[test]
fn a_bootstrap_record_above_the_offered_format_fails_accept() {
    use nccl_net_zip::transport::ib::comm::Boot;
    use nccl_net_zip::transport::ib::fabric::QpInfo;
    use nccl_net_zip::transport::ib::proto::Endpoint;
    use std::io::Write;
    let mut lc = (*cfg(CompressMode::On, 1)).clone();
    lc.decodes = 1;
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut l = IbListenComm::bind(addr, Arc::new(MemOpener), Arc::new(lc)).unwrap();
    let h = *l.handle();
    assert_eq!(h.decodes, 1);
    let boot = Boot {
        secret: h.secret,
        endpoint: Endpoint { addr: 0, rkey: 0 },
        qps: vec![QpInfo {
            qpn: 1,
            lid: 0,
            mtu: 4096,
            gid: [0; 16],
        }],
        format: 2,
    };
    let mut b = boot.encode();
    assert_eq!(Boot::decode(&b, h.secret).unwrap(), boot);
    let mut old = b.clone();
    old[28..30].fill(0);
    assert_eq!(Boot::decode(&old, h.secret).unwrap().format, 1);
    let mut c = std::net::TcpStream::connect(h.addr).unwrap();
    c.write_all(&b).unwrap();
    let t0 = Instant::now();
    let e = loop {
        match l.accept() {
            Ok(None) => {}
            Ok(Some(_)) => panic!("accepted a connector that writes v2 to a v1 listener"),
            Err(e) => break e,
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "accept hung");
        std::thread::yield_now();
    };
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(
        e.to_string().contains("v2") && e.to_string().contains("v1"),
        "{e}"
    );
    b.clear();
}
