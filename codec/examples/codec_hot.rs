//! Focused hot-loop benchmark for profiling: one data set, 1 MiB frames, best-of
//! rounds of single-thread encode and decode GB/s. Also the workload for
//! `valgrind --tool=callgrind` instruction counts (`--rounds 1`).
//!
//! `cargo run --release -p nccl-zip-codec --example codec_hot -- [gauss:SIGMA|FILE] [bf16|fp16|fp32] [--rounds N] [--mib M] [--frame-kib K] [--enc-only|--dec-only] [--checksum|--checksum-ab] [--format 2] [--effort fast] [--no-table]`
//! (`--frame-kib 256`: frames the size of the plugin's default chunk). `--checksum-ab`
//! measures frames without and with the CRC32C (`NCCL_ZIP_CHECKSUM`) in the same
//! rounds, alternating, and the bare CRC32C of the data; `--checksum` alone codes
//! every frame with it (for instruction counts under callgrind).
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
    let (mut ab, mut checksum) = (false, false);
    let mut format = 1u8;
    let mut effort = Effort::Full;
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
            "--checksum-ab" => ab = true,
            "--checksum" => checksum = true,
            // version 2 without the column table search (frames differ from §V2.9's)
            "--no-table" => nccl_zip_codec::coltab::set_encoder_table(false),
            "--effort" => {
                effort = Effort::parse(&v[i + 1]).expect("--effort fast|full");
                i += 1;
            }
            "--format" => {
                format = v[i + 1].parse().unwrap();
                i += 1;
            }
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
    let variants: Vec<EncodeOptions> = if ab {
        vec![
            EncodeOptions {
                format,
                effort,
                ..EncodeOptions::default()
            },
            EncodeOptions {
                checksum: true,
                format,
                effort,
                ..EncodeOptions::default()
            },
        ]
    } else {
        vec![EncodeOptions {
            checksum,
            format,
            effort,
            ..EncodeOptions::default()
        }]
    };
    let total = data.len() as f64;
    struct V {
        frames: Vec<Vec<u8>>,
        lens: Vec<usize>,
        dec: Decoder,
        be: f64,
        bd: f64,
    }
    let mut vs: Vec<V> = variants
        .iter()
        .map(|opts| {
            let mut frames: Vec<Vec<u8>> = msgs
                .iter()
                .map(|m| vec![0u8; max_compressed_size(m.len())])
                .collect();
            let lens = msgs
                .iter()
                .zip(frames.iter_mut())
                .map(|(m, f)| compress(m, f, opts).unwrap())
                .collect();
            V {
                frames,
                lens,
                dec: Decoder::new(),
                be: f64::MAX,
                bd: f64::MAX,
            }
        })
        .collect();
    let mut out = vec![0u8; frame];
    let mut bc = f64::MAX;
    for _ in 0..rounds {
        for (opts, v) in variants.iter().zip(vs.iter_mut()) {
            if enc_on {
                let t = Instant::now();
                for (j, m) in msgs.iter().enumerate() {
                    v.lens[j] = std::hint::black_box(compress(m, &mut v.frames[j], opts).unwrap());
                }
                v.be = v.be.min(t.elapsed().as_secs_f64());
            }
            if dec_on {
                let t = Instant::now();
                for (j, f) in v.frames.iter().enumerate() {
                    std::hint::black_box(v.dec.decompress(&f[..v.lens[j]], &mut out).unwrap());
                }
                v.bd = v.bd.min(t.elapsed().as_secs_f64());
            }
        }
        if ab {
            let t = Instant::now();
            for m in &msgs {
                std::hint::black_box(crc32c::crc32c(m));
            }
            bc = bc.min(t.elapsed().as_secs_f64());
        }
    }
    for (opts, v) in variants.iter().zip(vs.iter()) {
        for (j, f) in v.frames.iter().enumerate() {
            let n = decompress(&f[..v.lens[j]], &mut out).unwrap();
            assert!(out[..n] == *msgs[j], "round trip failed");
        }
        let values = total / ty.width() as f64;
        println!(
            "{src} {}{}: {:.1} MiB in {} KiB frames, ratio {:.4}, enc {:.2} GB/s, dec {:.2} GB/s ({:.0} values)",
            ty.name(),
            if opts.checksum { " +crc32c" } else { "" },
            total / (1 << 20) as f64,
            frame >> 10,
            total / v.lens.iter().sum::<usize>() as f64,
            total / v.be / 1e9,
            total / v.bd / 1e9,
            values
        );
    }
    if ab {
        println!(
            "bare crc32c over the same frames: {:.2} GB/s",
            total / bc / 1e9
        );
    }
}
