//! Codec throughput with statistics (criterion): encode and decode of one NCCL-sized
//! message per iteration, for the data classes the plugin meets. Ratios, zstd and
//! the entropy bound are in `examples/codec_bench.rs` (scripts/bench_codec.sh).
//!
//! `cargo bench -p nccl-zip-codec --bench throughput`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::{bf16, f16};
use nccl_zip_codec::{compress, decompress, max_compressed_size, EncodeOptions};

/// Deterministic Gaussian values (Box–Muller over an xorshift stream).
fn gaussian(n: usize, sigma: f64, seed: u64) -> Vec<f64> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next(), next());
            sigma * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        })
        .collect()
}

fn data(kind: &str, bytes: usize) -> Vec<u8> {
    match kind {
        "bf16" => gaussian(bytes / 2, 0.02, 1)
            .iter()
            .flat_map(|&v| bf16::from_f64(v).to_le_bytes())
            .collect(),
        "fp16" => gaussian(bytes / 2, 0.02, 2)
            .iter()
            .flat_map(|&v| f16::from_f64(v).to_le_bytes())
            .collect(),
        "fp32" => gaussian(bytes / 4, 0.02, 3)
            .iter()
            .flat_map(|&v| (v as f32).to_le_bytes())
            .collect(),
        _ => {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            (0..bytes)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        }
    }
}

fn bench(c: &mut Criterion) {
    let opts = EncodeOptions::default();
    for kind in ["bf16", "fp16", "fp32", "random"] {
        let mut g = c.benchmark_group(kind);
        for bytes in [128 << 10, 1 << 20] {
            let src = data(kind, bytes);
            let mut frame = vec![0u8; max_compressed_size(bytes)];
            let n = compress(&src, &mut frame, &opts).unwrap();
            let mut out = vec![0u8; bytes];
            g.throughput(Throughput::Bytes(bytes as u64));
            g.bench_with_input(BenchmarkId::new("encode", bytes), &src, |b, s| {
                let mut f = vec![0u8; max_compressed_size(bytes)];
                b.iter(|| compress(black_box(s), &mut f, &opts).unwrap())
            });
            g.bench_with_input(BenchmarkId::new("decode", bytes), &frame[..n], |b, f| {
                b.iter(|| decompress(black_box(f), &mut out).unwrap())
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
