//! `nccl-zip probe FILE`: what the plugin would do with this data.
//!
//! The file is read per tensor with the dtype its header states (safetensors:
//! BF16, F16, F32, F8_E4M3, F8_E5M2; `.npy`: `<f2`, `<f4`; anything else is
//! reported raw), each tensor is cut into the plugin's chunks and each chunk is
//! coded alone, as the plugin's sender does (chunks below 4 KiB and chunks that do
//! not shrink go raw). The codec's one-thread encode speed measured here feeds the
//! plugin's own cost model (`adapt::predicted_speedup`) for the link asked about.
//!
//! NCCL messages are buckets of whatever the framework packs together; a tensor on
//! its own is the closest a file can come to them.

use clap::Args;
use nccl_net_zip::adapt::{predicted_speedup, MIN_COMPRESS_BYTES};
use nccl_net_zip::codec::{self, DtypeHint, EncodeOptions};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ProbeArgs {
    file: PathBuf,
    /// How to read FILE: auto (by its first bytes and name), safetensors, npy, or raw
    /// (the whole file as one tensor of --dtype).
    #[arg(long, default_value = "auto", value_parser = ["auto", "safetensors", "npy", "raw"])]
    format: String,
    /// Element type for raw files, or to override every tensor's header dtype:
    /// auto|raw|bf16|fp16|fp32|fp8e4m3|fp8e5m2.
    #[arg(long, value_parser = super::parse_dtype)]
    dtype: Option<DtypeHint>,
    /// The plugin's chunk size (NCCL_ZIP_CHUNK_SIZE): 4K..4M.
    #[arg(long, default_value = "256K", value_parser = parse_chunk)]
    chunk: usize,
    /// Link to predict for, e.g. 25gbit, 100Gbit/s, 400mbit (a plain number is Mbit/s,
    /// as NCCL_ZIP_LINK_MBPS). Without it: 10, 25, 100 and 200 Gbit/s.
    #[arg(long, value_parser = parse_link)]
    link: Option<f64>,
    /// CPU cores free for the codec on each node [default: this machine's].
    #[arg(long)]
    cores: Option<usize>,
    /// TCP streams per comm (NCCL_ZIP_NSTREAMS): each compresses on its own thread.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Print only the summary, not one line per tensor.
    #[arg(long)]
    quiet: bool,
}

fn parse_chunk(s: &str) -> Result<usize, String> {
    let n = parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{s:?}: {e}"))?;
    if !(4096..=4 << 20).contains(&n) {
        return Err(format!("{s:?}: the plugin's chunk size is 4K..4M"));
    }
    Ok(n as usize)
}

/// A link rate in bits per second: "25gbit", "25Gbit/s", "25g", "400mbit", "2.5gbps";
/// a plain number is Mbit/s.
pub fn parse_link(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("/s").unwrap_or(&t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a rate such as 25gbit"))?;
    let mult = match unit.trim() {
        "" | "m" | "mbit" | "mbps" | "mb" => 1e6,
        "g" | "gbit" | "gbps" | "gb" => 1e9,
        "t" | "tbit" | "tbps" => 1e12,
        "k" | "kbit" | "kbps" => 1e3,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use gbit or mbit)")),
    };
    if !(x > 0.0 && x.is_finite()) {
        return Err(format!("{s:?}: the rate must be positive"));
    }
    Ok(x * mult)
}

/// One tensor of the file.
struct Tensor<'a> {
    name: String,
    /// What the header says, as printed.
    dtype_name: String,
    hint: DtypeHint,
    bytes: &'a [u8],
}

fn hint_name(h: DtypeHint) -> &'static str {
    match h {
        DtypeHint::Auto => "auto",
        DtypeHint::Raw => "raw",
        DtypeHint::Bf16 => "bf16",
        DtypeHint::Fp16 => "fp16",
        DtypeHint::Fp32 => "fp32",
        DtypeHint::Fp8E4m3 => "fp8e4m3",
        DtypeHint::Fp8E5m2 => "fp8e5m2",
    }
}

fn safetensors_tensors(data: &[u8]) -> Result<Vec<Tensor<'_>>, String> {
    use safetensors::Dtype as D;
    let st = safetensors::SafeTensors::deserialize(data)
        .map_err(|e| format!("not a valid safetensors file: {e:?}"))?;
    let mut v: Vec<Tensor> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let (hint, known) = match view.dtype() {
                D::BF16 => (DtypeHint::Bf16, true),
                D::F16 => (DtypeHint::Fp16, true),
                D::F32 => (DtypeHint::Fp32, true),
                D::F8_E4M3 => (DtypeHint::Fp8E4m3, true),
                D::F8_E5M2 => (DtypeHint::Fp8E5m2, true),
                _ => (DtypeHint::Raw, false),
            };
            Tensor {
                dtype_name: if known {
                    hint_name(hint).to_string()
                } else {
                    format!("raw({:?})", view.dtype())
                },
                name,
                hint,
                bytes: view.data(),
            }
        })
        .collect();
    // In file order, which is the order a checkpoint's layers come in.
    v.sort_by_key(|t| t.bytes.as_ptr() as usize);
    Ok(v)
}

/// A `.npy` file: magic, version, header length, a Python dict literal with 'descr'.
fn npy_tensor<'a>(data: &'a [u8], name: &str) -> Result<Tensor<'a>, String> {
    let bad = |why: &str| format!("not a valid .npy file: {why}");
    if data.len() < 10 || &data[..6] != b"\x93NUMPY" {
        return Err(bad("no \\x93NUMPY magic"));
    }
    let (hlen, start): (usize, usize) = match data[6] {
        1 => (u16::from_le_bytes([data[8], data[9]]) as usize, 10),
        2 | 3 if data.len() >= 12 => (
            u32::from_le_bytes([data[8], data[9], data[10], data[11]]) as usize,
            12,
        ),
        v => return Err(bad(&format!("version {v}"))),
    };
    let end = start
        .checked_add(hlen)
        .filter(|&e| e <= data.len())
        .ok_or_else(|| bad("header longer than the file"))?;
    let header = String::from_utf8_lossy(&data[start..end]);
    let descr = header
        .split_once("'descr':")
        .and_then(|(_, r)| r.trim_start().strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no 'descr' in the header"))?;
    // Little-endian floats the codec knows; anything else (f64, ints, big-endian,
    // ml_dtypes' bf16/fp8, which numpy writes as opaque void) goes raw.
    let hint = match descr {
        "<f2" => Some(DtypeHint::Fp16),
        "<f4" => Some(DtypeHint::Fp32),
        _ => None,
    };
    Ok(Tensor {
        name: name.to_string(),
        dtype_name: hint.map_or(format!("raw({descr})"), |h| hint_name(h).to_string()),
        hint: hint.unwrap_or(DtypeHint::Raw),
        bytes: &data[end..],
    })
}

/// Wire bytes of `bytes` sent as the plugin sends it: chunks of `chunk`, each coded
/// alone when at least [`MIN_COMPRESS_BYTES`], raw when the frame does not shrink.
struct Coded {
    wire: u64,
    chunks: u64,
    chunks_coded: u64,
}

fn code_chunks(bytes: &[u8], hint: DtypeHint, chunk: usize, out: &mut [u8]) -> Coded {
    let opts = EncodeOptions {
        dtype: hint,
        ..EncodeOptions::default()
    };
    let mut c = Coded {
        wire: 0,
        chunks: 0,
        chunks_coded: 0,
    };
    for ch in bytes.chunks(chunk) {
        c.chunks += 1;
        let n = if ch.len() < MIN_COMPRESS_BYTES || hint == DtypeHint::Raw {
            ch.len()
        } else {
            match codec::compress(ch, out, &opts) {
                Ok(n) if n < ch.len() => {
                    c.chunks_coded += 1;
                    n
                }
                _ => ch.len(),
            }
        };
        c.wire += n as u64;
    }
    c
}

/// One thread's encode and decode speed (input bytes per second) over the coded
/// chunks, repeated until each has run for at least `min`.
fn codec_speed(tensors: &[Tensor], chunk: usize, min: Duration) -> Option<(f64, f64)> {
    let mut frames = Vec::new();
    let mut out = vec![0u8; codec::max_compressed_size(chunk)];
    for t in tensors.iter().filter(|t| t.hint != DtypeHint::Raw) {
        let opts = EncodeOptions {
            dtype: t.hint,
            ..EncodeOptions::default()
        };
        for ch in t
            .bytes
            .chunks(chunk)
            .filter(|c| c.len() >= MIN_COMPRESS_BYTES)
        {
            if let Ok(n) = codec::compress(ch, &mut out, &opts) {
                if n < ch.len() {
                    frames.push((ch, opts, out[..n].to_vec()));
                }
            }
        }
    }
    if frames.is_empty() {
        return None;
    }
    let (mut enc_bytes, t0) = (0u64, Instant::now());
    while t0.elapsed() < min {
        for (ch, opts, _) in &frames {
            let _ = codec::compress(ch, &mut out, opts);
            enc_bytes += ch.len() as u64;
        }
    }
    let enc = enc_bytes as f64 / t0.elapsed().as_secs_f64();
    let mut dec = codec::Decoder::default();
    let mut dst = vec![0u8; chunk];
    let (mut dec_bytes, t0) = (0u64, Instant::now());
    while t0.elapsed() < min {
        for (ch, _, f) in &frames {
            let _ = dec.decompress(f, &mut dst[..ch.len()]);
            dec_bytes += ch.len() as u64;
        }
    }
    Some((enc, dec_bytes as f64 / t0.elapsed().as_secs_f64()))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

pub fn run(a: &ProbeArgs) -> Result<(), String> {
    let path = &a.file;
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let name = path.display().to_string();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let format = match a.format.as_str() {
        "auto" if data.starts_with(b"\x93NUMPY") => "npy",
        "auto" if ext == "safetensors" => "safetensors",
        // safetensors: u64 header length, then a JSON object.
        "auto" if data.len() >= 9 && data[8] == b'{' => "safetensors",
        "auto" => "raw",
        f => f,
    };
    let mut tensors = match format {
        "safetensors" => safetensors_tensors(&data).map_err(|e| format!("{name}: {e}"))?,
        "npy" => vec![npy_tensor(&data, &name).map_err(|e| format!("{name}: {e}"))?],
        _ => {
            let hint = a.dtype.unwrap_or(DtypeHint::Auto);
            vec![Tensor {
                name: name.clone(),
                dtype_name: hint_name(hint).to_string(),
                hint,
                bytes: &data,
            }]
        }
    };
    if let (Some(d), true) = (a.dtype, format != "raw") {
        for t in &mut tensors {
            t.hint = d;
            t.dtype_name = format!("{} (--dtype)", hint_name(d));
        }
    }

    println!(
        "{name}: {format}, {} tensor(s), {:.1} MiB; chunks of {} KiB, each coded alone as the plugin sends them",
        tensors.len(),
        mib(data.len() as u64),
        a.chunk >> 10
    );
    if !a.quiet {
        println!(
            "{:<48} {:<12} {:>12} {:>8} {:>10}",
            "tensor", "dtype", "bytes", "ratio", "coded"
        );
    }
    let mut out = vec![0u8; codec::max_compressed_size(a.chunk)];
    let (mut raw, mut wire) = (0u64, 0u64);
    let mut by_dtype: Vec<(String, u64, u64)> = Vec::new();
    for t in &tensors {
        let c = code_chunks(t.bytes, t.hint, a.chunk, &mut out);
        let n = t.bytes.len() as u64;
        raw += n;
        wire += c.wire;
        let key = hint_name(t.hint).to_string();
        match by_dtype.iter_mut().find(|(k, _, _)| *k == key) {
            Some(e) => (e.1, e.2) = (e.1 + n, e.2 + c.wire),
            None => by_dtype.push((key, n, c.wire)),
        }
        if !a.quiet {
            println!(
                "{:<48} {:<12} {:>12} {:>8.4} {:>10}",
                t.name,
                t.dtype_name,
                n,
                n as f64 / c.wire.max(1) as f64,
                format!("{}/{}", c.chunks_coded, c.chunks)
            );
        }
    }
    let ratio = raw as f64 / wire.max(1) as f64;
    for (k, r, w) in &by_dtype {
        println!(
            "  {k:<8} {:>10.1} MiB -> {:>10.1} MiB  ratio {:.4}",
            mib(*r),
            mib(*w),
            *r as f64 / (*w).max(1) as f64
        );
    }
    println!(
        "overall: {:.1} MiB -> {:.1} MiB on the wire, ratio {ratio:.4}",
        mib(raw),
        mib(wire)
    );

    let Some((enc, dec)) = codec_speed(&tensors, a.chunk, Duration::from_millis(300)) else {
        println!(
            "nothing compresses: the plugin would send this data raw (speedup 1.00x on any link)"
        );
        return Ok(());
    };
    let here = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores = a.cores.unwrap_or(here);
    let threads = a.streams.max(1).min(cores.max(1));
    println!(
        "codec on this machine, 1 thread: encode {:.2} GB/s, decode {:.2} GB/s ({} cores here)",
        enc / 1e9,
        dec / 1e9,
        here
    );
    println!(
        "prediction (the plugin's cost model, src/adapt.rs): {} streams on {cores} cores -> {threads} codec threads, {:.2} GB/s of input",
        a.streams,
        enc * threads as f64 / 1e9
    );
    let links = match a.link {
        Some(l) => vec![l],
        None => vec![10e9, 25e9, 100e9, 200e9],
    };
    for l in links {
        let s = predicted_speedup(ratio, enc, a.streams, cores, l / 8.0);
        let s_dec = predicted_speedup(ratio, dec, a.streams, cores, l / 8.0);
        let verdict = if s > 1.0 {
            "compresses"
        } else {
            "sends raw (would not pay)"
        };
        print!(
            "  link {:>7.1} Gbit/s: predicted speedup {s:.2}x ({verdict})",
            l / 1e9
        );
        // The model times the sender's encoder; the receiver decodes too. Say so
        // when decode is the slower side here and changes the answer.
        if s_dec < s - 0.005 {
            print!(
                ", {s_dec:.2}x if the receivers' decode ({:.2} GB/s) is the limit",
                dec / 1e9
            );
        }
        println!();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links() {
        assert_eq!(parse_link("25gbit").unwrap(), 25e9);
        assert_eq!(parse_link("25Gbit/s").unwrap(), 25e9);
        assert_eq!(parse_link("2.5g").unwrap(), 2.5e9);
        assert_eq!(parse_link("400mbit").unwrap(), 400e6);
        assert_eq!(parse_link("10000").unwrap(), 10e9);
        assert!(parse_link("fast").is_err());
        assert!(parse_link("0gbit").is_err());
        assert!(parse_link("25parsec").is_err());
    }
}
