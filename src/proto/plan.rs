//! How a message is cut into chunks. Chunks spread one message over several
//! streams and, with compression, are the split-send unit: each goes on the wire as
//! soon as it is ready.

/// Chunk size for a message of `total` bytes: about `total / nstreams`, rounded up
/// to 4 KiB (so LL128's 128-byte lines never straddle chunks), kept within
/// `[min_chunk, max_chunk]`.
pub fn chunk_size(total: usize, nstreams: usize, min_chunk: usize, max_chunk: usize) -> usize {
    let per_stream = total.div_ceil(nstreams.max(1));
    let rounded = per_stream.div_ceil(4096).saturating_mul(4096);
    rounded.clamp(min_chunk.max(1), max_chunk.max(min_chunk).max(1))
}

/// `(offset, len)` of every chunk; a 0-byte message is one empty chunk.
pub fn chunks(total: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = if total == 0 { 1 } else { total.div_ceil(chunk) };
    (0..n).map(move |i| {
        let off = i * chunk;
        (off, chunk.min(total - off))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(chunk_size(128 << 10, 4, 32 << 10, 256 << 10), 32 << 10);
        assert_eq!(chunk_size(4 << 20, 4, 32 << 10, 256 << 10), 256 << 10);
        assert_eq!(chunk_size(1000, 4, 32 << 10, 256 << 10), 32 << 10);
        assert_eq!(chunks(0, 4096).collect::<Vec<_>>(), vec![(0, 0)]);
        assert_eq!(
            chunks(5000, 4096).collect::<Vec<_>>(),
            vec![(0, 4096), (4096, 904)]
        );
    }

    proptest! {
        #[test]
        fn chunks_tile_the_message(total in 0usize..(8 << 20), ns in 1usize..16, minc in 512usize..65536, maxc in 4096usize..(1 << 20)) {
            let c = chunk_size(total, ns, minc.min(maxc), maxc);
            prop_assert!(c > 0 && c <= maxc.max(minc));
            let mut next = 0;
            for (off, len) in chunks(total, c) {
                prop_assert_eq!(off, next);
                prop_assert!(len > 0 || total == 0);
                next = off + len;
            }
            prop_assert_eq!(next, total);
        }
    }
}
