//! `NCCL_ZIP_STATS_FILE`: the built perf tool drives the built plugin through
//! `dlopen`; the JSON lines it leaves must account for every byte, per peer and
//! direction, and the exit record must be there also when the comms were never
//! closed.

use std::process::Command;

struct Run {
    lines: Vec<serde_json::Value>,
}

fn run(tag: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = std::env::temp_dir().join(format!("nzc_stats_{}_{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("stats-%p.jsonl");
    let perf = env!("CARGO_BIN_EXE_nccl-zip-perf");
    let so = std::path::Path::new(perf).with_file_name("libnccl_net_zip.so");
    let mut cmd = Command::new(perf);
    cmd.args([
        "loop",
        "--sizes",
        "65536,1000",
        "--count",
        "40",
        "--data",
        "bf16",
    ])
    .arg("--plugin")
    .arg(&so)
    .args(extra)
    .env("NCCL_ZIP_STATS_FILE", &file)
    .env("NCCL_ZIP_COMPRESS", "on")
    .env("NCCL_SOCKET_IFNAME", "lo");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "perf tool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The %p in the name became the child's pid: one file.
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one stats file per process");
    let name = files[0].file_name().into_string().unwrap();
    assert!(name.starts_with("stats-") && !name.contains("%p"), "{name}");
    let text = std::fs::read_to_string(files[0].path()).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    Run { lines }
}

/// 40 messages alternating 64 KiB and 1000 bytes.
const PAYLOAD: u64 = 20 * 65536 + 20 * 1000;

fn check_final_record(r: &Run, comms_open: u64) {
    let finals: Vec<_> = r
        .lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l["kind"] == "process" && l["final"] == true)
        .collect();
    assert_eq!(finals.len(), 1, "one exit record: {:?}", r.lines);
    let (at, p) = finals[0];
    assert_eq!(p["comms_open"], comms_open, "{p}");
    assert_eq!(p["pid"].as_u64().is_some(), true);
    let peers: Vec<_> = r.lines[at + 1..]
        .iter()
        .take_while(|l| l["kind"] != "process")
        .filter(|l| l["kind"] == "peer")
        .collect();
    let dir = |d: &str| {
        peers
            .iter()
            .find(|l| l["dir"] == d && l["peer"] == "127.0.0.1")
            .unwrap_or_else(|| panic!("no {d} line for 127.0.0.1: {peers:?}"))
    };
    for d in ["send", "recv"] {
        let l = dir(d);
        assert_eq!(l["raw_bytes"], PAYLOAD, "{l}");
        assert_eq!(l["messages"], 40, "{l}");
        assert_eq!(l["transport"], "tcp", "{l}");
        let wire = l["wire_bytes"].as_u64().unwrap();
        assert!(wire > 0 && wire < PAYLOAD, "bf16 compressed: {l}");
        assert!(l["chunks_compressed"].as_u64().unwrap() > 0, "{l}");
    }
    assert_eq!(p["totals"]["raw_bytes"], 2 * PAYLOAD, "{p}");
    // The chunks were compressed and decoded by the codec workers, whose CPU
    // time the process line carries.
    let codec = p["codec_threads"].as_u64().unwrap_or(0);
    assert!(codec >= 1, "no codec workers: {p}");
    assert!(p["codec_cpu_s"].as_f64().unwrap_or(0.0) > 0.0, "{p}");
}

#[test]
fn exit_record_accounts_for_every_byte_after_close() {
    let r = run("closed", &[], &[("NCCL_ZIP_STATS_INTERVAL_MS", "0")]);
    check_final_record(&r, 0);
}

#[test]
fn exit_record_is_written_when_comms_are_never_closed() {
    let r = run(
        "open",
        &["--exit-without-close"],
        &[
            ("NCCL_ZIP_STATS_INTERVAL_MS", "0"),
            ("NCCL_ZIP_STATS_PER_COMM", "1"),
        ],
    );
    // The loop opens a send and a receive comm and leaves both open.
    check_final_record(&r, 2);
    let comms = r.lines.iter().filter(|l| l["kind"] == "comm").count();
    assert_eq!(
        comms, 2,
        "per-comm lines for the two open comms: {:?}",
        r.lines
    );
}

#[test]
fn periodic_records_come_every_interval() {
    let r = run(
        "periodic",
        &["--poll-sleep-us", "2000"],
        &[("NCCL_ZIP_STATS_INTERVAL_MS", "20")],
    );
    let periodic = r
        .lines
        .iter()
        .filter(|l| l["kind"] == "process" && l["final"] == false)
        .count();
    assert!(periodic >= 1, "no periodic record: {:?}", r.lines);
    check_final_record(&r, 0);
}
