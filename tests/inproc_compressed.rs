//! The compressed data path in process: NCCL_ZIP_COMPRESS=on, every kind of data,
//! bit-exact, and the wire really carries fewer bytes for float data.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{mixed_messages, pair, transfer_and_check};

#[test]
fn compressed_transfers_are_bit_exact_and_smaller() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "on");
    std::env::set_var("NCCL_ZIP_CHECKSUM", "1");
    let (s, r) = pair();
    let msgs = mixed_messages(&[
        0usize,
        1,
        3,
        4096,
        4097,
        65535,
        131072,
        524288 + 3,
        1 << 20,
        4 << 20,
    ]);
    transfer_and_check(&s, &r, &msgs, 4 << 20);
    let st = r.stats();
    let (raw, wire) = (st.raw_bytes.load(Relaxed), st.wire_bytes.load(Relaxed));
    assert!(
        st.chunks_compressed.load(Relaxed) > 0,
        "nothing was compressed: {}",
        st.summary()
    );
    assert!(
        (wire as f64) < raw as f64 * 0.8,
        "wire {wire} vs raw {raw}: {}",
        st.summary()
    );
}
