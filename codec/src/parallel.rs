//! Multi-threaded helpers for large buffers (CLI, benchmarks). The plugin's hot path
//! uses the single-threaded [`crate::compress`] / [`crate::decompress`].

use crate::decode::{decode_block_any, parse_for_decode, verify};
use crate::encode::{check_args, encode_block, has_fill_block, header, resolve_dtype, store};
use crate::format::*;
use crate::{decompress, CodecError, Dtype, EncodeOptions};

/// [`crate::compress`] with the blocks spread over up to `threads` threads.
/// Produces exactly the same frame. Allocates scratch space (about the input size).
pub fn compress_parallel(
    src: &[u8],
    dst: &mut [u8],
    opts: &EncodeOptions,
    threads: usize,
) -> Result<usize, CodecError> {
    let n = src.len();
    check_args(n, dst.len(), opts)?;
    let b = 1usize << opts.block_log2;
    let nb = n.div_ceil(b);
    if threads <= 1 || nb < 2 || opts.format != VERSION {
        // version 2: the single-thread encoder (same bytes; a parallel v2 path is to do)
        return crate::compress(src, dst, opts);
    }
    let (crc, dtype) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            if opts.checksum {
                crc32c::crc32c(src)
            } else {
                0
            }
        });
        let d = resolve_dtype(src, opts.dtype);
        (c.join().expect("crc thread"), d)
    });
    let limit = HEADER_LEN + n;
    let blocks_worth_it = dtype != Dtype::Raw
        || (opts.dtype == crate::DtypeHint::Auto && has_fill_block(src, opts.block_log2));
    if blocks_worth_it && HEADER_LEN + 4 * nb < limit {
        let per = nb.div_ceil(threads.min(nb));
        let parts: Vec<(Vec<u8>, Vec<usize>)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..nb)
                .step_by(per)
                .map(|first| {
                    s.spawn(move || {
                        let last = (first + per).min(nb);
                        let bytes = src[first * b..(last * b).min(n)].len();
                        let mut out = vec![0u8; bytes + (last - first)];
                        let mut sizes = Vec::with_capacity(last - first);
                        let mut pos = 0;
                        for i in first..last {
                            let blk = &src[i * b..((i + 1) * b).min(n)];
                            // room 1 + L: the same decisions as the serial encoder (see tests)
                            let (size, _) =
                                encode_block(dtype, blk, &mut out[pos..pos + 1 + blk.len()])
                                    .expect("1 + L bytes always hold a block");
                            sizes.push(size);
                            pos += size;
                        }
                        out.truncate(pos);
                        (out, sizes)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("encoder thread"))
                .collect()
        });
        let total = HEADER_LEN + 4 * nb + parts.iter().map(|p| p.0.len()).sum::<usize>();
        if total < limit {
            let mut pos = HEADER_LEN + 4 * nb;
            let mut i = 0;
            for (bytes, sizes) in &parts {
                for &sz in sizes {
                    dst[HEADER_LEN + 4 * i..HEADER_LEN + 4 * i + 4]
                        .copy_from_slice(&(sz as u32).to_le_bytes());
                    i += 1;
                }
                dst[pos..pos + bytes.len()].copy_from_slice(bytes);
                pos += bytes.len();
            }
            header(dtype, opts, n, crc, false).write(&mut dst[..HEADER_LEN]);
            return Ok(total);
        }
    }
    Ok(store(src, dst, opts, crc, dtype).frame_len)
}

/// [`crate::decompress`] with the blocks spread over up to `threads` threads.
/// Same results and errors, but blocks complete out of order (do not use it on
/// buffers that a GPU polls, such as NCCL LL/LL128 receive buffers).
pub fn decompress_parallel(
    src: &[u8],
    dst: &mut [u8],
    threads: usize,
) -> Result<usize, CodecError> {
    let (h, n) = parse_for_decode(src, dst.len())?;
    let b = 1usize << h.block_log2;
    let nb = n.div_ceil(b);
    if threads <= 1 || h.flags & FLAG_STORED != 0 || nb < 2 {
        return decompress(src, dst);
    }
    // Block offsets; the table is bounded by src.len(), not by a claimed length.
    let (ct, t0) = crate::coltab::frame_table(&h, src)?;
    let ct = ct.as_ref();
    let table_end = t0
        .checked_add(nb.checked_mul(4).ok_or(CodecError::Truncated)?)
        .ok_or(CodecError::Truncated)?;
    if table_end > src.len() {
        return Err(CodecError::Truncated);
    }
    let mut offs = Vec::with_capacity(nb + 1);
    let mut pos = table_end;
    offs.push(pos);
    for c in src[t0..table_end].chunks_exact(4) {
        pos = pos
            .checked_add(u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .ok_or(CodecError::Truncated)?;
        if pos > src.len() {
            return Err(CodecError::Truncated);
        }
        offs.push(pos);
    }
    if pos != src.len() {
        return Err(CodecError::TrailingBytes {
            frame_len: pos as u64,
            src_len: src.len(),
        });
    }
    let per = nb.div_ceil(threads.min(nb));
    let out = &mut dst[..n];
    let offs = &offs;
    let res: Result<(), CodecError> = std::thread::scope(|s| {
        let hs: Vec<_> = out
            .chunks_mut(per * b)
            .enumerate()
            .map(|(t, chunk)| {
                s.spawn(move || {
                    let mut tables = crate::decode::Decoder::new();
                    for (j, blk_out) in chunk.chunks_mut(b).enumerate() {
                        let i = t * per + j;
                        decode_block_any(
                            h.version,
                            src,
                            offs[i],
                            offs[i + 1] - offs[i],
                            blk_out,
                            &mut tables,
                            ct.map(|c| (c, i * b)),
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("decoder thread"))
            .collect()
    });
    res?;
    verify(&h, &dst[..n])?;
    Ok(n)
}
