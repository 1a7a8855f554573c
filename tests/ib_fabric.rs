//! The IB protocol against the in-memory RC fabric: transfers of every size,
//! split-send of compressed chunks, out-of-order QPs, credit exhaustion, QP errors
//! and peer loss. Every transfer is checked bit for bit.

use nccl_net_zip::adapt::Policy;
use nccl_net_zip::codec::{DtypeHint, EncodeOptions};
use nccl_net_zip::codec_glue::Coder;
use nccl_net_zip::config::CompressMode;
use nccl_net_zip::error::Error;
use nccl_net_zip::transport::ib::fabric::{Fabric, Mr};
use nccl_net_zip::transport::ib::mem_fabric::{MemFabric, MemNet};
use nccl_net_zip::transport::ib::proto::{Event, Params, Receiver, Sender, MAX_CHUNKS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering::Relaxed;

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

fn coder(mode: CompressMode) -> Coder {
    Coder {
        policy: Policy::new(mode, 100_000, 4),
        opts: EncodeOptions {
            dtype: DtypeHint::Bf16,
            ..EncodeOptions::default()
        },
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
        let seq = self.next_send;
        self.s
            .isend(seq, buf.as_ptr() as u64, buf.len(), mr.lkey)
            .unwrap();
        self.next_send += 1;
        seq
    }

    fn irecv(&mut self, buf: &mut [u8], mr: &Mr) -> u64 {
        let seq = self.next_recv;
        self.r
            .irecv(seq, buf.as_ptr() as u64, buf.len(), mr.rkey)
            .unwrap();
        self.next_recv += 1;
        seq
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
    let mut srcs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            if i % 2 == 0 {
                bf16_data(n, seed + i as u64)
            } else {
                random_bytes(n, seed + i as u64)
            }
        })
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
            pair.irecv(&mut dsts[posted], &rmrs[posted]);
            pair.isend(&mut srcs[posted], &smrs[posted]);
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

#[test]
fn chunks_before_chunk_zero_wait_for_the_info_record() {
    // Small chunks on 4 QPs; run QPs 3, 2, 1 to completion before QP 0, so every
    // chunk except those on QP 0 lands before the info record and chunk 0.
    let p = Params {
        max_chunk: 4096,
        min_chunk: 4096,
        ..Params::default()
    };
    for mode in [CompressMode::Off, CompressMode::On] {
        let mut src = bf16_data(64 << 10, 7);
        let mut dst = vec![0u8; 64 << 10];
        let mut pair = Pair::new(4, p.clone(), mode, 0);
        let (smr, rmr) = (reg(&mut pair.fs, &mut src), reg(&mut pair.fr, &mut dst));
        pair.irecv(&mut dst, &rmr);
        pair.isend(&mut src, &smr);
        let mut ev = Vec::new();
        pair.r.progress(&mut pair.fr, &mut ev).unwrap();
        while pair.net.step(1, 0) {} // the CTS
        pair.s.progress(&mut pair.fs, &mut ev).unwrap();
        for qp in [3, 2, 1] {
            while pair.net.step(0, qp) {}
        }
        pair.r.progress(&mut pair.fr, &mut ev).unwrap();
        assert!(ev.is_empty(), "complete before chunk 0 landed: {ev:?}");
        while pair.net.step(0, 0) {}
        pair.settle();
        pair.recvd.extend(ev.iter().filter_map(|e| match e {
            Event::RecvDone { seq, size } => Some((*seq, *size)),
            _ => None,
        }));
        assert_eq!(pair.recvd, vec![(0, 64 << 10)]);
        assert!(dst == src);
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
        assert!(pair.s.isend(99, 0, 0, 0).is_err());
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
            .irecv(pair.next_recv, d.as_mut_ptr() as u64, d.len(), rmr.rkey)
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
