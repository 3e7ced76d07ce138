//! The vocabulary every layer of the service shares, without I/O: who calls and with which
//! tier (`caller`), what each tool is (`catalog`: names, schemas, tiers; the handlers live far
//! above), how arguments are checked (`arguments`), how templates render (`render`) and which
//! runtimes exist (`runtimes`). Builds and tests alone: `cargo test -p aegis-core`.

pub mod arguments;
pub mod caller;
pub mod catalog;
pub mod render;
pub mod runtimes;
pub mod settings;

/// The only tenant until multi-tenancy arrives; every tenant-scoped row carries it.
pub const DEFAULT_TENANT: &str = "default";
