//! The `nccl-zip` command-line tool (`src/bin/nccl-zip.rs` in the root crate calls
//! [`cli_main`]).
//!
//! ```text
//! nccl-zip compress IN OUT [--dtype auto|raw|bf16|fp16|fp32] [--checksum] [--block-log2 N]
//! nccl-zip decompress IN OUT
//! nccl-zip probe FILE [--dtype D] [--block-log2 N]
//! nccl-zip info FRAME
//! ```
//! Exit status 0 on success, 1 on a failure (one line on stderr), 2 on bad usage.

use crate::{
    compress_parallel, compress_with_stats, decompress_parallel, frame_info, max_compressed_size,
    DtypeHint, EncodeOptions,
};
use std::time::Instant;

const USAGE: &str = "usage: nccl-zip compress IN OUT [--dtype auto|raw|bf16|fp16|fp32] [--checksum] [--block-log2 N] | decompress IN OUT | probe FILE [--dtype D] | info FRAME";

/// Runs the tool with `args` (including the program name); returns the exit status.
pub fn cli_main(args: Vec<String>) -> i32 {
    match run(&args[1.min(args.len())..]) {
        Ok(()) => 0,
        Err(Fail::Usage(why)) => {
            eprintln!("nccl-zip: {why}\n{USAGE}");
            2
        }
        Err(Fail::Error(why)) => {
            eprintln!("nccl-zip: {why}");
            1
        }
    }
}

enum Fail {
    Usage(String),
    Error(String),
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn read(path: &str) -> Result<Vec<u8>, Fail> {
    std::fs::read(path).map_err(|e| Fail::Error(format!("cannot read {path}: {e}")))
}

fn write(path: &str, data: &[u8]) -> Result<(), Fail> {
    std::fs::write(path, data).map_err(|e| Fail::Error(format!("cannot write {path}: {e}")))
}

fn parse_opts(flags: &[String]) -> Result<EncodeOptions, Fail> {
    let mut o = EncodeOptions::default();
    let mut i = 0;
    while i < flags.len() {
        match flags[i].as_str() {
            "--checksum" => o.checksum = true,
            "--dtype" => {
                let v = flags
                    .get(i + 1)
                    .ok_or(Fail::Usage("--dtype needs a value".into()))?;
                o.dtype =
                    DtypeHint::parse(v).ok_or_else(|| Fail::Usage(format!("unknown dtype {v}")))?;
                i += 1;
            }
            "--block-log2" => {
                let v = flags
                    .get(i + 1)
                    .ok_or(Fail::Usage("--block-log2 needs a value".into()))?;
                o.block_log2 = v
                    .parse()
                    .ok()
                    .filter(|b| (12..=20).contains(b))
                    .ok_or_else(|| Fail::Usage(format!("--block-log2 must be 12..=20, got {v}")))?;
                i += 1;
            }
            f => return Err(Fail::Usage(format!("unknown option {f}"))),
        }
        i += 1;
    }
    Ok(o)
}

fn run(args: &[String]) -> Result<(), Fail> {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    match (cmd, args.len()) {
        ("compress", 3..) => {
            let opts = parse_opts(&args[3..])?;
            let src = read(&args[1])?;
            let mut dst = vec![0u8; max_compressed_size(src.len())];
            let n = compress_parallel(&src, &mut dst, &opts, threads())
                .map_err(|e| Fail::Error(e.to_string()))?;
            write(&args[2], &dst[..n])
        }
        ("decompress", 3) => {
            let src = read(&args[1])?;
            let info = frame_info(&src).map_err(|e| Fail::Error(format!("{}: {e}", args[1])))?;
            // Bounded by what the frame can hold: a stored frame holds raw_len bytes, a
            // coded block at most 2^20 bytes per 2 input bytes (FILL), so a lying
            // header cannot make us allocate more than the frame justifies.
            let cap = (src.len() as u64).saturating_mul(1 << 19);
            if info.raw_len > cap {
                return Err(Fail::Error(format!(
                    "{}: corrupt frame: length {} impossible",
                    args[1], info.raw_len
                )));
            }
            let mut dst = vec![0u8; info.raw_len as usize];
            let n = decompress_parallel(&src, &mut dst, threads())
                .map_err(|e| Fail::Error(format!("{}: {e}", args[1])))?;
            write(&args[2], &dst[..n])
        }
        ("probe", 2..) => {
            let opts = parse_opts(&args[2..])?;
            let src = read(&args[1])?;
            let mut dst = vec![0u8; max_compressed_size(src.len())];
            let t = Instant::now();
            let st = compress_with_stats(&src, &mut dst, &opts)
                .map_err(|e| Fail::Error(e.to_string()))?;
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{}: {} -> {} bytes, ratio {:.4}, dtype {}, {}blocks coded {} raw {} fill {}, encode {:.2} GB/s (1 thread)",
                args[1],
                src.len(),
                st.frame_len,
                src.len() as f64 / st.frame_len.max(1) as f64,
                st.dtype.map_or("raw", |d| d.name()),
                if st.stored { "stored frame, " } else { "" },
                st.blocks_coded,
                st.blocks_raw,
                st.blocks_fill,
                src.len() as f64 / secs.max(1e-9) / 1e9
            );
            Ok(())
        }
        ("info", 2) => {
            let src = read(&args[1])?;
            let i = frame_info(&src).map_err(|e| Fail::Error(format!("{}: {e}", args[1])))?;
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
        _ => Err(Fail::Usage(if cmd.is_empty() {
            "no command".into()
        } else {
            format!("bad command or arguments: {}", args.join(" "))
        })),
    }
}
