//! The audit log: hash-chained rows for every tool call and admin change.
//!
//! Rows are appended under a transaction-scoped advisory lock so the chain has one order even with
//! several replicas; one writer task per database takes that lock once for every row waiting
//! (`writer.rs`), so concurrent calls share a transaction instead of queueing for the lock. Each row's `hash` covers its canonical content and the previous row's hash;
//! `verify` recomputes the chain and names the first row whose stored hash no longer matches, so
//! an edit made directly in the database is detected. A call that runs leaves two rows: its
//! intent, chained before the tool starts (`intent.rs`), and its completion; refusals leave one.
//! The chain's head (position and hash) is published (`anchor.rs`) so that removing the newest
//! rows, which no hash inside the database can reveal, is detected against that anchor.
//!
//! Arguments and results are stored as digests, never raw: secrets passed to tools stay out of the log.

mod anchor;
mod intent;
mod verify;
mod writer;

pub use anchor::{head, log_head_periodically, Head};
pub use intent::{begin_call, recover_abandoned, CallAudit, Completion};
pub use verify::{verify, Anchor, BrokenRow, Verification, VerifyError};
pub use writer::observe_batches;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use aegis_core::caller::Caller;

/// The hash "before" the first row.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Advisory lock key that serialises appends (arbitrary constant: "audit" in ASCII).
const APPEND_LOCK: i64 = 0x0061_7564_6974;

/// Whether a row records a tool call or an admin change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A tool invocation through the router.
    Tool,
    /// A change through the operator API (keys, deploys outside the router...).
    Admin,
}

/// What the caller asked and what happened; the router and admin handlers fill it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Tool call or admin change.
    pub kind: EntryKind,
    /// Tool name or admin action (`api_key.create`, ...).
    pub action: String,
    /// Allowed or denied.
    pub allowed: bool,
    /// Machine-readable reason for a denial (or a failure), e.g. `tier`, `invalid_arguments`.
    pub reason_code: Option<String>,
    /// Human-readable reason.
    pub reason: Option<String>,
    /// Digest of the arguments.
    pub args_digest: String,
    /// `ok`, `error`, `denied`; `running` for an intent; `cancelled` or `abandoned` for a call
    /// whose caller went away or whose orchestrator stopped before it finished.
    pub outcome: &'static str,
    /// Digest of the result, when there was one.
    pub result_digest: Option<String>,
    /// Time spent, milliseconds.
    pub duration_ms: i64,
    /// The sandbox the call ran in or was refused for (`cmd.run`, `fs.*`, the process tools, a
    /// sandbox's admin changes); `None` for everything else.
    pub sandbox_id: Option<Uuid>,
}

impl Entry {
    /// A refusal: denied, with its reason code and reason, no result, outside any sandbox (set
    /// `sandbox_id` for one that named a sandbox). The router and the doors that refuse before
    /// it build their rows here, so a refusal's row has one shape wherever it is made.
    pub fn denied(
        kind: EntryKind,
        action: impl Into<String>,
        code: impl Into<String>,
        reason: impl Into<String>,
        args_digest: String,
        duration: std::time::Duration,
    ) -> Self {
        Self {
            kind,
            action: action.into(),
            allowed: false,
            reason_code: Some(code.into()),
            reason: Some(reason.into()),
            args_digest,
            outcome: "denied",
            result_digest: None,
            duration_ms: duration.as_millis() as i64,
            sandbox_id: None,
        }
    }
}

/// A stored row, as `GET /v1/audit` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct AuditRow {
    /// Position in the chain (1-based, gap-free per database).
    pub seq: i64,
    /// Row id.
    pub id: Uuid,
    /// When it was recorded.
    pub at: DateTime<Utc>,
    /// `api_key`, `session`, `execution`, `system`.
    pub caller_kind: String,
    /// Key id, session id or execution id.
    pub caller_id: String,
    /// `tool` or `admin`.
    pub kind: String,
    /// Tool name or admin action.
    pub action: String,
    /// `allowed` or `denied`.
    pub decision: String,
    /// Reason code of a denial or failure.
    pub reason_code: Option<String>,
    /// Human reason.
    pub reason: Option<String>,
    /// `sha256:` digest of the canonical arguments.
    pub args_digest: String,
    /// `ok`, `error`, `denied`, `running` (an intent), `cancelled`, `abandoned`.
    pub outcome: String,
    /// `sha256:` digest of the result.
    pub result_digest: Option<String>,
    pub duration_ms: i64,
    /// For a completion row: the id of the intent row it completes.
    pub intent_id: Option<Uuid>,
    /// Position in the tenant's chain, 1-based (not hashed; checked by verification).
    pub chain_index: Option<i64>,
    /// The sandbox the call ran in or was refused for, when there was one (hashed when present).
    pub sandbox_id: Option<Uuid>,
    /// Hash of the previous row.
    pub prev_hash: String,
    /// Hash of this row's content and `prev_hash`.
    pub hash: String,
}

/// The columns of [`AuditRow`], in its field order.
const COLUMNS: &str = "seq, id, at, caller_kind, caller_id, kind, action, decision, reason_code, \
     reason, args_digest, outcome, result_digest, duration_ms, intent_id, chain_index, sandbox_id, prev_hash, hash";

/// `sha256:<hex>` of a JSON value in canonical form (sorted keys, no spaces).
pub fn digest(value: &Value) -> String {
    // Streamed into the hash: a large result is neither copied nor serialised into a string.
    let mut hasher = Sha256::new();
    write_canonical(value, &mut hasher).expect("hashing cannot fail");
    format!("sha256:{}", hex(&hasher.finalize()))
}

/// [`digest`] of a value whose [`canonical`] text the caller has already made: the same
/// `sha256:<hex>`, hashed in one pass over one buffer (a door can then send those bytes instead
/// of serialising the value again).
pub fn digest_of_canonical(canonical: &str) -> String {
    format!("sha256:{}", hex_sha256(canonical.as_bytes()))
}

/// [`digest`] of a JSON string, without copying the text into a value first.
pub fn digest_text(text: &str) -> String {
    let mut hasher = Sha256::new();
    serde_json::to_writer(&mut hasher, text).expect("hashing cannot fail");
    format!("sha256:{}", hex(&hasher.finalize()))
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Serialises with object keys sorted at every level (serde_json's map is sorted by default
/// unless `preserve_order` is enabled; we sort explicitly so the digest never depends on it).
/// The bytes are exactly serde_json's compact form of the sorted value.
pub fn canonical(value: &Value) -> String {
    // Sized for the value up front: a large result is not copied at every doubling.
    let least = aegis_core::arguments::json_len_lower_bound(value);
    let mut out = Vec::with_capacity(least.saturating_add(least / 32).saturating_add(64));
    write_canonical(value, &mut out).expect("writing to memory cannot fail");
    // Only serde_json's output and ASCII punctuation were written: valid UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`canonical`], written to `out` as it is produced.
fn write_canonical(value: &Value, out: &mut impl std::io::Write) -> std::io::Result<()> {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.write_all(b"{")?;
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                serde_json::to_writer(&mut *out, key)?;
                out.write_all(b":")?;
                write_canonical(&map[key], out)?;
            }
            out.write_all(b"}")
        }
        Value::Array(items) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_canonical(item, out)?;
            }
            out.write_all(b"]")
        }
        scalar => Ok(serde_json::to_writer(out, scalar)?),
    }
}

/// The content a row's hash covers, in a fixed field order. `intent_id` and `sandbox_id` are
/// covered when present (rows written before either existed hash exactly as they did).
fn row_content(row: &AuditRow) -> String {
    let mut content = json!({
        "id": row.id,
        "at": row.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "caller_kind": row.caller_kind,
        "caller_id": row.caller_id,
        "kind": row.kind,
        "action": row.action,
        "decision": row.decision,
        "reason_code": row.reason_code,
        "reason": row.reason,
        "args_digest": row.args_digest,
        "outcome": row.outcome,
        "result_digest": row.result_digest,
        "duration_ms": row.duration_ms,
        "prev_hash": row.prev_hash,
    });
    if let Some(intent) = row.intent_id {
        content["intent_id"] = json!(intent);
    }
    if let Some(sandbox) = row.sandbox_id {
        content["sandbox_id"] = json!(sandbox);
    }
    canonical(&content)
}

pub(crate) fn row_hash(row: &AuditRow) -> String {
    hex_sha256(row_content(row).as_bytes())
}

/// Appends one row to the chain.
pub async fn record(pool: &PgPool, caller: &Caller, entry: Entry) -> Result<Uuid, sqlx::Error> {
    let id = Uuid::new_v4();
    append(pool, caller, entry, id, None, None).await?;
    Ok(id)
}

/// Appends one row with a chosen id; `intent` names the intent a completion row completes and
/// `instance` the orchestrator instance writing it.
pub(crate) async fn append(
    pool: &PgPool,
    caller: &Caller,
    entry: Entry,
    id: Uuid,
    intent: Option<Uuid>,
    instance: Option<Uuid>,
) -> Result<AuditRow, sqlx::Error> {
    let row = AuditRow {
        seq: 0,
        id,
        // Set by the writer, inside the chain's lock.
        at: Utc::now(),
        caller_kind: caller.kind.as_str().to_owned(),
        caller_id: caller.id.clone(),
        kind: match entry.kind {
            EntryKind::Tool => "tool",
            EntryKind::Admin => "admin",
        }
        .to_owned(),
        action: entry.action,
        decision: if entry.allowed { "allowed" } else { "denied" }.to_owned(),
        reason_code: entry.reason_code,
        reason: entry.reason,
        args_digest: entry.args_digest,
        outcome: entry.outcome.to_owned(),
        result_digest: entry.result_digest,
        duration_ms: entry.duration_ms,
        intent_id: intent,
        chain_index: None,
        sandbox_id: entry.sandbox_id,
        prev_hash: String::new(),
        hash: String::new(),
    };
    writer::submit(pool, &caller.tenant, instance, row).await
}

/// Records a change made through the operator API (keys, sandboxes, sessions, contexts).
pub async fn record_admin(
    pool: &PgPool,
    caller: &Caller,
    action: &str,
    args: &Value,
    ok: bool,
    started: std::time::Instant,
) -> Result<Uuid, sqlx::Error> {
    record_admin_of(pool, caller, action, args, ok, started, None).await
}

/// [`record_admin`] of a change to one sandbox (made, destroyed, paused...), so the row is found
/// with that sandbox's history.
pub async fn record_admin_of(
    pool: &PgPool,
    caller: &Caller,
    action: &str,
    args: &Value,
    ok: bool,
    started: std::time::Instant,
    sandbox_id: Option<Uuid>,
) -> Result<Uuid, sqlx::Error> {
    record(
        pool,
        caller,
        Entry {
            kind: EntryKind::Admin,
            action: action.to_owned(),
            allowed: true,
            reason_code: None,
            reason: None,
            args_digest: digest(args),
            outcome: if ok { "ok" } else { "error" },
            result_digest: None,
            duration_ms: started.elapsed().as_millis() as i64,
            sandbox_id,
        },
    )
    .await
}

/// Filters of `GET /v1/audit`.
#[derive(Debug, Default, Clone, serde::Deserialize, utoipa::IntoParams)]
pub struct Query {
    /// Only this tool or admin action.
    pub tool: Option<String>,
    /// Only this caller id (key id, session id, execution id).
    pub caller: Option<String>,
    /// Only calls that ran in (or were refused for) this sandbox, and its admin changes.
    pub sandbox: Option<Uuid>,
    /// `allowed` or `denied`.
    pub decision: Option<String>,
    /// Rows at or after this time (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Rows before this time (RFC 3339).
    pub until: Option<DateTime<Utc>>,
    /// Page size (1-500, default 100).
    pub limit: Option<i64>,
    /// Rows with `seq` greater than this (the previous page's `next_after`).
    pub after: Option<i64>,
}

/// One page of rows, oldest first.
pub async fn list(pool: &PgPool, tenant: &str, q: &Query) -> Result<Vec<AuditRow>, sqlx::Error> {
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM audit_log \
         WHERE tenant_id = $1 AND ($2::text IS NULL OR action = $2) \
         AND ($3::text IS NULL OR caller_id = $3) AND ($4::text IS NULL OR decision = $4) \
         AND ($5::timestamptz IS NULL OR at >= $5) AND ($6::timestamptz IS NULL OR at < $6) \
         AND ($9::uuid IS NULL OR sandbox_id = $9) \
         AND seq > $7 ORDER BY tenant_id, seq LIMIT $8"
    ))
    .bind(tenant)
    .bind(&q.tool)
    .bind(&q.caller)
    .bind(&q.decision)
    .bind(q.since)
    .bind(q.until)
    .bind(q.after.unwrap_or(0))
    .bind(limit)
    .bind(q.sandbox)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The form every stored digest and row hash was made with: a sorted copy, then serde_json.
    fn sorted_copy(v: &Value) -> String {
        fn sort(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    let mut keys: Vec<&String> = m.keys().collect();
                    keys.sort();
                    let mut out = serde_json::Map::new();
                    for k in keys {
                        out.insert(k.clone(), sort(&m[k]));
                    }
                    Value::Object(out)
                }
                Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
                other => other.clone(),
            }
        }
        sort(v).to_string()
    }

    #[test]
    fn the_streamed_form_is_byte_for_byte_the_stored_one() {
        let value = json!({
            "z": [1, -2, 3.5, 1e300, 18446744073709551615u64, -9223372036854775808i64, null, true],
            "a": {"b\"q": "line\nbreak\ttab \u{1}", "é": "ünïcödé 🚀", "": {}},
            "m": [[], {}, [{"y": 1, "x": [2, {"d": 0, "c": "\\"}]}]],
            "s": "plain",
        });
        assert_eq!(canonical(&value), sorted_copy(&value));
        assert_eq!(
            digest(&value),
            format!("sha256:{}", hex_sha256(sorted_copy(&value).as_bytes()))
        );
        let text = "an envelope \"quoted\" ünï\n";
        assert_eq!(digest_text(text), digest(&json!(text)));
        for scalar in [json!(null), json!(0), json!("x"), json!([]), json!({})] {
            assert_eq!(canonical(&scalar), sorted_copy(&scalar));
        }
    }
}
