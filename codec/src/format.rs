//! Frame and block layout constants and the frame header (docs/FORMAT.md §2–4).

use crate::CodecError;

/// Frame magic, "NZCF".
pub const MAGIC: [u8; 4] = *b"NZCF";
/// Format version 1 (the default the encoder writes).
pub const VERSION: u8 = 1;
/// Format version 2 (docs/FORMAT.md, "Version 2").
pub const VERSION_2: u8 = 2;
/// Header length; also the constant in `max_compressed_size(n) = n + HEADER_LEN`.
pub const HEADER_LEN: usize = 24;
/// Flag: bytes 16..20 hold CRC32C of the input.
pub const FLAG_CHECKSUM: u8 = 1;
/// Flag: the payload is the input verbatim.
pub const FLAG_STORED: u8 = 2;
/// Flag (version 2 block frames): a column table follows the header (FORMAT.md §V2.9).
pub const FLAG_COLTAB: u8 = 4;
/// Smallest and largest `block_log2`.
pub const MIN_BLOCK_LOG2: u8 = 12;
pub const MAX_BLOCK_LOG2: u8 = 20;
/// Default block size: 64 KiB.
pub const DEFAULT_BLOCK_LOG2: u8 = 16;
/// Values per segment of a coded block's bitstream.
pub const SEG_ELEMS: usize = 1024;
/// Inputs shorter than this are always stored.
pub const MIN_CODED_INPUT: usize = 64;
/// Blocks with fewer elements than this are never coded.
pub const MIN_CODED_ELEMS: usize = 64;
/// Coded block header length (mode, k, anchor, reserved).
pub const BLOCK_HEADER_LEN: usize = 4;

/// Block modes.
pub const MODE_RAW: u8 = 0;
pub const MODE_FILL: u8 = 1;
pub const MODE_BF16: u8 = 2;
pub const MODE_FP16: u8 = 3;
pub const MODE_FP32: u8 = 4;

/// A parsed, validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// 1 or 2.
    pub version: u8,
    pub flags: u8,
    pub dtype: u8,
    pub block_log2: u8,
    pub raw_len: u64,
    pub crc: u32,
}

impl Header {
    pub fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = self.version;
        out[5] = self.flags;
        out[6] = self.dtype;
        out[7] = self.block_log2;
        out[8..16].copy_from_slice(&self.raw_len.to_le_bytes());
        out[16..20].copy_from_slice(&self.crc.to_le_bytes());
        let hcrc = crc32c::crc32c(&out[0..20]);
        out[20..24].copy_from_slice(&hcrc.to_le_bytes());
    }

    pub fn parse(src: &[u8]) -> Result<Header, CodecError> {
        if src.len() < HEADER_LEN {
            if src.len() >= 4 && src[0..4] != MAGIC {
                return Err(CodecError::BadMagic);
            }
            return Err(CodecError::Truncated);
        }
        if src[0..4] != MAGIC {
            return Err(CodecError::BadMagic);
        }
        let version = src[4];
        if version != VERSION && version != VERSION_2 {
            return Err(CodecError::UnsupportedVersion(version));
        }
        let hcrc = u32::from_le_bytes([src[20], src[21], src[22], src[23]]);
        if crc32c::crc32c(&src[0..20]) != hcrc {
            return Err(CodecError::Corrupt("header checksum mismatch"));
        }
        let flags = src[5];
        if flags & !(FLAG_CHECKSUM | FLAG_STORED) != 0
            && (version != VERSION_2 || flags & !(FLAG_CHECKSUM | FLAG_COLTAB) != 0)
        {
            return Err(CodecError::Corrupt("unknown header flags"));
        }
        let dtype = src[6];
        if dtype > 3 && !(version == VERSION_2 && dtype <= 5) {
            return Err(CodecError::Corrupt("unknown dtype"));
        }
        let block_log2 = src[7];
        if !(MIN_BLOCK_LOG2..=MAX_BLOCK_LOG2).contains(&block_log2) {
            return Err(CodecError::Corrupt("block size out of range"));
        }
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&src[8..16]);
        let raw_len = u64::from_le_bytes(raw);
        let crc = u32::from_le_bytes([src[16], src[17], src[18], src[19]]);
        if flags & FLAG_CHECKSUM == 0 && crc != 0 {
            return Err(CodecError::Corrupt("checksum field set without flag"));
        }
        Ok(Header {
            version,
            flags,
            dtype,
            block_log2,
            raw_len,
            crc,
        })
    }
}
