//! Attested SEAL sessions in PostgreSQL, so they survive restarts and every replica sees them,
//! and the one sandbox each session gets on its first sandbox call.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// A session as stored.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Session {
    /// Session id (also the JWT `sub`).
    pub id: Uuid,
    /// Security context name (`scp`).
    pub context_name: String,
    /// Workload identity (`wid`).
    pub workload_id: String,
    /// The client's Ed25519 public key.
    #[serde(skip)]
    pub public_key: Vec<u8>,
    /// The token's `jti`.
    #[serde(skip)]
    pub token_id: String,
    /// `active` or `revoked` (expiry is computed from `expires_at`).
    pub status: String,
    /// When attested.
    pub created_at: DateTime<Utc>,
    /// When the token expires.
    pub expires_at: DateTime<Utc>,
    /// When revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The session's sandbox, once created.
    pub sandbox_id: Option<Uuid>,
}

const COLUMNS: &str = "id, context_name, workload_id, public_key, token_id, status, created_at, \
     expires_at, revoked_at, sandbox_id";

impl Session {
    /// `active`, `revoked` or `expired`, as operators see it.
    pub fn state(&self, now: DateTime<Utc>) -> &'static str {
        if self.status == "revoked" {
            "revoked"
        } else if self.expires_at <= now {
            "expired"
        } else {
            "active"
        }
    }
}

/// Stores a new session (in the caller's transaction, with the token it may redeem).
pub async fn create(
    db: impl sqlx::PgExecutor<'_>,
    tenant: &str,
    session: &Session,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO seal_sessions (id, tenant_id, context_name, workload_id, public_key, token_id, \
         status, created_at, expires_at) VALUES ($1,$2,$3,$4,$5,$6,'active',$7,$8)",
    )
    .bind(session.id)
    .bind(tenant)
    .bind(&session.context_name)
    .bind(&session.workload_id)
    .bind(&session.public_key)
    .bind(&session.token_id)
    .bind(session.created_at)
    .bind(session.expires_at)
    .execute(db)
    .await?;
    Ok(())
}

/// One session by id.
pub async fn get(pool: &PgPool, tenant: &str, id: Uuid) -> Result<Option<Session>, sqlx::Error> {
    aegis_store::database::tenant_row(pool, "seal_sessions", COLUMNS, tenant, id).await
}

/// Sessions, newest first; `live_only` hides revoked and expired ones.
pub async fn list(
    pool: &PgPool,
    tenant: &str,
    live_only: bool,
) -> Result<Vec<Session>, sqlx::Error> {
    let live = live_only.then_some("active");
    aegis_store::database::tenant_rows(pool, "seal_sessions", COLUMNS, tenant, live).await
}

/// Marks a session revoked; returns it (None when unknown).
pub async fn revoke(pool: &PgPool, tenant: &str, id: Uuid) -> Result<Option<Session>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE seal_sessions SET status = 'revoked', revoked_at = COALESCE(revoked_at, now()) \
         WHERE tenant_id = $1 AND id = $2 RETURNING {COLUMNS}"
    ))
    .bind(tenant)
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// Records the session's sandbox (first caller wins; returns the recorded one).
pub async fn set_sandbox(
    pool: &PgPool,
    id: Uuid,
    sandbox: Uuid,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE seal_sessions SET sandbox_id = COALESCE(sandbox_id, $2) WHERE id = $1 RETURNING sandbox_id",
    )
    .bind(id)
    .bind(sandbox)
    .fetch_optional(pool)
    .await
    .map(Option::flatten)
}

/// Creates the session's sandbox and records it on the session row; returns the recorded one.
/// Run it in a task of its own (the caller may go away): a sandbox created here is always either
/// recorded on the session (destroyed when the session ends) or destroyed at once.
pub async fn ensure_sandbox(
    services: super::Services,
    session: Uuid,
    context: aegis_seal::context::SecurityContext,
    mcp_key: Option<Uuid>,
) -> Result<dispatcher::SandboxId, String> {
    let created = services
        .sandboxes
        .create_for_session(&services.pool, session, &context, mcp_key)
        .await
        .map_err(|e| format!("no sandbox for this session: {e}"))?;
    match set_sandbox(&services.pool, session, created.0).await {
        Ok(Some(id)) if id == created.0 => Ok(created),
        Ok(Some(id)) => {
            // Another request created one first: keep theirs, drop ours.
            let _ = services.sandboxes.destroy(created).await;
            Ok(dispatcher::SandboxId(id))
        }
        Ok(None) | Err(_) => {
            // The session row is gone or unwritable: nothing would ever destroy this sandbox.
            let _ = services.sandboxes.destroy(created).await;
            Err(format!(
                "could not record sandbox {created} on session {session}"
            ))
        }
    }
}

/// Sessions that ended (revoked or expired) but still hold a sandbox.
pub async fn ended_with_sandbox(pool: &PgPool) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, sandbox_id FROM seal_sessions WHERE sandbox_id IS NOT NULL \
         AND (status = 'revoked' OR expires_at <= now())",
    )
    .fetch_all(pool)
    .await
}

/// Forgets a session's sandbox after it was destroyed.
pub async fn clear_sandbox(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE seal_sessions SET sandbox_id = NULL WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Drops replay records older than `keep_secs` (beyond the freshness window they cannot recur).
pub async fn prune_replay_guard(pool: &PgPool, keep_secs: i64) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM seal_replay_guard WHERE seen_at < now() - make_interval(secs => $1)",
    )
    .bind(keep_secs as f64)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Attestation attempts of the last minute, this one included, by scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptCounts {
    /// By the same workload id.
    pub workload: i64,
    /// From the same source address (0 when the source is unknown).
    pub source: i64,
    /// On the whole node (every replica shares the table).
    pub node: i64,
}

/// Records an attestation attempt and counts the attempts of the last minute per workload, per
/// source address and node-wide. Refused attempts count too: a flood is a flood.
pub async fn record_attest_attempt(
    pool: &PgPool,
    workload: &str,
    source: Option<&str>,
) -> Result<AttemptCounts, sqlx::Error> {
    sqlx::query("INSERT INTO seal_attest_attempts (workload_id, source) VALUES ($1, $2)")
        .bind(workload)
        .bind(source)
        .execute(pool)
        .await?;
    sqlx::query("DELETE FROM seal_attest_attempts WHERE at < now() - interval '10 minutes'")
        .execute(pool)
        .await?;
    let (workload, source, node): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE workload_id = $1), \
         count(*) FILTER (WHERE $2::text IS NOT NULL AND source = $2), count(*) \
         FROM seal_attest_attempts WHERE at > now() - interval '1 minute'",
    )
    .bind(workload)
    .bind(source)
    .fetch_one(pool)
    .await?;
    Ok(AttemptCounts {
        workload,
        source,
        node,
    })
}

/// The node's token signing seed, made at first start.
pub async fn signing_seed(pool: &PgPool) -> Result<(String, [u8; 32]), sqlx::Error> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| sqlx::Error::Protocol(format!("random: {e}")))?;
    let kid = format!("k-{}", &Uuid::new_v4().simple().to_string()[..12]);
    sqlx::query("INSERT INTO seal_signing_keys (kid, seed) SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM seal_signing_keys)")
        .bind(&kid)
        .bind(seed.as_slice())
        .execute(pool)
        .await?;
    let (kid, stored): (String, Vec<u8>) =
        sqlx::query_as("SELECT kid, seed FROM seal_signing_keys ORDER BY created_at LIMIT 1")
            .fetch_one(pool)
            .await?;
    let mut out = [0u8; 32];
    if stored.len() == 32 {
        out.copy_from_slice(&stored);
    }
    Ok((kid, out))
}

/// What [`admit`] learnt about a session, read in the same statement that records the
/// envelope's signature.
#[derive(Debug, Clone)]
pub struct Admission {
    /// `active` or `revoked`, as stored now (a revocation by any replica is seen at once).
    pub status: String,
    /// The session's sandbox, as stored now.
    pub sandbox_id: Option<Uuid>,
    /// A digest of the session's security context definition (None: the context is gone).
    pub context_version: Option<String>,
    /// False when the signature was seen before (a replay) or the session is not active.
    pub fresh: bool,
}

/// One call's admission: its session, its envelope's signature and its context's name.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    /// The session's tenant.
    pub tenant: String,
    /// The session the envelope's token names.
    pub session: Uuid,
    /// The envelope's signature (the replay guard's key).
    pub signature: String,
    /// The session's security context.
    pub context_name: String,
}

/// One statement for every per-call fact that can change under a cached session, for a batch of
/// calls: records each envelope's signature in the replay guard (only for an active session; the
/// primary key makes the check atomic across replicas), and reads each session's current status
/// and sandbox and its context's version. One answer per request, in order; None where the
/// session no longer exists.
///
/// A signature that occurs twice in one batch is offered to the guard once, by its first
/// request: the later ones are replays and are answered `fresh: false`.
pub async fn admit<'e>(
    db: impl sqlx::PgExecutor<'e>,
    requests: &[impl std::borrow::Borrow<AdmitRequest>],
) -> Result<Vec<Option<Admission>>, sqlx::Error> {
    let mut first = std::collections::HashSet::with_capacity(requests.len());
    let offered: Vec<bool> = requests
        .iter()
        .map(|r| first.insert(r.borrow().signature.as_str()))
        .collect();
    let tenants: Vec<&str> = requests
        .iter()
        .map(|r| r.borrow().tenant.as_str())
        .collect();
    let ids: Vec<Uuid> = requests.iter().map(|r| r.borrow().session).collect();
    let signatures: Vec<&str> = requests
        .iter()
        .map(|r| r.borrow().signature.as_str())
        .collect();
    let contexts: Vec<&str> = requests
        .iter()
        .map(|r| r.borrow().context_name.as_str())
        .collect();
    /// Request number (from 1), status, sandbox, context version, fresh.
    type Row = (i64, String, Option<Uuid>, Option<String>, bool);
    let rows: Vec<Row> = sqlx::query_as(
        "WITH r AS (SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], \
             $5::bool[]) WITH ORDINALITY AS r(tenant_id, session_id, signature, context_name, \
             offered, n)), \
         s AS (SELECT r.n, r.tenant_id, r.signature, r.context_name, r.offered, \
             ss.id, ss.status, ss.sandbox_id FROM r JOIN seal_sessions ss \
             ON ss.tenant_id = r.tenant_id AND ss.id = r.session_id), \
         g AS (INSERT INTO seal_replay_guard (signature, session_id) \
             SELECT signature, id FROM s WHERE status = 'active' AND offered \
             ON CONFLICT DO NOTHING RETURNING signature) \
         SELECT s.n, s.status, s.sandbox_id, \
             (SELECT md5(c.definition::text) FROM security_contexts c \
                 WHERE c.tenant_id = s.tenant_id AND c.name = s.context_name), \
             s.offered AND g.signature IS NOT NULL \
         FROM s LEFT JOIN g ON g.signature = s.signature",
    )
    .bind(&tenants)
    .bind(&ids)
    .bind(&signatures)
    .bind(&contexts)
    .bind(&offered)
    .fetch_all(db)
    .await?;
    let mut answers = vec![None; requests.len()];
    for (n, status, sandbox_id, context_version, fresh) in rows {
        if let Some(slot) = usize::try_from(n - 1).ok().and_then(|i| answers.get_mut(i)) {
            *slot = Some(Admission {
                status,
                sandbox_id,
                context_version,
                fresh,
            });
        }
    }
    Ok(answers)
}
