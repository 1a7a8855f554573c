//! Helpers shared by the test binaries that inspect or load the built plugin.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The cdylib cargo built with the library for this test run. Tests run from
/// target/<profile>/deps/<name>-<hash>; cargo builds the cdylib into deps/ and
/// copies it up to target/<profile>/. Prefer the deps/ file (always the one built
/// for this run), then the copy.
pub fn plugin_so() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        deps.join("libnccl_net_zip.so"),
        deps.parent()
            .expect("profile dir")
            .join("libnccl_net_zip.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("plugin not built: none of {candidates:?} exists"))
}

/// The `(NEEDED)` lines of `readelf -d so`; panics if readelf fails or lists none.
pub fn needed_libs(so: &PathBuf) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(so)
        .output()
        .expect("readelf (binutils) is needed for this test");
    assert!(out.status.success(), "readelf -d {so:?} failed");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<String> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .map(str::to_string)
        .collect();
    assert!(
        !needed.is_empty(),
        "no NEEDED entries parsed from:\n{dynamic}"
    );
    needed
}
