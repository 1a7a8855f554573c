//! GPU codec throughput (a program run by scripts/gpu_validate.sh, ignored by
//! `cargo test`): `cargo test --release --test gpu_bench -- --ignored --nocapture`.
//!
//! Prints, per case, GB/s of uncompressed bytes measured to host-visible completion
//! (the host spins on the host-mapped results; no stream sync), the compression
//! ratio, and the fraction of the HBM roofline (bytes read + written / time over
//! NCCL_ZIP_HBM_GBPS, default 3350 for H100 SXM; set it for other parts).
//! Input: bf16 Gaussian (sigma 0.02), the common NCCL case.

use std::time::{Duration, Instant};

use nccl_net_zip::gpu::{DecodeJob, DeviceBuffer, EncodeJob, GpuCodec};
use nccl_zip_codec::DtypeHint;
use rand::{Rng, SeedableRng};

fn bf16_gauss(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(n + 2);
    while v.len() < n {
        let u1: f64 = rng.gen_range(1e-12..1.0);
        let x =
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * rng.gen::<f64>()).cos() * 0.02;
        v.extend((((x as f32).to_bits() >> 16) as u16).to_le_bytes());
    }
    v.truncate(n);
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[test]
#[ignore]
fn gpu_bench() {
    let g = match GpuCodec::new(0) {
        Ok(Ok(g)) => g,
        Ok(Err(why)) => {
            println!("SKIP: {why}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let hbm: f64 = std::env::var("NCCL_ZIP_HBM_GBPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3350.0);
    let i = g.info();
    println!(
        "device: {} cc {}.{} driver {} SMs {} | used SMs {} x {} CTAs/SM | kernels {:?} | nvcc {} | HBM roofline {hbm} GB/s",
        i.name, i.compute_capability.0, i.compute_capability.1, i.driver_version, i.sm_count, g.sms(), g.ctas_per_sm(), g.kernel_source(), nccl_net_zip::gpu::NVCC_VERSION
    );
    let stream = g.context().default_stream();
    // (message size, messages in flight per launch, iterations)
    let cases: [(usize, usize, usize); 4] = [
        (256 << 20, 1, 5),
        (128 << 10, 8, 200),
        (512 << 10, 8, 100),
        (1 << 20, 8, 50),
    ];
    println!(
        "{:>10} {:>8} {:>7} {:>10} {:>9} {:>10} {:>9} {:>8}",
        "msg", "inflight", "ratio", "enc GB/s", "enc HBM%", "dec GB/s", "dec HBM%", "enc us"
    );
    for (n, inflight, iters) in cases {
        let input = bf16_gauss(n, 42);
        let mut batch = g.new_batch(inflight, n as u64).unwrap();
        let srcs: Vec<DeviceBuffer> = (0..inflight)
            .map(|_| {
                let b = DeviceBuffer::new(g.context(), n).unwrap();
                b.write(0, &input).unwrap();
                b
            })
            .collect();
        let frames: Vec<DeviceBuffer> = (0..inflight)
            .map(|_| DeviceBuffer::new(g.context(), n + 24).unwrap())
            .collect();
        let outs: Vec<DeviceBuffer> = (0..inflight)
            .map(|_| DeviceBuffer::new(g.context(), n).unwrap())
            .collect();
        let ejobs: Vec<EncodeJob> = (0..inflight)
            .map(|k| EncodeJob {
                src: srcs[k].ptr(),
                n: n as u64,
                dst: frames[k].ptr(),
                dst_cap: (n + 24) as u64,
                hint: DtypeHint::Auto,
                checksum: false,
                block_log2: 16,
            })
            .collect();
        let mut enc_t = Vec::new();
        let mut flen = 0;
        for it in 0..iters + 2 {
            let t0 = Instant::now();
            // SAFETY: buffers outlive the wait below.
            unsafe { g.encode_batch(&stream, &mut batch, &ejobs) }.unwrap();
            let r = batch.wait(Duration::from_secs(30)).unwrap();
            let dt = t0.elapsed().as_secs_f64();
            flen = *r[0].as_ref().unwrap();
            if it >= 2 {
                enc_t.push(dt);
            }
        }
        let djobs: Vec<DecodeJob> = (0..inflight)
            .map(|k| DecodeJob {
                src: frames[k].ptr(),
                src_len: flen,
                dst: outs[k].ptr(),
                dst_cap: n as u64,
            })
            .collect();
        let mut dec_t = Vec::new();
        for it in 0..iters + 2 {
            let t0 = Instant::now();
            // SAFETY: as above.
            unsafe { g.decode_batch(&stream, &mut batch, &djobs) }.unwrap();
            let r = batch.wait(Duration::from_secs(30)).unwrap();
            let dt = t0.elapsed().as_secs_f64();
            assert_eq!(*r[0].as_ref().unwrap(), n as u64);
            if it >= 2 {
                dec_t.push(dt);
            }
        }
        stream.synchronize().unwrap();
        let mut back = vec![0u8; n];
        outs[0].read(0, &mut back).unwrap();
        assert!(back == input, "decode mismatch at {n}");
        let bytes = (n * inflight) as f64;
        let (te, td) = (median(enc_t), median(dec_t));
        let ratio = n as f64 / flen as f64;
        let traffic = bytes + bytes / ratio; // read input + write frame (and vice versa)
        println!(
            "{:>10} {:>8} {:>7.3} {:>10.2} {:>8.1}% {:>10.2} {:>8.1}% {:>8.1}",
            n,
            inflight,
            ratio,
            bytes / te / 1e9,
            100.0 * traffic / te / 1e9 / hbm,
            bytes / td / 1e9,
            100.0 * traffic / td / 1e9 / hbm,
            te * 1e6
        );
    }
}
