mod common;
use common::*;
use nccl_zip_codec::*;

fn rt(src: &[u8], opts: &EncodeOptions) -> FrameStats {
    let mut f = vec![0u8; max_compressed_size(src.len())];
    let st = compress_with_stats(src, &mut f, opts).unwrap();
    let mut o = vec![0u8; src.len()];
    assert_eq!(decompress(&f[..st.frame_len], &mut o).unwrap(), src.len());
    assert!(o == src);
    st
}

#[test]
fn smoke_ratios() {
    let o = EncodeOptions::default();
    for ty in [Ty::Bf16, Ty::Fp16, Ty::Fp32] {
        for s in [1e-3, 1e-2, 0.1, 1.0] {
            let d = gaussian(ty, 1 << 20, s, 1);
            let st = rt(&d, &o);
            eprintln!(
                "{} sigma={s}: ratio {:.4} {:?}",
                ty.name(),
                d.len() as f64 / st.frame_len as f64,
                st
            );
        }
        let d = gradient_like(ty, 1 << 20, 2);
        let st = rt(&d, &o);
        eprintln!(
            "{} grad: ratio {:.4} {:?}",
            ty.name(),
            d.len() as f64 / st.frame_len as f64,
            st
        );
    }
    let d = Rng::new(3).bytes(1 << 20);
    let st = rt(&d, &o);
    eprintln!("random: {:?}", st);
}
