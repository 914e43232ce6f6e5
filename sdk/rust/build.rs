//! Generates this crate's own client for `jobfence.v1.JobCoordinator` from
//! the repository's `proto/` (with protox: no system `protoc`). The SDK
//! depends on the API, never on the coordinator's code.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = root.join("jobfence/v1/coordinator.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let fds = protox::compile([&proto], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
