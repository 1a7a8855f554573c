//! Host proof of the GPU kernels (no GPU needed): kernels/host/harness.cpp compiles
//! the kernels' per-CTA logic (kernels/nzc_codec.cuh, the very source nvcc builds)
//! with g++ under AddressSanitizer + UBSan and runs it work item by work item. These
//! tests require that it
//! * reproduces every frozen vector of codec/tests/vectors byte for byte,
//! * matches `nccl_zip_codec::compress` on a seeded sweep of dtypes, sizes and options,
//! * decodes exactly the frames the CPU decoder accepts, to the same bytes, on
//!   corrupted frames (and never touches memory out of bounds: ASan aborts otherwise),
//! * and that its code table and shared-memory carve equal the Rust ones.
//!
//! A second executor runs whole launches concurrently (issue 19, item 7): the
//! kernels' own launch bodies (`encode_jobs` / `decode_jobs`), one OS thread per
//! CTA, real atomics for the claim counters, the look-back and the finisher,
//! and every parallel loop in a seeded random order. Frozen vectors, a sweep and
//! the corrupted frames go through it under ThreadSanitizer (and the sweep under
//! AddressSanitizer); a planted race proves TSan reports. Replacing the
//! finisher's acquire-release counter by a relaxed one makes TSan report the
//! finisher's reads of other CTAs' block sizes (checked by hand, 2026-11-25).

mod frozen;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use nccl_zip_codec::{compress, decompress, max_compressed_size, DtypeHint, Effort, EncodeOptions};
use rand::{Rng, RngCore, SeedableRng};

/// A fresh directory per call (tests run in parallel threads of one process).
/// Everything this binary needs is embedded (tests/frozen/mod.rs), so it runs from
/// any copy of the tree, or from none.
fn work_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = frozen::scratch_dir("kernels_host").join(format!("w{k}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The embedded kernel sources written out as a tree, for g++.
fn source_tree() -> PathBuf {
    let d = frozen::scratch_dir("kernels_host").join("src");
    for (path, text) in frozen::KERNEL_SOURCES {
        let f = d.join(path);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, text).unwrap();
    }
    d
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum San {
    /// AddressSanitizer + UBSan (plain build where they do not link).
    Address,
    /// ThreadSanitizer: required (the concurrent executor's whole point).
    Thread,
}

fn build_harness(san: San) -> PathBuf {
    let name = match san {
        San::Address => "nzc_host",
        San::Thread => "nzc_host_tsan",
    };
    let out = frozen::scratch_dir("kernels_host").join(name);
    let src = source_tree().join("kernels/host/harness.cpp");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let base = [
        "-std=c++17",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pthread",
    ];
    let flags: &[&str] = match san {
        San::Address => &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ],
        San::Thread => &["-fsanitize=thread", "-fno-omit-frame-pointer"],
    };
    let t0 = std::time::Instant::now();
    let try_build = |extra: &[&str]| {
        Command::new(&cxx)
            .args(base)
            .args(extra)
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if try_build(flags) {
        eprintln!(
            "kernels_host: harness built with {san:?} sanitizer in {:?}",
            t0.elapsed()
        );
    } else if san == San::Thread {
        panic!("cannot build kernels/host/harness.cpp with {cxx} -fsanitize=thread (libtsan is part of the g++ packages)");
    } else if try_build(&[]) {
        eprintln!("kernels_host: WARNING: sanitizers unavailable, harness built without them");
    } else {
        panic!("cannot build kernels/host/harness.cpp with {cxx} (a C++17 compiler is required)");
    }
    out
}

/// The harness binary for `san`, built once per test process.
fn harness_for(san: San) -> &'static Path {
    static A: OnceLock<PathBuf> = OnceLock::new();
    static T: OnceLock<PathBuf> = OnceLock::new();
    match san {
        San::Address => A.get_or_init(|| build_harness(san)),
        San::Thread => T.get_or_init(|| build_harness(san)),
    }
}

fn harness() -> &'static Path {
    harness_for(San::Address)
}

/// Runs a harness script; one result line per command.
fn run_script(dir: &Path, lines: &[String]) -> Vec<String> {
    run_script_on(harness(), dir, lines)
}

fn harness_output(bin: &Path, dir: &Path, lines: &[String]) -> std::process::Output {
    let script = dir.join("script.txt");
    std::fs::write(&script, lines.join("\n") + "\n").unwrap();
    Command::new(bin)
        .arg(&script)
        .env("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0")
        // Any report fails the run (exit code 66).
        .env("TSAN_OPTIONS", "halt_on_error=1:exitcode=66")
        .output()
        .expect("run harness")
}

fn run_script_on(bin: &Path, dir: &Path, lines: &[String]) -> Vec<String> {
    let o = harness_output(bin, dir, lines);
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "harness failed (sanitizer report?): {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let res: Vec<String> = stdout.lines().map(str::to_string).collect();
    assert_eq!(
        res.len(),
        lines.len(),
        "harness answered {} of {} commands",
        res.len(),
        lines.len()
    );
    res
}

fn hint_code(h: DtypeHint) -> u32 {
    nccl_net_zip::gpu::abi::hint_code(h)
}

struct EncCase {
    input: Vec<u8>,
    opts: EncodeOptions,
}

/// How the harness runs a job: work item after work item (`Seq`, shared memory
/// poisoned before each), or as a concurrent launch (`Conc`: the kernels' launch
/// bodies, CTAs as threads, seeded random loop orders; CTAs and job copies vary
/// per case).
#[derive(Clone, Copy, Debug)]
enum Launch {
    Seq,
    Conc { san: San, seed: u64 },
}

impl Launch {
    fn bin(self) -> &'static Path {
        match self {
            Launch::Seq => harness(),
            Launch::Conc { san, .. } => harness_for(san),
        }
    }

    /// The command for case `i`: `op` (enc/dec) and its arguments.
    fn cmd(self, op: &str, i: usize, args: String) -> String {
        match self {
            Launch::Seq => format!("{op} {args}"),
            Launch::Conc { seed, .. } => {
                let ctas = [1, 2, 3, 5, 8][(seed as usize + i) % 5];
                let jobs = 1 + i % 3;
                format!("p{op} {args} {ctas} {jobs} {}", seed + i as u64)
            }
        }
    }
}

/// Encodes every case with the harness; returns the frames.
fn harness_encode(cases: &[EncCase]) -> Vec<Vec<u8>> {
    harness_encode_with(cases, Launch::Seq)
}

fn harness_encode_with(cases: &[EncCase], launch: Launch) -> Vec<Vec<u8>> {
    let dir = work_dir();
    let mut lines = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let inp = dir.join(format!("e{i}.in"));
        std::fs::write(&inp, &c.input).unwrap();
        let args = format!(
            "{} {} {} {} {}",
            inp.display(),
            dir.join(format!("e{i}.nzf")).display(),
            hint_code(c.opts.dtype),
            c.opts.checksum as u32,
            c.opts.block_log2
        );
        lines.push(launch.cmd("enc", i, args));
    }
    let res = run_script_on(launch.bin(), &dir, &lines);
    let out = res
        .iter()
        .enumerate()
        .map(|(i, r)| {
            assert!(r.starts_with("ok "), "case {i}: harness encode said {r}");
            std::fs::read(dir.join(format!("e{i}.nzf"))).unwrap()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Decodes every (frame, cap) with the harness: Ok(bytes) or Err(status line).
fn harness_decode(frames: &[(Vec<u8>, usize)]) -> Vec<Result<Vec<u8>, String>> {
    harness_decode_with(frames, Launch::Seq)
}

fn harness_decode_with(
    frames: &[(Vec<u8>, usize)],
    launch: Launch,
) -> Vec<Result<Vec<u8>, String>> {
    harness_decode_op(frames, launch, "dec")
}

/// `op`: "dec" (nzc_decode: version-1 frames) or "dec2" (nzc_decode_v2: version 2).
fn harness_decode_op(
    frames: &[(Vec<u8>, usize)],
    launch: Launch,
    op: &str,
) -> Vec<Result<Vec<u8>, String>> {
    let dir = work_dir();
    let mut lines = Vec::new();
    for (i, (f, cap)) in frames.iter().enumerate() {
        let inp = dir.join(format!("d{i}.nzf"));
        std::fs::write(&inp, f).unwrap();
        let args = format!(
            "{} {} {}",
            inp.display(),
            dir.join(format!("d{i}.out")).display(),
            cap
        );
        lines.push(launch.cmd(op, i, args));
    }
    let out = run_script_on(launch.bin(), &dir, &lines)
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if r.starts_with("ok ") {
                Ok(std::fs::read(dir.join(format!("d{i}.out"))).unwrap())
            } else {
                Err(r.clone())
            }
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn cpu_frame(input: &[u8], opts: &EncodeOptions) -> Vec<u8> {
    let mut f = vec![0u8; max_compressed_size(input.len())];
    let n = compress(input, &mut f, opts).unwrap();
    f.truncate(n);
    f
}

#[test]
fn code_table_matches_codec_crate() {
    let text = frozen::kernel_source("kernels/nzc_codes.cuh");
    let rows: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{') && l.ends_with("},"))
        .map(|l| {
            l.trim_matches(|c| c == '{' || c == '}' || c == ',')
                .split(',')
                .map(|v| v.trim().parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 32);
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(
            &row[..],
            &nccl_zip_codec::codes::CODE_LENGTHS[k][..],
            "code {k}"
        );
    }
}

#[test]
fn smem_formula_v2_matches_kernels() {
    let lines: Vec<String> = (12..=20).map(|l| format!("smem2 {l}")).collect();
    let dir = work_dir();
    for (l, r) in (12..=20u32).zip(run_script(&dir, &lines)) {
        assert_eq!(
            r,
            format!("ok {}", nccl_net_zip::gpu::abi::smem_bytes_v2(l)),
            "block_log2 {l}"
        );
    }
}

#[test]
fn smem_formula_matches_kernels() {
    let lines: Vec<String> = (12..=20).map(|l| format!("smem {l}")).collect();
    let dir = work_dir();
    for (l, r) in (12..=20u32).zip(run_script(&dir, &lines)) {
        assert_eq!(
            r,
            format!("ok {}", nccl_net_zip::gpu::abi::smem_bytes(l)),
            "block_log2 {l}"
        );
    }
}

#[test]
fn frozen_vectors_byte_for_byte() {
    let man = frozen::manifest();
    assert!(man.len() >= 10, "MANIFEST lists {} vectors", man.len());
    let cases: Vec<EncCase> = man
        .iter()
        .map(|(v, opts)| EncCase {
            input: v.input.to_vec(),
            opts: *opts,
        })
        .collect();
    let frames = harness_encode(&cases);
    let mut dec = Vec::new();
    for ((v, _), (frame, case)) in man.iter().zip(frames.iter().zip(&cases)) {
        assert!(
            frame[..] == *v.frame,
            "vector {}: harness frame ({} bytes) != frozen frame ({} bytes)",
            v.name,
            frame.len(),
            v.frame.len()
        );
        dec.push((v.frame.to_vec(), case.input.len()));
    }
    for ((v, _), (r, case)) in man.iter().zip(harness_decode(&dec).into_iter().zip(&cases)) {
        assert_eq!(
            r.as_deref().ok(),
            Some(&case.input[..]),
            "vector {}: harness decode",
            v.name
        );
    }
    eprintln!(
        "kernels_host: {} frozen vectors reproduced and decoded",
        man.len()
    );
}

/// The embedded vectors are the ones on disk when the tree is at hand (a stale
/// build would otherwise test old bytes); from a copy without them, nothing to do.
#[test]
fn embedded_vectors_match_the_tree() {
    let dir = std::path::Path::new("codec/tests/vectors");
    if !dir.join("MANIFEST.txt").exists() {
        eprintln!("embedded_vectors_match_the_tree: no codec/tests/vectors under the current directory; embedded copies only");
        return;
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("MANIFEST.txt")).unwrap(),
        frozen::MANIFEST
    );
    for (v, _) in frozen::manifest() {
        for (ext, bytes) in [("in", v.input), ("nzf", v.frame)] {
            let disk = std::fs::read(dir.join(format!("{}.{ext}", v.name))).unwrap();
            assert!(
                disk == bytes,
                "{}.{ext} differs from the embedded copy",
                v.name
            );
        }
    }
}

// ---- seeded inputs --------------------------------------------------------------
fn gauss(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen_range(1e-12..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn f32_to_f16_bits(x: f32) -> u16 {
    // round-toward-zero conversion, enough to make fp16-shaped data
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xFF) as i32 - 127 + 15;
    let m = (b >> 13) & 0x3FF;
    if e <= 0 {
        sign
    } else if e >= 31 {
        sign | 0x7BFF
    } else {
        sign | ((e as u16) << 10) | m as u16
    }
}

fn gen_input(rng: &mut impl Rng, kind: u32, n: usize) -> Vec<u8> {
    let sigma = 10f64.powf(rng.gen_range(-6.0..2.0));
    let mut v = Vec::with_capacity(n + 4);
    match kind {
        0 => (0..n / 2 + 1).for_each(|_| {
            v.extend(((((gauss(rng) * sigma) as f32).to_bits() >> 16) as u16).to_le_bytes())
        }),
        1 => (0..n / 2 + 1).for_each(|_| {
            v.extend(f32_to_f16_bits((gauss(rng) * sigma.min(100.0)) as f32).to_le_bytes())
        }),
        2 => (0..n / 4 + 1).for_each(|_| v.extend(((gauss(rng) * sigma) as f32).to_le_bytes())),
        3 => {
            // gradient-like: wide scale mixture, some exact zeros
            (0..n / 2 + 1).for_each(|_| {
                let s = sigma * 2f64.powi(rng.gen_range(-12..12));
                let x = if rng.gen_bool(0.1) {
                    0.0
                } else {
                    gauss(rng) * s
                };
                v.extend((((x as f32).to_bits() >> 16) as u16).to_le_bytes())
            })
        }
        4 => {
            v.resize(n, 0);
            rng.fill_bytes(&mut v)
        }
        5 => (0..n / 4 + 1).for_each(|i| v.extend(((i as u32 * 7) % 1000).to_le_bytes())),
        _ => {
            // runs of constant bytes mixed with bf16 and random chunks
            while v.len() < n {
                let len = rng.gen_range(1..20000);
                match rng.gen_range(0..3) {
                    0 => v.extend(std::iter::repeat_n(rng.gen::<u8>(), len)),
                    1 => (0..len / 2).for_each(|_| {
                        v.extend(((((gauss(rng)) as f32).to_bits() >> 16) as u16).to_le_bytes())
                    }),
                    _ => (0..len).for_each(|_| v.push(rng.gen())),
                }
            }
        }
    }
    v.truncate(n);
    v
}

fn sweep_cases(seed: u64, count: usize) -> Vec<EncCase> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sizes = [
        0usize, 1, 17, 63, 64, 65, 1000, 4095, 4096, 4097, 8083, 12345, 65536, 70001, 131072,
        200003,
    ];
    let hints = [
        DtypeHint::Auto,
        DtypeHint::Auto,
        DtypeHint::Auto,
        DtypeHint::Bf16,
        DtypeHint::Fp16,
        DtypeHint::Fp32,
        DtypeHint::Raw,
        DtypeHint::Fp8E4m3,
    ];
    (0..count)
        .map(|i| {
            let n = if i < sizes.len() {
                sizes[i]
            } else if rng.gen_bool(0.3) {
                rng.gen_range(64..600_000)
            } else {
                sizes[rng.gen_range(0..sizes.len())]
            };
            let kind = rng.gen_range(0..7);
            EncCase {
                input: gen_input(&mut rng, kind, n),
                opts: EncodeOptions {
                    effort: Effort::Full,
                    dtype: hints[rng.gen_range(0..hints.len())],
                    checksum: rng.gen_bool(0.3),
                    block_log2: *[12u8, 13, 14, 16, 16, 16, 17, 20]
                        .get(rng.gen_range(0..8))
                        .unwrap(),
                    format: 1,
                },
            }
        })
        .collect()
}

#[test]
fn random_sweep_matches_cpu_encoder() {
    let cases = sweep_cases(0x5EED_C0DE, 80);
    let frames = harness_encode(&cases);
    let mut total = 0usize;
    for (i, (c, f)) in cases.iter().zip(&frames).enumerate() {
        let want = cpu_frame(&c.input, &c.opts);
        total += c.input.len();
        assert!(
            f == &want,
            "case {i}: n={} opts={:?}: harness frame {} bytes, CPU frame {} bytes",
            c.input.len(),
            c.opts,
            f.len(),
            want.len()
        );
    }
    // and the harness decodes the CPU frames
    let dec: Vec<(Vec<u8>, usize)> = cases
        .iter()
        .map(|c| (cpu_frame(&c.input, &c.opts), c.input.len()))
        .collect();
    for (i, (r, c)) in harness_decode(&dec).into_iter().zip(&cases).enumerate() {
        assert!(
            r.as_deref().ok() == Some(&c.input[..]),
            "case {i}: decode of CPU frame: {:?}",
            r.err()
        );
    }
    eprintln!(
        "kernels_host: {} random cases ({total} bytes) identical to the CPU encoder",
        cases.len()
    );
}

/// Two decoders' answers on the same frames: both accept with the same bytes,
/// or both reject. Returns how many both rejected.
fn same_decisions<E1: std::fmt::Debug, E2: std::fmt::Debug>(
    pairs: impl Iterator<Item = (Result<Vec<u8>, E1>, Result<Vec<u8>, E2>)>,
    a: &str,
    b: &str,
) -> usize {
    let mut rejected = 0;
    for (i, (x, y)) in pairs.enumerate() {
        match (&x, &y) {
            (Ok(p), Ok(q)) => assert_eq!(p, q, "frame {i}: both accept but outputs differ"),
            (Err(_), Err(_)) => rejected += 1,
            _ => panic!(
                "frame {i}: {a} {:?} vs {b} {:?}",
                x.as_ref().map(|v| v.len()),
                y.as_ref().map(|v| v.len())
            ),
        }
    }
    rejected
}

/// Frames of six kinds, each corrupted 40 ways (bit flips, truncation, padding,
/// garbage runs; some with a receive smaller than the message), and intact.
fn corrupt_frames() -> Vec<(Vec<u8>, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xBAD_F00D);
    let mut bases = Vec::new();
    for (kind, n, dt, ck, bl) in [
        (0u32, 70001usize, DtypeHint::Auto, true, 12u8),
        (1, 30000, DtypeHint::Fp16, false, 13),
        (2, 40000, DtypeHint::Fp32, true, 14),
        (6, 50000, DtypeHint::Auto, false, 12),
        (4, 5000, DtypeHint::Auto, true, 16),
        (0, 9000, DtypeHint::Bf16, false, 16),
    ] {
        let input = gen_input(&mut rng, kind, n);
        let opts = EncodeOptions {
            effort: Effort::Full,
            dtype: dt,
            checksum: ck,
            block_log2: bl,
            format: 1,
        };
        bases.push((cpu_frame(&input, &opts), input));
    }
    let mut frames = Vec::new();
    for (frame, input) in &bases {
        for t in 0..40 {
            let mut f = frame.clone();
            match t % 5 {
                0 | 1 => {
                    // flip a byte after the header (the header CRC catches header flips)
                    let p = rng.gen_range(24.min(f.len() - 1)..f.len());
                    f[p] ^= 1 << rng.gen_range(0..8);
                }
                2 => {
                    let cut = rng.gen_range(0..f.len());
                    f.truncate(cut);
                }
                3 => f.extend(std::iter::repeat_n(0u8, rng.gen_range(1..9))),
                _ => {
                    // random garbage in a random run of bytes, including the header
                    let p = rng.gen_range(0..f.len());
                    let e = (p + rng.gen_range(1..64)).min(f.len());
                    rng.fill_bytes(&mut f[p..e]);
                }
            }
            let cap = if t % 7 == 0 {
                input.len().saturating_sub(1)
            } else {
                input.len() + rng.gen_range(0..100)
            };
            frames.push((f, cap));
        }
        frames.push((frame.clone(), input.len()));
    }
    frames
}

#[test]
fn corrupt_frames_rejected_like_cpu_without_oob() {
    let frames = corrupt_frames();
    let res = harness_decode(&frames);
    let cpu = frames.iter().map(|(f, cap)| {
        let mut out = vec![0u8; *cap];
        decompress(f, &mut out).map(|n| out[..n].to_vec())
    });
    let rejected = same_decisions(cpu.zip(res), "CPU", "harness");
    assert!(
        rejected > frames.len() / 2,
        "only {rejected} of {} corrupted frames rejected",
        frames.len()
    );
    eprintln!("kernels_host: {} corrupted frames, {rejected} rejected, decisions identical to the CPU decoder", frames.len());
}

// ---- the concurrent executor (issue 19, item 7) ---------------------------------

/// ThreadSanitizer is really watching: a planted race in the harness fails it.
#[test]
fn tsan_reports_a_planted_race() {
    let dir = work_dir();
    let o = harness_output(harness_for(San::Thread), &dir, &["race".to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("ThreadSanitizer: data race"),
        "no race reported: {}\n{err}",
        o.status
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every frozen vector, encoded and decoded by concurrent launches (1-8 CTAs,
/// 1-3 copies of the job in one launch) under ThreadSanitizer: the same bytes.
#[test]
fn concurrent_launches_reproduce_frozen_vectors_under_tsan() {
    let man = frozen::manifest();
    let cases: Vec<EncCase> = man
        .iter()
        .map(|(v, opts)| EncCase {
            input: v.input.to_vec(),
            opts: *opts,
        })
        .collect();
    for seed in [1u64, 1000] {
        let launch = Launch::Conc {
            san: San::Thread,
            seed,
        };
        let frames = harness_encode_with(&cases, launch);
        for ((v, _), f) in man.iter().zip(&frames) {
            assert!(
                f[..] == *v.frame,
                "vector {} (seed {seed}): concurrent frame differs",
                v.name
            );
        }
        let dec: Vec<(Vec<u8>, usize)> = man
            .iter()
            .map(|(v, _)| (v.frame.to_vec(), v.input.len()))
            .collect();
        for ((v, _), r) in man.iter().zip(harness_decode_with(&dec, launch)) {
            assert_eq!(
                r.as_deref().ok(),
                Some(v.input),
                "vector {} (seed {seed}): concurrent decode",
                v.name
            );
        }
    }
    eprintln!(
        "kernels_host: {} frozen vectors through concurrent launches under TSan, twice",
        man.len()
    );
}

/// A seeded sweep through concurrent launches, under ThreadSanitizer and under
/// AddressSanitizer: frames identical to the CPU encoder, CPU frames decoded.
#[test]
fn concurrent_sweep_matches_cpu_under_tsan_and_asan() {
    let cases = sweep_cases(0xC0C0_A5A5, 36);
    let want: Vec<Vec<u8>> = cases.iter().map(|c| cpu_frame(&c.input, &c.opts)).collect();
    for san in [San::Thread, San::Address] {
        let launch = Launch::Conc { san, seed: 77 };
        let frames = harness_encode_with(&cases, launch);
        for (i, (c, (f, w))) in cases.iter().zip(frames.iter().zip(&want)).enumerate() {
            assert!(
                f == w,
                "{san:?} case {i}: n={} opts={:?}: concurrent frame {} bytes, CPU {} bytes",
                c.input.len(),
                c.opts,
                f.len(),
                w.len()
            );
        }
        let dec: Vec<(Vec<u8>, usize)> = want
            .iter()
            .zip(&cases)
            .map(|(f, c)| (f.clone(), c.input.len()))
            .collect();
        for (i, (r, c)) in harness_decode_with(&dec, launch)
            .into_iter()
            .zip(&cases)
            .enumerate()
        {
            assert!(
                r.as_deref().ok() == Some(&c.input[..]),
                "{san:?} case {i}: concurrent decode of the CPU frame: {:?}",
                r.err()
            );
        }
    }
    eprintln!(
        "kernels_host: {} sweep cases through concurrent launches under TSan and ASan",
        cases.len()
    );
}

/// Corrupted frames through concurrent decode launches under ThreadSanitizer:
/// the same decision and bytes as the sequential harness (whose decisions
/// `corrupt_frames_rejected_like_cpu_without_oob` ties to the CPU decoder).
#[test]
fn concurrent_decode_of_corrupt_frames_matches_sequential_under_tsan() {
    let frames = corrupt_frames();
    let seq = harness_decode(&frames);
    let conc = harness_decode_with(
        &frames,
        Launch::Conc {
            san: San::Thread,
            seed: 5,
        },
    );
    let rejected = same_decisions(seq.into_iter().zip(conc), "sequential", "concurrent");
    eprintln!(
        "kernels_host: {} corrupted frames through concurrent launches under TSan, {rejected} rejected by both",
        frames.len()
    );
}

// ---- the format v2 decoder (issue 19, item 1) -------------------------------------
// `dec2`/`pdec2` run decode_jobs<VERS_2> (the body of nzc_decode_v2), `dec`/`pdec`
// decode_jobs<VERS_1> (nzc_decode). The CPU decoder (codec/src/v2.rs) is the oracle.

/// A seeded input with what v2 codes specially: all-zero 64-byte lines and longer
/// zero rows, scattered exact zeros, a misaligned non-float prefix, -0.0 and NaNs.
fn gen_sparse(rng: &mut impl Rng, n: usize, w: usize) -> Vec<u8> {
    let prefix = rng.gen_range(0..4usize).min(n);
    let mut v: Vec<u8> = (0..prefix).map(|_| rng.gen()).collect();
    let sigma = 10f64.powf(rng.gen_range(-4.0..1.0));
    let p_zero = [0.0, 0.3, 0.7][rng.gen_range(0..3)];
    let row = 64 * rng.gen_range(1..64usize);
    while v.len() < n {
        if rng.gen_bool(0.15) {
            v.extend(std::iter::repeat_n(0u8, row));
            continue;
        }
        for _ in 0..row / w {
            let x = gauss(rng) * sigma;
            let bits: u32 = if rng.gen_bool(p_zero) {
                0
            } else if rng.gen_bool(0.002) {
                [0x8000_0000u32, 0x7FC0_0001, 0xFF80_0000, 1][rng.gen_range(0..4)]
            } else {
                (x as f32).to_bits()
            };
            if w == 4 {
                // fp32 holding bf16 values (low planes omitted) half of the time
                let b = if p_zero > 0.5 {
                    bits & 0xFFFF_0000
                } else {
                    bits
                };
                v.extend(b.to_le_bytes());
            } else {
                v.extend(((bits >> 16) as u16).to_le_bytes());
            }
        }
    }
    v.truncate(n);
    v
}

/// An input for FORMAT.md §V2.9/§V2.10, by `kind`: 0-2 channel-structured
/// activations (bf16, fp16, fp32; per-column scales with a period, some zero rows:
/// a column table, COL blocks with zero lines), 3-5 fp8 bytes (Gaussian; rows of 128
/// with their own scale: SHIFT; rows repeating a row with small changes: LAG), 6 mostly
/// subnormal fp16 (FP16N). Returns the input and the hint that reaches it.
fn gen_v2_ext(rng: &mut impl Rng, kind: u32, n: usize) -> (Vec<u8>, DtypeHint) {
    let mut v = Vec::with_capacity(n + 256);
    let fp8 = |mag: f64, neg: bool| (neg as u8) << 7 | mag.clamp(0.0, 126.0) as u8;
    let hint = match kind {
        0..=2 => {
            let w = [2usize, 2, 4][kind as usize];
            let p = 16 * rng.gen_range(1..100usize);
            let scale: Vec<f64> = (0..p).map(|_| 2f64.powi(rng.gen_range(-7..7))).collect();
            let sigma = 10f64.powf(rng.gen_range(-3.0..0.0));
            let mut i = 0usize;
            while v.len() < n {
                if i % p == 0 && rng.gen_bool(0.1) {
                    // a zero row (whole 64-byte lines when p * w is a multiple of 64)
                    v.extend(std::iter::repeat_n(0u8, p * w));
                    i += p;
                    continue;
                }
                let x = gauss(rng) * sigma * scale[i % p];
                match kind {
                    0 => v.extend((((x as f32).to_bits() >> 16) as u16).to_le_bytes()),
                    1 => v.extend(f32_to_f16_bits(x as f32).to_le_bytes()),
                    _ => v.extend((x as f32).to_le_bytes()),
                }
                i += 1;
            }
            [
                DtypeHint::Auto,
                DtypeHint::Bf16,
                DtypeHint::Fp16,
                DtypeHint::Fp32,
            ][if rng.gen_bool(0.5) {
                0
            } else {
                1 + kind as usize
            }]
        }
        3..=5 => {
            let row = 128 * rng.gen_range(1..9usize);
            let base: Vec<u8> = (0..row)
                .map(|_| fp8(60.0 + 10.0 * gauss(rng), rng.gen_bool(0.5)))
                .collect();
            while v.len() < n {
                let centre = rng.gen_range(20.0..100.0);
                for j in 0..row {
                    let b = match kind {
                        3 => fp8(56.0 + 8.0 * gauss(rng), rng.gen_bool(0.5)),
                        4 => fp8(centre + 4.0 * gauss(rng), rng.gen_bool(0.5)),
                        _ => {
                            let d = rng.gen_range(-2i32..=2);
                            (base[j] & 0x80) | ((base[j] & 0x7F) as i32 + d).clamp(0, 126) as u8
                        }
                    };
                    v.push(b);
                }
            }
            [DtypeHint::Fp8E4m3, DtypeHint::Fp8E5m2, DtypeHint::Auto][rng.gen_range(0..3)]
        }
        _ => {
            while v.len() < n {
                let g = gauss(rng);
                let bits: u16 = if rng.gen_bool(0.1) {
                    f32_to_f16_bits((g * 0.01) as f32)
                } else if rng.gen_bool(0.05) {
                    0x8000 * rng.gen::<bool>() as u16
                } else {
                    (((g.abs() * 200.0) as u16).min(1023)) | 0x8000 * (g < 0.0) as u16
                };
                v.extend(bits.to_le_bytes());
            }
            [DtypeHint::Auto, DtypeHint::Fp16][rng.gen_range(0..2)]
        }
    };
    v.truncate(n);
    (v, hint)
}

/// (mode, flags) of each block of a v2 block frame.
fn v2_block_modes(f: &[u8]) -> Vec<(u8, u8)> {
    let info = nccl_zip_codec::frame_info(f).unwrap();
    let t0 = if f[5] & 4 != 0 {
        24 + 2 + (u16::from_le_bytes([f[24], f[25]]) as usize).div_ceil(2)
    } else {
        24
    };
    let nb = info.blocks as usize;
    let mut pos = t0 + 4 * nb;
    (0..nb)
        .map(|i| {
            let size = u32::from_le_bytes(f[t0 + 4 * i..t0 + 4 * i + 4].try_into().unwrap());
            let r = (f[pos], if size > 1 { f[pos + 1] } else { 0 });
            pos += size as usize;
            r
        })
        .collect()
}

fn v2_opts(dtype: DtypeHint, checksum: bool, block_log2: u8) -> EncodeOptions {
    EncodeOptions {
        effort: Effort::Full,
        dtype,
        checksum,
        block_log2,
        format: 2,
    }
}

/// The sweep: sizes 0, odd and misaligned, every hint, block sizes 4 KiB-1 MiB,
/// dense (sweep_cases' kinds) and sparse inputs, all as format-2 CPU frames.
fn v2_sweep(seed: u64, count: usize) -> Vec<EncCase> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut cases: Vec<EncCase> = sweep_cases(seed, count / 2)
        .into_iter()
        .map(|c| EncCase {
            input: c.input,
            opts: EncodeOptions {
                format: 2,
                ..c.opts
            },
        })
        .collect();
    let sizes = [
        0usize, 1, 3, 17, 63, 64, 65, 127, 129, 4095, 4097, 8083, 12345, 65537, 70001, 262147,
    ];
    while cases.len() < count {
        let n = if cases.len() < count / 2 + sizes.len() {
            sizes[cases.len() - count / 2]
        } else {
            rng.gen_range(64..400_000)
        };
        let w = [2usize, 2, 4][rng.gen_range(0..3)];
        let hint = [
            DtypeHint::Auto,
            DtypeHint::Auto,
            DtypeHint::Bf16,
            DtypeHint::Fp16,
            DtypeHint::Fp32,
        ][rng.gen_range(0..5)];
        let bl = [12u8, 13, 16, 16, 17, 20][rng.gen_range(0..6)];
        cases.push(EncCase {
            input: gen_sparse(&mut rng, n, w),
            opts: v2_opts(hint, rng.gen_bool(0.3), bl),
        });
    }
    // §V2.9/§V2.10: every kind of gen_v2_ext at least once, then at random
    for i in 0..count / 3 {
        let kind = if i < 7 { i as u32 } else { rng.gen_range(0..7) };
        let n = rng.gen_range(9000..300_000);
        let (input, hint) = gen_v2_ext(&mut rng, kind, n);
        let bl = [12u8, 13, 14, 16, 17, 20][rng.gen_range(0..6)];
        cases.push(EncCase {
            input,
            opts: v2_opts(hint, rng.gen_bool(0.3), bl),
        });
    }
    cases
}

#[test]
fn v2_frozen_vectors_decode_byte_for_byte() {
    let man = frozen::manifest_v2();
    assert_eq!(man.len(), 28, "codec/tests/vectors/v2 holds 28 vectors");
    let frames: Vec<(Vec<u8>, usize)> = man
        .iter()
        .map(|(v, opts)| {
            // the vector is still what the CPU encoder writes
            assert!(
                cpu_frame(v.input, opts) == v.frame,
                "vector {}: CPU frame differs",
                v.name
            );
            (v.frame.to_vec(), v.input.len())
        })
        .collect();
    let mut ext = std::collections::BTreeMap::new();
    for ((v, _), r) in man
        .iter()
        .zip(harness_decode_op(&frames, Launch::Seq, "dec2"))
    {
        // FORMAT.md §V2.9's column tables and §V2.10's modes (fp8 frames: header
        // dtype 4/5, blocks of mode 5/6; FP16N: block mode 7) included
        if let Some(e) = frozen::v2_extension(v.frame) {
            *ext.entry(e).or_insert(0) += 1;
        }
        assert_eq!(r.as_deref().ok(), Some(v.input), "vector {}", v.name);
    }
    // the coltab_*, fp8_* and fp16n_* vectors at least (fp16_laplace_1e-5_subnormal
    // codes as FP16N, ll_lines and mixed_fill_raw_coded detect as fp8)
    for (e, min) in [("coltab", 4), ("fp8", 3), ("fp16n", 1)] {
        assert!(
            ext.get(e).copied().unwrap_or(0) >= min,
            "{e} vectors: {ext:?}"
        );
    }
    // each kernel rejects the other format's frames (ST_HEADER)
    let v1: Vec<(Vec<u8>, usize)> = frozen::manifest()
        .iter()
        .map(|(v, _)| (v.frame.to_vec(), v.input.len()))
        .collect();
    for (i, r) in harness_decode_op(&v1, Launch::Seq, "dec2")
        .into_iter()
        .enumerate()
    {
        assert_eq!(r, Err("err 2".to_string()), "v1 vector {i} through dec2");
    }
    for (i, r) in harness_decode_op(&frames, Launch::Seq, "dec")
        .into_iter()
        .enumerate()
    {
        assert_eq!(r, Err("err 2".to_string()), "v2 vector {i} through dec");
    }
    eprintln!(
        "kernels_host: {} v2 frozen vectors decoded byte for byte ({ext:?} use §V2.9/§V2.10)",
        man.len()
    );
}

#[test]
fn v2_sweep_decodes_cpu_frames() {
    let cases = v2_sweep(0x0002_5EED, 64);
    let frames: Vec<(Vec<u8>, usize)> = cases
        .iter()
        .map(|c| (cpu_frame(&c.input, &c.opts), c.input.len()))
        .collect();
    let (mut total, mut ext) = (0, std::collections::BTreeMap::new());
    for (i, ((r, c), (f, _))) in harness_decode_op(&frames, Launch::Seq, "dec2")
        .into_iter()
        .zip(&cases)
        .zip(&frames)
        .enumerate()
    {
        // frames using FORMAT.md §V2.9 (a column table) or §V2.10 (fp8, FP16N) included
        if let Some(e) = frozen::v2_extension(f) {
            *ext.entry(e).or_insert(0) += 1;
        }
        total += c.input.len();
        assert!(
            r.as_deref().ok() == Some(&c.input[..]),
            "case {i}: n={} opts={:?}: {:?}",
            c.input.len(),
            c.opts,
            r.err()
        );
    }
    for e in ["coltab", "fp8", "fp16n"] {
        assert!(ext.contains_key(e), "the sweep has no {e} frame: {ext:?}");
    }
    eprintln!(
        "kernels_host: {} v2 sweep frames ({total} bytes) decoded byte for byte ({ext:?} use §V2.9/§V2.10)",
        cases.len()
    );
}

/// Small v2 frames (coded blocks with lines, Z, explicit codes, phases; fp16; fp32
/// with omitted planes; checksum on and off), each cut at every length and flipped
/// at every bit after the header, plus larger frames corrupted at random.
fn v2_corrupt_frames() -> Vec<(Vec<u8>, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xBAD_0002);
    let mut frames = Vec::new();
    let small = [
        (gen_sparse(&mut rng, 700, 2), DtypeHint::Bf16, false),
        (gen_sparse(&mut rng, 900, 4), DtypeHint::Fp32, true),
        (gen_input(&mut rng, 1, 500), DtypeHint::Fp16, false),
        (gen_sparse(&mut rng, 1200, 2), DtypeHint::Auto, true),
    ];
    for (input, hint, ck) in &small {
        let f = cpu_frame(input, &v2_opts(*hint, *ck, 12));
        assert_eq!(f[4], 2);
        for cut in 0..f.len() {
            frames.push((f[..cut].to_vec(), input.len()));
        }
        for bit in 8 * 24..8 * f.len() {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            frames.push((g, input.len()));
        }
        frames.push((f, input.len()));
    }
    // §V2.9/§V2.10 frames: a column table with COL blocks (bf16 with zero lines,
    // fp16, fp32), fp8 blocks (plain, SHIFT, LAG), FP16N; each cut at every length
    // up to 400 bytes after the table and 150 more places, flipped at every bit of
    // its first 300 bytes after the header and at 600 more bits
    let ext = [
        (0u32, 9000usize, 12u8, "coltab", None),
        (1, 9000, 13, "coltab", None),
        (2, 20000, 13, "coltab", None),
        (3, 3000, 12, "fp8", Some((5u8, 0u8))),
        (4, 4000, 12, "fp8", Some((5, 1))),
        (5, 4000, 12, "fp8", Some((5, 2))),
        (6, 3000, 12, "fp16n", Some((7, 0))),
    ];
    for (kind, n, bl, want, block) in ext {
        // the first seed whose frame has what this entry is for
        let (input, f) = (0..64)
            .find_map(|_| {
                let (input, hint) = gen_v2_ext(&mut rng, kind, n);
                let hint = if (3..=5).contains(&kind) {
                    DtypeHint::Fp8E4m3
                } else {
                    hint
                };
                let f = cpu_frame(&input, &v2_opts(hint, kind % 2 == 0, bl));
                let ok = frozen::v2_extension(&f) == Some(want)
                    && match block {
                        Some(b) => v2_block_modes(&f).contains(&b),
                        None => v2_block_modes(&f)
                            .iter()
                            .any(|&(m, fl)| m >= 2 && fl & 4 != 0),
                    };
                ok.then_some((input, f))
            })
            .unwrap_or_else(|| panic!("no {want} {block:?} frame from gen_v2_ext kind {kind}"));
        let t0 = if f[5] & 4 != 0 {
            26 + (u16::from_le_bytes([f[24], f[25]]) as usize).div_ceil(2)
        } else {
            24
        };
        let mut cuts: Vec<usize> = (0..(t0 + 400).min(f.len())).collect();
        cuts.extend((0..150).map(|_| rng.gen_range(0..f.len())));
        for cut in cuts {
            frames.push((f[..cut].to_vec(), input.len()));
        }
        let mut bits: Vec<usize> = (8 * 24..8 * (24 + 300).min(f.len())).collect();
        bits.extend((0..600).map(|_| rng.gen_range(8 * 24..8 * f.len())));
        for bit in bits {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            frames.push((g, input.len()));
        }
        frames.push((f, input.len()));
    }
    for (n, w, ck, bl) in [
        (70001, 2, true, 12u8),
        (50000, 4, false, 14),
        (200000, 2, false, 16),
    ] {
        let input = gen_sparse(&mut rng, n, w);
        let f = cpu_frame(&input, &v2_opts(DtypeHint::Auto, ck, bl));
        for t in 0..60 {
            let mut g = f.clone();
            match t % 3 {
                0 => {
                    let p = rng.gen_range(24..g.len());
                    g[p] ^= 1 << rng.gen_range(0..8);
                }
                1 => g.truncate(rng.gen_range(0..f.len())),
                _ => {
                    let p = rng.gen_range(24..g.len());
                    let e = (p + rng.gen_range(1..32)).min(g.len());
                    rng.fill_bytes(&mut g[p..e]);
                }
            }
            let cap = if t % 7 == 0 {
                n - 1
            } else {
                n + rng.gen_range(0..100)
            };
            frames.push((g, cap));
        }
    }
    frames
}

#[test]
fn v2_corrupt_frames_rejected_like_cpu_without_oob() {
    let frames = v2_corrupt_frames();
    let res = harness_decode_op(&frames, Launch::Seq, "dec2");
    let cpu = frames.iter().map(|(f, cap)| {
        let mut out = vec![0u8; *cap];
        decompress(f, &mut out).map(|n| out[..n].to_vec())
    });
    // frames using FORMAT.md §V2.9/§V2.10 included: the same decisions
    let ext = frames
        .iter()
        .filter(|(f, _)| frozen::v2_extension(f).is_some())
        .count();
    let pairs = cpu.zip(res).map(|(c, g)| (c.map_err(|e| e.to_string()), g));
    let rejected = same_decisions(pairs, "CPU", "harness");
    eprintln!("kernels_host: {ext} of the corrupted frames still say §V2.9/§V2.10 in their header or block modes");
    // flips of plane bytes in frames without a checksum decode (to other bytes,
    // as on the CPU); everything else is rejected
    assert!(
        rejected > frames.len() / 2,
        "only {rejected} of {} corrupted v2 frames rejected",
        frames.len()
    );
    eprintln!(
        "kernels_host: {} corrupted v2 frames, {rejected} rejected, decisions identical to the CPU decoder",
        frames.len()
    );
}

#[test]
fn v2_concurrent_decode_under_tsan_and_asan() {
    let man = frozen::manifest_v2();
    let vec_frames: Vec<(Vec<u8>, usize)> = man
        .iter()
        .map(|(v, _)| (v.frame.to_vec(), v.input.len()))
        .collect();
    for seed in [1u64, 1000] {
        let launch = Launch::Conc {
            san: San::Thread,
            seed,
        };
        for ((v, _), r) in man
            .iter()
            .zip(harness_decode_op(&vec_frames, launch, "dec2"))
        {
            assert_eq!(
                r.as_deref().ok(),
                Some(v.input),
                "vector {} (seed {seed})",
                v.name
            );
        }
    }
    let cases = v2_sweep(0x0002_C0C0, 24);
    let frames: Vec<(Vec<u8>, usize)> = cases
        .iter()
        .map(|c| (cpu_frame(&c.input, &c.opts), c.input.len()))
        .collect();
    let mut ext = 0;
    for san in [San::Thread, San::Address] {
        let launch = Launch::Conc { san, seed: 78 };
        for (i, ((r, c), (f, _))) in harness_decode_op(&frames, launch, "dec2")
            .into_iter()
            .zip(&cases)
            .zip(&frames)
            .enumerate()
        {
            if frozen::v2_extension(f).is_some() {
                ext += 1;
            }
            assert!(
                r.as_deref().ok() == Some(&c.input[..]),
                "{san:?} case {i}: {:?}",
                r.err()
            );
        }
    }
    // corrupted frames: the same decisions and bytes as the sequential decoder
    let bad: Vec<(Vec<u8>, usize)> = v2_corrupt_frames().into_iter().step_by(7).collect();
    let seq = harness_decode_op(&bad, Launch::Seq, "dec2");
    let conc = harness_decode_op(
        &bad,
        Launch::Conc {
            san: San::Thread,
            seed: 6,
        },
        "dec2",
    );
    let rejected = same_decisions(seq.into_iter().zip(conc), "sequential", "concurrent");
    assert!(ext > 0, "the concurrent sweep has §V2.9/§V2.10 frames");
    eprintln!(
        "kernels_host: v2 through concurrent launches: {} vectors twice and {} sweep cases ({} using §V2.9/§V2.10; TSan, ASan), {} corrupted frames ({rejected} rejected by both)",
        man.len(),
        cases.len(),
        ext / 2,
        bad.len()
    );
}
