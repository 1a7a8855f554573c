//! The TCP data path with real CUDA buffers (NCCL_PTR_CUDA): device memory on both
//! sides, staged through the CUDA lanes (GPU kernels, pinned mapped staging),
//! bit-exact, in process. Prints "SKIP: <reason>" and passes without a usable GPU.
//! scripts/gpu_validate.sh runs it on the GPU machine.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use inproc_util::{bf16_gaussian, pair, pattern};
use nccl_net_zip::gpu::{backend_for, DeviceBuffer, Emulation};
use nccl_net_zip::proto::slots::Slot;

fn context() -> Option<Arc<CudaContext>> {
    nccl_net_zip::gpu::driver::open_context(0)
        .map_err(|u| eprintln!("SKIP: {u}"))
        .ok()
}

/// Ends the process (status 3) after one clear line. A request that never completes
/// (or fails) may have a GPU lane's kernel or copy still queued: a panic would
/// unwind through the test's device buffers, whose `cuMemFree` waits for that work,
/// and the binary would sit until the caller's time limit. `_exit` skips atexit
/// handlers (the CUDA driver's teardown could wait as well).
fn exit_now(why: &str) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    eprintln!(
        "DATA PATH DID NOT FINISH: test cuda_buffers_through_the_gpu_codec_bit_exact, \
         {why}; exiting with status 3"
    );
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process at once; nothing is shared with other processes.
    unsafe { libc::_exit(3) }
}

fn wait(slot: *const Slot, what: &str) -> usize {
    // SAFETY: a request pointer returned by isend/irecv, alive until test() is done.
    let s = unsafe { &*slot };
    let limit = Duration::from_secs(60);
    let t0 = Instant::now();
    loop {
        match s.test() {
            Ok(Some(n)) => return n,
            Ok(None) => {}
            Err(e) => exit_now(&format!("{what}: test() failed: {e}")),
        }
        if t0.elapsed() > limit {
            exit_now(&format!(
                "{what}: not complete after {limit:?} (a GPU lane's kernel or copy never finished?)"
            ));
        }
    }
}

#[test]
fn cuda_buffers_through_the_gpu_codec_bit_exact() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "on");
    std::env::set_var("NCCL_ZIP_CHECKSUM", "1");
    let Some(ctx) = context() else { return };
    let (s, r) = pair();
    let sizes = [
        0usize,
        1,
        3,
        4096,
        65537,
        256 << 10,
        (512 << 10) + 3,
        1 << 20,
        4 << 20,
    ];
    let mut msgs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        msgs.push(bf16_gaussian(i as u64, n, 0.02));
        msgs.push(pattern(50 + i as u64, n));
        msgs.push(vec![0u8; n]);
    }
    let cap = 4 << 20;
    let sbuf: Vec<DeviceBuffer> = msgs
        .iter()
        .map(|m| {
            let b = DeviceBuffer::new(&ctx, m.len().max(1)).unwrap();
            b.write(0, m).unwrap();
            b
        })
        .collect();
    let rbuf: Vec<DeviceBuffer> = msgs
        .iter()
        .map(|_| {
            let b = DeviceBuffer::new(&ctx, cap).unwrap();
            b.fill(0xEE).unwrap();
            b
        })
        .collect();
    let dev = backend_for(sbuf[0].ptr(), Emulation::Off).expect("CUDA backend");
    eprintln!("backend: {}", dev.describe());
    let t0 = Instant::now();
    for w in (0..msgs.len()).step_by(8) {
        let mut reqs = Vec::new();
        for i in w..(w + 8).min(msgs.len()) {
            let rq = r
                .irecv(rbuf[i].ptr() as *mut u8, cap, Some(dev.clone()))
                .unwrap()
                .expect("slot") as *const Slot;
            let sq = s
                .isend(sbuf[i].ptr() as *const u8, msgs[i].len(), Some(dev.clone()))
                .unwrap()
                .expect("slot") as *const Slot;
            reqs.push((i, sq, rq));
        }
        for (i, sq, rq) in reqs {
            let what = |dir: &str| format!("{dir} of message {i} ({} bytes)", msgs[i].len());
            assert_eq!(wait(sq, &what("send")), msgs[i].len());
            assert_eq!(wait(rq, &what("recv")), msgs[i].len());
            let mut got = vec![0u8; msgs[i].len() + 64.min(cap - msgs[i].len())];
            rbuf[i].read(0, &mut got).unwrap();
            assert!(got[..msgs[i].len()] == msgs[i][..], "message {i} differs");
            assert!(
                got[msgs[i].len()..].iter().all(|&b| b == 0xEE),
                "message {i} wrote past its end"
            );
        }
    }
    let st = r.stats();
    eprintln!(
        "{} messages in {:?}; recv {}",
        msgs.len(),
        t0.elapsed(),
        st.summary()
    );
    assert!(st.chunks_device.load(Relaxed) > 0);
    assert!(st.chunks_compressed.load(Relaxed) > 0);
    assert!(s.stats().chunks_device.load(Relaxed) > 0);
}
