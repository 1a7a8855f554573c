//! The host/device ABI of the codec kernels: `#[repr(C)]` mirrors of the structs in
//! `kernels/nzc_codec.cuh` (pinned by size asserts on both sides), the status codes,
//! and the shared-memory formula (`smem_carve`), which `tests/kernels_host.rs`
//! compares with the C++ one.

/// Encoder descriptor (`nzc::EncJob`). Pointers are device addresses (or host-mapped
/// addresses valid on the device).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EncJob {
    pub src: u64,
    pub dst: u64,
    pub n: u64,
    pub dst_cap: u64,
    pub ws: u64,
    pub result: u64,
    pub hint: u32,
    pub checksum: u32,
    pub block_log2: u32,
    pub nb: u32,
}

/// Decoder descriptor (`nzc::DecJob`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecJob {
    pub src: u64,
    pub src_len: u64,
    pub dst: u64,
    pub dst_cap: u64,
    pub ws: u64,
    pub result: u64,
    pub ws_blocks: u64,
    pub reserved: u64,
}

/// Per-job result (`nzc::JobResult`), written by the kernel, `done` last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobResult {
    pub len: u64,
    pub status: u32,
    pub done: u32,
}

const _: () = assert!(std::mem::size_of::<EncJob>() == 64);
const _: () = assert!(std::mem::size_of::<DecJob>() == 64);
const _: () = assert!(std::mem::size_of::<JobResult>() == 16);

/// `sizeof(nzc::JobState)`, the head of every job workspace.
pub const JOB_STATE_BYTES: u64 = 32;
/// Threads per CTA (`__launch_bounds__(256)` in the kernels).
pub const THREADS: u32 = 256;

/// Bytes of a job workspace for `nb` blocks (`nzc::ws_bytes`).
pub const fn ws_bytes(nb: u64) -> u64 {
    JOB_STATE_BYTES + 8 * nb + 4 * nb
}

/// Kernel status codes (`ST_*` in kernels/nzc_common.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    BadArgs,
    Header,
    DstTooSmall,
    Length,
    Block,
    Stream,
    Checksum,
    Unknown(u32),
}

impl Status {
    pub fn from_u32(v: u32) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::BadArgs,
            2 => Status::Header,
            3 => Status::DstTooSmall,
            4 => Status::Length,
            5 => Status::Block,
            6 => Status::Stream,
            7 => Status::Checksum,
            x => Status::Unknown(x),
        }
    }
}

/// Dynamic shared memory of one CTA for blocks up to `2^block_log2` bytes
/// (the same carve as `nzc::smem_carve`).
pub const fn smem_bytes(block_log2: u32) -> u64 {
    const fn a16(v: u64) -> u64 {
        (v + 15) & !15
    }
    let ns = ((1u64 << block_log2) / 2).div_ceil(1024);
    let mut o = 0;
    o = a16(o + 8 * 64); // sc64
    o = a16(o + 8 * 3 * 6 * 32); // cost
    o = a16(o + 4 * 64); // sc
    o = a16(o + 4 * 3 * 256); // hist
    o = a16(o + 4 * 3 * 256); // nz
    o = a16(o + 4 * 4096); // lut
    o = a16(o + 4 * ns); // seglen
    o = a16(o + 4 * ns); // segoff
    o = a16(o + 4 * 256); // crc_tab
    o = a16(o + 4 * 32); // crc_x2n
    o = a16(o + 4 * 256); // crc_part
    o = a16(o + 2 * ns * 32); // lanebits
    o = a16(o + 2 * ns * 32); // laneoff
    o = a16(o + 32 * (1024 + 4)); // keys (a padded stride per segment)
    o = a16(o + 26 * 32); // codelen
    o
}

/// Dynamic shared memory of one `nzc_decode_v2` CTA for blocks up to
/// `2^block_log2` bytes (the same carve as `nzc::smem_carve_v2`): the v2
/// decoder's arrays and a staging buffer for the kept elements of up to 64 KiB.
pub const fn smem_bytes_v2(block_log2: u32) -> u64 {
    const fn a16(v: u64) -> u64 {
        (v + 15) & !15
    }
    let b = 1u64 << block_log2;
    let stage = if block_log2 < 16 { b } else { 1 << 16 };
    let mut o = 0;
    o = a16(o + 8 * 64); // sc64
    o = a16(o + 4 * 64); // sc
    o = a16(o + 4 * 4096); // lut
    o = a16(o + 4 * 256); // crc_tab
    o = a16(o + 4 * 32); // crc_x2n
    o = a16(o + 4 * 256); // crc_part
    o = a16(o + 26 * 32); // codelen
    o = a16(o + 4096); // ctab: a COL block's column table (P <= 8192 nibbles)
    o = a16(o + 4 * 4 * b / 512); // v2a: bit0, nbits, p0, zeros
    o = a16(o + 4 * (b / 512 + 2 * b / 2048)); // v2b: line0, elided, before
    o = a16(o + stage + stage / 128); // stage
    o
}

/// Encoder hint code (`HINT_*`) for a codec dtype hint.
pub fn hint_code(h: nccl_zip_codec::DtypeHint) -> u32 {
    use nccl_zip_codec::DtypeHint as H;
    match h {
        H::Auto => 0,
        H::Raw => 1,
        H::Bf16 => 2,
        H::Fp16 => 3,
        H::Fp32 => 4,
        H::Fp8E4m3 => 5,
        H::Fp8E5m2 => 6,
    }
}
