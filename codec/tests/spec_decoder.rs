//! An independent, deliberately naive decoder written from docs/FORMAT.md alone
//! (bit-at-a-time canonical decoding; only the code-length table is shared). It must
//! agree with the fast decoder on the frozen vectors and on fresh frames, so the
//! document and the implementation cannot drift apart unnoticed.
mod common;
use common::*;
use nccl_zip_codec::codes::CODE_LENGTHS;
use nccl_zip_codec::*;

struct Bits<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> u32 {
        let v = (self.b[self.pos / 8] >> (self.pos % 8)) & 1;
        self.pos += 1;
        v as u32
    }
    fn field(&mut self, w: u32) -> u32 {
        (0..w).map(|i| self.bit() << i).sum()
    }
}

/// Canonical code (MSB-first value) per symbol, per FORMAT.md §5.
fn canonical(lens: &[u8; 26]) -> Vec<(u32, u32, usize)> {
    let mut syms: Vec<usize> = (0..26).collect();
    syms.sort_by_key(|&s| (lens[s], s));
    let mut out = Vec::new();
    let (mut code, mut prev) = (0u32, 0u32);
    for (i, &s) in syms.iter().enumerate() {
        let l = lens[s] as u32;
        if i > 0 {
            code = (code + 1) << (l - prev);
        }
        prev = l;
        out.push((l, code, s));
    }
    out
}

fn spec_decode(f: &[u8]) -> Vec<u8> {
    assert_eq!(&f[0..4], b"NZCF");
    let flags = f[5];
    let b = 1usize << f[7];
    let n = u64::from_le_bytes(f[8..16].try_into().unwrap()) as usize;
    if flags & 2 != 0 {
        return f[24..24 + n].to_vec();
    }
    let nb = n.div_ceil(b);
    let mut out = Vec::new();
    let mut pos = 24 + 4 * nb;
    for i in 0..nb {
        let size = u32::from_le_bytes(f[24 + 4 * i..28 + 4 * i].try_into().unwrap()) as usize;
        let blk = &f[pos..pos + size];
        let l = b.min(n - i * b);
        match blk[0] {
            0 => out.extend_from_slice(&blk[1..]),
            1 => out.extend(std::iter::repeat_n(blk[1], l)),
            mode @ 2..=4 => {
                let (w, ebits) = if mode == 4 {
                    (4, 8)
                } else if mode == 3 {
                    (2, 5)
                } else {
                    (2, 8)
                };
                let (k, a) = (blk[1] as usize, blk[2] as u32);
                let codes = canonical(&CODE_LENGTHS[k]);
                let m = l / w;
                let nseg = m.div_ceil(1024);
                let p1 = 4 + 2 * nseg;
                let p2 = p1 + m;
                let mut sp = p2 + if mode == 4 { 2 * m } else { 0 };
                for j in 0..nseg {
                    let seg_len = u16::from_le_bytes([blk[4 + 2 * j], blk[5 + 2 * j]]) as usize;
                    let mut r = Bits {
                        b: &blk[sp..sp + seg_len],
                        pos: 0,
                    };
                    for e_idx in 1024 * j..(1024 * (j + 1)).min(m) {
                        let (mut code, mut len) = (0u32, 0u32);
                        let sym = loop {
                            code = (code << 1) | r.bit();
                            len += 1;
                            if let Some(&(_, _, s)) =
                                codes.iter().find(|&&(l, c, _)| l == len && c == code)
                            {
                                break s;
                            }
                        };
                        let e = match sym {
                            24 => 0,
                            25 => r.field(ebits),
                            d => a - d as u32,
                        };
                        let q = blk[p1 + e_idx] as u32;
                        match mode {
                            2 => {
                                let x = ((q & 0x80) << 8) | (e << 7) | (q & 0x7F);
                                out.extend_from_slice(&(x as u16).to_le_bytes());
                            }
                            3 => {
                                let x3 = r.field(3);
                                let x = ((x3 >> 2) << 15) | (e << 10) | ((x3 & 3) << 8) | q;
                                out.extend_from_slice(&(x as u16).to_le_bytes());
                            }
                            _ => {
                                let lo = u16::from_le_bytes([
                                    blk[p2 + 2 * e_idx],
                                    blk[p2 + 2 * e_idx + 1],
                                ]) as u32;
                                let x = ((q & 0x80) << 24) | (e << 23) | ((q & 0x7F) << 16) | lo;
                                out.extend_from_slice(&x.to_le_bytes());
                            }
                        }
                    }
                    assert_eq!(r.pos.div_ceil(8), seg_len, "segment length");
                    sp += seg_len;
                }
                out.extend_from_slice(&blk[sp..]);
            }
            m => panic!("mode {m}"),
        }
        pos += size;
    }
    assert_eq!(pos, f.len());
    out
}

#[test]
fn spec_decoder_agrees_on_vectors_and_fresh_frames() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "nzf") {
            let f = std::fs::read(&p).unwrap();
            let want = std::fs::read(p.with_extension("in")).unwrap();
            assert!(spec_decode(&f) == want, "{}", p.display());
            checked += 1;
        }
    }
    assert!(checked >= 10);
    for (ty, hint) in [
        (Ty::Bf16, DtypeHint::Bf16),
        (Ty::Fp16, DtypeHint::Fp16),
        (Ty::Fp32, DtypeHint::Fp32),
    ] {
        for (i, d) in [
            gaussian(ty, 50_001, 0.3, 1),
            gradient_like(ty, 40_000, 2),
            laplace(ty, 30_000, 1e-6, 3),
        ]
        .iter()
        .enumerate()
        {
            let mut f = vec![0u8; max_compressed_size(d.len())];
            let n = compress(
                d,
                &mut f,
                &EncodeOptions {
                    effort: Effort::Full,
                    dtype: hint,
                    checksum: false,
                    block_log2: 14,
                    format: 1,
                },
            )
            .unwrap();
            assert!(spec_decode(&f[..n]) == *d, "{} case {i}", ty.name());
        }
    }
}
