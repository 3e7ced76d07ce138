//! The wire contract the node shares with its clients: the gRPC messages and services of
//! `proto/` (`orchestrator.v1.Node`, `seal.v1.Gateway`), generated at build time with a vendored
//! `protoc`, and the shape of an API key. The service implements these; the CLI and SDK-style
//! clients only call them, so both sides depend on this crate and on nothing of each other.

/// `orchestrator.v1`: the node service.
pub mod orchestrator {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("orchestrator.v1");
}

/// `seal.v1`: the SEAL gateway.
pub mod seal {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("seal.v1");
}

/// Encoded descriptors of every service we define, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("orchestrator_descriptor");

/// Every API key starts with this, so a key is recognisable in a credentials file or a leak scan.
pub const API_KEY_PREFIX: &str = "aok_";
