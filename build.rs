//! Build script: generates the ABI bindings from our own header and sets the
//! link options the plugin needs to be loaded (and unloaded) safely by NCCL.

use std::env;
use std::path::PathBuf;

fn main() {
    let header = "nccl-headers/net_v8.h";
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=nccl-headers/exports.map");

    let bindings = bindgen::Builder::default()
        .header(header)
        .allowlist_type("ncclNet_v8_t|ncclNetProperties_v8_t|ncclNetDeviceHandle_v8_t|ncclResult_t|ncclDebugLogLevel|ncclDebugLogger_t|ncclNetDeviceType")
        .allowlist_var("NCCL_.*")
        .rustified_enum("ncclResult_t")
        .constified_enum_module("ncclDebugLogLevel|ncclNetDeviceType")
        .derive_default(true)
        .layout_tests(true)
        .generate()
        .expect("bindgen failed on nccl-headers/net_v8.h (is libclang installed? scripts/setup.sh installs it)");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("net_v8.rs");
    bindings.write_to_file(&out).expect("write bindings");

    // Only the cdylib: export exactly one symbol, and never let the dynamic
    // loader unmap us while our I/O threads might still run (NCCL >= 2.28
    // dlclose()s the plugin after the last communicator).
    let map =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("nccl-headers/exports.map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");

    build_test_logger();
}

// ---------------------------------------------------------------------------
// Test tools (not the plugin): the C logger that nccl-zip-perf hands to `init`.
// Stable Rust cannot define a C-variadic function, so it is C, compiled here and
// linked into the binaries only; the cdylib never sees it.
// ---------------------------------------------------------------------------
fn build_test_logger() {
    println!("cargo:rerun-if-changed=tools/test_logger.c");
    let objs = cc::Build::new()
        .file("tools/test_logger.c")
        .warnings(true)
        .compile_intermediates();
    for o in objs {
        println!("cargo:rustc-link-arg-bins={}", o.display());
    }
}
