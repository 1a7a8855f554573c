//! `nccl-zip`: compress, decompress and probe files with the plugin's codec.
fn main() {
    std::process::exit(nccl_net_zip::codec::cli::cli_main(
        std::env::args().collect(),
    ))
}
