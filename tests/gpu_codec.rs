//! GPU kernels against the CPU reference, on a real GPU. Every test prints
//! "SKIP: <reason>" and passes when no usable GPU is present (CPU-only CI).
//! scripts/gpu_validate.sh runs these on the GPU machine, also under compute-sanitizer.

mod frozen;
mod gpu_util;

use std::time::Duration;

use nccl_net_zip::gpu::{
    DecodeJob, DeviceBuffer, EncodeJob, GpuBatch, GpuCodec, JobOutcome, Status,
};
use nccl_zip_codec::{compress, decompress, max_compressed_size, DtypeHint, Effort, EncodeOptions};
use rand::{Rng, RngCore, SeedableRng};

/// [`gpu_util::wait_or_exit`] with this binary's limit.
fn wait_or_exit(batch: &GpuBatch, what: &str) -> Vec<JobOutcome> {
    gpu_util::wait_or_exit(batch, what, timeout())
}

fn codec() -> Option<GpuCodec> {
    match GpuCodec::new(0) {
        Ok(Ok(c)) => {
            eprintln!(
                "GPU: {} cc {}.{} driver {} SMs {} (using {}), kernels {:?}",
                c.info().name,
                c.info().compute_capability.0,
                c.info().compute_capability.1,
                c.info().driver_version,
                c.info().sm_count,
                c.sms(),
                c.kernel_source()
            );
            Some(c)
        }
        Ok(Err(why)) => {
            eprintln!("SKIP: {why}");
            None
        }
        Err(e) => panic!("GpuCodec::new: {e}"),
    }
}

/// Per-batch wait limit; NZC_TEST_TIMEOUT_S raises it (compute-sanitizer is slow).
fn timeout() -> Duration {
    Duration::from_secs(
        std::env::var("NZC_TEST_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
    )
}

struct Case {
    input: Vec<u8>,
    opts: EncodeOptions,
}

fn cpu_frame(c: &Case) -> Vec<u8> {
    let mut f = vec![0u8; max_compressed_size(c.input.len())];
    let n = compress(&c.input, &mut f, &c.opts).unwrap();
    f.truncate(n);
    f
}

/// Encodes cases on the GPU in batches of up to 8; returns frames or statuses.
fn gpu_encode(g: &GpuCodec, cases: &[Case]) -> Vec<Result<Vec<u8>, Status>> {
    let stream = g.context().default_stream();
    let maxn = cases.iter().map(|c| c.input.len()).max().unwrap_or(0) as u64;
    let mut batch = g.new_batch(8, maxn.max(1)).unwrap();
    let mut out = Vec::new();
    let batches = cases.len().div_ceil(8);
    for (k, chunk) in cases.chunks(8).enumerate() {
        let bufs: Vec<(DeviceBuffer, DeviceBuffer)> = chunk
            .iter()
            .map(|c| {
                let s = DeviceBuffer::new(g.context(), c.input.len()).unwrap();
                s.write(0, &c.input).unwrap();
                let d = DeviceBuffer::new(g.context(), c.input.len() + 24).unwrap();
                d.fill(0xEE).unwrap();
                (s, d)
            })
            .collect();
        let jobs: Vec<EncodeJob> = chunk
            .iter()
            .zip(&bufs)
            .map(|(c, (s, d))| EncodeJob {
                src: s.ptr(),
                n: c.input.len() as u64,
                dst: d.ptr(),
                dst_cap: d.len() as u64,
                hint: c.opts.dtype,
                checksum: c.opts.checksum,
                block_log2: c.opts.block_log2,
            })
            .collect();
        // SAFETY: buffers live until wait() returns below.
        unsafe { g.encode_batch(&stream, &mut batch, &jobs) }.unwrap();
        let res = wait_or_exit(
            &batch,
            &format!(
                "encode batch {} of {batches} (cases {}..{})",
                k + 1,
                8 * k,
                8 * k + chunk.len()
            ),
        );
        stream.synchronize().unwrap();
        for (r, (_, d)) in res.into_iter().zip(&bufs) {
            out.push(r.map(|len| {
                let mut f = vec![0u8; len as usize];
                d.read(0, &mut f).unwrap();
                f
            }));
        }
    }
    out
}

/// Decodes (frame, dst_cap) pairs on the GPU (format 1: `nzc_decode`).
fn gpu_decode(g: &GpuCodec, frames: &[(Vec<u8>, usize)]) -> Vec<Result<Vec<u8>, Status>> {
    gpu_decode_format(g, frames, 1)
}

/// Decodes (frame, dst_cap) pairs of frame `format` on the GPU.
fn gpu_decode_format(
    g: &GpuCodec,
    frames: &[(Vec<u8>, usize)],
    format: u8,
) -> Vec<Result<Vec<u8>, Status>> {
    let stream = g.context().default_stream();
    let maxcap = frames.iter().map(|f| f.1).max().unwrap_or(0) as u64;
    let mut batch = g.new_batch(8, maxcap.max(1)).unwrap();
    let mut out = Vec::new();
    let batches = frames.len().div_ceil(8);
    for (k, chunk) in frames.chunks(8).enumerate() {
        let bufs: Vec<(DeviceBuffer, DeviceBuffer)> = chunk
            .iter()
            .map(|(f, cap)| {
                let s = DeviceBuffer::new(g.context(), f.len()).unwrap();
                s.write(0, f).unwrap();
                (s, DeviceBuffer::new(g.context(), *cap).unwrap())
            })
            .collect();
        let jobs: Vec<DecodeJob> = chunk
            .iter()
            .zip(&bufs)
            .map(|((f, cap), (s, d))| DecodeJob {
                src: s.ptr(),
                src_len: f.len() as u64,
                dst: d.ptr(),
                dst_cap: *cap as u64,
            })
            .collect();
        // SAFETY: buffers live until wait() returns below.
        unsafe { g.decode_batch_format(&stream, &mut batch, &jobs, format) }.unwrap();
        let res = wait_or_exit(
            &batch,
            &format!(
                "decode batch {} of {batches} (frames {}..{})",
                k + 1,
                8 * k,
                8 * k + chunk.len()
            ),
        );
        stream.synchronize().unwrap();
        for (r, (_, d)) in res.into_iter().zip(&bufs) {
            out.push(r.map(|len| {
                let mut v = vec![0u8; len as usize];
                d.read(0, &mut v).unwrap();
                v
            }));
        }
    }
    out
}

/// The frozen vectors, embedded at build time (tests/frozen/mod.rs): the GPU
/// machine runs this binary from a tree at another path.
fn vectors() -> Vec<(String, Case)> {
    frozen::manifest()
        .into_iter()
        .map(|(v, opts)| {
            (
                v.name.to_string(),
                Case {
                    input: v.input.to_vec(),
                    opts,
                },
            )
        })
        .collect()
}

/// The frozen frame of vector `name`.
fn frozen_frame(name: &str) -> &'static [u8] {
    frozen::VECTORS
        .iter()
        .find(|v| v.name == name)
        .map(|v| v.frame)
        .unwrap_or_else(|| panic!("no embedded vector {name}"))
}

fn gauss(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(1e-12..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * rng.gen::<f64>()).cos()
}

fn random_cases(seed: u64, count: usize) -> Vec<Case> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sizes = [
        1usize, 17, 64, 4097, 8083, 12345, 65536, 131072, 524288, 614400, 1048576,
    ];
    (0..count)
        .map(|i| {
            let n = if i < sizes.len() {
                sizes[i]
            } else {
                rng.gen_range(1..1_100_000)
            };
            let sigma = 10f64.powf(rng.gen_range(-5.0..1.0));
            let mut v = Vec::with_capacity(n + 4);
            match rng.gen_range(0..4) {
                0 => (0..n / 2 + 1).for_each(|_| {
                    v.extend(
                        ((((gauss(&mut rng) * sigma) as f32).to_bits() >> 16) as u16).to_le_bytes(),
                    )
                }),
                1 => (0..n / 4 + 1)
                    .for_each(|_| v.extend(((gauss(&mut rng) * sigma) as f32).to_le_bytes())),
                2 => {
                    v.resize(n, 0);
                    rng.fill_bytes(&mut v);
                }
                _ => {
                    while v.len() < n {
                        let len = rng.gen_range(1..30000);
                        if rng.gen_bool(0.5) {
                            v.extend(std::iter::repeat_n(rng.gen::<u8>(), len))
                        } else {
                            (0..len / 2).for_each(|_| {
                                v.extend(
                                    (((gauss(&mut rng) as f32).to_bits() >> 16) as u16)
                                        .to_le_bytes(),
                                )
                            })
                        }
                    }
                }
            }
            v.truncate(n);
            let hints = [
                DtypeHint::Auto,
                DtypeHint::Auto,
                DtypeHint::Bf16,
                DtypeHint::Fp16,
                DtypeHint::Fp32,
                DtypeHint::Raw,
            ];
            Case {
                input: v,
                opts: EncodeOptions {
                    effort: Effort::Full,
                    dtype: hints[rng.gen_range(0..hints.len())],
                    checksum: rng.gen_bool(0.3),
                    block_log2: [12u8, 14, 16, 16, 16][rng.gen_range(0..5)],
                    format: 1,
                },
            }
        })
        .collect()
}

#[test]
fn gpu_encode_frozen_vectors_byte_identical() {
    let Some(g) = codec() else { return };
    let v = vectors();
    let cases: Vec<Case> = v
        .iter()
        .map(|(_, c)| Case {
            input: c.input.clone(),
            opts: c.opts,
        })
        .collect();
    for ((name, c), r) in v.iter().zip(gpu_encode(&g, &cases)) {
        let want = frozen_frame(name);
        let got = r.unwrap_or_else(|s| panic!("vector {name}: GPU encode status {s:?}"));
        assert!(
            got == want,
            "vector {name}: GPU frame {} bytes != frozen {} bytes",
            got.len(),
            want.len()
        );
        assert!(c.input.len() + 24 >= got.len());
    }
}

#[test]
fn gpu_decode_frozen_vectors() {
    let Some(g) = codec() else { return };
    let v = vectors();
    let frames: Vec<(Vec<u8>, usize)> = v
        .iter()
        .map(|(n, c)| (frozen_frame(n).to_vec(), c.input.len()))
        .collect();
    for ((name, c), r) in v.iter().zip(gpu_decode(&g, &frames)) {
        assert_eq!(r.as_deref().ok(), Some(&c.input[..]), "vector {name}");
    }
}

#[test]
fn gpu_random_sweep_matches_cpu() {
    let Some(g) = codec() else { return };
    let cases = random_cases(0x6E0_5EED, 48);
    let frames = gpu_encode(&g, &cases);
    for (i, (c, f)) in cases.iter().zip(&frames).enumerate() {
        let want = cpu_frame(c);
        let got = f
            .as_ref()
            .unwrap_or_else(|s| panic!("case {i}: status {s:?}"));
        assert!(
            got == &want,
            "case {i}: n={} {:?}: GPU {} bytes vs CPU {} bytes",
            c.input.len(),
            c.opts,
            got.len(),
            want.len()
        );
    }
    let dec: Vec<(Vec<u8>, usize)> = cases
        .iter()
        .map(|c| (cpu_frame(c), c.input.len()))
        .collect();
    for (i, (r, c)) in gpu_decode(&g, &dec).into_iter().zip(&cases).enumerate() {
        assert!(
            r.as_deref().ok() == Some(&c.input[..]),
            "case {i}: GPU decode {:?}",
            r.err()
        );
    }
}

#[test]
fn gpu_corrupt_frames_rejected_like_cpu() {
    let Some(g) = codec() else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC0FFEE);
    let bases: Vec<Case> = random_cases(7, 8);
    let mut frames = Vec::new();
    for c in &bases {
        let f0 = cpu_frame(c);
        for t in 0..24 {
            let mut f = f0.clone();
            match t % 4 {
                0 | 1 => {
                    let p = rng.gen_range(24.min(f.len() - 1)..f.len());
                    f[p] ^= 1 << rng.gen_range(0..8);
                }
                2 => f.truncate(rng.gen_range(0..f.len())),
                _ => {
                    let p = rng.gen_range(0..f.len());
                    let e = (p + rng.gen_range(1..64)).min(f.len());
                    rng.fill_bytes(&mut f[p..e]);
                }
            }
            let cap = if t % 5 == 0 {
                c.input.len().saturating_sub(1).max(1)
            } else {
                c.input.len().max(1)
            };
            frames.push((f, cap));
        }
    }
    for (i, ((f, cap), r)) in frames.iter().zip(gpu_decode(&g, &frames)).enumerate() {
        let mut out = vec![0u8; *cap];
        let cpu = decompress(f, &mut out).map(|n| out[..n].to_vec());
        match (&cpu, &r) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "frame {i}"),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "frame {i}: CPU {:?} vs GPU {:?}",
                cpu.map(|v| v.len()),
                r.map(|v| v.len())
            ),
        }
    }
}

/// Format 2 (`nzc_decode_v2`): the 28 frozen v2 vectors (column tables, fp8 and
/// FP16N included), the sweep's inputs as v2 CPU frames, and corrupted v2 frames
/// decided as the CPU decides; each kernel rejects the other format's frames.
#[test]
fn gpu_decode_v2_matches_cpu() {
    let Some(g) = codec() else { return };
    let man = frozen::manifest_v2();
    let frames: Vec<(Vec<u8>, usize)> = man
        .iter()
        .map(|(v, _)| (v.frame.to_vec(), v.input.len()))
        .collect();
    for ((v, _), r) in man.iter().zip(gpu_decode_format(&g, &frames, 2)) {
        assert_eq!(r.as_deref().ok(), Some(v.input), "v2 vector {}", v.name);
    }
    for (r, (f, _)) in gpu_decode_format(&g, &frames, 1).into_iter().zip(&frames) {
        assert!(
            r.is_err() || f.len() < 24,
            "format-1 kernel accepted a v2 frame"
        );
    }
    let cases: Vec<Case> = random_cases(0x2_6E0, 24)
        .into_iter()
        .map(|c| Case {
            opts: EncodeOptions {
                format: 2,
                ..c.opts
            },
            ..c
        })
        .collect();
    let dec: Vec<(Vec<u8>, usize)> = cases
        .iter()
        .map(|c| (cpu_frame(c), c.input.len()))
        .collect();
    for (i, ((r, c), (f, _))) in gpu_decode_format(&g, &dec, 2)
        .into_iter()
        .zip(&cases)
        .zip(&dec)
        .enumerate()
    {
        assert!(
            r.as_deref().ok() == Some(&c.input[..]),
            "v2 case {i}: {:?}",
            r.err()
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC0FFEE2);
    let mut bad = Vec::new();
    for (f0, n) in dec.iter().take(8) {
        for t in 0..24 {
            let mut f = f0.clone();
            match t % 3 {
                0 => {
                    let p = rng.gen_range(24.min(f.len() - 1)..f.len());
                    f[p] ^= 1 << rng.gen_range(0..8);
                }
                1 => f.truncate(rng.gen_range(0..f.len())),
                _ => {
                    let p = rng.gen_range(24.min(f.len() - 1)..f.len());
                    let e = (p + rng.gen_range(1..32)).min(f.len());
                    rng.fill_bytes(&mut f[p..e]);
                }
            }
            bad.push((f, (*n).max(1)));
        }
    }
    for (i, ((f, cap), r)) in bad.iter().zip(gpu_decode_format(&g, &bad, 2)).enumerate() {
        let mut out = vec![0u8; *cap];
        let cpu = decompress(f, &mut out).map(|n| out[..n].to_vec());
        match (&cpu, &r) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "v2 frame {i}"),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "v2 frame {i}: CPU {:?} vs GPU {:?}",
                cpu.map(|v| v.len()),
                r.map(|v| v.len())
            ),
        }
    }
}
