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

/// The one path normaliser (relative paths under `/workspace`; `..`, NUL, overlong paths and
/// components refused), shared by security contexts and the tool policy.
pub use aegis_seal::context::normalise_path;

/// The one rule of a domain entry (`example.org` exact, `*.example.org` strict subdomains),
/// shared by security contexts' domain allowlists and the egress rules.
pub use aegis_seal::context::domain_matches;

/// The only tenant until multi-tenancy arrives; every tenant-scoped row carries it.
pub const DEFAULT_TENANT: &str = "default";
