//! Frozen test vectors: seeded inputs and their exact frames, committed under
//! `tests/vectors/` (`NAME.in`, `NAME.nzf`, listed in `MANIFEST.txt`). The CUDA
//! encoder/decoder (issue 4) must reproduce them byte for byte.
//!
//! Any change to the encoder's output makes this test fail. After a deliberate
//! format change (bump `format::VERSION`!), regenerate with
//! `NCCL_ZIP_REGEN_VECTORS=1 cargo test -p nccl-zip-codec --release --test vectors`.
mod common;
use common::{Rng, *};
use nccl_zip_codec::*;
use std::path::PathBuf;

struct Case {
    name: &'static str,
    opts: EncodeOptions,
    input: fn() -> Vec<u8>,
}

fn opts(dtype: DtypeHint, checksum: bool, block_log2: u8) -> EncodeOptions {
    EncodeOptions {
        effort: Effort::Full,
        dtype,
        checksum,
        block_log2,
        format: 1,
    }
}

fn cases() -> Vec<Case> {
    use DtypeHint::*;
    vec![
        Case {
            name: "bf16_gauss_0.02_70001",
            opts: opts(Auto, false, 16),
            input: || gaussian(Ty::Bf16, 70_002, 0.02, 101)[..70_001].to_vec(),
        },
        Case {
            name: "bf16_gauss_1_b12",
            opts: opts(Auto, true, 12),
            input: || gaussian(Ty::Bf16, 20_000, 1.0, 102),
        },
        Case {
            name: "fp16_gauss_0.5",
            opts: opts(Auto, false, 13),
            input: || gaussian(Ty::Fp16, 30_000, 0.5, 103),
        },
        Case {
            name: "fp16_laplace_1e-5_subnormal",
            opts: opts(Fp16, true, 12),
            input: || laplace(Ty::Fp16, 12_345, 1e-5, 104),
        },
        Case {
            name: "fp32_gauss_1e-3",
            opts: opts(Auto, true, 14),
            input: || gaussian(Ty::Fp32, 40_000, 1e-3, 105),
        },
        Case {
            name: "fp32_gradient",
            opts: opts(Fp32, false, 15),
            input: || gradient_like(Ty::Fp32, 50_003, 106),
        },
        Case {
            name: "bf16_relu",
            opts: opts(Bf16, false, 12),
            input: || relu_like(Ty::Bf16, 16_384, 107),
        },
        Case {
            name: "bf16_hint_on_fp32",
            opts: opts(Bf16, false, 12),
            input: || gaussian(Ty::Fp32, 9_000, 0.1, 108),
        },
        Case {
            name: "mixed_fill_raw_coded",
            opts: opts(Auto, true, 12),
            input: || {
                [
                    gaussian(Ty::Bf16, 8192, 0.1, 109),
                    vec![0; 4096],
                    vec![0x3F; 5000],
                    Rng::new(109).bytes(4096),
                    gaussian(Ty::Bf16, 3000, 0.1, 110),
                ]
                .concat()
            },
        },
        Case {
            name: "zeros",
            opts: opts(Auto, false, 12),
            input: || vec![0; 10_000],
        },
        Case {
            name: "random_stored",
            opts: opts(Auto, true, 16),
            input: || Rng::new(111).bytes(5_000),
        },
        Case {
            name: "tiny_17",
            opts: opts(Bf16, false, 16),
            input: || gaussian(Ty::Bf16, 18, 0.1, 112)[..17].to_vec(),
        },
        Case {
            name: "ll_lines",
            opts: opts(Auto, false, 16),
            input: || ll_lines(16_384, 113),
        },
        Case {
            name: "ints",
            opts: opts(Auto, false, 12),
            input: || int_counters(8_192, 114),
        },
        Case {
            name: "empty",
            opts: opts(Auto, false, 16),
            input: Vec::new,
        },
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

/// Format version 2 (docs/FORMAT.md §V2): `tests/vectors/v2/`, same names and
/// generators as version 1's where they apply, plus the sparse mechanisms.
fn cases_v2() -> Vec<Case> {
    let mut v: Vec<Case> = cases()
        .into_iter()
        .map(|mut c| {
            c.opts.format = 2;
            c
        })
        .collect();
    let o = |dtype, checksum, block_log2| EncodeOptions {
        format: 2,
        ..opts(dtype, checksum, block_log2)
    };
    use DtypeHint::*;
    v.push(Case {
        name: "emb_grad_zero_rows",
        opts: o(Auto, true, 14),
        input: || embedding_grad(60_000, 1024, 0.8, 120),
    });
    v.push(Case {
        name: "fp32_holding_bf16",
        opts: o(Auto, false, 14),
        input: || bf16_in_fp32(&gaussian(Ty::Bf16, 20_000, 0.02, 121)),
    });
    v.push(Case {
        name: "relu_fp32_specials_odd",
        opts: o(Fp32, true, 12),
        input: || {
            let mut b = relu_like(Ty::Fp32, 12_001, 122);
            // -0.0, NaN payloads, infinities, subnormals
            for (i, p) in [
                0x8000_0000u32,
                0x7FC0_0001,
                0xFF80_0000,
                0x0000_0001,
                0x7F80_0001,
            ]
            .iter()
            .enumerate()
            {
                b[400 * i..400 * i + 4].copy_from_slice(&p.to_le_bytes());
            }
            b
        },
    });
    v.push(Case {
        name: "bf16_misaligned_prefix",
        opts: o(Auto, false, 13),
        input: || [int_counters(61, 123), gaussian(Ty::Bf16, 20_000, 0.1, 123)].concat(),
    });
    v.push(Case {
        name: "moe_partial",
        opts: o(Bf16, false, 12),
        input: || moe_dispatch(2, 16, 256, 0.5, 124),
    });
    // the column table (FORMAT.md §V2.9): COLTAB frames, COL blocks
    v.push(Case {
        name: "coltab_bf16_384",
        opts: o(Auto, true, 14),
        input: || channels(Ty::Bf16, 70_000, 384, 0.05, 125),
    });
    v.push(Case {
        name: "coltab_bf16_lines",
        opts: o(Bf16, false, 12),
        input: || {
            // P = 1040, zero lines, -0.0, NaN, an odd length
            let mut b = channels(Ty::Bf16, 40_001, 1040, 0.1, 126);
            let mut r = Rng::new(126);
            for c in b.chunks_mut(64) {
                if r.next_u64() % 8 == 0 {
                    c.fill(0);
                }
            }
            b[1000..1002].copy_from_slice(&0x8000u16.to_le_bytes());
            b[3000..3002].copy_from_slice(&0x7FC1u16.to_le_bytes());
            b
        },
    });
    v.push(Case {
        name: "coltab_fp16_phase1",
        opts: o(Auto, false, 13),
        input: || [vec![7u8], channels(Ty::Fp16, 36_000, 96, 0.01, 127)].concat(),
    });
    v.push(Case {
        name: "coltab_fp32_1536",
        opts: o(Fp32, true, 15),
        input: || channels(Ty::Fp32, 100_000, 1536, 1.0, 128),
    });
    // §V2.10: fp8 byte codes (detected, plain), SHIFT (row scales), LAG (rows that
    // repeat), FP16N (subnormal fp16 at phase 1)
    v.push(Case {
        name: "fp8_e4m3_gauss",
        opts: o(Auto, true, 13),
        input: || {
            let mut r = Rng::new(125);
            let x: Vec<f64> = (0..20_001).map(|_| r.gauss()).collect();
            fp8_scaled(&x, true)
        },
    });
    v.push(Case {
        name: "fp8_e5m2_shift_rows",
        opts: o(Fp8E5m2, false, 13),
        input: || {
            let mut r = Rng::new(126);
            let x: Vec<f64> = (0..16_384)
                .map(|i| r.gauss() * 2f64.powi(((i / 256) % 7) as i32))
                .collect();
            fp8_scaled(&x, false)
        },
    });
    v.push(Case {
        name: "fp8_e4m3_lag_rows",
        opts: o(Fp8E4m3, false, 14),
        input: || {
            let mut r = Rng::new(127);
            let row: Vec<f64> = (0..384).map(|_| r.gauss()).collect();
            let x: Vec<f64> = (0..20_000)
                .map(|i| row[i % 384] * if r.next_u64() % 8 == 0 { 1.25 } else { 1.0 })
                .collect();
            fp8_scaled(&x, true)
        },
    });
    v.push(Case {
        name: "fp16n_subnormal_phase1",
        opts: o(Auto, true, 13),
        input: || {
            let mut r = Rng::new(128);
            let mut b = vec![7u8];
            b.extend(encode(Ty::Fp16, (0..10_000).map(|_| r.laplace() * 2e-6)));
            b[101..103].copy_from_slice(&0x7E01u16.to_le_bytes());
            b[203..205].copy_from_slice(&0x8000u16.to_le_bytes());
            b
        },
    });
    v
}

fn manifest_line(c: &Case, input: &[u8], frame: &[u8]) -> String {
    format!(
        "{} dtype={:?} checksum={} block_log2={} in={} frame={} crc32c(frame)={:#010x}",
        c.name,
        c.opts.dtype,
        c.opts.checksum,
        c.opts.block_log2,
        input.len(),
        frame.len(),
        crc32c::crc32c(frame)
    )
}

#[test]
fn frozen_vectors() {
    check_vectors(cases(), dir(), "v1");
}

#[test]
fn frozen_vectors_v2() {
    check_vectors(cases_v2(), dir().join("v2"), "v2");
}

fn check_vectors(cases: Vec<Case>, dir: PathBuf, fmt: &str) {
    let regen = std::env::var_os("NCCL_ZIP_REGEN_VECTORS").is_some();
    if regen {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut manifest = format!(
        "# Frozen vectors of format {fmt}: NAME.in -> NAME.nzf with these options.\n\
         # Inputs come from codec/tests/common/mod.rs (seeded); regenerate with\n\
         # NCCL_ZIP_REGEN_VECTORS=1 cargo test -p nccl-zip-codec --release --test vectors\n",
    );
    for c in cases {
        let input = (c.input)();
        let mut frame = vec![0u8; max_compressed_size(input.len())];
        let n = compress(&input, &mut frame, &c.opts).unwrap();
        frame.truncate(n);
        manifest.push_str(&manifest_line(&c, &input, &frame));
        manifest.push('\n');
        let (pin, pf) = (
            dir.join(format!("{}.in", c.name)),
            dir.join(format!("{}.nzf", c.name)),
        );
        if regen {
            std::fs::write(&pin, &input).unwrap();
            std::fs::write(&pf, &frame).unwrap();
            continue;
        }
        let want_in = std::fs::read(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
        let want_f = std::fs::read(&pf).unwrap_or_else(|e| panic!("{}: {e}", pf.display()));
        assert!(
            want_in == input,
            "{}: the seeded generator no longer gives the committed input",
            c.name
        );
        assert!(
            want_f == frame,
            "{}: the encoder no longer gives the committed frame (format change?)",
            c.name
        );
        let mut out = vec![0u8; input.len()];
        assert_eq!(decompress(&want_f, &mut out).unwrap(), input.len());
        assert!(
            out == input,
            "{}: committed frame does not decode to the input",
            c.name
        );
    }
    let pm = dir.join("MANIFEST.txt");
    if regen {
        std::fs::write(&pm, &manifest).unwrap();
    } else {
        assert_eq!(std::fs::read_to_string(&pm).unwrap(), manifest);
    }
}
