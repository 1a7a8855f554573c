// Builds the GPU kernels' host harness (kernels/host/harness.cpp, without its
// main) for the `kernel_decode` differential target.
fn main() {
    let src = "../../kernels/host/harness.cpp";
    for f in [
        src,
        "../../kernels/nzc_codec.cuh",
        "../../kernels/nzc_common.cuh",
        "../../kernels/nzc_codes.cuh",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    cc::Build::new()
        .cpp(true)
        .file(src)
        .define("NZC_HOST_NO_MAIN", None)
        .flag("-std=c++17")
        .flag("-Wno-unused-function")
        .flag("-pthread")
        .opt_level(1)
        .compile("nzc_host");
}
