//! The AVX-512 encoder paths (bf16 and fp32 split with Z's compaction; the 64-key
//! packer) and the AVX2 ones of Z (`avx2_z`: the split with its compaction) write
//! the same frames as the older AVX2 path (version 1's split, then an 8-byte
//! compaction) and the portable encoder, and the AVX-512 and `avx2_z` decoder paths
//! (Z's spread and join) read every frame, intact or with bits flipped, as the older
//! AVX2 decoder does, on data made to reach each of their branches: escapes in one
//! half of a 64-key step, long codes (16- and 8-element chunks over 56 bits),
//! escaped `e = 0` under Z, sub-segments whose length is not a multiple of 64 or
//! 32, and misaligned starts. One test: the switches (`set_avx512`, `set_avx2_z`)
//! are process-wide. Without AVX-512 it compares the AVX2 paths alone.
mod common;
use common::{Rng, *};
use nccl_zip_codec::*;

fn frame(src: &[u8], o: &EncodeOptions) -> Vec<u8> {
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut f, o).unwrap();
    f.truncate(n);
    f
}

/// Elements whose exponents spread over `span` values around 127 (bf16 and fp32
/// bit patterns; fp16's field is narrower: `span` is clamped by the field).
fn spread(ty: Ty, nbytes: usize, span: u32, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let w = ty.width();
    let mut v = vec![0u8; nbytes / w * w];
    for x in v.chunks_exact_mut(w) {
        let e = 127 - span / 2 + (r.next_u64() % span as u64) as u32;
        let m = r.next_u64();
        match ty {
            Ty::Fp32 => x.copy_from_slice(&(((m as u32) & 0x807F_FFFF) | (e << 23)).to_le_bytes()),
            Ty::Bf16 => {
                x.copy_from_slice(&((((m as u32) & 0x807F) | (e << 7)) as u16).to_le_bytes())
            }
            Ty::Fp16 => {
                let e = 15 - 15.min(span / 2) + (e % 30.min(span));
                x.copy_from_slice(&((((m as u32) & 0x83FF) | (e << 10)) as u16).to_le_bytes())
            }
        }
    }
    v
}

/// The vector paths compared with the reference (the older AVX2 path): AVX-512's
/// where the CPU has it, then `avx2_z`.
const PATHS: [(&str, bool, bool); 2] = [("AVX-512", true, true), ("avx2_z", false, true)];

/// Switches to `(avx512, avx2_z)`; false where the CPU lacks AVX-512 and it was asked.
fn switch(avx512: bool, avx2_z: bool) -> bool {
    set_avx2_z(avx2_z);
    set_avx512(avx512) == avx512
}

#[test]
fn vector_paths_write_the_avx2_frames() {
    if !std::is_x86_feature_detected!("avx2") {
        println!("skipped: this CPU lacks AVX2");
        return;
    }
    if !switch(true, true) {
        println!(
            "AVX-512 paths skipped: this CPU lacks AVX-512 F, BW, VL, VBMI or VBMI2; comparing the AVX2 paths"
        );
    }
    let paths: Vec<_> = PATHS.iter().filter(|p| switch(p.1, p.2)).collect();
    let n = 1 << 17;
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        cases.push((format!("gauss {}", ty.name()), gaussian(ty, n, 0.05, 1)));
        cases.push((format!("relu {}", ty.name()), relu_like(ty, n, 2)));
        cases.push((format!("grad {}", ty.name()), gradient_like(ty, n, 3)));
        // escapes now and then: one half of some 64-key steps
        let mut g = gaussian(ty, n, 0.05, 4);
        let w = ty.width();
        let mut r = Rng::new(5);
        for _ in 0..n / w / 200 {
            let i = (r.next_u64() as usize % (n / w)) * w;
            g[i + w - 1] ^= 0x40;
        }
        cases.push((format!("outliers {}", ty.name()), g));
        // long codes (wide blocks: 8-element chunks, some over 56 bits)
        for span in [12, 24, 40] {
            cases.push((
                format!("spread {span} {}", ty.name()),
                spread(ty, n, span, 6 + span as u64),
            ));
        }
        // zeros with subnormals: an escaped e = 0 under Z in some sub-segments
        let mut z = relu_like(ty, n, 7);
        for c in z.chunks_exact_mut(w).step_by(1500) {
            c.fill(0);
            c[0] = 1;
        }
        cases.push((format!("relu+subnormal {}", ty.name()), z));
        // zero lines among ReLU's zeros
        let mut l = relu_like(ty, n, 8);
        for c in l.chunks_mut(4096).step_by(3) {
            c[..1024].fill(0);
        }
        cases.push((format!("relu+lines {}", ty.name()), l));
        // one zero line in the second block only, and a zero short last line only:
        // the fast encoder's AVX-512 split meets it after a block without one
        // (and codes the block again with the scan)
        let mut late = relu_like(ty, n, 16);
        late[n / 2 + 1000..n / 2 + 1256].fill(0);
        cases.push((format!("relu, one late line {}", ty.name()), late));
        // one zero line alone, the second of a 128-byte step (the split takes 64
        // bf16 or fp32 elements a step)
        let mut odd = relu_like(ty, n, 18);
        odd[n / 2 + 64 * 21..n / 2 + 64 * 22].fill(0);
        cases.push((format!("relu, one odd line {}", ty.name()), odd));
        // and the first of one (avx2_z's fp32 split takes two lines a step)
        let mut even = relu_like(ty, n, 19);
        even[n / 2 + 64 * 20..n / 2 + 64 * 21].fill(0);
        cases.push((format!("relu, one even line {}", ty.name()), even));
        let mut tail = relu_like(ty, n - 64 + 2 * w, 17);
        let tl = tail.len();
        tail[tl - 2 * w..].fill(0);
        cases.push((format!("relu, zero tail {}", ty.name()), tail));
    }
    cases.push(("emb 92".into(), embedding_grad(n, 4096, 0.92, 9)));
    cases.push(("moe".into(), moe_dispatch(4, 8, 4096, 0.7, 10)));
    cases.push((
        "bf16 in fp32".into(),
        bf16_in_fp32(&gaussian(Ty::Bf16, n / 2, 0.02, 11)),
    ));
    let mut compared = 0;
    for (name, data) in &cases {
        for (k, len) in [
            (0usize, data.len()),
            (1, 100_001),
            (3, 65_536 + 4 * 37),
            (2, 8191),
        ] {
            let src = &data[k.min(data.len())..(k + len).min(data.len())];
            for effort in [Effort::Full, Effort::Fast] {
                for dtype in [DtypeHint::Auto, DtypeHint::Bf16, DtypeHint::Fp32] {
                    let o = EncodeOptions {
                        format: 2,
                        effort,
                        dtype,
                        ..EncodeOptions::default()
                    };
                    assert!(switch(false, false));
                    let b = frame(src, &o);
                    for &&(path, x, z) in &paths {
                        assert!(switch(x, z));
                        let a = frame(src, &o);
                        assert!(a == b, "{path} and AVX2 frames differ: {name}, +{k}, {o:?}");
                    }
                    // and the portable encoder's
                    same_as_scalar(src, &o);
                    // the vector decoders (Z's spread and join) and the older AVX2
                    // one agree on corrupt frames too: the same bytes or both an
                    // error; intact, they give the source
                    let mut r = Rng::new(compared as u64);
                    for t in 0..4 {
                        let mut f = b.clone();
                        if t > 0 {
                            let fl = f.len();
                            for _ in 0..t {
                                let i = 24 + r.next_u64() as usize % (fl - 24);
                                f[i] ^= 1 << (r.next_u64() % 8);
                            }
                        }
                        let mut o2 = vec![0u8; src.len()];
                        assert!(switch(false, false));
                        let r2 = decompress(&f, &mut o2);
                        if t == 0 {
                            assert!(r2.is_ok() && o2 == src, "round trip: {name}, +{k}, {o:?}");
                        }
                        for &&(path, x, z) in &paths {
                            let mut o1 = vec![0u8; src.len()];
                            assert!(switch(x, z));
                            let r1 = decompress(&f, &mut o1);
                            assert!(
                                r1.is_ok() == r2.is_ok() && (r1.is_err() || o1 == o2),
                                "{path} and AVX2 decoders differ: {name}, +{k}, {o:?}, {t} flips"
                            );
                        }
                    }
                    compared += 1;
                }
            }
        }
    }
    println!("{compared} encodings compared");
}
