//! Compress then decompress arbitrary bytes with options (format 1 or 2, either effort)
//! taken from the first byte.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nccl_zip_codec::{compress, decompress, max_compressed_size, DtypeHint, Effort, EncodeOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, src)) = data.split_first() else {
        return;
    };
    let dtype = [
        DtypeHint::Auto,
        DtypeHint::Bf16,
        DtypeHint::Fp16,
        DtypeHint::Fp32,
        DtypeHint::Raw,
    ][(sel % 5) as usize];
    // format 1 or 2 (docs/FORMAT.md §V2), v2 at either effort (§V2.11)
    let opts = EncodeOptions {
        dtype,
        checksum: sel & 8 != 0,
        block_log2: 12 + (sel >> 4) % 9,
        format: 1 + (sel / 5) % 2,
        effort: if sel & 4 != 0 { Effort::Fast } else { Effort::Full },
    };
    let mut frame = vec![0u8; max_compressed_size(src.len())];
    let n = compress(src, &mut frame, &opts).expect("compress");
    assert!(n <= src.len() + 24);
    let mut out = vec![0u8; src.len()];
    assert_eq!(
        decompress(&frame[..n], &mut out).expect("decompress"),
        src.len()
    );
    assert!(out == src);
});
