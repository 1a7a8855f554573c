//! A probe of a small message (`adapt::Decision::Probe`: the policy sends raw
//! but measures the codec after `REPROBE_EVERY` chunks, then after twice as many
//! each time, up to `MAX_REPROBE_EVERY`) runs the codec on the
//! calling thread and the message still goes raw on the inline stream. Through
//! the I/O and codec workers, those thread wake-ups made one message in 65 of an
//! incompressible stream 2-3 times slower (`scripts/bench_latency.sh`, p99 at
//! 4-64 KiB).

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{pair, pattern, transfer_and_check};
use nccl_net_zip::adapt::{MAX_REPROBE_EVERY, REPROBE_EVERY};

#[test]
fn probes_of_small_messages_run_here_and_the_messages_go_inline() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "auto");
    std::env::remove_var("NCCL_ZIP_INLINE_MAX"); // 64 KiB
    let (s, r) = pair();
    // Incompressible 16 KiB messages: the policy bypasses them and probes one
    // after each window of 64 to 1,024, so at least one in this many.
    let n = MAX_REPROBE_EVERY as usize + 2;
    let msgs: Vec<Vec<u8>> = (0..n).map(|i| pattern(7 + i as u64, 16 << 10)).collect();
    let st = s.stats();
    // A warm-up: the policy's learning measures raw first (two epochs of
    // `adapt::EPOCH_BYTES` and at least `adapt::MIN_EPOCH` each), then
    // compression on the workers, whose first chunk replaces the ratio's
    // optimistic prior and closes the gate. Batches of 4 MiB messages until the
    // codec has run (at most 1 GiB).
    let warm_len = 4 << 20;
    let warm: Vec<Vec<u8>> = (0..4).map(|i| pattern(1000 + i as u64, warm_len)).collect();
    let codec0 = st.codec_ns.load(Relaxed);
    for _ in 0..64 {
        transfer_and_check(&s, &r, &warm, warm_len);
        if st.codec_ns.load(Relaxed) > codec0 {
            break;
        }
    }
    let codec1 = st.codec_ns.load(Relaxed);
    assert!(codec1 > codec0, "the warm-up went through the codec");
    let (inline0, bypass0) = (st.chunks_inline.load(Relaxed), st.bypassed.load(Relaxed));
    transfer_and_check(&s, &r, &msgs, 16 << 10);
    let inline = st.chunks_inline.load(Relaxed) - inline0;
    let bypassed = st.bypassed.load(Relaxed) - bypass0;
    // At most one probe per shortest window.
    let most_probes = n as u64 / (REPROBE_EVERY as u64 + 1) + 1;
    assert!(
        bypassed >= n as u64 - most_probes,
        "the policy bypassed only {bypassed} of {n} incompressible messages"
    );
    assert!(
        st.codec_ns.load(Relaxed) > codec1,
        "no probe measured the codec after the warm-up"
    );
    assert_eq!(
        inline, n as u64,
        "every message after the warm-up went inline, probes included"
    );
    assert_eq!(
        st.chunks_compressed.load(Relaxed),
        0,
        "a random chunk came out smaller"
    );
}
