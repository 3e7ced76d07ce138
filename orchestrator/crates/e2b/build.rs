//! Generates envd's `process` and `filesystem` messages from `proto/e2b/envd/` with a vendored
//! `protoc` (prost for the binary form, pbjson for the proto3 JSON mapping).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let include = protoc_bin_vendored::include_path()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("envd_descriptor.bin");
    let protos = [
        "../../../proto/e2b/envd/process.proto",
        "../../../proto/e2b/envd/filesystem.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    prost_build::Config::new()
        .file_descriptor_set_path(&descriptors)
        // Timestamp, the one well-known type used, with its JSON form (RFC 3339) is ours.
        .extern_path(
            ".google.protobuf.Timestamp",
            "crate::envd::timestamp::Timestamp",
        )
        // Maps in a stable order: the same message always encodes to the same bytes.
        .btree_map(["."])
        // `prost::Name`: errors name the message type ("process.StartRequest").
        .enable_type_names()
        .compile_protos(&protos, &[PathBuf::from("../../../proto"), include])?;
    let set = std::fs::read(&descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&set)?
        // As envd's Connect server does: a newer client's extra fields are not an error.
        .ignore_unknown_fields()
        .btree_map(["."])
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
