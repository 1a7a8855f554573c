//! The `nccl-zip` tool logic (`cli::cli_main`): round trip through files, probe, and
//! one-line failures with non-zero status on bad input.
mod common;
use common::*;
use nccl_zip_codec::cli::cli_main;

fn run(args: &[&str]) -> i32 {
    cli_main(
        std::iter::once("nccl-zip")
            .chain(args.iter().copied())
            .map(String::from)
            .collect(),
    )
}

#[test]
fn compress_decompress_probe_info() {
    let dir = std::env::temp_dir().join(format!("nccl-zip-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |n: &str| dir.join(n).to_string_lossy().to_string();
    let data = gaussian(Ty::Bf16, 3 << 20, 0.05, 1);
    std::fs::write(p("in.bf16"), &data).unwrap();
    assert_eq!(
        run(&[
            "compress",
            &p("in.bf16"),
            &p("f.nzf"),
            "--dtype",
            "bf16",
            "--checksum"
        ]),
        0
    );
    let frame = std::fs::read(p("f.nzf")).unwrap();
    assert!(
        frame.len() * 3 < data.len() * 2,
        "bf16 should compress by > 1.5x-ish"
    );
    assert_eq!(run(&["decompress", &p("f.nzf"), &p("out.bf16")]), 0);
    assert!(std::fs::read(p("out.bf16")).unwrap() == data);
    assert_eq!(run(&["probe", &p("in.bf16")]), 0);
    assert_eq!(run(&["info", &p("f.nzf")]), 0);

    // failures: corrupt frame, missing file, bad usage
    let mut bad = frame.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    std::fs::write(p("bad.nzf"), &bad).unwrap();
    assert_eq!(run(&["decompress", &p("bad.nzf"), &p("x")]), 1);
    std::fs::write(p("trunc.nzf"), &frame[..100]).unwrap();
    assert_eq!(run(&["decompress", &p("trunc.nzf"), &p("x")]), 1);
    assert_eq!(run(&["decompress", &p("in.bf16"), &p("x")]), 1);
    assert_eq!(run(&["decompress", &p("nope"), &p("x")]), 1);
    assert_eq!(
        run(&["compress", &p("in.bf16"), &p("x"), "--dtype", "fp64"]),
        2
    );
    assert_eq!(run(&["frobnicate"]), 2);
    assert_eq!(run(&[]), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
