//! Rebuilds this crate when a migration is added or changed: `sqlx::migrate!` (`database.rs`)
//! embeds `migrations/` when the crate is compiled, and Cargo does not otherwise notice a new
//! file there, so a stale build would start a node without it.

fn main() {
    println!("cargo:rerun-if-changed=../../../migrations");
}
