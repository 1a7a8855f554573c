//! Codec throughput with statistics (criterion): encode and decode of one NCCL-sized
//! message per iteration, for the data classes the plugin meets. Ratios, zstd and
//! the entropy bound are in `examples/codec_bench.rs` (scripts/bench_codec.sh).
//!
//! `cargo bench -p nccl-zip-codec --bench throughput`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nccl_zip_codec::{compress, decompress, max_compressed_size, EncodeOptions};

#[path = "../tests/common/mod.rs"]
mod common;
use common::{gaussian, Rng, Ty};

/// One message of `bytes` bytes: Gaussian (sigma 0.02) of the type, or random bytes.
fn data(kind: &str, bytes: usize) -> Vec<u8> {
    match kind {
        "bf16" => gaussian(Ty::Bf16, bytes, 0.02, 1),
        "fp16" => gaussian(Ty::Fp16, bytes, 0.02, 2),
        "fp32" => gaussian(Ty::Fp32, bytes, 0.02, 3),
        _ => Rng::new(4).bytes(bytes),
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
