//! In-process loopback through the plugin's internal API (no dlopen): a fast check
//! of the data path that runs in every `cargo test`. The dlopen, two-process tests
//! are in tests/pair.rs.

mod inproc_util;

use inproc_util::{pair, pattern, transfer_and_check};
use nccl_net_zip::error::Error;

#[test]
fn messages_arrive_bit_exact_with_true_sizes() {
    let (s, r) = pair();
    let sizes = [
        0usize,
        1,
        2,
        3,
        17,
        4095,
        4097,
        65536,
        131072 + 5,
        1 << 20,
        (4 << 20) - 1,
    ];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i as u64, n))
        .collect();
    transfer_and_check(&s, &r, &msgs, 4 << 20);
}
#[test]
fn oversize_message_is_invalid_usage() {
    let (s, r) = pair();
    let msg = pattern(7, 5000);
    let mut buf = vec![0u8; 4096];
    let rq = r.irecv(buf.as_mut_ptr(), buf.len(), None).unwrap().unwrap()
        as *const nccl_net_zip::proto::slots::Slot;
    s.isend(msg.as_ptr(), msg.len(), None).unwrap().unwrap();
    let rq = unsafe { &*rq };
    let t0 = std::time::Instant::now();
    loop {
        match rq.test() {
            Ok(None) => assert!(t0.elapsed().as_secs() < 10, "oversize receive hung"),
            Ok(Some(n)) => panic!("oversize receive completed with {n} bytes"),
            Err(Error::InvalidUsage(m)) => {
                assert!(m.contains("5000") && m.contains("4096"), "{m}");
                break;
            }
            Err(e) => panic!("wrong error {e}"),
        }
    }
    // Let the sender finish or fail before closing; either is fine here.
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(s);
    drop(r);
}
