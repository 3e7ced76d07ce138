//! The Docker labels the dispatcher stamps on every container and volume it creates.
//!
//! Labels are how the reaper finds leftovers after a crash, whatever their status, without
//! trusting any in-memory state. They are written at creation and never change (Docker cannot
//! relabel), so they carry only facts that never change: that the object is ours, which database
//! (scope) and which instance created it, which sandbox it belongs to, and the first owner. The
//! Postgres row is the truth for everything that can change (current owner, adopting instance).

/// Prefix reserved for the dispatcher; caller labels may not use it (no spoofing of ownership).
pub const RESERVED_PREFIX: &str = "org.aegis.";

/// `true` on everything the dispatcher manages; the reaper never looks at anything without it.
pub const MANAGED: &str = "org.aegis.managed";
/// The database the object is recorded in (see the `sandbox_scope` table).
pub const SCOPE: &str = "org.aegis.scope";
/// The PostgreSQL cluster of that database (its system identifier), when readable.
pub const DB_CLUSTER: &str = "org.aegis.db-cluster";
/// The name of that database: lets a reaper on the same cluster collect the objects of a
/// database that was dropped (test databases) or recreated.
pub const DB_NAME: &str = "org.aegis.db-name";
/// The orchestrator instance that created the object.
pub const INSTANCE: &str = "org.aegis.instance";
/// The sandbox the object belongs to (absent on the executor-install helper).
pub const SANDBOX: &str = "org.aegis.sandbox";
/// The owner kind at creation (`pool` for warm-pool sandboxes; the row says who owns it now).
pub const OWNER_KIND: &str = "org.aegis.owner-kind";
/// The owner id at creation.
pub const OWNER_ID: &str = "org.aegis.owner-id";
/// RFC 3339 creation time.
pub const CREATED_AT: &str = "org.aegis.created-at";
/// What the object is: `sandbox`, `workspace`, `executor-installer`, `executor`, `beacon`.
pub const COMPONENT: &str = "org.aegis.component";
/// On beacon volumes: when the instance last beat, in Unix seconds (see `beacon.rs`).
pub const BEAT_AT: &str = "org.aegis.beat-at";
/// On the executor volume: the SHA-256 of the binary it holds.
pub const EXECUTOR_SHA256: &str = "org.aegis.executor.sha256";

/// The Docker filter expression selecting everything managed (`label=org.aegis.managed=true`).
pub(crate) fn managed_filter() -> String {
    format!("{MANAGED}=true")
}

/// The Docker listing filters selecting what is managed and carries every label of `also`
/// (`key=value`): how every listing of the reaper and the beacon is narrowed.
pub(crate) fn managed_with<const N: usize>(
    also: [String; N],
) -> std::collections::HashMap<String, Vec<String>> {
    let labels = std::iter::once(managed_filter()).chain(also).collect();
    std::collections::HashMap::from([("label".to_owned(), labels)])
}
