//! Frame digests of format 2 over a seeded corpus (dense, sparse, specials, odd sizes
//! and alignments, every dtype hint): one line per case, CRC32C and length of the
//! frame. Run on two commits and `diff` the outputs to check that an encoder change
//! kept every frame byte-identical (FORMAT.md V2.5–V2.7 are normative). With
//! `bench/data` (scripts/make_tensors.sh) the real tensors' first MiB is a case too.
//!
//! `cargo run --release -p nccl-zip-codec --example v2_digest [-- --effort fast] > digests.txt`
//! (`--effort fast`: the fast encoder's frames, FORMAT.md §V2.11, which follow their
//! own rules: compare them with another run of the same effort)
#[path = "../tests/common/mod.rs"]
mod common;
use common::*;
use nccl_zip_codec::*;

fn main() {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let effort = match v.as_slice() {
        [] => Effort::Full,
        [f, e] if f == "--effort" => Effort::parse(e).expect("--effort fast|full"),
        _ => panic!("usage: v2_digest [--effort fast|full]"),
    };
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    let n = 1 << 18;
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        for (i, s) in [1e-3, 1e-2, 1.0, 1e4].into_iter().enumerate() {
            cases.push((
                format!("gauss {s} {}", ty.name()),
                gaussian(ty, n, s, i as u64),
            ));
        }
        cases.push((format!("grad {}", ty.name()), gradient_like(ty, n, 7)));
        cases.push((format!("relu {}", ty.name()), relu_like(ty, n, 8)));
        cases.push((format!("laplace {}", ty.name()), laplace(ty, n, 0.1, 9)));
    }
    for pct in [0, 50, 92, 99] {
        cases.push((
            format!("emb {pct}"),
            embedding_grad(n, 4096, pct as f64 / 100.0, 3),
        ));
    }
    cases.push(("moe".into(), moe_dispatch(8, 8, 4096, 0.7, 4)));
    // channel structure (the column table, FORMAT.md §V2.9), dense and with ReLU's
    // zeros (elided lines and Z beside COL)
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        for (width, seed) in [(1536usize, 14u64), (4096, 15)] {
            let v = channels(ty, n, width, 0.05, seed);
            cases.push((format!("channels {width} {}", ty.name()), v.clone()));
            let w = ty.width();
            let mut relu = v;
            for x in relu.chunks_exact_mut(w) {
                if x[w - 1] & 0x80 != 0 {
                    x.fill(0);
                }
            }
            cases.push((format!("relu channels {width} {}", ty.name()), relu));
        }
    }
    // the real tensors of scripts/make_tensors.sh, where present: the first 1 MiB
    if let Ok(dir) = std::fs::read_dir("bench/data") {
        let mut files: Vec<_> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            if let Ok(mut d) = std::fs::read(&f) {
                d.truncate(1 << 20);
                cases.push((format!("file {}", f.display()), d));
            }
        }
    }
    cases.push((
        "bf16 in fp32".into(),
        bf16_in_fp32(&gaussian(Ty::Bf16, n / 2, 0.02, 5)),
    ));
    cases.push(("random".into(), Rng::new(6).bytes(n)));
    cases.push(("ll lines".into(), ll_lines(n, 10)));
    cases.push(("counters".into(), int_counters(n, 11)));
    // specials: -0.0, subnormals, inf, NaN and zeros sprinkled into Gaussian data
    let mut r = Rng::new(12);
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        let mut v = gaussian(ty, n, 0.1, 13);
        let w = ty.width();
        for _ in 0..n / w / 8 {
            let i = (r.next_u64() as usize % (n / w)) * w;
            let pick = r.next_u64() % 5;
            for b in 0..w {
                v[i + b] = match pick {
                    0 => 0,
                    1 => {
                        if b == w - 1 {
                            0x80
                        } else {
                            0
                        }
                    }
                    2 => {
                        if b == 0 {
                            1
                        } else {
                            0
                        }
                    }
                    3 => 0xFF,
                    _ => {
                        if b == w - 1 {
                            0x7F
                        } else {
                            0xFF
                        }
                    }
                };
            }
        }
        cases.push((format!("specials {}", ty.name()), v.clone()));
        // zero runs (lines) mixed with specials
        for c in v.chunks_mut(4096).step_by(3) {
            c[..2048].fill(0);
        }
        cases.push((format!("specials+zero runs {}", ty.name()), v));
    }
    let hints = [
        DtypeHint::Auto,
        DtypeHint::Bf16,
        DtypeHint::Fp16,
        DtypeHint::Fp32,
    ];
    for (name, data) in &cases {
        for (k, len) in [
            (0usize, data.len()),
            (1, 100_001),
            (3, 8191),
            (2, 65_537),
            (0, 4096 + 17),
        ] {
            let src = &data[k.min(data.len())..(k + len).min(data.len())];
            for hint in hints {
                for block_log2 in [16u8, 12] {
                    let opts = EncodeOptions {
                        format: 2,
                        dtype: hint,
                        block_log2,
                        effort,
                        ..EncodeOptions::default()
                    };
                    let mut dst = vec![0u8; max_compressed_size(src.len())];
                    let fl = compress(src, &mut dst, &opts).unwrap();
                    let mut back = vec![0u8; src.len()];
                    let m = decompress(&dst[..fl], &mut back).unwrap();
                    assert!(back[..m] == *src, "{name} round trip");
                    println!(
                        "{name} +{k} {len} {hint:?} {block_log2}: {fl} {:08x}",
                        crc32c::crc32c(&dst[..fl])
                    );
                }
            }
        }
    }
}
