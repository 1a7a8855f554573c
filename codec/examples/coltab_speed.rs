//! Version 2 with and without the column table (docs/FORMAT.md §V2.9), same run:
//! ratio and single-thread encode / decode GB/s per real tensor file, 256 KiB
//! messages (the plugin's chunk), best of rounds. Usage:
//! `cargo run --release -p nccl-zip-codec --example coltab_speed -- [DIR] [SECS]`
//! (DIR default bench/data, SECS per figure default 0.2).
use nccl_zip_codec::{coltab, compress, decompress, max_compressed_size, EncodeOptions};
use std::time::Instant;

fn best(secs: f64, mut f: impl FnMut()) -> f64 {
    let mut b = f64::MAX;
    let t0 = Instant::now();
    let mut r = 0;
    while r < 3 || (t0.elapsed().as_secs_f64() < secs && r < 200) {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64());
        r += 1;
    }
    b
}

fn main() {
    let mut a = std::env::args().skip(1);
    let dir = a.next().unwrap_or_else(|| "bench/data".into());
    let secs: f64 = a.next().map_or(0.2, |s| s.parse().unwrap());
    let opts = EncodeOptions {
        format: 2,
        ..EncodeOptions::default()
    };
    let msg = 262144;
    println!("| data | v2 no table | enc / dec GB/s | v2 with table | enc / dec GB/s | frames with a table |");
    println!("|---|---|---|---|---|---|");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("data dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for p in files {
        let data = std::fs::read(&p).unwrap();
        let msgs: Vec<&[u8]> = data.chunks(msg).collect();
        let mut frames: Vec<Vec<u8>> = msgs
            .iter()
            .map(|m| vec![0u8; max_compressed_size(m.len())])
            .collect();
        let mut out = vec![0u8; msg];
        let mut row = Vec::new();
        let mut tables = 0;
        for on in [false, true] {
            coltab::set_encoder_table(on);
            let mut lens = vec![0usize; msgs.len()];
            for (i, m) in msgs.iter().enumerate() {
                lens[i] = compress(m, &mut frames[i], &opts).unwrap();
                if on {
                    tables += (frames[i][5] & 4 != 0) as usize;
                }
                let n = decompress(&frames[i][..lens[i]], &mut out).unwrap();
                assert!(&out[..n] == *m);
            }
            let enc = best(secs, || {
                for (i, m) in msgs.iter().enumerate() {
                    std::hint::black_box(compress(m, &mut frames[i], &opts).unwrap());
                }
            });
            let dec = best(secs, || {
                for (i, f) in frames.iter().enumerate() {
                    std::hint::black_box(decompress(&f[..lens[i]], &mut out).unwrap());
                }
            });
            let g = |t: f64| data.len() as f64 / t / 1e9;
            row.push(format!(
                "{:.4} | {:.2} / {:.2}",
                data.len() as f64 / lens.iter().sum::<usize>() as f64,
                g(enc),
                g(dec)
            ));
        }
        println!(
            "| {} | {} | {} | {}/{} |",
            p.file_name().unwrap().to_string_lossy(),
            row[0],
            row[1],
            tables,
            msgs.len()
        );
    }
}
