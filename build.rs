//! Compiles proto/ with protox (no system `protoc` needed) and writes the
//! encoded file descriptor set that server reflection serves.

use prost::Message;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/jobfence/v1/coordinator.proto",
        "proto/jobfence/v1/admin.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("jobfence_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec, but an undecodable request is INVALID_ARGUMENT.
        .codec_path("crate::grpc::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
