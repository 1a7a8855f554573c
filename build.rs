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
    build_gpu_kernels();
    git_commit();
}

// The commit the init banner and the tools' `--version` name: NCCL_ZIP_GIT_COMMIT when set
// (scripts/release.sh sets it, with "-dirty" for uncommitted changes), else
// `git rev-parse` at the time this script last ran. Deliberately no
// rerun-if-changed on .git: a commit would then rebuild the kernels and the crate,
// so a dev build may name an older commit; release builds are exact.
fn git_commit() {
    println!("cargo:rerun-if-env-changed=NCCL_ZIP_GIT_COMMIT");
    let commit = env::var("NCCL_ZIP_GIT_COMMIT").ok().unwrap_or_else(|| {
        std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".into())
    });
    println!("cargo:rustc-env=NZC_GIT_COMMIT={commit}");
}

// ---------------------------------------------------------------------------
// Test tools (not the plugin): the C logger that nccl-zip-perf hands to `init`.
// Stable Rust cannot define a C-variadic function, so it is C, compiled here and
// linked into the binaries only; the cdylib never sees it.
// ---------------------------------------------------------------------------
fn build_test_logger() {
    println!("cargo:rerun-if-changed=tools/profile_logger.c");
    // The profile driver's logger (tests/nccl_profiles.rs): integration tests only.
    for o in cc::Build::new()
        .file("tools/profile_logger.c")
        .warnings(true)
        .compile_intermediates()
    {
        println!("cargo:rustc-link-arg-tests={}", o.display());
    }
    println!("cargo:rerun-if-changed=tools/test_logger.c");
    let objs = cc::Build::new()
        .file("tools/test_logger.c")
        .warnings(true)
        .compile_intermediates();
    for o in objs {
        println!("cargo:rustc-link-arg-bins={}", o.display());
    }
}

// ---------------------------------------------------------------------------
// GPU codec kernels (issue 4, src/gpu/): kernels/*.cu -> one fatbin embedded in
// the library (SASS sm_80/sm_90/sm_100 + compute_90 PTX), plus the kernel source
// flattened into one file for the NVRTC fallback on drivers too old for the fatbin.
// nvcc: $NVCC, $CUDA_HOME/bin, PATH, then .toolchain/cuda/nvidia/cu13/bin (filled by
// scripts/setup_cuda.sh). Without nvcc the build still succeeds with an empty fatbin
// and a warning, unless NCCL_ZIP_REQUIRE_KERNELS=1 (CI), which makes it an error.
// Exposes NZC_FATBIN, NZC_KERNEL_SRC and NZC_NVCC_VERSION to the crate (env!).
// ---------------------------------------------------------------------------
fn build_gpu_kernels() {
    use std::path::Path;
    use std::process::Command;

    const KERNEL: &str = "kernels/nzc_kernels.cu";
    const GENCODE: [&str; 4] = [
        "arch=compute_80,code=sm_80",
        "arch=compute_90,code=sm_90",
        "arch=compute_100,code=sm_100",
        "arch=compute_90,code=compute_90",
    ];
    for f in [
        KERNEL,
        "kernels/nzc_codec.cuh",
        "kernels/nzc_common.cuh",
        "kernels/nzc_codes.cuh",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    for v in [
        "NVCC",
        "CUDA_HOME",
        "NCCL_ZIP_REQUIRE_KERNELS",
        "NCCL_ZIP_NVCC_FLAGS",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let fatbin = out_dir.join("nzc_kernels.fatbin");
    let src_out = out_dir.join("nzc_kernels_flat.cu");
    let require = env::var("NCCL_ZIP_REQUIRE_KERNELS").is_ok_and(|v| v == "1");

    // Flattened source for NVRTC: quoted includes inlined once each.
    fn flatten(path: &Path, seen: &mut Vec<PathBuf>, out: &mut String) {
        let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if seen.contains(&canon) {
            return;
        }
        seen.push(canon);
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        for line in text.lines() {
            let t = line.trim_start();
            if t.starts_with("#pragma once") {
                continue;
            }
            if let Some(rest) = t.strip_prefix("#include \"") {
                let name = rest.split('"').next().unwrap();
                flatten(&path.parent().unwrap().join(name), seen, out);
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    let mut flat = String::new();
    flatten(&manifest.join(KERNEL), &mut Vec::new(), &mut flat);
    std::fs::write(&src_out, flat).expect("write flattened kernel source");
    println!("cargo:rustc-env=NZC_KERNEL_SRC={}", src_out.display());

    let found = find_nvcc(&manifest);
    let mut version = String::from("none");
    let built = match &found {
        None => {
            Err("no nvcc found (set NVCC or CUDA_HOME, or run scripts/setup_cuda.sh)".to_string())
        }
        Some(nvcc) => {
            if let Ok(o) = Command::new(nvcc).arg("--version").output() {
                let text = String::from_utf8_lossy(&o.stdout).to_string();
                if let Some(l) = text.lines().find(|l| l.contains("release")) {
                    version = l.trim().to_string();
                }
            }
            let mut cmd = Command::new(nvcc);
            cmd.args(["-fatbin", "-O3", "-std=c++17", "-t", "0"]);
            for g in GENCODE {
                cmd.arg("-gencode").arg(g);
            }
            // Extra flags for measuring variants, e.g. -DNZC_UNORDERED_ROUNDS (docs/GPU.md).
            if let Ok(extra) = env::var("NCCL_ZIP_NVCC_FLAGS") {
                cmd.args(extra.split_whitespace());
            }
            cmd.arg("-o").arg(&fatbin).arg(manifest.join(KERNEL));
            match cmd.output() {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(format!(
                    "{} failed: {}",
                    nvcc.display(),
                    String::from_utf8_lossy(&o.stderr)
                )),
                Err(e) => Err(format!("cannot run {}: {e}", nvcc.display())),
            }
        }
    };
    if let Err(why) = built {
        if require {
            panic!("NCCL_ZIP_REQUIRE_KERNELS=1 but the GPU kernels were not built: {why}");
        }
        for l in why.lines().take(20) {
            println!("cargo:warning=GPU kernels not built (GPU codec disabled): {l}");
        }
        std::fs::write(&fatbin, b"").expect("write empty fatbin");
    }
    println!("cargo:rustc-env=NZC_FATBIN={}", fatbin.display());
    println!("cargo:rustc-env=NZC_NVCC_VERSION={version}");
}

fn find_nvcc(manifest: &std::path::Path) -> Option<PathBuf> {
    let ok = |p: &PathBuf| p.is_file();
    if let Some(p) = env::var_os("NVCC").map(PathBuf::from) {
        if ok(&p) {
            return Some(p);
        }
        println!(
            "cargo:warning=NVCC={} is not a file; looking elsewhere",
            p.display()
        );
    }
    if let Some(h) = env::var_os("CUDA_HOME") {
        let p = PathBuf::from(h).join("bin/nvcc");
        if ok(&p) {
            return Some(p);
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("nvcc");
            if ok(&p) {
                return Some(p);
            }
        }
    }
    let p = manifest.join(".toolchain/cuda/nvidia/cu13/bin/nvcc");
    ok(&p).then_some(p)
}
