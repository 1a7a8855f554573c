//! Codec benchmark: per dtype and data class, our ratio and single-thread GB/s
//! (encode, decode) in frame formats 1 and 2 against zstd levels 1 and 3 and the order-0 entropy bound, all
//! measured in the same run on the same bytes.
//!
//! `cargo run --release -p nccl-zip-codec --example codec_bench [-- --data DIR] [--msg BYTES] [--secs S]`
//!
//! Data: synthetic seeded classes, plus every `*.bf16`, `*.fp16`, `*.fp32` file in
//! DIR (default `bench/data`, written by `scripts/make_tensors.py`), plus sparse and
//! fp8 classes (issue 19) built from those files where the class is "real" and
//! synthetically otherwise (names start with `sparse:` and `fp8:`). Inputs are cut
//! into messages of `--msg` bytes (default 1 MiB, NCCL's largest; the plugin's chunk
//! is 256 KiB: `--msg 262144`) and each message is one frame, as the plugin does it.
//! `--effort fast` codes the v2 column with the fast encoder (docs/FORMAT.md §V2.11).
//! `--dump DIR` also writes each class's bytes to DIR (for `codec/tools/v2_estimate.py`).
#[path = "../tests/common/mod.rs"]
mod common;
use common::*;
use nccl_zip_codec::*;
use std::time::Instant;

struct Args {
    data: String,
    msg: usize,
    secs: f64,
    only: Option<String>,
    no_zstd: bool,
    dump: Option<String>,
    /// the v2 encoder's effort (`--effort fast|full`)
    effort: Effort,
}

fn args() -> Args {
    let mut a = Args {
        data: "bench/data".into(),
        msg: 1 << 20,
        secs: 0.4,
        only: None,
        no_zstd: false,
        dump: None,
        effort: Effort::Full,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        match v[i].as_str() {
            "--data" => a.data = v[i + 1].clone(),
            "--msg" => a.msg = v[i + 1].parse().expect("--msg BYTES"),
            "--secs" => a.secs = v[i + 1].parse().expect("--secs S"),
            "--only" => a.only = Some(v[i + 1].clone()),
            "--dump" => a.dump = Some(v[i + 1].clone()),
            "--effort" => a.effort = Effort::parse(&v[i + 1]).expect("--effort fast|full"),
            "--no-zstd" => {
                a.no_zstd = true;
                i += 1;
                continue;
            }
            "--bench" => {
                i += 1;
                continue;
            }
            x => panic!("unknown argument {x}"),
        }
        i += 2;
    }
    a
}

/// Best-of throughput: runs `f` over all messages repeatedly for about `secs`,
/// in rounds, and keeps the fastest round (the machine is shared and noisy).
fn gbps(total: usize, secs: f64, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < 3 || (start.elapsed().as_secs_f64() < secs && rounds < 200) {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        rounds += 1;
    }
    total as f64 / best / 1e9
}

/// Order-0 bound in bytes: entropy of the 16-bit values (bf16, fp16); of the top 16
/// bits plus the entropy of the low 16 bits (fp32: the two halves coded independently,
/// so an fp32 buffer holding bf16 values gets its low half at 0 bits); of the bytes
/// (fp8). Counts runs of zeros value by value: zstd can beat it on sparse data.
fn entropy_bound(w: usize, d: &[u8]) -> f64 {
    fn h(counts: &[u64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| -(c as f64) * (c as f64 / n as f64).log2())
            .sum()
    }
    if w == 1 {
        let mut hb = vec![0u64; 256];
        for &b in d {
            hb[b as usize] += 1;
        }
        return h(&hb) / 8.0;
    }
    let mut hi = vec![0u64; 1 << 16];
    let mut lo = vec![0u64; 1 << 16];
    for c in d.chunks_exact(w) {
        hi[u16::from_le_bytes([c[w - 2], c[w - 1]]) as usize] += 1;
        if w == 4 {
            lo[u16::from_le_bytes([c[0], c[1]]) as usize] += 1;
        }
    }
    (h(&hi) + if w == 4 { h(&lo) } else { 0.0 }) / 8.0
}

/// Best-of throughput of two codecs measured in alternating rounds (v1, v2; the
/// order flips every round), so that both see the same moments of a shared,
/// noisy machine: (GB/s of `f1`, GB/s of `f2`, median over rounds of `f2`'s
/// speed over `f1`'s in the same round).
fn paired(total: usize, secs: f64, mut f1: impl FnMut(), mut f2: impl FnMut()) -> (f64, f64, f64) {
    let (mut b1, mut b2) = (f64::MAX, f64::MAX);
    let mut ratios = Vec::new();
    let start = Instant::now();
    // Each round runs both: twice the time of one figure.
    while ratios.len() < 3 || (start.elapsed().as_secs_f64() < 2.0 * secs && ratios.len() < 200) {
        let time = |f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        };
        let (t1, t2) = if ratios.len() % 2 == 0 {
            let t1 = time(&mut f1);
            (t1, time(&mut f2))
        } else {
            let t2 = time(&mut f2);
            (time(&mut f1), t2)
        };
        b1 = b1.min(t1);
        b2 = b2.min(t2);
        ratios.push(t1 / t2);
    }
    ratios.sort_by(f64::total_cmp);
    let g = |t: f64| total as f64 / t / 1e9;
    (g(b1), g(b2), ratios[ratios.len() / 2])
}

/// Every message's frame under `opts`: (frames, lengths, detected types).
fn frames_of(opts: &EncodeOptions, msgs: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<usize>, String) {
    let mut frames: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| vec![0u8; max_compressed_size(m.len())])
        .collect();
    let mut lens = vec![0usize; msgs.len()];
    let mut detected = std::collections::BTreeMap::new();
    for (i, m) in msgs.iter().enumerate() {
        let st = compress_with_stats(m, &mut frames[i], opts).unwrap();
        lens[i] = st.frame_len;
        *detected
            .entry(st.dtype.map_or("raw", |d| d.name()))
            .or_insert(0) += 1;
    }
    let det: Vec<String> = detected.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    (frames, lens, det.join(" "))
}

/// Our codec in frame formats 1 and 2, timed in alternating rounds ([`paired`]):
/// per format (ratio, enc GB/s, dec GB/s, detected types), and v2/v1 encode and
/// decode as the median of the rounds' ratios.
#[allow(clippy::type_complexity)]
fn ours(
    msgs: &[&[u8]],
    total: usize,
    a: &Args,
    name: &str,
) -> ([(f64, f64, f64, String); 2], f64, f64) {
    let opts = |format| EncodeOptions {
        format,
        effort: a.effort,
        ..EncodeOptions::default()
    };
    let (o1, o2) = (opts(1), opts(2));
    let mut f = [frames_of(&o1, msgs), frames_of(&o2, msgs)];
    let mut out = vec![0u8; a.msg];
    for (k, (frames, lens, _)) in f.iter().enumerate() {
        for (i, m) in msgs.iter().enumerate() {
            let n = decompress(&frames[i][..lens[i]], &mut out).unwrap();
            assert!(&out[..n] == *m, "{name}: v{} round trip failed", k + 1);
        }
    }
    let [(f1, l1, d1), (f2, l2, d2)] = &mut f;
    let enc = |frames: &mut Vec<Vec<u8>>, o: &EncodeOptions| {
        for (i, m) in msgs.iter().enumerate() {
            std::hint::black_box(compress(m, &mut frames[i], o).unwrap());
        }
    };
    // Encoding again writes the same frames (the encoder is deterministic).
    let (e1, e2, er) = paired(total, a.secs, || enc(f1, &o1), || enc(f2, &o2));
    let mut out2 = vec![0u8; a.msg];
    let (dc1, dc2, dr) = paired(
        total,
        a.secs,
        || {
            for (i, f) in f1.iter().enumerate() {
                std::hint::black_box(decompress(&f[..l1[i]], &mut out).unwrap());
            }
        },
        || {
            for (i, f) in f2.iter().enumerate() {
                std::hint::black_box(decompress(&f[..l2[i]], &mut out2).unwrap());
            }
        },
    );
    let ratio = |l: &[usize]| total as f64 / l.iter().sum::<usize>() as f64;
    (
        [
            (ratio(l1), e1, dc1, std::mem::take(d1)),
            (ratio(l2), e2, dc2, std::mem::take(d2)),
        ],
        er,
        dr,
    )
}

fn run(name: &str, tname: &str, w: usize, data: &[u8], a: &Args) {
    let msgs: Vec<&[u8]> = data.chunks(a.msg).collect();
    let total = data.len();
    let ([v1, v2], enc_ratio, dec_ratio) = ours(&msgs, total, a, name);
    let mut out = vec![0u8; a.msg];
    let mut z = Vec::new();
    for level in if a.no_zstd { vec![] } else { vec![1, 3] } {
        let mut c = zstd::bulk::Compressor::new(level).unwrap();
        let mut zf: Vec<Vec<u8>> = msgs
            .iter()
            .map(|m| vec![0u8; zstd::zstd_safe::compress_bound(m.len())])
            .collect();
        let mut zl = vec![0usize; msgs.len()];
        let zenc = gbps(total, a.secs, || {
            for (i, m) in msgs.iter().enumerate() {
                zl[i] = c.compress_to_buffer(m, &mut zf[i][..]).unwrap();
            }
        });
        let mut d = zstd::bulk::Decompressor::new().unwrap();
        let zdec = gbps(total, a.secs, || {
            for (i, f) in zf.iter().enumerate() {
                std::hint::black_box(d.decompress_to_buffer(&f[..zl[i]], &mut out[..]).unwrap());
            }
        });
        z.push((total as f64 / zl.iter().sum::<usize>() as f64, zenc, zdec));
    }
    while z.len() < 2 {
        z.push((0.0, 0.0, 0.0));
    }
    let bound = total as f64 / entropy_bound(w, data);
    println!(
        "| {name} | {} | {:.1} | {:.4} | {:.4} | {:.2} / {:.2} | {:.4} | {:.2} / {:.2} | {:.4} | {:.2} / {:.2} | {:.4} | {:.2} / {:.2} | {} | {} | {:.2} / {:.2} |",
        tname,
        total as f64 / (1 << 20) as f64,
        bound,
        v1.0,
        v1.1,
        v1.2,
        v2.0,
        v2.1,
        v2.2,
        z[0].0,
        z[0].1,
        z[0].2,
        z[1].0,
        z[1].1,
        z[1].2,
        v1.3,
        v2.3,
        enc_ratio,
        dec_ratio
    );
}

type Gen = Box<dyn Fn() -> Vec<u8>>;

/// Reads `DIR/NAME`, or None when the real tensors have not been written.
fn real(dir: &str, name: &str) -> Option<Vec<u8>> {
    std::fs::read(std::path::Path::new(dir).join(name)).ok()
}

/// The sparse and fp8 classes of issue 19: (name, type name, element width, data).
fn issue19_sets(a: &Args, sets: &mut Vec<(String, &'static str, usize, Gen)>) {
    let size = 16 << 20;
    // Embedding-table gradient: only rows of tokens in the batch are non-zero; in a
    // reduce-scatter the zero rows fill hop by hop (92% -> 85% -> ... -> 50%).
    for (pct, seed) in [(92u32, 21u64), (50, 22), (85, 23), (99, 24)] {
        sets.push((
            format!("sparse: embedding grad, {pct}% zero rows (4096 wide)"),
            "bf16",
            2,
            Box::new(move || embedding_grad(size, 4096, pct as f64 / 100.0, seed)),
        ));
    }
    for (unfilled, seed) in [(30u32, 31u64), (60, 32)] {
        sets.push((
            format!("sparse: MoE dispatch, {unfilled}% unfilled capacity (4096 wide)"),
            "bf16",
            2,
            Box::new(move || moe_dispatch(8, 256, 4096, 1.0 - unfilled as f64 / 100.0, seed)),
        ));
    }
    sets.push((
        "sparse: fp32 holding bf16 (gauss σ=0.02)".into(),
        "fp32",
        4,
        Box::new(move || bf16_in_fp32(&gaussian(Ty::Bf16, size / 2, 0.02, 33))),
    ));
    let dir = a.data.clone();
    if let Some(w) = real(&dir, "weights.bf16") {
        sets.push((
            "sparse: fp32 holding bf16 (real weights)".into(),
            "fp32",
            4,
            Box::new(move || bf16_in_fp32(&w[..(size / 2).min(w.len())])),
        ));
    }
    if let Some(act) = real(&dir, "activations.fp32") {
        let vals = f32_values(&act);
        let relu: Vec<f64> = vals.iter().map(|v| v.max(0.0)).collect();
        let r2 = relu.clone();
        sets.push((
            "sparse: ReLU of real activations".into(),
            "bf16",
            2,
            Box::new(move || bf16_bytes(r2.iter().copied())),
        ));
        let r3 = relu.clone();
        sets.push((
            "sparse: ReLU of real activations".into(),
            "fp16",
            2,
            Box::new(move || encode(Ty::Fp16, r3.iter().copied())),
        ));
        sets.push((
            "sparse: ReLU of real activations".into(),
            "fp32",
            4,
            Box::new(move || encode(Ty::Fp32, relu.iter().copied())),
        ));
        let v2 = vals.clone();
        sets.push((
            "fp8: real activations, per-tensor scale".into(),
            "e4m3",
            1,
            Box::new(move || fp8_scaled(&v2, true)),
        ));
    }
    for (e4m3, tn) in [(true, "e4m3"), (false, "e5m2")] {
        sets.push((
            "fp8: gauss, per-tensor scale".into(),
            tn,
            1,
            Box::new(move || {
                let mut r = Rng::new(41);
                let v: Vec<f64> = (0..size / 2).map(|_| r.gauss()).collect();
                fp8_scaled(&v, e4m3)
            }),
        ));
    }
    if let Some(g) = real(&dir, "gradients.fp32") {
        let vals = f32_values(&g);
        sets.push((
            "fp8: real gradients, per-tensor scale".into(),
            "e5m2",
            1,
            Box::new(move || fp8_scaled(&vals, false)),
        ));
    }
    if let Some(wt) = real(&dir, "weights.fp32") {
        let vals = f32_values(&wt[..(size / 2).min(wt.len())]);
        sets.push((
            "fp8: real weights, per-tensor scale".into(),
            "e4m3",
            1,
            Box::new(move || fp8_scaled(&vals, true)),
        ));
    }
}

fn main() {
    let a = args();
    println!(
        "message size {} bytes, single thread, best-of rounds over ~{} s per figure; v1 and v2 \
         in alternating rounds, v2/v1 paired: the median over rounds of v2's speed over v1's in the same round; \
         v2 encoder effort: {}",
        a.msg,
        a.secs,
        a.effort.name()
    );
    println!("| data | type | MiB | order-0 bound | v1 | v1 enc/dec GB/s | v2 | v2 enc/dec GB/s | zstd-1 | zstd-1 enc/dec GB/s | zstd-3 | zstd-3 enc/dec GB/s | v1 detected (msgs) | v2 detected | v2/v1 enc/dec paired |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let size = 16 << 20;
    let mut sets: Vec<(String, &'static str, usize, Gen)> = Vec::new();
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        for (i, s) in [1e-3, 1e-2, 1e-1, 1.0].into_iter().enumerate() {
            sets.push((
                format!("gauss σ={s}"),
                ty.name(),
                ty.width(),
                Box::new(move || gaussian(ty, size, s, i as u64)),
            ));
        }
        sets.push((
            "grad-like (synthetic)".into(),
            ty.name(),
            ty.width(),
            Box::new(move || gradient_like(ty, size, 7)),
        ));
        sets.push((
            "relu (synthetic)".into(),
            ty.name(),
            ty.width(),
            Box::new(move || relu_like(ty, size, 8)),
        ));
    }
    sets.push((
        "random bytes".into(),
        "bf16",
        2,
        Box::new(move || Rng::new(9).bytes(size)),
    ));
    if let Ok(rd) = std::fs::read_dir(&a.data) {
        let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        for p in files {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            let ty = match ext {
                "bf16" => Ty::Bf16,
                "fp16" => Ty::Fp16,
                "fp32" => Ty::Fp32,
                _ => continue,
            };
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            sets.push((
                format!("real: {stem}"),
                ty.name(),
                ty.width(),
                Box::new(move || std::fs::read(&p).unwrap()),
            ));
        }
    }
    issue19_sets(&a, &mut sets);
    for (i, (name, tname, w, gen)) in sets.iter().enumerate() {
        if let Some(o) = &a.only {
            if !name.contains(o.as_str()) && tname != o {
                continue;
            }
        }
        let data = gen();
        if let Some(d) = &a.dump {
            std::fs::create_dir_all(d).unwrap();
            let slug: String = name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let path = std::path::Path::new(d).join(format!("{i:02}-{slug}.{tname}"));
            std::fs::write(path, &data).unwrap();
        }
        run(name, tname, *w, &data, &a);
    }
}
