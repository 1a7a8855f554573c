//! `nccl-zip`: compress, decompress and inspect files with the plugin's codec, and
//! `probe` a checkpoint or tensor file: will the plugin help on this data and link?
//!
//! Exit status 0 on success, 1 on a failure (one line on stderr), 2 on bad usage.
//! Files carry a CRC32C of their content unless `--no-checksum`: `decompress`
//! fails on a corrupt file instead of writing wrong bytes. Files written without
//! one (older versions of this tool, or `--no-checksum`) still decompress.

mod probe;

use clap::{Parser, Subcommand};
use nccl_net_zip::codec::{
    compress_parallel, decompress_parallel, frame_info, max_compressed_size, DtypeHint, Effort,
    EncodeOptions,
};
use std::path::{Path, PathBuf};

/// What `--version` prints: the crate version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NZC_GIT_COMMIT"),
    ")"
);

/// dtype names accepted by --dtype (the codec's `DtypeHint::parse` also takes aliases).
const DTYPES: &str = "auto|raw|bf16|fp16|fp32|fp8e4m3|fp8e5m2";

/// Lossless float compression with the codec of the nccl-net-zip NCCL plugin.
#[derive(Parser, Debug)]
#[command(
    name = "nccl-zip",
    version = VERSION,
    max_term_width = 100,
    after_help = "dtypes (--dtype): auto, raw, bf16, fp16, fp32, fp8e4m3, fp8e5m2 (fp8 is recognised and stored raw by format v1).\nExamples:\n  nccl-zip probe model.safetensors --link 25gbit --cores 8\n  nccl-zip compress grads.bin grads.nzf --dtype bf16\n  nccl-zip decompress grads.nzf grads.bin"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Compress IN into OUT (a frame: docs/FORMAT.md), with a CRC32C of IN by default.
    Compress {
        input: PathBuf,
        output: PathBuf,
        /// Element type: auto|raw|bf16|fp16|fp32|fp8e4m3|fp8e5m2 (fp8 is stored raw by format v1).
        #[arg(long, default_value = "auto", value_parser = parse_dtype)]
        dtype: DtypeHint,
        /// Leave the checksum out (4 bytes and a CRC pass saved; corruption then
        /// decompresses to wrong bytes without an error).
        #[arg(long)]
        no_checksum: bool,
        /// Kept for old scripts: checksums are the default now.
        #[arg(long, hide = true, conflicts_with = "no_checksum")]
        checksum: bool,
        /// Block size 2^N bytes, 12..=20.
        #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u8).range(12..=20))]
        block_log2: u8,
        /// Frame format version to write: 1 (default; what the plugin's GPU kernels
        /// read) or 2 (docs/FORMAT.md V2: sparse data, misaligned starts). `decompress`
        /// reads both.
        #[arg(long, value_name = "V", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        format: u8,
        /// Format 2's encoder effort: full (default: column table, explicit codes) or
        /// fast (about format 1's encode speed; docs/FORMAT.md V2.11).
        #[arg(long, value_name = "E", default_value = "full", value_parser = parse_effort)]
        effort: Effort,
    },
    /// Decompress IN into OUT; fails on a corrupt or truncated file.
    Decompress { input: PathBuf, output: PathBuf },
    /// Print a frame's header and block table summary.
    Info { frame: PathBuf },
    /// Will the plugin help on this data? Ratio per tensor and predicted speedup.
    ///
    /// Reads a .safetensors or .npy file per tensor with the dtype from its header
    /// (other files are one tensor of --dtype), cuts each into the plugin's chunks,
    /// measures the codec's speed on this machine and feeds both to the plugin's cost
    /// model for the link asked about.
    Probe(probe::ProbeArgs),
}

fn parse_dtype(s: &str) -> Result<DtypeHint, String> {
    DtypeHint::parse(s).ok_or_else(|| format!("unknown dtype {s:?}: expected {DTYPES}"))
}

fn parse_effort(s: &str) -> Result<Effort, String> {
    Effort::parse(s).ok_or_else(|| format!("unknown effort {s:?}: expected full or fast"))
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn write(path: &Path, data: &[u8]) -> Result<(), String> {
    std::fs::write(path, data).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn main() {
    let cli = Cli::parse(); // usage errors exit 2, --help and --version 0
    if let Err(why) = run(cli.cmd) {
        eprintln!("nccl-zip: {why}");
        std::process::exit(1);
    }
}

fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Compress {
            input,
            output,
            dtype,
            no_checksum,
            checksum: _,
            block_log2,
            format,
            effort,
        } => {
            let opts = EncodeOptions {
                effort,
                dtype,
                checksum: !no_checksum,
                block_log2,
                format,
            };
            let src = read(&input)?;
            let mut dst = vec![0u8; max_compressed_size(src.len())];
            let n =
                compress_parallel(&src, &mut dst, &opts, threads()).map_err(|e| e.to_string())?;
            write(&output, &dst[..n])
        }
        Cmd::Decompress { input, output } => {
            let name = input.display();
            let src = read(&input)?;
            let info = frame_info(&src).map_err(|e| format!("{name}: {e}"))?;
            // Bounded by what the frame can hold: a stored frame holds raw_len bytes, a
            // coded block at most 2^20 bytes per 2 input bytes (FILL), so a lying
            // header cannot make us allocate more than the frame justifies.
            let cap = (src.len() as u64).saturating_mul(1 << 19);
            if info.raw_len > cap {
                return Err(format!(
                    "{name}: corrupt frame: length {} impossible",
                    info.raw_len
                ));
            }
            let mut dst = vec![0u8; info.raw_len as usize];
            let n = decompress_parallel(&src, &mut dst, threads())
                .map_err(|e| format!("{name}: {e}"))?;
            if info.checksum.is_none() {
                eprintln!("nccl-zip: note: {name} carries no checksum (written with --no-checksum or by an older nccl-zip): corruption would go unnoticed");
            }
            write(&output, &dst[..n])
        }
        Cmd::Info { frame } => {
            let src = read(&frame)?;
            let i = frame_info(&src).map_err(|e| format!("{}: {e}", frame.display()))?;
            println!(
                "raw_len {} frame_len {} dtype {} blocks {} block_size {} stored {} checksum {}",
                i.raw_len,
                i.frame_len,
                i.dtype.name(),
                i.blocks,
                i.block_size,
                i.stored,
                i.checksum
                    .map_or("none".to_string(), |c| format!("{c:#010x}"))
            );
            Ok(())
        }
        Cmd::Probe(a) => probe::run(&a),
    }
}
