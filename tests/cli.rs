//! The command-line tools as a user runs them (the built binaries): `--help` and
//! `--version`, the `nccl-zip` round trip and its failures, checksums that catch
//! every bit flip, and `probe` over safetensors and .npy files.

use nccl_net_zip::codec::{self, DtypeHint, EncodeOptions};
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, Normal};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ZIP: &str = env!("CARGO_BIN_EXE_nccl-zip");
const PERF: &str = env!("CARGO_BIN_EXE_nccl-zip-perf");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-zip-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).output().expect("spawn")
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn gaussian_bf16(n: usize, sigma: f64, seed: u64) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    let d = Normal::new(0.0, sigma).unwrap();
    (0..n)
        .flat_map(|_| half::bf16::from_f64(d.sample(&mut r)).to_le_bytes())
        .collect()
}

fn gaussian_f32(n: usize, sigma: f64, seed: u64) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    let d = Normal::new(0.0, sigma).unwrap();
    (0..n)
        .flat_map(|_| (d.sample(&mut r) as f32).to_le_bytes())
        .collect()
}

#[test]
fn help_and_version() {
    for bin in [ZIP, PERF] {
        let h = run(bin, &["--help"]);
        assert_eq!(code(&h), 0, "{bin} --help: {}", text(&h));
        let v = run(bin, &["--version"]);
        assert_eq!(code(&v), 0, "{bin} --version: {}", text(&v));
        let out = text(&v);
        assert!(
            out.contains(env!("CARGO_PKG_VERSION")) && out.contains("commit "),
            "{bin} --version: {out}"
        );
    }
    let h = text(&run(ZIP, &["--help"]));
    assert!(h.contains("fp8e4m3") && h.contains("fp8e5m2"), "{h}");
    let h = text(&run(ZIP, &["compress", "--help"]));
    assert!(h.contains("fp8e4m3") && h.contains("--no-checksum"), "{h}");
    // No command, an unknown one, an unknown dtype: usage errors, exit 2.
    assert_eq!(code(&run(ZIP, &[])), 2);
    assert_eq!(code(&run(ZIP, &["frobnicate"])), 2);
    assert_eq!(
        code(&run(ZIP, &["compress", "a", "b", "--dtype", "fp64"])),
        2
    );
    assert_eq!(code(&run(PERF, &["loop", "--sizes", "12Q"])), 2);
}

#[test]
fn compress_decompress_info_and_failures() {
    let d = scratch("roundtrip");
    let p = |n: &str| d.join(n).to_string_lossy().to_string();
    let data = gaussian_bf16(3 << 19, 0.05, 1);
    std::fs::write(p("in.bf16"), &data).unwrap();
    let o = run(
        ZIP,
        &["compress", &p("in.bf16"), &p("f.nzf"), "--dtype", "bf16"],
    );
    assert_eq!(code(&o), 0, "{}", text(&o));
    let frame = std::fs::read(p("f.nzf")).unwrap();
    assert!(
        frame.len() * 3 < data.len() * 2,
        "bf16 should compress > 1.5x-ish"
    );
    let o = run(ZIP, &["decompress", &p("f.nzf"), &p("out")]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(std::fs::read(p("out")).unwrap() == data);
    let info = text(&run(ZIP, &["info", &p("f.nzf")]));
    assert!(info.contains("checksum 0x"), "checksum by default: {info}");
    // The old flag is still accepted.
    let o = run(ZIP, &["compress", &p("in.bf16"), &p("g.nzf"), "--checksum"]);
    assert_eq!(code(&o), 0, "{}", text(&o));

    std::fs::write(p("trunc.nzf"), &frame[..100]).unwrap();
    assert_eq!(
        code(&run(ZIP, &["decompress", &p("trunc.nzf"), &p("x")])),
        1
    );
    assert_eq!(code(&run(ZIP, &["decompress", &p("in.bf16"), &p("x")])), 1);
    assert_eq!(code(&run(ZIP, &["decompress", &p("nope"), &p("x")])), 1);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Flips one bit at a time all over a compressed file (every header and block-table
/// bit, and a spread of payload bits): `decompress` must exit non-zero for every
/// flip. Without a checksum most payload flips decode to wrong bytes with exit 0.
#[test]
fn every_bit_flip_fails_decompress() {
    let d = scratch("flips");
    let p = |n: &str| d.join(n).to_string_lossy().to_string();
    // 4 blocks of 64 KiB: header, a 16-byte block table, coded blocks.
    let data = gaussian_bf16(100_000, 0.02, 7);
    std::fs::write(p("in"), &data).unwrap();
    assert_eq!(code(&run(ZIP, &["compress", &p("in"), &p("f")])), 0);
    let frame = std::fs::read(p("f")).unwrap();
    let fixed = 24 + 4 * 4;
    let mut bits: Vec<usize> = (0..fixed * 8).collect();
    let step = (frame.len() * 8 - fixed * 8) / 150;
    bits.extend((fixed * 8..frame.len() * 8).step_by(step.max(1)));
    bits.push(frame.len() * 8 - 1);
    let mut passed = Vec::new();
    for &bit in &bits {
        let mut bad = frame.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        std::fs::write(p("bad"), &bad).unwrap();
        let o = run(ZIP, &["decompress", &p("bad"), &p("out")]);
        if code(&o) == 0 {
            passed.push(bit);
        } else {
            assert_eq!(code(&o), 1, "bit {bit}: {}", text(&o));
        }
    }
    assert!(
        passed.is_empty(),
        "{} of {} bit flips decompressed with exit 0: bits {passed:?}",
        passed.len(),
        bits.len()
    );

    // --no-checksum: no CRC in the frame, and such files (like those of older
    // versions) still decompress, with a note on stderr.
    assert_eq!(
        code(&run(ZIP, &["compress", &p("in"), &p("n"), "--no-checksum"])),
        0
    );
    assert!(text(&run(ZIP, &["info", &p("n")])).contains("checksum none"));
    let o = run(ZIP, &["decompress", &p("n"), &p("out")]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(text(&o).contains("no checksum"));
    assert!(std::fs::read(p("out")).unwrap() == data);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A safetensors file written by hand (u64 header length, JSON header padded to 8
/// bytes, the tensors' bytes).
fn write_safetensors(path: &Path, tensors: &[(&str, &str, &[u8], usize)]) {
    let (mut hdr, mut off) = (Vec::new(), 0usize);
    for (name, dtype, bytes, width) in tensors {
        hdr.push(format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            bytes.len() / width,
            off + bytes.len()
        ));
        off += bytes.len();
    }
    let mut json = format!("{{{}}}", hdr.join(",")).into_bytes();
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut f = (json.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(&json);
    for (_, _, bytes, _) in tensors {
        f.extend_from_slice(bytes);
    }
    std::fs::write(path, f).unwrap();
}

fn direct_ratio(bytes: &[u8], dtype: DtypeHint) -> f64 {
    let mut out = vec![0u8; codec::max_compressed_size(bytes.len())];
    let opts = EncodeOptions {
        dtype,
        ..EncodeOptions::default()
    };
    bytes.len() as f64 / codec::compress(bytes, &mut out, &opts).unwrap() as f64
}

/// The probe's line for `name`: (dtype, bytes, ratio).
fn probe_line(out: &str, name: &str) -> (String, usize, f64) {
    let l = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no line for {name}:\n{out}"));
    let f: Vec<&str> = l.split_whitespace().collect();
    (
        f[1].to_string(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    )
}

#[test]
fn probe_reads_safetensors_per_tensor() {
    let d = scratch("probe");
    let path = d.join("model.safetensors");
    let w = gaussian_bf16(600_000, 0.02, 3); // 1.2 MB: 5 chunks, the last one short
    let b = gaussian_f32(200_000, 1e-3, 4);
    let ids: Vec<u8> = (0..4096u32)
        .flat_map(|i| (i as i64).to_le_bytes())
        .collect();
    write_safetensors(
        &path,
        &[
            ("layer.0.weight", "BF16", &w, 2),
            ("layer.0.bias", "F32", &b, 4),
            ("position_ids", "I64", &ids, 8),
        ],
    );
    let o = run(
        ZIP,
        &[
            "probe",
            path.to_str().unwrap(),
            "--link",
            "25gbit",
            "--cores",
            "8",
        ],
    );
    let out = text(&o);
    assert_eq!(code(&o), 0, "{out}");
    for (name, dtype, bytes, hint) in [
        ("layer.0.weight", "bf16", &w, DtypeHint::Bf16),
        ("layer.0.bias", "fp32", &b, DtypeHint::Fp32),
    ] {
        let (dt, n, ratio) = probe_line(&out, name);
        assert_eq!(dt, dtype, "{out}");
        assert_eq!(n, bytes.len());
        let direct = direct_ratio(bytes, hint);
        assert!(
            (ratio / direct - 1.0).abs() < 0.03,
            "{name}: probe {ratio} vs codec on the whole tensor {direct}\n{out}"
        );
    }
    let (dt, _, ratio) = probe_line(&out, "position_ids");
    assert_eq!(dt, "raw(I64)", "{out}");
    assert_eq!(ratio, 1.0);
    assert!(
        out.contains("overall:") && out.contains("predicted speedup"),
        "{out}"
    );
    assert!(out.contains("link    25.0 Gbit/s"), "{out}");

    // Not a float file read as bf16 by accident: a corrupt header is an error.
    let mut bad = std::fs::read(&path).unwrap();
    bad[0] = 0xFF;
    std::fs::write(d.join("bad.safetensors"), &bad).unwrap();
    let o = run(ZIP, &["probe", d.join("bad.safetensors").to_str().unwrap()]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn probe_reads_npy() {
    let d = scratch("npy");
    let vals = gaussian_f32(100_000, 0.1, 5);
    for (descr, want) in [("<f4", "fp32"), ("<f8", "raw(<f8)")] {
        let header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (100000,), }}");
        let mut h = header.into_bytes();
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(b' ');
        }
        h.push(b'\n');
        let mut f = b"\x93NUMPY\x01\x00".to_vec();
        f.extend_from_slice(&(h.len() as u16).to_le_bytes());
        f.extend_from_slice(&h);
        f.extend_from_slice(&vals);
        let path = d.join("t.npy");
        std::fs::write(&path, &f).unwrap();
        let o = run(ZIP, &["probe", path.to_str().unwrap(), "--link", "10gbit"]);
        let out = text(&o);
        assert_eq!(code(&o), 0, "{out}");
        let (dt, n, ratio) = probe_line(&out, path.to_str().unwrap());
        assert_eq!((dt.as_str(), n), (want, vals.len()), "{out}");
        if want == "fp32" {
            let direct = direct_ratio(&vals, DtypeHint::Fp32);
            assert!(
                (ratio / direct - 1.0).abs() < 0.03,
                "{ratio} vs {direct}\n{out}"
            );
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}
