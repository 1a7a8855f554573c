//! The frozen vectors of codec/tests/vectors and the kernel sources, embedded in the
//! test binary at build time, so that the GPU and host-proof tests give the same
//! answer wherever the binary runs: the GPU machine gets prebuilt binaries
//! (scripts/gpu_bundle.sh) in a tree at another path, where a path baked in with
//! `env!("CARGO_MANIFEST_DIR")` does not exist.
#![allow(dead_code)]

use nccl_zip_codec::{DtypeHint, Effort, EncodeOptions};

/// One frozen vector: `input` compresses to exactly `frame` with the MANIFEST's options.
pub struct Vector {
    pub name: &'static str,
    pub input: &'static [u8],
    pub frame: &'static [u8],
}

macro_rules! embed_vectors {
    ($dir:literal: $($name:literal),* $(,)?) => {
        &[$(Vector {
            name: $name,
            input: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/codec/tests/vectors/", $dir, $name, ".in")),
            frame: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/codec/tests/vectors/", $dir, $name, ".nzf")),
        }),*]
    };
}

/// codec/tests/vectors/MANIFEST.txt as it was at build time.
pub const MANIFEST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/codec/tests/vectors/MANIFEST.txt"
));

/// Every vector MANIFEST.txt lists (checked by [`manifest`]: a vector added there
/// but not here fails every test that reads the vectors, naming it).
pub static VECTORS: &[Vector] = embed_vectors!(
    "":
    "bf16_gauss_0.02_70001",
    "bf16_gauss_1_b12",
    "fp16_gauss_0.5",
    "fp16_laplace_1e-5_subnormal",
    "fp32_gauss_1e-3",
    "fp32_gradient",
    "bf16_relu",
    "bf16_hint_on_fp32",
    "mixed_fill_raw_coded",
    "zeros",
    "random_stored",
    "tiny_17",
    "ll_lines",
    "ints",
    "empty",
);

/// codec/tests/vectors/v2/MANIFEST.txt (format 2) as it was at build time.
pub const MANIFEST_V2: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/codec/tests/vectors/v2/MANIFEST.txt"
));

/// Every vector of format 2 that MANIFEST_V2 lists.
pub static VECTORS_V2: &[Vector] = embed_vectors!(
    "v2/":
    "bf16_gauss_0.02_70001",
    "bf16_gauss_1_b12",
    "fp16_gauss_0.5",
    "fp16_laplace_1e-5_subnormal",
    "fp32_gauss_1e-3",
    "fp32_gradient",
    "bf16_relu",
    "bf16_hint_on_fp32",
    "mixed_fill_raw_coded",
    "zeros",
    "random_stored",
    "tiny_17",
    "ll_lines",
    "ints",
    "empty",
    "bf16_misaligned_prefix",
    "emb_grad_zero_rows",
    "fp32_holding_bf16",
    "moe_partial",
    "relu_fp32_specials_odd",
    "coltab_bf16_384",
    "coltab_bf16_lines",
    "coltab_fp16_phase1",
    "coltab_fp32_1536",
    "fp8_e4m3_gauss",
    "fp8_e5m2_shift_rows",
    "fp8_e4m3_lag_rows",
    "fp16n_subnormal_phase1",
);

/// Which of FORMAT.md §V2.9/§V2.10 a version-2 frame uses, for the tests' counts
/// (the GPU decoder `nzc_decode_v2` decodes them all, as the CPU decoder does):
/// "coltab" (header flag `COLTAB`), "fp8" (header dtype 4/5 or a block of mode 5/6),
/// "fp16n" (a block of mode 7), or None.
pub fn v2_extension(f: &[u8]) -> Option<&'static str> {
    if f.len() < 24 || f[4] != 2 {
        return None;
    }
    if f[5] & 4 != 0 {
        return Some("coltab");
    }
    if f[6] == 4 || f[6] == 5 {
        return Some("fp8");
    }
    let info = nccl_zip_codec::frame_info(f).ok()?;
    if info.stored {
        return None;
    }
    let nb = info.blocks as usize;
    let mut pos = 24 + 4 * nb;
    for i in 0..nb {
        let size = u32::from_le_bytes(f[24 + 4 * i..28 + 4 * i].try_into().unwrap()) as usize;
        match f.get(pos) {
            Some(5 | 6) => return Some("fp8"),
            Some(7) => return Some("fp16n"),
            _ => {}
        }
        pos += size;
    }
    None
}

/// The MANIFEST's vectors in its order, each with its options and embedded bytes.
pub fn manifest() -> Vec<(&'static Vector, EncodeOptions)> {
    manifest_of(MANIFEST, VECTORS, 1)
}

/// The same for format 2's vectors (codec/tests/vectors/v2).
pub fn manifest_v2() -> Vec<(&'static Vector, EncodeOptions)> {
    manifest_of(MANIFEST_V2, VECTORS_V2, 2)
}

fn manifest_of(
    text: &str,
    vectors: &'static [Vector],
    format: u8,
) -> Vec<(&'static Vector, EncodeOptions)> {
    let out: Vec<_> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let kv = |k: &str| {
                f.iter()
                    .find_map(|x| x.strip_prefix(k))
                    .unwrap_or_else(|| panic!("MANIFEST line without {k}: {l}"))
            };
            let dtype = match kv("dtype=") {
                "Auto" => DtypeHint::Auto,
                "Raw" => DtypeHint::Raw,
                "Bf16" => DtypeHint::Bf16,
                "Fp16" => DtypeHint::Fp16,
                "Fp32" => DtypeHint::Fp32,
                "Fp8E4m3" => DtypeHint::Fp8E4m3,
                "Fp8E5m2" => DtypeHint::Fp8E5m2,
                d => panic!("unknown dtype {d} in MANIFEST"),
            };
            let opts = EncodeOptions { effort: Effort::Full,
                dtype,
                checksum: kv("checksum=") == "true",
                block_log2: kv("block_log2=").parse().unwrap(),
                format,
            };
            let v = vectors.iter().find(|v| v.name == f[0]).unwrap_or_else(|| {
                panic!(
                    "MANIFEST lists vector {} but tests/frozen/mod.rs does not embed it: add it to VECTORS",
                    f[0]
                )
            });
            (v, opts)
        })
        .collect();
    assert_eq!(
        out.len(),
        vectors.len(),
        "tests/frozen/mod.rs embeds vectors MANIFEST.txt does not list"
    );
    out
}

/// The kernel sources the host harness compiles, as `(path in the tree, text)`.
pub static KERNEL_SOURCES: &[(&str, &str)] = &[
    (
        "kernels/host/harness.cpp",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/kernels/host/harness.cpp"
        )),
    ),
    (
        "kernels/nzc_codec.cuh",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/kernels/nzc_codec.cuh"
        )),
    ),
    (
        "kernels/nzc_codes.cuh",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/kernels/nzc_codes.cuh"
        )),
    ),
    (
        "kernels/nzc_common.cuh",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/kernels/nzc_common.cuh"
        )),
    ),
];

/// The embedded text of `path` (one of [`KERNEL_SOURCES`]).
pub fn kernel_source(path: &str) -> &'static str {
    KERNEL_SOURCES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("{path} is not embedded in tests/frozen/mod.rs"))
}

/// A scratch directory for this process: `std::env::temp_dir()` (the build-time
/// `CARGO_TARGET_TMPDIR` may not exist where the binary runs).
pub fn scratch_dir(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("nzc_{what}_{}", std::process::id()));
    std::fs::create_dir_all(&d)
        .unwrap_or_else(|e| panic!("cannot create scratch dir {}: {e}", d.display()));
    d
}
