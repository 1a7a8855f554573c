//! The device data path (NCCL_PTR_CUDA buffers) in process, on the emulated device
//! (`gpu::backend::SimBackend`): the same lanes, staging, STORED handling, raw
//! fallback and CPU-codec fallback the CUDA backend runs, bit-exact, with every mix
//! of host and device buffers on the two sides. The real CUDA lanes are exercised
//! by scripts/gpu_validate.sh on a GPU machine.

mod inproc_util;

use std::sync::atomic::Ordering::Relaxed;

use inproc_util::{mixed_messages, pair, transfer_and_check_on};
use nccl_net_zip::gpu::{backend_for, Emulation};

fn messages() -> Vec<Vec<u8>> {
    mixed_messages(&[
        0usize,
        1,
        3,
        63,
        64,
        4096,
        4097,
        65535,
        131072,
        256 << 10,
        (256 << 10) + 1,
        524288 + 3,
        1 << 20,
        3 << 20,
    ])
}

#[test]
fn device_buffers_every_mix_bit_exact() {
    std::env::set_var("NCCL_ZIP_COMPRESS", "on");
    std::env::set_var("NCCL_ZIP_CHECKSUM", "1");
    // Fewer lanes than streams: chunks wait for lanes of the shared pools.
    std::env::set_var("NCCL_ZIP_GPU_LANES", "2");
    let (s, r) = pair();
    let k = backend_for(0, Emulation::Kernels).unwrap();
    let nk = backend_for(0, Emulation::NoKernels).unwrap();
    let msgs = messages();
    let cap = 3 << 20;
    for (name, sd, rd) in [
        (
            "device -> device (kernels)",
            Some(k.clone()),
            Some(k.clone()),
        ),
        ("device -> host", Some(k.clone()), None),
        ("host -> device", None, Some(k.clone())),
        (
            "device -> device (no kernels)",
            Some(nk.clone()),
            Some(nk.clone()),
        ),
        (
            "device (kernels) -> device (no kernels)",
            Some(k.clone()),
            Some(nk.clone()),
        ),
    ] {
        let (sdev0, rdev0) = (
            s.stats().chunks_device.load(Relaxed),
            r.stats().chunks_device.load(Relaxed),
        );
        let (sd_used, rd_used) = (sd.is_some(), rd.is_some());
        let before = (
            r.stats().chunks_compressed.load(Relaxed),
            r.stats().wire_bytes.load(Relaxed),
            r.stats().raw_bytes.load(Relaxed),
        );
        transfer_and_check_on(&s, &r, &msgs, cap, sd, rd);
        let st = r.stats();
        let compressed = st.chunks_compressed.load(Relaxed) - before.0;
        let wire = st.wire_bytes.load(Relaxed) - before.1;
        let raw = st.raw_bytes.load(Relaxed) - before.2;
        eprintln!("{name}: {compressed} compressed chunks, wire/raw {wire}/{raw}");
        assert!(compressed > 0, "{name}: nothing was compressed");
        let sdev = s.stats().chunks_device.load(Relaxed) - sdev0;
        let rdev = r.stats().chunks_device.load(Relaxed) - rdev0;
        assert_eq!(sdev > 0, sd_used, "{name}: {sdev} device chunks sent");
        assert_eq!(rdev > 0, rd_used, "{name}: {rdev} device chunks received");
        assert!(
            (wire as f64) < raw as f64 * 0.8,
            "{name}: wire {wire} vs raw {raw}"
        );
    }
    // Lanes live in pools shared by all comms, bounded per device and direction
    // (2 emulated devices x 2 directions x NCCL_ZIP_GPU_LANES=2), whatever the
    // number of streams; the comms' own staging goes at close.
    let held = &nccl_net_zip::stats::HELD;
    let lanes = held.gpu_lanes.load(Relaxed);
    assert!((1..=8).contains(&lanes), "{lanes} GPU lanes");
    drop((s, r));
    assert_eq!(
        held.staging_bytes.load(Relaxed),
        nccl_net_zip::gpu::pool::pooled_staging_bytes(),
        "comm staging not released at close"
    );
}
