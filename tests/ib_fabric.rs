//! The IB protocol against the in-memory RC fabric: transfers of every size,
//! split-send of compressed chunks, out-of-order QPs, credit exhaustion, QP errors
//! and peer loss; device buffers (GPUDirect RDMA) on the emulated GPU backend,
//! with every lane operation counted. Every transfer is checked bit for bit.

use nccl_net_zip::adapt::Policy;
use nccl_net_zip::codec::{DtypeHint, EncodeOptions};
use nccl_net_zip::codec_glue::Coder;
use nccl_net_zip::config::CompressMode;
use nccl_net_zip::error::{Error, Result};
use nccl_net_zip::gpu::{backend_for, Backend, Emulation, Lane};
use nccl_net_zip::transport::ib::fabric::{Fabric, Mr};
use nccl_net_zip::transport::ib::mem_fabric::{MemFabric, MemNet};
use nccl_net_zip::transport::ib::proto::{Coders, Event, Params, Receiver, Sender, MAX_CHUNKS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

type Dev = Option<Arc<dyn Backend>>;

/// Two connected sides and a seeded scheduler that picks which QP moves next, so
/// chunks on different QPs land in a different order from run to run.
struct Pair {
    net: MemNet,
    fs: MemFabric,
    fr: MemFabric,
    s: Sender,
    r: Receiver,
    sent: Vec<u64>,
    recvd: Vec<(u64, usize)>,
    rng: StdRng,
    next_send: u64,
    next_recv: u64,
}

fn coder(mode: CompressMode) -> Coders {
    let c = || Coder {
        policy: Policy::new(mode, Some(100_000), 4),
        opts: EncodeOptions {
            dtype: DtypeHint::Bf16,
            ..EncodeOptions::default()
        },
    };
    Coders {
        host: c(),
        dev: c(),
    }
}

impl Pair {
    fn new(nqps: usize, p: Params, mode: CompressMode, seed: u64) -> Pair {
        let net = MemNet::new(nqps);
        let (mut fs, mut fr) = net.endpoints();
        let mut s = Sender::new(&mut fs, p.clone(), coder(mode)).unwrap();
        let mut r = Receiver::new(&mut fr, p).unwrap();
        s.connect(r.endpoint());
        r.connect(s.endpoint());
        Pair {
            net,
            fs,
            fr,
            s,
            r,
            sent: vec![],
            recvd: vec![],
            rng: StdRng::seed_from_u64(seed),
            next_send: 0,
            next_recv: 0,
        }
    }

    fn isend(&mut self, buf: &mut [u8], mr: &Mr) -> u64 {
        self.isend_on(buf, mr, None)
    }

    fn irecv(&mut self, buf: &mut [u8], mr: &Mr) -> u64 {
        self.irecv_on(buf, mr, None)
    }

    /// `buf` is (emulated) device memory of `dev` when given.
    fn isend_on(&mut self, buf: &mut [u8], mr: &Mr, dev: Dev) -> u64 {
        let seq = self.next_send;
        self.s
            .isend(seq, buf.as_ptr() as u64, buf.len(), mr.lkey, dev)
            .unwrap();
        self.next_send += 1;
        seq
    }

    fn irecv_on(&mut self, buf: &mut [u8], mr: &Mr, dev: Dev) -> u64 {
        let seq = self.next_recv;
        self.r
            .irecv(seq, buf.as_ptr() as u64, buf.len(), mr.rkey, dev)
            .unwrap();
        self.next_recv += 1;
        seq
    }

    /// The receiver writes its CTS, which lands (QP 0); the sender then queues
    /// the message's writes without executing them.
    fn land_cts(&mut self, ev: &mut Vec<Event>) {
        self.r.progress(&mut self.fr, ev).unwrap();
        while self.net.step(1, 0) {}
        self.s.progress(&mut self.fs, ev).unwrap();
    }

    /// One round: both sides make progress, then one random busy QP executes a write.
    /// Returns (sender result, receiver result, whether anything was executed).
    fn round(&mut self) -> (Result<(), Error>, Result<(), Error>, bool) {
        let mut ev = Vec::new();
        let a = self.s.progress(&mut self.fs, &mut ev);
        let b = self.r.progress(&mut self.fr, &mut ev);
        for e in ev {
            match e {
                Event::SendDone { seq } => self.sent.push(seq),
                Event::RecvDone { seq, size } => self.recvd.push((seq, size)),
            }
        }
        let busy = self.net.busy();
        let moved = if busy.is_empty() {
            false
        } else {
            let (side, qp) = busy[self.rng.gen_range(0..busy.len())];
            self.net.step(side, qp)
        };
        (a, b, moved)
    }

    /// Runs until nothing moves; panics on any error.
    fn settle(&mut self) {
        let mut idle = 0;
        while idle < 3 {
            let (a, b, moved) = self.round();
            a.expect("sender failed");
            b.expect("receiver failed");
            idle = if moved { 0 } else { idle + 1 };
        }
    }

    /// Runs until nothing moves or a side fails; returns both sides' last results.
    fn settle_errors(&mut self) -> (Result<(), Error>, Result<(), Error>) {
        let mut idle = 0;
        let mut last = (Ok(()), Ok(()));
        while idle < 3 {
            let (a, b, moved) = self.round();
            idle = if moved { 0 } else { idle + 1 };
            last = (a, b);
        }
        last
    }
}

fn reg(f: &mut MemFabric, b: &mut [u8]) -> Mr {
    // SAFETY: every buffer outlives its fabric in these tests (declared first).
    unsafe { f.reg_mr(b.as_mut_ptr(), b.len()).unwrap() }
}

/// bf16 values of a Gaussian: compressible (about 1.5x), never trivially so.
fn bf16_data(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let (u1, u2): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
        let g = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos() * 0.02;
        v.extend_from_slice(&g.to_bits().to_le_bytes()[2..4]);
    }
    v.truncate(n);
    v
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen()).collect()
}

/// Sends `sizes` (receives posted with `cap` = size + slack) and checks every byte.
fn transfer(nqps: usize, p: Params, mode: CompressMode, sizes: &[usize], seed: u64) -> Pair {
    transfer_on(nqps, p, mode, sizes, seed, None, None, |i, n, seed| {
        if i.is_multiple_of(2) {
            bf16_data(n, seed + i as u64)
        } else {
            random_bytes(n, seed + i as u64)
        }
    })
}

/// [`transfer`] with the send buffers in device memory of `sdev` and the receive
/// buffers in device memory of `rdev` (when given), and message `i` of `n` bytes
/// made by `data(i, n, seed)`.
#[allow(clippy::too_many_arguments)]
fn transfer_on(
    nqps: usize,
    p: Params,
    mode: CompressMode,
    sizes: &[usize],
    seed: u64,
    sdev: Dev,
    rdev: Dev,
    data: impl Fn(usize, usize, u64) -> Vec<u8>,
) -> Pair {
    let mut srcs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| data(i, n, seed))
        .collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xA5; n + 100]).collect();
    let mut pair = Pair::new(nqps, p, mode, seed);
    let smrs: Vec<Mr> = srcs.iter_mut().map(|b| reg(&mut pair.fs, b)).collect();
    let rmrs: Vec<Mr> = dsts.iter_mut().map(|b| reg(&mut pair.fr, b)).collect();
    // Interleave posting with progress: at most 32 requests in flight per side.
    let mut posted = 0;
    let mut done = 0;
    while done < sizes.len() {
        while posted < sizes.len() && posted - pair.sent.len().min(pair.recvd.len()) < 32 {
            pair.irecv_on(&mut dsts[posted], &rmrs[posted], rdev.clone());
            pair.isend_on(&mut srcs[posted], &smrs[posted], sdev.clone());
            posted += 1;
        }
        pair.settle();
        done = pair.sent.len().min(pair.recvd.len());
        assert!(done == posted, "stalled at {done}/{posted}");
    }
    let mut recvd = pair.recvd.clone();
    recvd.sort();
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(recvd[i], (i as u64, n), "reported size of message {i}");
        assert!(
            dsts[i][..n] == srcs[i][..],
            "message {i} ({n} bytes) differs"
        );
        assert!(
            dsts[i][n..].iter().all(|&b| b == 0xA5),
            "message {i} wrote past its end"
        );
    }
    assert_eq!(pair.s.pending(), 0);
    assert_eq!(pair.r.pending(), 0);
    pair
}

const ODD_SIZES: &[usize] = &[
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
    65543,
    128 << 10,
    614_400,
    1 << 20,
    (1 << 20) + 3,
];

#[test]
fn normal_transfer_raw() {
    let p = transfer(4, Params::default(), CompressMode::Off, &[512 << 10; 20], 1);
    let st = &p.s.stats;
    assert_eq!(st.chunks_compressed.load(Relaxed), 0);
    assert_eq!(st.messages.load(Relaxed), 20);
}

#[test]
fn split_send_compressed_subchunks() {
    let sizes = [512 << 10, 1 << 20, 256 << 10, 128 << 10];
    let p = transfer(4, Params::default(), CompressMode::On, &sizes, 2);
    let (s, r) = (&p.s.stats, &p.r.stats);
    // Even-indexed messages are bf16: their chunks must go compressed, several per
    // message (split-send), and the wire must carry fewer bytes than the data.
    let compressed = s.chunks_compressed.load(Relaxed);
    assert!(compressed >= 8, "only {compressed} compressed chunks");
    assert_eq!(compressed, r.chunks_compressed.load(Relaxed));
    let raw: usize = sizes.iter().sum();
    assert!(
        (s.wire_bytes.load(Relaxed) as usize) < raw * 9 / 10,
        "{}",
        s.summary()
    );
    assert_eq!(r.raw_bytes.load(Relaxed) as usize, raw);
    // The registered buffers are counted: the receiver's staging slots, the
    // sender's compression outputs (each holds one chunk's largest frame).
    let pp = Params::default();
    let staged = r.staging_bytes.load(Relaxed) as usize;
    assert!(staged >= pp.stage_slots * pp.stage_bytes, "{}", r.summary());
    let sent = s.staging_bytes.load(Relaxed) as usize;
    assert!(sent >= pp.send_bufs * pp.max_chunk, "{}", s.summary());
}

#[test]
fn all_sizes_every_qp_count_and_schedule() {
    for nqps in 1..=4 {
        for (k, mode) in [CompressMode::Off, CompressMode::On]
            .into_iter()
            .enumerate()
        {
            for seed in 0..3 {
                transfer(
                    nqps,
                    Params::default(),
                    mode,
                    ODD_SIZES,
                    seed * 10 + k as u64 + nqps as u64 * 100,
                );
            }
        }
    }
}

/// Posts one 64 KiB message of `src` (receive and send buffers on `rdev` and
/// `sdev`), runs QPs 3, 2, 1 to completion before QP 0, so every chunk except
/// those on QP 0 lands before the info record and chunk 0, checks that nothing
/// completed, runs `early` (more checks at that point), then lands QP 0 and checks
/// the message arrived whole.
fn land_before_chunk_zero(
    mut pair: Pair,
    mut src: Vec<u8>,
    rdev: Dev,
    sdev: Dev,
    early: impl FnOnce(),
) -> Pair {
    let mut dst = vec![0u8; src.len()];
    let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
    pair.irecv_on(&mut dst, &rmr, rdev);
    pair.isend_on(&mut src, &smr, sdev);
    let mut ev = Vec::new();
    pair.land_cts(&mut ev);
    for qp in [3, 2, 1] {
        while pair.net.step(0, qp) {}
    }
    pair.r.progress(&mut pair.fr, &mut ev).unwrap();
    assert!(ev.is_empty(), "complete before chunk 0 landed: {ev:?}");
    early();
    while pair.net.step(0, 0) {}
    pair.settle();
    pair.recvd.extend(ev.iter().filter_map(|e| match e {
        Event::RecvDone { seq, size } => Some((*seq, *size)),
        _ => None,
    }));
    assert_eq!(pair.recvd, vec![(0, src.len())]);
    assert!(dst == src);
    pair
}

#[test]
fn chunks_before_chunk_zero_wait_for_the_info_record() {
    // Small chunks on 4 QPs, host memory, raw and compressed.
    for mode in [CompressMode::Off, CompressMode::On] {
        let pair = Pair::new(4, small_chunks(), mode, 0);
        land_before_chunk_zero(pair, bf16_data(64 << 10, 7), None, None, || {});
    }
}

#[test]
fn credit_exhaustion_more_isends_than_cts() {
    // 2 staging slots = 2 CTS credits; 12 messages posted at once on both sides.
    let p = Params {
        stage_slots: 2,
        stage_bytes: 256 << 10,
        ..Params::default()
    };
    let n = 12;
    let mut srcs: Vec<Vec<u8>> = (0..n)
        .map(|i| bf16_data(200_000 + i * 1000, i as u64))
        .collect();
    let mut dsts: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 256 << 10]).collect();
    let mut pair = Pair::new(2, p, CompressMode::On, 3);
    let smrs: Vec<Mr> = srcs.iter_mut().map(|b| reg(&mut pair.fs, b)).collect();
    let rmrs: Vec<Mr> = dsts.iter_mut().map(|b| reg(&mut pair.fr, b)).collect();
    for i in 0..n {
        pair.isend(&mut srcs[i], &smrs[i]);
    }
    // Only 3 receives posted: the sender must wait for CTS, not fail or overrun.
    for i in 0..3 {
        pair.irecv(&mut dsts[i], &rmrs[i]);
    }
    pair.settle();
    assert_eq!(pair.recvd.len(), 3);
    assert_eq!(pair.sent.len(), 3);
    assert_eq!(pair.s.pending(), n - 3, "the rest wait for CTS entries");
    for i in 3..n {
        pair.irecv(&mut dsts[i], &rmrs[i]);
    }
    pair.settle();
    assert_eq!(pair.recvd.len(), n);
    for i in 0..n {
        assert!(dsts[i][..srcs[i].len()] == srcs[i][..], "message {i}");
    }
}

#[test]
fn slow_receiver_never_runs_out_of_posted_receives() {
    // The model fails a write-with-immediate that finds no posted receive (RNR).
    // Let the sender run far ahead of a receiver that polls only rarely.
    let p = Params {
        max_chunk: 4096,
        min_chunk: 4096,
        stage_slots: 4,
        ..Params::default()
    };
    let n = 16;
    let mut srcs: Vec<Vec<u8>> = (0..n)
        .map(|i| random_bytes(MAX_CHUNKS * 4096, i as u64))
        .collect();
    let mut dsts: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; MAX_CHUNKS * 4096]).collect();
    let mut pair = Pair::new(1, p, CompressMode::Off, 4);
    let smrs: Vec<Mr> = srcs.iter_mut().map(|b| reg(&mut pair.fs, b)).collect();
    let rmrs: Vec<Mr> = dsts.iter_mut().map(|b| reg(&mut pair.fr, b)).collect();
    for i in 0..n {
        pair.irecv(&mut dsts[i], &rmrs[i]);
        pair.isend(&mut srcs[i], &smrs[i]);
    }
    let mut ev = Vec::new();
    for round in 0..20_000 {
        pair.s.progress(&mut pair.fs, &mut ev).unwrap();
        if round % 500 == 0 {
            pair.r.progress(&mut pair.fr, &mut ev).unwrap();
        }
        pair.net.run();
    }
    pair.settle();
    let recvd = ev
        .iter()
        .filter(|e| matches!(e, Event::RecvDone { .. }))
        .count()
        + pair.recvd.len();
    assert_eq!(recvd, n);
    for i in 0..n {
        assert!(dsts[i] == srcs[i], "message {i}");
    }
}

#[test]
fn small_send_queue_paces_posting() {
    let p = Params {
        max_chunk: 4096,
        min_chunk: 4096,
        sq_depth: 3,
        ..Params::default()
    };
    transfer(
        2,
        p,
        CompressMode::On,
        &[64 << 10, 100_000, 0, 5, 64 << 10],
        5,
    );
}

#[test]
fn oversized_message_is_invalid_usage() {
    let mut src = random_bytes(5000, 1);
    let mut dst = vec![0u8; 4000];
    let mut pair = Pair::new(2, Params::default(), CompressMode::Off, 6);
    let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
    pair.irecv(&mut dst, &rmr);
    pair.isend(&mut src, &smr);
    let (a, _) = pair.settle_errors();
    assert!(matches!(a, Err(Error::InvalidUsage(_))), "{a:?}");
    assert!(dst.iter().all(|&b| b == 0), "nothing may be written");
}

/// 4 KiB chunks: a 64 KiB message has 16, spread over the QPs.
fn small_chunks() -> Params {
    Params {
        max_chunk: 4096,
        min_chunk: 4096,
        ..Params::default()
    }
}

/// A pair whose one 64 KiB bf16 message (small chunks, 4 QPs) has its CTS
/// landed and every write queued, none executed. Fields drop in order: the
/// fabrics before the buffers they registered (so keep it whole and use
/// `.pair`: destructuring it would free the buffers first).
struct Queued {
    pair: Pair,
    _src: Vec<u8>,
    _dst: Vec<u8>,
}

fn queued_message(mode: CompressMode, seed: u64) -> Queued {
    let mut pair = Pair::new(4, small_chunks(), mode, seed);
    let mut src = bf16_data(64 << 10, seed + 8);
    let mut dst = vec![0u8; src.len()];
    let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
    pair.irecv(&mut dst, &rmr);
    pair.isend(&mut src, &smr);
    pair.land_cts(&mut Vec::new());
    Queued {
        pair,
        _src: src,
        _dst: dst,
    }
}

#[test]
fn a_chunk_that_comes_twice_fails_the_receive() {
    // One 64 KiB message in 4 KiB chunks on 4 QPs, raw and compressed: a data
    // write delivered twice (a broken sender; RC never does it) must fail the
    // receiver, not complete the message with another chunk's bytes missing.
    for mode in [CompressMode::Off, CompressMode::On] {
        let mut q = queued_message(mode, 3);
        let pair = &mut q.pair;
        // QP 1 carries data chunks only (the info record rides with chunk 0).
        assert!(pair.net.duplicate_front(0, 1), "no write queued on QP 1");
        let (_, b) = pair.settle_errors();
        assert!(
            matches!(b, Err(Error::Remote(ref m)) if m.contains("twice")),
            "{mode:?}: {b:?}"
        );
        assert!(
            pair.recvd.is_empty(),
            "{mode:?}: completed: {:?}",
            pair.recvd
        );
    }
}

#[test]
fn chunks_before_chunk_zero_are_bounded() {
    // A broken sender that repeats a chunk before chunk 0 (and its info record)
    // lands: the receiver keeps such chunks for later, but never more than a
    // message can have.
    let mut q = queued_message(CompressMode::Off, 5);
    let pair = &mut q.pair;
    for _ in 0..MAX_CHUNKS {
        assert!(pair.net.duplicate_front(0, 1), "no write queued on QP 1");
    }
    while pair.net.step(0, 1) {}
    let mut ev = Vec::new();
    let mut r = Ok(());
    for _ in 0..100 {
        r = pair.r.progress(&mut pair.fr, &mut ev);
        if r.is_err() {
            break;
        }
    }
    assert!(
        matches!(r, Err(Error::Remote(ref m)) if m.contains("before its chunk 0")),
        "{r:?}"
    );
    assert!(ev.is_empty(), "completed: {ev:?}");
}

/// Starts a 4-message transfer and executes `steps` writes of it.
fn half_done(steps: usize, seed: u64) -> (Pair, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let p = Params {
        max_chunk: 16 << 10,
        min_chunk: 16 << 10,
        ..Params::default()
    };
    let mut srcs: Vec<Vec<u8>> = (0..4).map(|i| bf16_data(256 << 10, i)).collect();
    let mut dsts: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 256 << 10]).collect();
    let mut pair = Pair::new(3, p, CompressMode::On, seed);
    for i in 0..4 {
        let (smr, rmr) = (
            reg(&mut pair.fs, &mut srcs[i]),
            reg(&mut pair.fr, &mut dsts[i]),
        );
        pair.irecv(&mut dsts[i], &rmr);
        pair.isend(&mut srcs[i], &smr);
    }
    for _ in 0..steps {
        let (a, b, _) = pair.round();
        a.unwrap();
        b.unwrap();
    }
    assert!(
        pair.sent.len() < 4,
        "transfer finished too early for the test"
    );
    (pair, srcs, dsts)
}

#[test]
fn qp_error_mid_transfer_fails_both_sides() {
    for seed in 0..4 {
        let (mut pair, _s, _d) = half_done(30, seed);
        pair.net.inject_qp_error(0, 1);
        let (a, _) = pair.settle_errors();
        assert!(
            matches!(a, Err(Error::Remote(ref m)) if m.contains("flushed") || m.contains("retries")),
            "{a:?}"
        );
        // A failed side refuses new work with the same error.
        assert!(pair.s.isend(99, 0, 0, 0, None).is_err());
        // The receiver's QP 1 is healthy but its peer's is not: the receiver learns
        // of it when the sender side is torn down and its next CTS write fails.
        pair.net.lose(0);
        let mut d = vec![0u8; 10];
        let rmr = reg(&mut pair.fr, &mut d);
        pair.irecv(&mut d, &rmr);
        let (_, b) = pair.settle_errors();
        assert!(matches!(b, Err(Error::Remote(_))), "{b:?}");
    }
}

#[test]
fn qp_error_on_receiver_flushes_its_receives() {
    let (mut pair, _s, _d) = half_done(30, 9);
    pair.net.inject_qp_error(1, 2);
    let (a, b) = pair.settle_errors();
    assert!(
        matches!(b, Err(Error::Remote(ref m)) if m.contains("flushed")),
        "{b:?}"
    );
    // The sender's next write on QP 2 meets a QP in the error state.
    assert!(matches!(a, Err(Error::Remote(_))), "{a:?}");
    assert!(pair.recvd.len() < 4);
}

#[test]
fn peer_loss_fails_pending_requests() {
    // Receiver vanishes: the sender's outstanding writes exceed their retries.
    let (mut pair, _s, _d) = half_done(25, 11);
    pair.net.lose(1);
    let (a, _) = pair.settle_errors();
    assert!(
        matches!(a, Err(Error::Remote(ref m)) if m.contains("unreachable")),
        "{a:?}"
    );
    // Sender vanishes before it wrote anything for a new receive: the receiver's
    // CTS write fails.
    let (mut pair, _s, _d) = half_done(25, 12);
    pair.net.lose(0);
    let mut d = vec![0u8; 10];
    let rmr = reg(&mut pair.fr, &mut d);
    for _ in 0..28 {
        pair.r
            .irecv(
                pair.next_recv,
                d.as_mut_ptr() as u64,
                d.len(),
                rmr.rkey,
                None,
            )
            .unwrap();
        pair.next_recv += 1;
    }
    let (_, b) = pair.settle_errors();
    assert!(
        matches!(b, Err(Error::Remote(ref m)) if m.contains("unreachable")),
        "{b:?}"
    );
}

#[test]
fn close_deregisters_everything() {
    let mut pair = transfer(2, Params::default(), CompressMode::On, &[1000, 70_000], 13);
    let Pair {
        s,
        r,
        mut fs,
        mut fr,
        ..
    } = pair_take(&mut pair);
    s.close(&mut fs).unwrap();
    r.close(&mut fr).unwrap();
}

fn pair_take(p: &mut Pair) -> Pair {
    let fresh = Pair::new(1, Params::default(), CompressMode::Off, 0);
    std::mem::replace(p, fresh)
}

// ---------------------------------------------------------------------------
// Device buffers (GPUDirect RDMA) on the emulated GPU backend

/// What the lanes of one [`Counting`] backend did.
#[derive(Default, Debug)]
struct Counts {
    lanes: AtomicUsize,
    encode: AtomicUsize,
    decode: AtomicUsize,
    download: AtomicUsize,
    upload: AtomicUsize,
    upload_from: AtomicUsize,
    flush: AtomicUsize,
}

impl Counts {
    fn get(&self, c: &AtomicUsize) -> usize {
        c.load(Relaxed)
    }
}

/// The emulated backend (`Emulation::Kernels` or `NoKernels`) with every lane
/// operation counted, so a test can tell the device path from the host path
/// (emulated device memory is host memory: the bytes alone cannot).
struct Counting {
    inner: Arc<dyn Backend>,
    c: Arc<Counts>,
    fail_encode: AtomicBool,
}

fn counting(emu: Emulation) -> (Arc<dyn Backend>, Arc<Counts>) {
    let c = Arc::new(Counts::default());
    let b = Arc::new(Counting {
        inner: backend_for(0, emu).unwrap(),
        c: c.clone(),
        fail_encode: AtomicBool::new(false),
    });
    (b, c)
}

impl Backend for Counting {
    fn describe(&self) -> String {
        format!("counting {}", self.inner.describe())
    }
    fn lane<'a>(&self, max_wire: usize, counter: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>> {
        self.c.lanes.fetch_add(1, Relaxed);
        Ok(Box::new(CountingLane {
            inner: self.inner.lane(max_wire, counter)?,
            c: self.c.clone(),
            fail_encode: self.fail_encode.load(Relaxed),
        }))
    }
    fn flush_rdma_writes(&self) -> Result<()> {
        self.c.flush.fetch_add(1, Relaxed);
        Ok(())
    }
}

struct CountingLane<'a> {
    inner: Box<dyn Lane + 'a>,
    c: Arc<Counts>,
    fail_encode: bool,
}

impl Lane for CountingLane<'_> {
    fn staging(&mut self, len: usize) -> Result<&mut [u8]> {
        self.inner.staging(len)
    }
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.inner.bytes(off, len)
    }
    fn kernels(&self) -> bool {
        self.inner.kernels()
    }
    fn download(&mut self, src: u64, len: usize) -> Result<()> {
        self.c.download.fetch_add(1, Relaxed);
        self.inner.download(src, len)
    }
    fn upload(&mut self, dst: u64, len: usize) -> Result<()> {
        self.c.upload.fetch_add(1, Relaxed);
        self.inner.upload(dst, len)
    }
    fn upload_from(&mut self, dst: u64, src: &[u8]) -> Result<()> {
        self.c.upload_from.fetch_add(1, Relaxed);
        self.inner.upload_from(dst, src)
    }
    fn encode(&mut self, src: u64, len: usize, opts: &EncodeOptions) -> Result<usize> {
        self.c.encode.fetch_add(1, Relaxed);
        if self.fail_encode {
            return Err(Error::Cuda("injected encode failure".into()));
        }
        self.inner.encode(src, len, opts)
    }
    fn decode(&mut self, frame_len: usize, dst: u64, cap: usize) -> Result<usize> {
        self.c.decode.fetch_add(1, Relaxed);
        self.inner.decode(frame_len, dst, cap)
    }
}

fn mixed_data(i: usize, n: usize, seed: u64) -> Vec<u8> {
    if i.is_multiple_of(2) {
        bf16_data(n, seed + i as u64)
    } else {
        random_bytes(n, seed + i as u64)
    }
}

#[test]
fn device_buffers_every_mix_raw_and_compressed_bit_exact() {
    for emu in [Emulation::Kernels, Emulation::NoKernels] {
        for (sd, rd) in [(true, false), (false, true), (true, true)] {
            for mode in [CompressMode::Off, CompressMode::On] {
                let name = format!(
                    "{emu:?} {} -> {} {mode:?}",
                    if sd { "device" } else { "host" },
                    if rd { "device" } else { "host" }
                );
                let (sb, sc) = counting(emu);
                let (rb, rc) = counting(emu);
                let p = transfer_on(
                    2,
                    Params::default(),
                    mode,
                    ODD_SIZES,
                    7 + sd as u64 * 2 + rd as u64,
                    sd.then(|| sb.clone()),
                    rd.then(|| rb.clone()),
                    mixed_data,
                );
                let (s, r) = (&p.s.stats, &p.r.stats);
                let nonempty = ODD_SIZES.iter().filter(|&&n| n > 0).count();
                // Every non-empty message has at least one chunk of device memory.
                let (sdev, rdev) = (s.chunks_device.load(Relaxed), r.chunks_device.load(Relaxed));
                assert_eq!(
                    sdev >= nonempty as u64,
                    sd,
                    "{name}: {sdev} device chunks sent"
                );
                assert_eq!(sdev > 0, sd, "{name}");
                assert_eq!(
                    rdev >= nonempty as u64,
                    rd,
                    "{name}: {rdev} device chunks received"
                );
                assert_eq!(rdev > 0, rd, "{name}");
                if sd && rd {
                    assert_eq!(sdev, rdev, "{name}: both sides count every chunk");
                }
                let cs = s.chunks_compressed.load(Relaxed);
                let kernels = emu == Emulation::Kernels;
                if mode == CompressMode::Off {
                    assert_eq!(cs, 0, "{name}");
                    assert_eq!(
                        sc.get(&sc.lanes) + rc.get(&rc.lanes),
                        0,
                        "{name}: raw needs no lane"
                    );
                    continue;
                }
                assert!(cs >= 8, "{name}: only {cs} compressed chunks");
                assert_eq!(cs, r.chunks_compressed.load(Relaxed), "{name}");
                assert!(
                    (s.wire_bytes.load(Relaxed) as f64) < 0.9 * s.raw_bytes.load(Relaxed) as f64,
                    "{name}: {}",
                    s.summary()
                );
                // Sender: each compressed chunk of device memory was encoded by the
                // lane (or copied down for the CPU codec); raw chunks went by GDR,
                // never copied.
                if sd {
                    assert_eq!(sc.get(&sc.lanes), 1, "{name}: one lane per side");
                    if kernels {
                        assert!(sc.get(&sc.encode) as u64 >= cs, "{name}: {:?}", sc);
                        assert_eq!(sc.get(&sc.download), 0, "{name}: raw chunks copied");
                    } else {
                        assert_eq!(sc.get(&sc.encode), 0, "{name}");
                        assert!(sc.get(&sc.download) as u64 >= cs, "{name}: {:?}", sc);
                    }
                    assert!(p.s.has_lane());
                } else {
                    assert_eq!(sc.get(&sc.lanes), 0, "{name}");
                    assert!(!p.s.has_lane());
                }
                // Receiver: exactly the compressed chunks went through the lane.
                if rd {
                    assert_eq!(rc.get(&rc.lanes), 1, "{name}");
                    let placed = if kernels { &rc.decode } else { &rc.upload_from };
                    assert_eq!(rc.get(placed) as u64, cs, "{name}: {:?}", rc);
                    assert_eq!(rc.get(&rc.upload), 0, "{name}: raw chunks land by GDR");
                    assert!(p.r.has_lane());
                } else {
                    assert_eq!(rc.get(&rc.lanes), 0, "{name}");
                    assert!(!p.r.has_lane());
                }
                eprintln!("{name}: sender {sc:?}, receiver {rc:?}, {}", s.summary());
            }
        }
    }
}

#[test]
fn device_frames_that_do_not_shrink_go_raw_from_device_memory() {
    let (sb, sc) = counting(Emulation::Kernels);
    let (rb, rc) = counting(Emulation::Kernels);
    let sizes = [4096, 65536, 300_000, (1 << 20) + 3];
    let p = transfer_on(
        3,
        Params::default(),
        CompressMode::On,
        &sizes,
        21,
        Some(sb),
        Some(rb),
        |i, n, seed| random_bytes(n, seed + i as u64),
    );
    let s = &p.s.stats;
    assert!(sc.get(&sc.encode) > 0, "the lane tried: {sc:?}");
    assert_eq!(s.chunks_compressed.load(Relaxed), 0);
    assert_eq!(s.wire_bytes.load(Relaxed), s.raw_bytes.load(Relaxed));
    assert_eq!(
        sc.get(&sc.download),
        0,
        "a STORED frame is dropped, not sent"
    );
    assert_eq!(rc.get(&rc.decode) + rc.get(&rc.upload_from), 0);
}

#[test]
fn failed_gpu_encode_sends_device_chunks_raw() {
    let c = Arc::new(Counts::default());
    let sb: Arc<dyn Backend> = Arc::new(Counting {
        inner: backend_for(0, Emulation::Kernels).unwrap(),
        c: c.clone(),
        fail_encode: AtomicBool::new(true),
    });
    let sizes = [100_000, 1 << 20];
    let p = transfer_on(
        2,
        Params::default(),
        CompressMode::On,
        &sizes,
        22,
        Some(sb),
        None,
        |i, n, seed| bf16_data(n, seed + i as u64),
    );
    assert!(c.get(&c.encode) > 0);
    assert_eq!(p.s.stats.chunks_compressed.load(Relaxed), 0);
}

/// A backend whose lanes cannot be made (out of pinned memory, a CUDA error).
struct NoLanes;
impl Backend for NoLanes {
    fn describe(&self) -> String {
        "no lanes".into()
    }
    fn lane<'a>(&self, _: usize, _: &'a AtomicU64) -> Result<Box<dyn Lane + 'a>> {
        Err(Error::Cuda(
            "cuMemHostAlloc: out of memory (injected)".into(),
        ))
    }
}

#[test]
fn device_lane_failure_fails_the_side_with_the_cuda_error() {
    // Receiver: a compressed chunk for device memory it cannot decode.
    let mut src = bf16_data(200_000, 5);
    let mut dst = vec![0u8; 200_000];
    let mut pair = Pair::new(2, Params::default(), CompressMode::On, 23);
    let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
    pair.irecv_on(&mut dst, &rmr, Some(Arc::new(NoLanes)));
    pair.isend(&mut src, &smr);
    let (_, b) = pair.settle_errors();
    assert!(
        matches!(b, Err(Error::Cuda(ref m)) if m.contains("injected")),
        "{b:?}"
    );
    assert!(pair.recvd.is_empty());
    // Sender: the chunk it wants to compress.
    let mut src = bf16_data(200_000, 6);
    let mut dst = vec![0u8; 200_000];
    let mut pair = Pair::new(2, Params::default(), CompressMode::On, 24);
    let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
    pair.irecv(&mut dst, &rmr);
    pair.isend_on(&mut src, &smr, Some(Arc::new(NoLanes)));
    let (a, _) = pair.settle_errors();
    assert!(matches!(a, Err(Error::Cuda(_))), "{a:?}");
    // Raw traffic needs no lane: GDR only.
    let mut src = bf16_data(200_000, 7);
    let mut dst = vec![0u8; 200_000];
    let mut pair = Pair::new(2, Params::default(), CompressMode::Off, 25);
    let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
    pair.irecv_on(&mut dst, &rmr, Some(Arc::new(NoLanes)));
    pair.isend_on(&mut src, &smr, Some(Arc::new(NoLanes)));
    pair.settle();
    assert_eq!(pair.recvd, vec![(0, 200_000)]);
    assert!(dst == src);
}

#[test]
fn device_chunks_before_chunk_zero_wait_for_the_info_record() {
    // As chunks_before_chunk_zero_wait_for_the_info_record, into device memory:
    // compressed chunks that land early are decoded by the lane later.
    let p = Params {
        max_chunk: 4096,
        min_chunk: 4096,
        send_bufs: 32,
        ..Params::default()
    };
    let (rb, rc) = counting(Emulation::Kernels);
    let (sb, sc) = counting(Emulation::Kernels);
    let pair = Pair::new(4, p, CompressMode::On, 0);
    let pair = land_before_chunk_zero(pair, bf16_data(64 << 10, 8), Some(rb), Some(sb), || {
        assert_eq!(
            rc.get(&rc.decode),
            0,
            "nothing decoded before the info record"
        )
    });
    let cs = pair.r.stats.chunks_compressed.load(Relaxed);
    assert!(cs >= 12, "{cs} of 16 chunks compressed");
    assert_eq!(rc.get(&rc.decode) as u64, cs);
    assert!(sc.get(&sc.encode) as u64 >= cs);
}

/// A sender that writes a codec format above the one its receiver agreed to
/// (issue 19 item 10) fails the receive with an error that says so, before any
/// decoder sees the frame; once the receiver has agreed to it, the same traffic
/// goes through.
#[test]
fn frames_above_the_agreed_format_fail_the_receive() {
    for agreed in [1u8, 2] {
        // Declared before the fabrics, so they outlive their registrations.
        let mut src = bf16_data(256 << 10, 3);
        let mut dst = vec![0u8; 256 << 10];
        let net = MemNet::new(1);
        let (mut fs, mut fr) = net.endpoints();
        let mut c = coder(CompressMode::On);
        c.host.opts.format = 2;
        c.dev.opts.format = 2;
        let mut s = Sender::new(&mut fs, Params::default(), c).unwrap();
        let mut r = Receiver::new(&mut fr, Params::default()).unwrap();
        s.connect(r.endpoint());
        r.connect(s.endpoint());
        r.agree_format(agreed);
        let mut p = Pair {
            net,
            fs,
            fr,
            s,
            r,
            sent: vec![],
            recvd: vec![],
            rng: StdRng::seed_from_u64(5),
            next_send: 0,
            next_recv: 0,
        };
        let (ms, mr) = (reg(&mut p.fs, &mut src), reg(&mut p.fr, &mut dst));
        p.isend(&mut src, &ms);
        p.irecv(&mut dst, &mr);
        let mut err = None;
        for _ in 0..100_000 {
            let (a, b, moved) = p.round();
            a.expect("sender");
            if let Err(e) = b {
                err = Some(e);
                break;
            }
            if !moved && !p.recvd.is_empty() {
                break;
            }
        }
        match agreed {
            1 => {
                let e = err.expect("a v2 frame to a v1 receiver must fail");
                assert!(matches!(e, Error::Remote(_)), "{e}");
                assert!(e.to_string().contains("agreed on v1"), "{e}");
            }
            _ => {
                assert!(err.is_none(), "{err:?}");
                assert_eq!(p.recvd, vec![(0, 256 << 10)]);
                assert!(dst == src, "v2 frames decode bit for bit");
            }
        }
    }
}
