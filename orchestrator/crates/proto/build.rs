//! Compiles `proto/` with a vendored `protoc`, so building needs no system protobuf compiler.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "../../../proto/orchestrator/v1/node.proto",
        "../../../proto/seal/v1/gateway.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("orchestrator_descriptor.bin"))
        .compile_protos(&protos, &["../../../proto"])?;
    Ok(())
}
