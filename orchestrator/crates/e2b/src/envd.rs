//! envd's messages and the headers its clients send.

pub mod files;
pub mod headers;
pub mod signature;
pub mod timestamp;

pub use timestamp::Timestamp;

/// `process`: processes inside a sandbox (start, stream output, input, signals, terminals).
pub mod process {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/process.rs"));
    include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));
}

/// `filesystem`: entries of a sandbox's filesystem (stat, list, move, remove, watch).
pub mod filesystem {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/filesystem.rs"));
    include!(concat!(env!("OUT_DIR"), "/filesystem.serde.rs"));
}
