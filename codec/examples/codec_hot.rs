//! Focused hot-loop benchmark for profiling: one data set, 1 MiB frames, best-of
//! rounds of single-thread encode and decode GB/s. Also the workload for
//! `valgrind --tool=callgrind` instruction counts (`--rounds 1`).
//!
//! `cargo run --release -p nccl-zip-codec --example codec_hot -- [gauss:SIGMA|FILE] [bf16|fp16|fp32] [--rounds N] [--mib M] [--frame-kib K] [--enc-only|--dec-only]`
//! (`--frame-kib 256`: frames the size of the plugin's default chunk).
#[path = "../tests/common/mod.rs"]
mod common;
use common::*;
use nccl_zip_codec::*;
use std::time::Instant;

fn main() {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let src = v.first().cloned().unwrap_or("gauss:0.02".into());
    let ty = match v.get(1).map(|s| s.as_str()).unwrap_or("bf16") {
        "fp16" => Ty::Fp16,
        "fp32" => Ty::Fp32,
        _ => Ty::Bf16,
    };
    let mut rounds = 30;
    let mut mib = 16usize;
    let mut frame = 1usize << 20;
    let (mut enc_on, mut dec_on) = (true, true);
    let mut i = 2;
    while i < v.len() {
        match v[i].as_str() {
            "--rounds" => {
                rounds = v[i + 1].parse().unwrap();
                i += 1;
            }
            "--mib" => {
                mib = v[i + 1].parse().unwrap();
                i += 1;
            }
            "--frame-kib" => {
                frame = v[i + 1].parse::<usize>().unwrap() << 10;
                i += 1;
            }
            "--enc-only" => dec_on = false,
            "--dec-only" => enc_on = false,
            x => panic!("unknown argument {x}"),
        }
        i += 1;
    }
    let data = if let Some(s) = src.strip_prefix("gauss:") {
        gaussian(ty, mib << 20, s.parse().unwrap(), 1)
    } else {
        std::fs::read(&src).unwrap()
    };
    let msgs: Vec<&[u8]> = data.chunks(frame).collect();
    let opts = EncodeOptions::default();
    let mut frames: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| vec![0u8; max_compressed_size(m.len())])
        .collect();
    let mut lens: Vec<usize> = msgs
        .iter()
        .zip(frames.iter_mut())
        .map(|(m, f)| compress(m, f, &opts).unwrap())
        .collect();
    let mut out = vec![0u8; frame];
    let mut dec = Decoder::new();
    let total = data.len() as f64;
    let (mut be, mut bd) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        if enc_on {
            let t = Instant::now();
            for (j, m) in msgs.iter().enumerate() {
                lens[j] = std::hint::black_box(compress(m, &mut frames[j], &opts).unwrap());
            }
            be = be.min(t.elapsed().as_secs_f64());
        }
        if dec_on {
            let t = Instant::now();
            for (j, f) in frames.iter().enumerate() {
                std::hint::black_box(dec.decompress(&f[..lens[j]], &mut out).unwrap());
            }
            bd = bd.min(t.elapsed().as_secs_f64());
        }
    }
    for (j, f) in frames.iter().enumerate() {
        let n = decompress(&f[..lens[j]], &mut out).unwrap();
        assert!(out[..n] == *msgs[j], "round trip failed");
    }
    let values = total / ty.width() as f64;
    println!(
        "{src} {}: {:.1} MiB in {} KiB frames, ratio {:.4}, enc {:.2} GB/s, dec {:.2} GB/s ({:.0} values)",
        ty.name(),
        total / (1 << 20) as f64,
        frame >> 10,
        total / lens.iter().sum::<usize>() as f64,
        total / be / 1e9,
        total / bd / 1e9,
        values
    );
}
