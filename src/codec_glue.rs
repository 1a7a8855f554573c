//! The data path's use of the codec: how big a compressed chunk may be, and how a
//! received compressed chunk is decoded into NCCL's buffer.

use crate::error::{Error, Result};
use crate::transport::tcp::stats::Stats;

/// Largest wire payload of one chunk whose uncompressed size is at most `max_chunk`.
pub fn max_wire(max_chunk: usize) -> usize {
    max_chunk + 4096
}

/// Decodes one compressed chunk into `dst`, which must come out exactly full.
pub fn decode_chunk(_frame: &[u8], _dst: &mut [u8], _stats: &Stats) -> Result<()> {
    Err(Error::Remote(
        "peer sent a compressed chunk but this build has no codec".into(),
    ))
}
