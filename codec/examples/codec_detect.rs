//! What v1's dtype detection makes of data that does not start where the floats do
//! (issue 19, item 3): a small non-float prefix (integer counters, NCCL LL lines)
//! before the floats, a start misaligned by 1–3 bytes, and fp8 data. Each input is cut
//! into chunks of `--chunk` bytes (default 262144, the plugin's chunk) and every chunk
//! is one frame; the table gives the detected dtype per chunk and the ratio, against
//! the same data aligned and without a prefix. Measures; changes nothing.
//!
//! `cargo run --release -p nccl-zip-codec --example codec_detect [-- --data DIR] [--chunk BYTES] [--mib M]`
#[path = "../tests/common/mod.rs"]
mod common;
use common::*;
use nccl_zip_codec::*;
use std::collections::BTreeMap;

enum Variant {
    Aligned,
    Prefix(&'static str, usize),
    Offset(usize),
}

/// Detected dtypes (counted per chunk) and the ratio, chunk by chunk.
fn measure(data: &[u8], chunk: usize, v: &Variant) -> (String, f64, String) {
    let mut det = BTreeMap::new();
    let (mut coded, mut raw, mut stored) = (0u32, 0u32, 0u32);
    let (mut inb, mut outb) = (0usize, 0usize);
    let mut frame = vec![0u8; max_compressed_size(chunk)];
    let mut pos = match v {
        Variant::Offset(o) => *o,
        _ => 0,
    };
    let mut seed = 1u64;
    loop {
        let c: Vec<u8> = match v {
            Variant::Prefix(kind, p) => {
                if pos + chunk - p > data.len() {
                    break;
                }
                let mut c = match *kind {
                    "ints" => int_counters(*p, seed),
                    _ => ll_lines(*p, seed),
                };
                c.extend_from_slice(&data[pos..pos + chunk - p]);
                pos += chunk - p;
                c
            }
            _ => {
                if pos + chunk > data.len() {
                    break;
                }
                pos += chunk;
                data[pos - chunk..pos].to_vec()
            }
        };
        seed += 1;
        let st = compress_with_stats(&c, &mut frame, &EncodeOptions::default()).unwrap();
        *det.entry(st.dtype.map_or("raw", |d| d.name())).or_insert(0) += 1;
        coded += st.blocks_coded;
        raw += st.blocks_raw;
        stored += st.stored as u32;
        inb += c.len();
        outb += st.frame_len;
    }
    let d: Vec<String> = det.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    (
        d.join(" "),
        inb as f64 / outb as f64,
        format!("{coded} / {raw} / {stored}"),
    )
}

fn main() {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let (mut dir, mut chunk, mut mib) = ("bench/data".to_string(), 262144usize, 4usize);
    let mut i = 0;
    while i < v.len() {
        match v[i].as_str() {
            "--data" => dir = v[i + 1].clone(),
            "--chunk" => chunk = v[i + 1].parse().expect("--chunk BYTES"),
            "--mib" => mib = v[i + 1].parse().expect("--mib M"),
            "--bench" => {
                i += 1;
                continue;
            }
            x => panic!("unknown argument {x}"),
        }
        i += 2;
    }
    let size = mib << 20;
    let rd = |name: &str| -> Option<Vec<u8>> {
        std::fs::read(std::path::Path::new(&dir).join(name))
            .ok()
            .map(|mut d| {
                d.truncate(size);
                d
            })
    };
    let mut sets: Vec<(String, Vec<u8>)> = vec![
        (
            "gauss σ=0.02 bf16".into(),
            gaussian(Ty::Bf16, size, 0.02, 1),
        ),
        (
            "gauss σ=0.02 fp16".into(),
            gaussian(Ty::Fp16, size, 0.02, 2),
        ),
        (
            "gauss σ=0.02 fp32".into(),
            gaussian(Ty::Fp32, size, 0.02, 3),
        ),
    ];
    for (f, label) in [
        ("weights.bf16", "real weights bf16"),
        ("activations.fp16", "real activations fp16"),
        ("weights.fp32", "real weights fp32"),
        ("gradients.bf16", "real gradients bf16"),
    ] {
        if let Some(d) = rd(f) {
            sets.push((label.into(), d));
        }
    }
    let mut r = Rng::new(5);
    let g: Vec<f64> = (0..size).map(|_| r.gauss()).collect();
    sets.push((
        "fp8 e4m3 (gauss, per-tensor scale)".into(),
        fp8_scaled(&g, true),
    ));
    sets.push((
        "fp8 e5m2 (gauss, per-tensor scale)".into(),
        fp8_scaled(&g, false),
    ));
    if let Some(a) = rd("activations.fp32") {
        let vals = f32_values(&a);
        sets.push((
            "fp8 e4m3 (real activations)".into(),
            fp8_scaled(&vals, true),
        ));
    }
    let variants = [
        ("aligned", Variant::Aligned),
        ("64 B int prefix", Variant::Prefix("ints", 64)),
        ("256 B int prefix", Variant::Prefix("ints", 256)),
        ("512 B int prefix", Variant::Prefix("ints", 512)),
        ("256 B LL-line prefix", Variant::Prefix("ll", 256)),
        ("62 B int prefix", Variant::Prefix("ints", 62)),
        ("start +1 B", Variant::Offset(1)),
        ("start +2 B", Variant::Offset(2)),
        ("start +3 B", Variant::Offset(3)),
    ];
    println!("chunk {chunk} bytes, {mib} MiB per data set (less where the file is smaller)");
    println!("| data | variant | detected (chunks) | blocks coded / raw, stored frames | ratio | ratio / aligned |");
    println!("|---|---|---|---|---|---|");
    for (name, data) in &sets {
        let mut base = 0.0;
        for (vn, var) in &variants {
            let (det, ratio, blocks) = measure(data, chunk, var);
            if matches!(var, Variant::Aligned) {
                base = ratio;
            }
            println!(
                "| {name} | {vn} | {det} | {blocks} | {ratio:.4} | {:.3} |",
                ratio / base
            );
        }
    }
}
