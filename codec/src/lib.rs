//! # nccl-zip-codec: a lossless float codec for NCCL network messages
//!
//! Compresses bf16, fp16 and fp32 tensors losslessly by coding each value's exponent
//! with one of 32 static canonical prefix codes (chosen per 64 KiB block from a cheap
//! integer cost estimate on a 1/13 sample, anchored at a per-block exponent), while
//! sign and mantissa bits travel raw in byte planes. Anything else (integers, NCCL
//! LL flag words, random bytes) is stored raw. The frame format is defined byte by
//! byte in `docs/FORMAT.md`; a CUDA encoder must reproduce these frames exactly, so
//! every encoder decision is an integer function of the input and the options.
//!
//! ## API
//! ```
//! use nccl_zip_codec::{compress, decompress, max_compressed_size, EncodeOptions};
//! let src: Vec<u8> = (0..4096u32).flat_map(|i| ((i % 97) as f32 * 0.01).to_le_bytes()).collect();
//! let mut frame = vec![0u8; max_compressed_size(src.len())];
//! let n = compress(&src, &mut frame, &EncodeOptions::default()).unwrap();
//! let mut out = vec![0u8; src.len()];
//! assert_eq!(decompress(&frame[..n], &mut out).unwrap(), src.len());
//! assert_eq!(out, src);
//! ```
//!
//! * [`max_compressed_size`]`(n) = n + 24`: a frame never exceeds its input by more.
//! * [`compress`] / [`compress_with_stats`] encode into a caller buffer of at least
//!   `max_compressed_size(src.len())` bytes, allocation-free.
//! * [`decompress`] decodes into a caller buffer (NCCL's receive buffer): an error,
//!   never a panic, when the frame is corrupt or larger than `dst`; output is written
//!   in ascending address order, each byte once with its final value: on x86-64
//!   a reader polling NCCL LL/LL128 flags never sees a flag before its data
//!   (`tests/write_order.rs`); on aarch64 that needs a store barrier per line,
//!   which this crate does not have (the plugin is built for x86-64 only).
//! * [`Decoder`] decodes frame after frame like [`decompress`], keeping the decode
//!   tables of its most recent code choices (at most 144 KiB): for receivers.
//! * [`frame_info`] reads the header and block table only.
//! * [`EncodeOptions::format`] picks the frame format written: 1 (default) or 2
//!   (`docs/FORMAT.md` §V2: exact zeros, zero lines, omitted fp32 low planes, a
//!   per-block phase, independently decodable sub-segments; fp8 byte codes and
//!   FP16N for mostly-subnormal fp16, §V2.10). Every decoder entry point reads both
//!   versions; [`detect_v2`] is version 2's type detection.
//! * Where the CPU has AVX-512 F, BW, VL, VBMI and VBMI2, version 2's encoder and
//!   decoder take AVX-512 paths (same bytes); `NCCL_ZIP_CODEC_AVX512=0` or
//!   [`set_avx512`] turns them off. Elsewhere on x86-64, the split and join under
//!   Z of bf16 and fp32 have AVX2 forms (same bytes; `NCCL_ZIP_CODEC_AVX2_Z=0`
//!   turns them off), and so has detection's pass over its sample (same
//!   statistics).
//! * [`compress_parallel`] / [`decompress_parallel`] spread the blocks of large buffers
//!   over threads (same bytes as the single-thread encoder; the parallel decoder does
//!   not keep the ascending write order).
//! * The `nccl-zip` command-line tool is `src/bin/nccl-zip/` in the plugin crate.
//!
//! All functions are thread-safe; the only global state is the AVX-512 switch
//! ([`set_avx512`]) and the AVX2 one of Z, which change speed, not bytes.

mod avx2_detect;
mod avx2_z;
mod avx512;
pub mod codes;
pub mod coltab;
mod decode;
mod elem;
mod encode;
pub mod format;
mod parallel;
mod v2;
mod v2_byte;

#[doc(hidden)]
pub use avx2_z::set_enabled as set_avx2_z;
pub use avx512::set_enabled as set_avx512;
pub use decode::{decompress, frame_info, Decoder};
pub use encode::detect as detect_v1;
pub use encode::{compress, compress_scalar, compress_with_stats};
pub use parallel::{compress_parallel, decompress_parallel};
pub use v2::detect_v2;

use std::fmt;

/// Element type hint for the encoder (the plugin maps `NCCL_ZIP_DTYPE` onto it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DtypeHint {
    /// Detect from a sample of the bytes (default).
    #[default]
    Auto,
    /// Never code: store the input (a fixed 24-byte header).
    Raw,
    Bf16,
    Fp16,
    Fp32,
    /// fp8: stored raw in format version 1, byte-coded in version 2.
    Fp8E4m3,
    /// fp8: stored raw in format version 1, byte-coded in version 2.
    Fp8E5m2,
}

impl DtypeHint {
    /// Parses `auto|raw|bf16|fp16|fp32|fp8e4m3|fp8e5m2` (case-insensitive).
    pub fn parse(s: &str) -> Option<DtypeHint> {
        Some(match s.to_ascii_lowercase().as_str() {
            "auto" => DtypeHint::Auto,
            "raw" | "none" => DtypeHint::Raw,
            "bf16" | "bfloat16" => DtypeHint::Bf16,
            "fp16" | "f16" | "half" | "float16" => DtypeHint::Fp16,
            "fp32" | "f32" | "float" | "float32" => DtypeHint::Fp32,
            "fp8e4m3" | "e4m3" => DtypeHint::Fp8E4m3,
            "fp8e5m2" | "e5m2" => DtypeHint::Fp8E5m2,
            _ => return None,
        })
    }
}

/// The element type a frame was coded as (header byte 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Raw = 0,
    Bf16 = 1,
    Fp16 = 2,
    Fp32 = 3,
    /// fp8 e4m3 (format version 2 only: byte-coded blocks).
    Fp8E4m3 = 4,
    /// fp8 e5m2 (format version 2 only: byte-coded blocks).
    Fp8E5m2 = 5,
}

impl Dtype {
    pub(crate) fn from_u8(v: u8) -> Dtype {
        match v {
            1 => Dtype::Bf16,
            2 => Dtype::Fp16,
            3 => Dtype::Fp32,
            4 => Dtype::Fp8E4m3,
            5 => Dtype::Fp8E5m2,
            _ => Dtype::Raw,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Raw => "raw",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
            Dtype::Fp8E4m3 => "e4m3",
            Dtype::Fp8E5m2 => "e5m2",
        }
    }
}

/// Encoder options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Element type; `Auto` detects it from a sample of the input.
    pub dtype: DtypeHint,
    /// Store a CRC32C of the input in the header; the decoder verifies it.
    pub checksum: bool,
    /// Block size is `1 << block_log2`, 12..=20; default 16 (64 KiB).
    pub block_log2: u8,
    /// Frame format version to write: 1 (default: the plugin's GPU kernels speak
    /// version 1 only) or 2 (docs/FORMAT.md "Version 2"). Decoders read both.
    pub format: u8,
    /// How hard the version-2 encoder looks for structure (version 1 ignores it).
    pub effort: Effort,
}

/// The version-2 encoder's effort (docs/FORMAT.md §V2.11). Both write frames every
/// version-2 decoder reads; the GPU encoder follows `Full`'s rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Effort {
    /// Every rule of §V2.6–V2.9: column table, explicit code lengths, zero lines.
    #[default]
    Full,
    /// About version 1's encode speed on dense data: no column table, static codes
    /// only, and zero lines looked for only where a block's sample has an exact
    /// zero. Sparse and fp8 data keep their codes (Z, lines, byte codes).
    Fast,
}

impl Effort {
    /// `full` or `fast` (any case).
    pub fn parse(s: &str) -> Option<Effort> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Some(Effort::Full),
            "fast" => Some(Effort::Fast),
            _ => None,
        }
    }

    /// The name [`Effort::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Effort::Full => "full",
            Effort::Fast => "fast",
        }
    }
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            dtype: DtypeHint::Auto,
            checksum: false,
            block_log2: format::DEFAULT_BLOCK_LOG2,
            format: format::VERSION,
            effort: Effort::Full,
        }
    }
}

/// What [`frame_info`] reads from a frame's header and block table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Uncompressed length.
    pub raw_len: u64,
    /// Total frame length in bytes (header, table and blocks).
    pub frame_len: u64,
    /// Element type chosen by the encoder.
    pub dtype: Dtype,
    /// Number of blocks (0 for a stored frame).
    pub blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// The frame is a stored (verbatim) frame.
    pub stored: bool,
    /// The CRC32C of the input, when the frame carries one.
    pub checksum: Option<u32>,
}

/// Per-frame statistics from [`compress_with_stats`], for adaptive callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Bytes written (the frame length).
    pub frame_len: usize,
    /// Input length.
    pub raw_len: usize,
    /// Element type used (`Raw` when stored).
    pub dtype: Option<Dtype>,
    /// The frame is stored verbatim.
    pub stored: bool,
    /// Blocks coded with an exponent code.
    pub blocks_coded: u32,
    /// Blocks stored raw inside a block frame.
    pub blocks_raw: u32,
    /// Blocks of one repeated byte.
    pub blocks_fill: u32,
}

/// Errors of the codec. Decoding never panics; every malformed frame maps to one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodecError {
    /// The output buffer is smaller than needed.
    DstTooSmall { needed: u64, available: usize },
    /// Not a frame: the magic number is wrong.
    BadMagic,
    /// The frame's version is not supported.
    UnsupportedVersion(u8),
    /// The frame ends before its header, table or blocks do.
    Truncated,
    /// The frame is malformed; the reason names what.
    Corrupt(&'static str),
    /// The decoded data does not match the frame's CRC32C.
    ChecksumMismatch { expected: u32, actual: u32 },
    /// The frame is followed by extra bytes.
    TrailingBytes { frame_len: u64, src_len: usize },
    /// Bad encoder options.
    InvalidOptions(&'static str),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::DstTooSmall { needed, available } => {
                write!(
                    f,
                    "output buffer too small: need {needed} bytes, have {available}"
                )
            }
            CodecError::BadMagic => write!(f, "not an nccl-zip frame (bad magic)"),
            CodecError::UnsupportedVersion(v) => write!(f, "unsupported frame version {v}"),
            CodecError::Truncated => write!(f, "frame truncated"),
            CodecError::Corrupt(why) => write!(f, "corrupt frame: {why}"),
            CodecError::ChecksumMismatch { expected, actual } => write!(
                f,
                "checksum mismatch: frame says {expected:#010x}, data has {actual:#010x}"
            ),
            CodecError::TrailingBytes { frame_len, src_len } => write!(
                f,
                "{} trailing bytes after a {frame_len}-byte frame",
                *src_len as u64 - frame_len
            ),
            CodecError::InvalidOptions(why) => write!(f, "invalid options: {why}"),
        }
    }
}

impl std::error::Error for CodecError {}

/// The largest frame [`compress`] can produce for `n` input bytes: `n + 24`.
pub const fn max_compressed_size(n: usize) -> usize {
    n + format::HEADER_LEN
}
