//! GPU codec throughput (a program run by scripts/gpu_validate.sh, ignored by
//! `cargo test`): `cargo test --release --test gpu_bench -- --ignored --nocapture`.
//!
//! Prints, per case, GB/s of uncompressed bytes measured to host-visible completion
//! (the host spins on the host-mapped results; no stream sync), the compression
//! ratio, and the fraction of the HBM roofline (bytes read + written / time over
//! NCCL_ZIP_HBM_GBPS, default 3350 for H100 SXM; set it for other parts).
//! Input: bf16 Gaussian (sigma 0.02), the common NCCL case.

mod gpu_util;

use std::time::{Duration, Instant};

use nccl_net_zip::gpu::{
    DecodeJob, DeviceBuffer, EncodeJob, GpuBatch, GpuCodec, JobOutcome, MappedHost,
};
use nccl_zip_codec::{compress, max_compressed_size, DtypeHint, Effort, EncodeOptions};
use rand::{Rng, SeedableRng};

/// [`gpu_util::wait_or_exit`] with this binary's limit.
fn wait_or_exit(batch: &GpuBatch, what: &str) -> Vec<JobOutcome> {
    gpu_util::wait_or_exit(batch, what, Duration::from_secs(30))
}

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
    let Some(mut g) = codec_or_skip() else {
        return;
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
    let capped = g.sms();
    let all = i.sm_count;
    // (message size, messages in flight per launch, SMs per launch, iterations): the
    // large buffer may use the whole GPU; NCCL-sized messages stay under the cap.
    let cases: [(usize, usize, u32, usize); 5] = [
        (256 << 20, 1, all, 5),
        (256 << 20, 1, capped, 3),
        (128 << 10, 8, capped, 200),
        (512 << 10, 8, capped, 100),
        (1 << 20, 8, capped, 50),
    ];
    println!(
        "{:>10} {:>8} {:>4} {:>7} {:>10} {:>9} {:>10} {:>9} {:>8} {:>11} {:>8}",
        "msg",
        "inflight",
        "SMs",
        "ratio",
        "enc GB/s",
        "enc HBM%",
        "dec GB/s",
        "dec HBM%",
        "enc us",
        "v2 dec GB/s",
        "v2 ratio"
    );
    for (n, inflight, sms, iters) in cases {
        g.set_sms(sms);
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
            let r = wait_or_exit(
                &batch,
                &format!("encode of {n} B x {inflight}, iteration {it}"),
            );
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
            let r = wait_or_exit(
                &batch,
                &format!("decode of {n} B x {inflight}, iteration {it}"),
            );
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
        // format 2 (nzc_decode_v2) on the CPU encoder's v2 frame of the same input:
        // docs/GPU.md "The v2 decoder as built" predicts it
        let v2_opts = EncodeOptions {
            effort: Effort::Full,
            dtype: DtypeHint::Auto,
            checksum: false,
            block_log2: 16,
            format: 2,
        };
        let mut f2 = vec![0u8; max_compressed_size(n)];
        let f2len = compress(&input, &mut f2, &v2_opts).unwrap();
        f2.truncate(f2len);
        let frames2: Vec<DeviceBuffer> = (0..inflight)
            .map(|_| {
                let b = DeviceBuffer::new(g.context(), f2len).unwrap();
                b.write(0, &f2).unwrap();
                b
            })
            .collect();
        let djobs2: Vec<DecodeJob> = (0..inflight)
            .map(|k| DecodeJob {
                src: frames2[k].ptr(),
                src_len: f2len as u64,
                dst: outs[k].ptr(),
                dst_cap: n as u64,
            })
            .collect();
        let mut dec2_t = Vec::new();
        for it in 0..iters + 2 {
            let t0 = Instant::now();
            // SAFETY: as above.
            unsafe { g.decode_batch_format(&stream, &mut batch, &djobs2, 2) }.unwrap();
            let r = wait_or_exit(
                &batch,
                &format!("v2 decode of {n} B x {inflight}, iteration {it}"),
            );
            let dt = t0.elapsed().as_secs_f64();
            assert_eq!(*r[0].as_ref().unwrap(), n as u64);
            if it >= 2 {
                dec2_t.push(dt);
            }
        }
        stream.synchronize().unwrap();
        outs[0].read(0, &mut back).unwrap();
        assert!(back == input, "v2 decode mismatch at {n}");
        let bytes = (n * inflight) as f64;
        let (te, td) = (median(enc_t), median(dec_t));
        let td2 = median(dec2_t);
        let ratio = n as f64 / flen as f64;
        let traffic = bytes + bytes / ratio; // read input + write frame (and vice versa)
        println!(
            "{:>10} {:>8} {:>4} {:>7.3} {:>10.2} {:>8.1}% {:>10.2} {:>8.1}% {:>8.1} {:>11.2} {:>8.3}",
            n,
            inflight,
            g.sms(),
            ratio,
            bytes / te / 1e9,
            100.0 * traffic / te / 1e9 / hbm,
            bytes / td / 1e9,
            100.0 * traffic / td / 1e9 / hbm,
            te * 1e6,
            bytes / td2 / 1e9,
            n as f64 / f2len as f64
        );
    }
}

/// One lane as the plugin's data path uses it (src/gpu/cuda_lane.rs): its own
/// highest-priority stream, a one-job batch, and pinned device-mapped staging that
/// the encoder writes the frame into and the decoder reads it from.
struct BenchLane {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    batch: nccl_net_zip::gpu::GpuBatch,
    staging: MappedHost,
    src: DeviceBuffer,
    out: DeviceBuffer,
}

/// The GPU codec on device 0, or None after printing why there is none (SKIP).
fn codec_or_skip() -> Option<GpuCodec> {
    match GpuCodec::new(0) {
        Ok(Ok(g)) => Some(g),
        Ok(Err(why)) => {
            println!("SKIP: {why}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Per-chunk encode and decode times of several threads, summarised: medians over
/// all chunks, and each direction's time per thread (the sum over its chunks,
/// averaged over the threads).
struct Timings {
    enc_p50: f64,
    dec_p50: f64,
    enc_sum: f64,
    dec_sum: f64,
}

impl Timings {
    fn of(per: &[(Vec<f64>, Vec<f64>)]) -> Timings {
        let n = per.len() as f64;
        let enc: Vec<f64> = per.iter().flat_map(|p| p.0.iter().copied()).collect();
        let dec: Vec<f64> = per.iter().flat_map(|p| p.1.iter().copied()).collect();
        Timings {
            enc_sum: enc.iter().sum::<f64>() / n,
            dec_sum: dec.iter().sum::<f64>() / n,
            enc_p50: median(enc),
            dec_p50: median(dec),
        }
    }
}

/// Median and total seconds of `iters` chunk encodes then decodes on one lane.
fn run_lane(g: &GpuCodec, l: &mut BenchLane, chunk: usize, iters: usize) -> (Vec<f64>, Vec<f64>) {
    let cap = max_compressed_size(chunk);
    let (mut enc, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let job = EncodeJob {
            src: l.src.ptr(),
            n: chunk as u64,
            dst: l.staging.dev_ptr(),
            dst_cap: cap as u64,
            hint: DtypeHint::Auto,
            checksum: false,
            block_log2: 16,
        };
        let t0 = Instant::now();
        // SAFETY: the buffers belong to this lane and outlive the wait.
        unsafe { g.encode_batch(&l.stream, &mut l.batch, &[job]) }.unwrap();
        let flen = wait_or_exit(
            &l.batch,
            &format!("gpu_bench_lanes: lane encode of a {chunk} B chunk"),
        )[0]
        .unwrap();
        enc.push(t0.elapsed().as_secs_f64());
        let job = DecodeJob {
            src: l.staging.dev_ptr(),
            src_len: flen,
            dst: l.out.ptr(),
            dst_cap: chunk as u64,
        };
        let t0 = Instant::now();
        // SAFETY: as above.
        unsafe { g.decode_batch(&l.stream, &mut l.batch, &[job]) }.unwrap();
        let n = wait_or_exit(
            &l.batch,
            &format!("gpu_bench_lanes: lane decode of a {chunk} B chunk"),
        )[0]
        .unwrap();
        dec.push(t0.elapsed().as_secs_f64());
        assert_eq!(n, chunk as u64);
    }
    (enc, dec)
}

/// The data-path configuration, measured to host-visible completion: `threads` I/O
/// threads, each with its own lane, each encoding one chunk into mapped staging,
/// then decoding it back into device memory, one launch per chunk (no batching
/// across lanes). This is what the plugin does today; against the batched figures
/// of `gpu_bench` it shows what per-chunk launches cost (docs/GPU.md, "measure,
/// then choose"). Also checks the frames in mapped staging equal the CPU encoder's.
#[test]
#[ignore]
fn gpu_bench_lanes() {
    let Some(g) = codec_or_skip() else {
        return;
    };
    println!(
        "lanes: one launch per chunk, {} SMs cap per launch, results host-mapped",
        g.sms()
    );
    println!(
        "{:>8} {:>7} {:>6} {:>11} {:>11} {:>12} {:>12} {:>11}",
        "chunk",
        "threads",
        "CTAs",
        "enc us p50",
        "dec us p50",
        "enc GB/s agg",
        "dec GB/s agg",
        "enc+dec GB/s"
    );
    let (_, greatest) = cudarc::driver::result::stream::get_priority_range().unwrap();
    for chunk in [4 << 10, 64 << 10, 256 << 10, 1 << 20] {
        let input = bf16_gauss(chunk, 7);
        let mut cpu = vec![0u8; max_compressed_size(chunk)];
        let cpu_len = compress(&input, &mut cpu, &EncodeOptions::default()).unwrap();
        for threads in [1usize, 4, 8] {
            let iters = (256 << 20) / chunk / threads;
            let iters = iters.clamp(20, 2000);
            let mut lanes: Vec<BenchLane> = (0..threads)
                .map(|_| {
                    let src = DeviceBuffer::new(g.context(), chunk).unwrap();
                    src.write(0, &input).unwrap();
                    BenchLane {
                        stream: g.context().new_stream_with_priority(greatest).unwrap(),
                        batch: g.new_batch(1, chunk as u64).unwrap(),
                        staging: MappedHost::new(g.context(), max_compressed_size(chunk)).unwrap(),
                        src,
                        out: DeviceBuffer::new(g.context(), chunk).unwrap(),
                    }
                })
                .collect();
            // Warm-up (module, first launches), then the timed round.
            for l in lanes.iter_mut() {
                run_lane(&g, l, chunk, 3);
            }
            let t0 = Instant::now();
            let per: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|s| {
                let hs: Vec<_> = lanes
                    .iter_mut()
                    .map(|l| {
                        let g = &g;
                        s.spawn(move || run_lane(g, l, chunk, iters))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let wall = t0.elapsed().as_secs_f64();
            let bytes = (chunk * iters * threads) as f64;
            let t = Timings::of(&per);
            for l in &lanes {
                // SAFETY: the lane's stream is idle (every batch was waited for).
                let frame = unsafe { std::slice::from_raw_parts(l.staging.host_ptr(), cpu_len) };
                assert!(
                    frame == &cpu[..cpu_len],
                    "mapped-staging frame differs from the CPU encoder's at chunk {chunk}"
                );
                let mut back = vec![0u8; chunk];
                l.out.read(0, &mut back).unwrap();
                assert!(back == input, "decode mismatch at chunk {chunk}");
            }
            println!(
                "{:>8} {:>7} {:>6} {:>11.1} {:>11.1} {:>12.2} {:>12.2} {:>11.2}",
                chunk,
                threads,
                g.grid_for((chunk as u64).div_ceil(1 << 16)),
                t.enc_p50 * 1e6,
                t.dec_p50 * 1e6,
                bytes / t.enc_sum / 1e9,
                bytes / t.dec_sum / 1e9,
                bytes / wall / 1e9,
            );
        }
    }
}

/// The plugin's own lanes (`Backend::lane`, what the TCP data path uses per chunk):
/// `threads` I/O threads, each with its own lane, encode a chunk of device memory
/// (frame ends in the lane's pinned staging, as the socket needs it) and decode it
/// back from staging into device memory, to host-visible completion. By default the
/// kernels work in the lane's device scratch and the copy engine moves frames
/// between scratch and staging; run again with `NCCL_ZIP_GPU_ZEROCOPY=1` (read when
/// the device is opened, so one setting per process) for kernels on the mapped
/// staging directly. Also checks every frame against the CPU encoder and every
/// decode against the input.
#[test]
#[ignore]
fn gpu_bench_data_path() {
    use nccl_net_zip::gpu::{backend_for, Emulation};
    use std::sync::atomic::AtomicU64;
    let Some(g) = codec_or_skip() else {
        return;
    };
    let zero_copy = std::env::var("NCCL_ZIP_GPU_ZEROCOPY").is_ok_and(|v| v == "1");
    let probe = DeviceBuffer::new(g.context(), 4096).unwrap();
    let b = backend_for(probe.ptr(), Emulation::Off).unwrap();
    println!("data path: {}", b.describe());
    println!(
        "{:>8} {:>7} {:>9} {:>11} {:>11} {:>12} {:>12}",
        "chunk", "threads", "mode", "enc us p50", "dec us p50", "enc GB/s agg", "dec GB/s agg"
    );
    let mode = if zero_copy { "zerocopy" } else { "scratch" };
    let opts = EncodeOptions::default();
    let counter = AtomicU64::new(0);
    for chunk in [64 << 10, 256 << 10, 1 << 20] {
        let input = bf16_gauss(chunk, 11);
        let mut cpu = vec![0u8; max_compressed_size(chunk)];
        let cpu_len = compress(&input, &mut cpu, &opts).unwrap();
        let max_wire = max_compressed_size(chunk);
        for threads in [1usize, 4, 8] {
            let iters = ((128 << 20) / chunk / threads).clamp(20, 1000);
            let per: Vec<(Vec<f64>, Vec<f64>)> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        let (g, b, input, cpu, counter, opts) =
                            (&g, &b, &input, &cpu[..cpu_len], &counter, &opts);
                        s.spawn(move || {
                            let src = DeviceBuffer::new(g.context(), chunk).unwrap();
                            src.write(0, input).unwrap();
                            let out = DeviceBuffer::new(g.context(), chunk).unwrap();
                            let mut lane = b.lane(max_wire, counter).unwrap();
                            let (mut enc, mut dec) = (Vec::new(), Vec::new());
                            for i in 0..iters + 3 {
                                let t0 = Instant::now();
                                let flen = lane.encode(src.ptr(), chunk, opts).unwrap();
                                let te = t0.elapsed().as_secs_f64();
                                if i == 0 {
                                    assert!(
                                        lane.bytes(0, flen) == cpu,
                                        "lane frame differs from the CPU encoder's at chunk {chunk} ({mode})"
                                    );
                                }
                                let t0 = Instant::now();
                                let n = lane.decode(flen, out.ptr(), chunk).unwrap();
                                let td = t0.elapsed().as_secs_f64();
                                assert_eq!(n, chunk);
                                if i >= 3 {
                                    enc.push(te);
                                    dec.push(td);
                                }
                            }
                            let mut back = vec![0u8; chunk];
                            out.read(0, &mut back).unwrap();
                            assert!(back == *input, "decode mismatch at chunk {chunk} ({mode})");
                            // The lane's stream has drained (every operation waits
                            // for it), so dropping the lane frees nothing in use.
                            drop(lane);
                            (enc, dec)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let bytes = (chunk * iters * threads) as f64;
            let t = Timings::of(&per);
            println!(
                "{:>8} {:>7} {:>9} {:>11.1} {:>11.1} {:>12.2} {:>12.2}",
                chunk,
                threads,
                mode,
                t.enc_p50 * 1e6,
                t.dec_p50 * 1e6,
                bytes / t.enc_sum / 1e9,
                bytes / t.dec_sum / 1e9,
            );
        }
    }
}
