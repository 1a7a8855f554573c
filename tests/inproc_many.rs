//! Many comms at once, as a large job opens them (channels × peers): compressed
//! traffic on all of them together, every comm's staging within its bound, the
//! plugin's totals equal to what the comms hold, and everything given back when
//! the comms close. One test in its own binary: `HELD` is process-wide.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{bf16_gaussian, pair, pattern, transfer_and_check};
use nccl_net_zip::codec::Decoder;
use nccl_net_zip::codec_glue::max_wire;
use nccl_net_zip::stats::{Stats, HELD};

const PAIRS: usize = 40;
const NSTREAMS: usize = 4;
const CHUNK: usize = 256 << 10;

/// Each pair holds 2 × (NSTREAMS data + 1 inline) sockets, plus listeners: more
/// than a default soft limit of 1024 allows for some runners.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn staging(st: &Stats) -> u64 {
    st.staging_bytes.load(Relaxed)
}

#[test]
fn many_comms_bounded_visible_and_released() {
    raise_open_file_limit();
    std::env::set_var("NCCL_ZIP_COMPRESS", "on");
    std::env::set_var("NCCL_ZIP_NSTREAMS", NSTREAMS.to_string());
    std::env::set_var("NCCL_ZIP_CHUNK_SIZE", CHUNK.to_string());
    let pairs: Vec<_> = (0..PAIRS).map(|_| pair()).collect();
    assert_eq!(HELD.comms.load(Relaxed), 2 * PAIRS as u64);
    // Compressed and raw messages on every comm at once, from four threads.
    let msgs = vec![
        bf16_gaussian(1, 1 << 20, 0.02),
        pattern(2, 300_001),
        bf16_gaussian(3, 3 << 20, 1.0),
        vec![0u8; 70_000],
    ];
    std::thread::scope(|sc| {
        for group in pairs.chunks(PAIRS / 4) {
            let msgs = &msgs;
            sc.spawn(move || {
                for (s, r) in group {
                    transfer_and_check(s, r, msgs, 3 << 20);
                }
            });
        }
    });

    // No comm holds an I/O thread of its own: the shared workers drive every
    // comm's data streams (the inline stream is served by the caller's thread).
    assert_eq!(HELD.io_threads.load(Relaxed), 0, "{}", HELD.summary());
    let workers = HELD.io_workers.load(Relaxed) as usize;
    assert!(
        (1..=nccl_net_zip::transport::tcp::workers::count(None)).contains(&workers),
        "{}",
        HELD.summary()
    );

    // Per comm: one compressed chunk's frame per data stream, whatever the traffic,
    // and within the 4 MiB of NCCL's own buffers for a connection.
    let bound = (NSTREAMS * max_wire(CHUNK)) as u64;
    assert!(bound <= 4 << 20);
    let mut sum = 0;
    for (i, (s, r)) in pairs.iter().enumerate() {
        assert!(
            s.stats().chunks_compressed.load(Relaxed) > 0,
            "pair {i}: {}",
            s.stats().summary()
        );
        for st in [s.stats(), r.stats()] {
            assert!(staging(st) <= bound, "pair {i}: {}", st.summary());
            sum += staging(st);
        }
    }
    // What the plugin says it holds is what its comms hold.
    assert_eq!(HELD.staging_bytes.load(Relaxed), sum, "{}", HELD.summary());
    assert!(sum > 0);
    // Decode tables live on the codec workers (one decoder each), which drop
    // them when they run out of work: never more than one decoder's per worker,
    // whatever the number of comms.
    let tables = HELD.decode_tables.load(Relaxed);
    let codec = HELD.codec_workers.load(Relaxed) as usize;
    assert!(codec >= 1, "{}", HELD.summary());
    assert!(
        tables <= (codec * Decoder::MAX_HELD_BYTES) as u64,
        "{}",
        HELD.summary()
    );

    // Closing gives everything back.
    drop(pairs);
    assert_eq!(HELD.comms.load(Relaxed), 0, "{}", HELD.summary());
    assert_eq!(HELD.io_threads.load(Relaxed), 0, "{}", HELD.summary());
    assert_eq!(HELD.staging_bytes.load(Relaxed), 0, "{}", HELD.summary());
    assert_eq!(HELD.decode_tables.load(Relaxed), 0, "{}", HELD.summary());
}
