//! The kernels' CRC32C combine (kernels/nzc_common.cuh, used by the GPU encoder's
//! CRC tree over parts of a large buffer) against the `crc32c` crate: its own
//! `crc32c_combine` for lengths up to 2^40 bytes, and a real 512 MiB + 3 byte
//! buffer hashed whole. The old combine indexed `x2n[k & 31]`, which is right for
//! zlib's CRC-32 but not CRC32C, so every length of 2^29 bytes or more was wrong.
//! Compiled with the host C++ compiler (no GPU, no nvcc needed).

use std::path::PathBuf;
use std::process::Command;

fn combine_tool() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("crc_combine");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("combine.cpp");
    std::fs::write(
        &src,
        format!(
            r#"#include <stdio.h>
#include <stdlib.h>
#include "{}/kernels/nzc_common.cuh"
// Reads "crc_a crc_b len_b" lines, prints the combined CRC of each.
int main() {{
    nzc::u32 x2n[32];
    nzc::crc_x2n_table(x2n);
    unsigned a, b;
    unsigned long long n;
    while (scanf("%u %u %llu", &a, &b, &n) == 3) printf("%u\n", nzc::crc32c_combine(x2n, a, b, n));
    return 0;
}}
"#,
            root.display()
        ),
    )
    .unwrap();
    let out = dir.join("combine");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let ok = Command::new(&cxx)
        .args(["-std=c++17", "-O2", "-Wall", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "cannot compile the combine tool with {cxx}");
    out
}

fn run(cases: &[(u32, u32, u64)]) -> Vec<u32> {
    use std::io::Write;
    let mut child = Command::new(combine_tool())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = String::new();
    for (a, b, n) in cases {
        input += &format!("{a} {b} {n}\n");
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

#[test]
fn combine_matches_the_crate_for_every_length_bit() {
    let mut cases = vec![];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for bit in 0..40u32 {
        for extra in [0u64, 1, 3, 0x1234] {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (1u64 << bit) + extra;
            cases.push(((x >> 32) as u32, x as u32, n));
        }
    }
    let got = run(&cases);
    let mut wrong = vec![];
    for (&(a, b, n), g) in cases.iter().zip(got) {
        let want = crc32c::crc32c_combine(a, b, n as usize);
        if g != want {
            wrong.push(n);
        }
    }
    assert!(wrong.is_empty(), "combine wrong for len_b = {wrong:?}");
}

#[test]
fn combine_matches_a_real_half_gib_part() {
    // A = 5 bytes, B = 2^29 + 3 bytes of a pattern: the first length whose bit 29
    // is set, where the old table lookup wrapped.
    let a = b"head!";
    let n = (1usize << 29) + 3;
    let b: Vec<u8> = (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8 >> 1)
        .collect();
    let whole = crc32c::crc32c_append(crc32c::crc32c(a), &b);
    let got = run(&[(crc32c::crc32c(a), crc32c::crc32c(&b), n as u64)]);
    assert_eq!(got, vec![whole]);
}
