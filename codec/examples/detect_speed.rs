//! Detection speed: ns per call of version 1's and version 2's dtype detection on
//! each 256 KiB chunk of a file (cache-hot: the same chunk over and over), best of
//! rounds. `cargo run --release -p nccl-zip-codec --example detect_speed -- FILE [CHUNK]`
use std::time::Instant;

fn main() {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let data = std::fs::read(&v[0]).expect("FILE");
    let chunk: usize = v.get(1).map(|s| s.parse().unwrap()).unwrap_or(262144);
    let c = &data[..chunk.min(data.len())];
    type Det = fn(&[u8]) -> nccl_zip_codec::Dtype;
    let dets: [(&str, Det); 2] = [
        ("v1 detect", nccl_zip_codec::detect_v1),
        ("v2 detect_v2", nccl_zip_codec::detect_v2),
    ];
    for (name, f) in dets {
        let mut best = f64::MAX;
        let mut d = None;
        for _ in 0..50 {
            let t = Instant::now();
            for _ in 0..200 {
                d = Some(f(std::hint::black_box(c)));
            }
            best = best.min(t.elapsed().as_secs_f64() / 200.0);
        }
        println!("{name}: {:.0} ns per call ({:?})", best * 1e9, d.unwrap());
    }
}
