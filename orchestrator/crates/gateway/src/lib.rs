//! The SEAL gateway: attestation and signed tool calls, shared by HTTP and gRPC.
//!
//! Both transports hand this module the same inputs (an attestation request; the envelope's JSON
//! text) and get the same answers back, so there is one code path for every check. The order of
//! checks on an envelope follows the notes' §9: protocol and shape, token signature and expiry,
//! session (exists, not revoked, not expired), timestamp freshness, Ed25519 signature over the
//! canonical bytes, replay, then policy and the tool router. Every decision is audited with the
//! session and the SEAL code.

mod admission;
pub mod attestation_tokens;
mod invoke;
pub mod sessions;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use dispatcher::SandboxId;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use aegis_core::caller::{Caller, CallerKind};
use aegis_seal::context::{Proof, RateLimiter, SecurityContext};
use aegis_seal::envelope::decode_public_key;
use aegis_seal::error::{SealCode, SealError};
use aegis_seal::token::{Claims, TokenIssuer};
use aegis_store::audit::{self, Entry, EntryKind};
use aegis_store::contexts;

pub use sessions::Session;

/// What the gateway uses of the node: its rows, the sessions' sandboxes, and the router through
/// [`ToolInvoker`](aegis_engines::call::ToolInvoker), the one call it makes upward. Built by the API
/// layer's composition root (`AppState::gateway_services`); cheap to clone (handles only).
#[derive(Clone)]
pub struct Services {
    /// Sessions, contexts, the replay guard and audit rows.
    pub pool: sqlx::PgPool,
    /// The sessions' sandboxes.
    pub sandboxes: std::sync::Arc<aegis_sandboxes::Sandboxes>,
    /// The router.
    pub tools: std::sync::Arc<dyn aegis_engines::call::ToolInvoker>,
}

/// Gateway settings (from `seal.*` in the node config).
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Token lifetime, seconds (at most 24 h).
    pub token_ttl_secs: i64,
    /// Envelope timestamp window, seconds either way.
    pub freshness_secs: i64,
    /// Attestation attempts allowed per workload per minute.
    pub attest_per_minute: i64,
    /// Attestation attempts allowed per source address per minute.
    pub attest_per_minute_per_source: i64,
    /// Attestation attempts allowed on the whole node (every replica) per minute.
    pub attest_per_minute_node: i64,
}

/// Long-lived gateway state: the token issuer, the per-session rate limiter, and the caches
/// that keep a signed call to one PostgreSQL round trip before the router.
///
/// What is cached never goes stale unseen: a session's cached facts (key, token id, expiry,
/// context name) never change after attestation, and what can change (revocation, the session's
/// sandbox, the context's definition) is read again on every call, in the same statement that
/// records the envelope in the replay guard (`sessions::admit`). So a revocation or a context
/// edit made through any replica applies to the very next call, with no TTL and no
/// notification channel to lose.
pub struct Gateway {
    issuer: TokenIssuer,
    limiter: Arc<RateLimiter>,
    config: GatewayConfig,
    sessions: Mutex<HashMap<Uuid, Arc<Session>>>,
    contexts: Mutex<HashMap<String, (String, Arc<SecurityContext>)>>,
    /// Tokens whose signature and claims were verified: that answer depends on the token's bytes
    /// alone (the keys never change while the node runs), so a session's token is checked once;
    /// its times are checked on every call.
    tokens: Mutex<HashMap<String, Arc<Claims>>>,
    /// The replay guard's batched writer.
    admissions: admission::Admissions,
}

/// Cached sessions beyond this are dropped (all at once: they are re-read on their next call).
const MAX_CACHED_SESSIONS: usize = 10_000;

/// Body of an attestation.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct AttestRequest {
    /// Standard Base64 of the raw 32-byte Ed25519 public key.
    pub public_key: String,
    /// Workload identity, e.g. `docker://<container id>`.
    pub workload_id: String,
    /// Security context name.
    pub security_context: String,
    /// The context's enrolment secret, as proof of the workload's identity.
    #[serde(default)]
    pub attestation_secret: Option<String>,
    /// A one-time attestation token an operator issued for the context, as proof.
    #[serde(default)]
    pub attestation_token: Option<String>,
}

/// A refused envelope: the error and the request id to echo.
#[derive(Debug)]
pub struct Refusal {
    /// The SEAL error.
    pub error: SealError,
    /// `payload.id`, when it could be read.
    pub request_id: Option<Value>,
}

impl Gateway {
    /// Builds the gateway around the node's signing key.
    pub fn new(seed: [u8; 32], config: GatewayConfig) -> Self {
        Self {
            issuer: TokenIssuer::from_seed(seed, "orchestrator"),
            limiter: Arc::new(RateLimiter::new()),
            config,
            sessions: Mutex::default(),
            contexts: Mutex::default(),
            tokens: Mutex::default(),
            admissions: admission::Admissions::default(),
        }
    }

    /// The token issuer (tests verify tokens with it).
    pub fn issuer(&self) -> &TokenIssuer {
        &self.issuer
    }

    /// Registers a client key for a workload under a security context and issues its token.
    /// `source` is the peer address of the request (for the per-source rate limit).
    pub async fn attest(
        &self,
        services: &Services,
        req: AttestRequest,
        source: Option<IpAddr>,
    ) -> Result<Value, SealError> {
        let started = Instant::now();
        let result = self.attest_inner(services, &req, source).await;
        let (caller, allowed, code, reason) = match &result {
            Ok((session, _)) => (
                session_caller(
                    session.id,
                    &req.security_context,
                    aegis_core::caller::Tier::User,
                ),
                true,
                None,
                None,
            ),
            Err(e) => (
                anonymous(&req.workload_id),
                false,
                {
                    aegis_metrics::seal_refusal(e.code.as_u32());
                    Some(e.code.as_u32().to_string())
                },
                Some(e.message.clone()),
            ),
        };
        let entry = Entry {
            kind: EntryKind::Admin,
            action: "seal.attest".to_owned(),
            allowed,
            reason_code: code,
            reason,
            args_digest: audit::digest(
                &json!({"workload_id": req.workload_id, "security_context": req.security_context, "public_key": req.public_key}),
            ),
            outcome: if allowed { "ok" } else { "denied" },
            result_digest: None,
            duration_ms: started.elapsed().as_millis() as i64,
            sandbox_id: None,
        };
        audit::record(&services.pool, &caller, entry)
            .await
            .map_err(|e| {
                SealError::new(
                    SealCode::AttestationFailed,
                    format!("audit log unavailable: {e}"),
                )
            })?;
        result.map(|(_, body)| body)
    }

    async fn attest_inner(
        &self,
        services: &Services,
        req: &AttestRequest,
        source: Option<IpAddr>,
    ) -> Result<(Session, Value), SealError> {
        let fail = |code, msg: String| SealError::new(code, msg);
        self.check_attempts(services, req, source).await?;
        let public_key = decode_public_key(&req.public_key)?;
        let context = contexts::get(
            &services.pool,
            aegis_core::DEFAULT_TENANT,
            &req.security_context,
        )
        .await
        .map_err(|e| match e {
            contexts::ContextError::NotFound(n) => fail(
                SealCode::ScopeNotFound,
                format!("security context `{n}` does not exist"),
            ),
            other => fail(SealCode::AttestationFailed, other.to_string()),
        })?;
        let token = req.attestation_token.as_deref().filter(|t| !t.is_empty());
        let secret = req.attestation_secret.as_deref().filter(|s| !s.is_empty());
        let proof = match (token, secret) {
            (Some(_), Some(_)) => {
                return Err(fail(
                    SealCode::AttestationFailed,
                    "present either an attestation_token or an attestation_secret, not both".into(),
                ))
            }
            // Checked below, in the session's transaction.
            (Some(_), None) => Proof::RedeemedToken,
            (None, Some(secret)) => Proof::Secret(secret),
            (None, None) => Proof::None,
        };
        context.admits(&req.workload_id, proof)?;

        let (session, claims) = self.new_session(&context.name, req, public_key.to_vec());
        let security_token = self.issuer.issue(&claims)?;
        store_session(services, &context.name, req, token, &session).await?;
        let body = json!({
            "status": "success",
            "security_token": security_token,
            "expires_at": session.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "session_id": session.id,
        });
        Ok((session, body))
    }

    /// The attempt is recorded and the flood limits (per workload, per source address, per
    /// node) checked before anything else of the request is looked at.
    async fn check_attempts(
        &self,
        services: &Services,
        req: &AttestRequest,
        source: Option<IpAddr>,
    ) -> Result<(), SealError> {
        let source = source.map(|ip| ip.to_string());
        let counts =
            sessions::record_attest_attempt(&services.pool, &req.workload_id, source.as_deref())
                .await
                .map_err(|e| SealError::new(SealCode::AttestationFailed, e.to_string()))?;
        let flooded = [
            (
                counts.workload,
                self.config.attest_per_minute,
                format!("workload `{}`", req.workload_id),
            ),
            (
                counts.source,
                self.config.attest_per_minute_per_source,
                format!("source address {}", source.as_deref().unwrap_or("unknown")),
            ),
            (
                counts.node,
                self.config.attest_per_minute_node,
                "this node".to_owned(),
            ),
        ];
        for (attempts, limit, scope) in flooded {
            if attempts > limit {
                return Err(SealError::new(
                    SealCode::AttestationFailed,
                    format!("too many attestation attempts from {scope} ({attempts} in the last minute; limit {limit}); retry later"),
                )
                .with_retry_after(60));
            }
        }
        Ok(())
    }

    /// The admitted workload's session and its token's claims, built once every check passed.
    fn new_session(
        &self,
        context_name: &str,
        req: &AttestRequest,
        public_key: Vec<u8>,
    ) -> (Session, Claims) {
        let now = Utc::now();
        let ttl = self.config.token_ttl_secs.clamp(60, 24 * 3600);
        let session = Session {
            id: Uuid::new_v4(),
            context_name: context_name.to_owned(),
            workload_id: req.workload_id.clone(),
            public_key,
            token_id: Uuid::new_v4().to_string(),
            status: "active".to_owned(),
            created_at: now,
            expires_at: now + chrono::Duration::seconds(ttl),
            revoked_at: None,
            sandbox_id: None,
        };
        let claims = Claims {
            sub: session.id.to_string(),
            iat: now.timestamp(),
            exp: session.expires_at.timestamp(),
            scp: context_name.to_owned(),
            wid: req.workload_id.clone(),
            jti: session.token_id.clone(),
            exec_id: None,
            iss: Some("orchestrator".to_owned()),
        };
        (session, claims)
    }

    /// A session's immutable facts, from the cache or (once) from the database.
    async fn cached_session(
        &self,
        pool: &PgPool,
        id: Uuid,
    ) -> Result<Option<Arc<Session>>, sqlx::Error> {
        if let Some(s) = lock(&self.sessions).get(&id) {
            return Ok(Some(s.clone()));
        }
        let Some(session) = sessions::get(pool, aegis_core::DEFAULT_TENANT, id).await? else {
            return Ok(None);
        };
        let session = Arc::new(session);
        let mut cache = lock(&self.sessions);
        if cache.len() >= MAX_CACHED_SESSIONS {
            cache.clear();
        }
        cache.insert(id, session.clone());
        Ok(Some(session))
    }

    fn forget_session(&self, id: Uuid) {
        lock(&self.sessions).remove(&id);
    }

    /// A security context at `version` (as `sessions::admit` just read it): the cached copy when
    /// it is that version, else read again. No version: the context was deleted.
    async fn cached_context(
        &self,
        pool: &PgPool,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<SecurityContext>, contexts::ContextError> {
        let Some(version) = version else {
            lock(&self.contexts).remove(name);
            return Err(contexts::ContextError::NotFound(name.to_owned()));
        };
        if let Some((v, ctx)) = lock(&self.contexts).get(name) {
            if v == version {
                return Ok(ctx.clone());
            }
        }
        let (ctx, v) = contexts::get_versioned(pool, aegis_core::DEFAULT_TENANT, name).await?;
        let ctx = Arc::new(ctx);
        lock(&self.contexts).insert(name.to_owned(), (v, ctx.clone()));
        Ok(ctx)
    }

    /// The session's sandbox, created on first use with the context's runtime. Creation runs in
    /// a task of its own: a caller that goes away mid-way (client disconnected) cannot leave a
    /// sandbox that no session row records; it is recorded, and destroyed with its session.
    async fn session_sandbox(
        &self,
        services: &Services,
        session: &Session,
        context: &SecurityContext,
    ) -> Result<SandboxId, SealError> {
        if let Some(id) = session.sandbox_id {
            return Ok(SandboxId(id));
        }
        let task = tokio::spawn(sessions::ensure_sandbox(
            services.clone(),
            session.id,
            context.clone(),
            None,
        ));
        task.await
            .map_err(|e| {
                SealError::new(
                    SealCode::NoMatchingCapability,
                    format!("no sandbox for this session: {e}"),
                )
            })?
            .map_err(|e| SealError::new(SealCode::NoMatchingCapability, e))
    }

    /// The tools a session's security token may call (for `GET /v1/seal/tools` and gRPC).
    pub async fn tools_for_token(
        &self,
        services: &Services,
        token: &str,
    ) -> Result<Value, SealError> {
        let now = Utc::now();
        let claims = self.issuer.verify(token, now.timestamp())?;
        // The token alone is not enough: its session must still be live (a revoked session
        // learns nothing more, not even its tool list), as stored now, not as cached.
        let session = Uuid::parse_str(&claims.sub)
            .ok()
            .map(|id| sessions::get(&services.pool, aegis_core::DEFAULT_TENANT, id));
        let session = match session {
            Some(lookup) => lookup
                .await
                .map_err(|e| SealError::new(SealCode::SessionNotFound, e.to_string()))?,
            None => None,
        }
        .ok_or_else(|| SealError::new(SealCode::SessionNotFound, "the token names no session"))?;
        invoke::issued_for(&session, &claims)?;
        invoke::live(&session, now)?;
        let context = contexts::get(&services.pool, aegis_core::DEFAULT_TENANT, &claims.scp)
            .await
            .map_err(|e| SealError::new(SealCode::ScopeNotFound, e.to_string()))?;
        let caller = Caller {
            seal: Some(aegis_core::caller::SealScope {
                context: Arc::new(context.clone()),
                limiter: self.limiter.clone(),
                session_key: claims.sub.clone(),
                ceilings: Vec::new(),
            }),
            ..session_caller(
                Uuid::parse_str(&claims.sub).unwrap_or_default(),
                &claims.scp,
                context.tier,
            )
        };
        Ok(json!({
            "protocol": "seal/v1",
            "attestation_endpoint": "/v1/seal/attest",
            "invoke_endpoint": "/v1/seal/invoke",
            "security_context": claims.scp,
            "tools": list_tools(&caller),
        }))
    }

    /// Destroys the sandboxes of sessions that were revoked or expired; prunes the replay guard.
    pub async fn sweep(&self, services: &Services) {
        match sessions::ended_with_sandbox(&services.pool).await {
            Ok(ended) => {
                for (session, sandbox) in ended {
                    if let Err(e) = services.sandboxes.destroy(SandboxId(sandbox)).await {
                        tracing::warn!(session = %session, sandbox = %sandbox, error = %e, "could not destroy an ended session's sandbox");
                        continue;
                    }
                    let _ = sessions::clear_sandbox(&services.pool, session).await;
                    tracing::info!(session = %session, sandbox = %sandbox, "destroyed the sandbox of an ended session");
                }
            }
            Err(e) => tracing::warn!(error = %e, "session sweep failed"),
        }
        let _ = sessions::prune_replay_guard(&services.pool, self.config.freshness_secs * 4).await;
    }
}

/// Storing the session is the last step, in one transaction with the redemption of the
/// attestation token (if one was presented), so a token admits one session only.
async fn store_session(
    services: &Services,
    context_name: &str,
    req: &AttestRequest,
    token: Option<&str>,
    session: &Session,
) -> Result<(), SealError> {
    let fail = |code, msg: String| SealError::new(code, msg);
    let db = |e: sqlx::Error| fail(SealCode::AttestationFailed, e.to_string());
    let mut tx = services.pool.begin().await.map_err(db)?;
    if let Some(token) = token {
        attestation_tokens::redeem(
            &mut tx,
            aegis_core::DEFAULT_TENANT,
            context_name,
            &req.workload_id,
            token,
            session.id,
        )
        .await
        .map_err(|e| match e {
            attestation_tokens::TokenError::Refused(why) => {
                SealError::new(SealCode::WorkloadVerificationFailed, why).with_details(
                    json!({"security_context": context_name, "workload_id": req.workload_id}),
                )
            }
            other => fail(SealCode::AttestationFailed, other.to_string()),
        })?;
    }
    sessions::create(&mut *tx, aegis_core::DEFAULT_TENANT, session)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(())
}

/// A cache lock; a panic while holding one leaves plain data behind, still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn list_tools(caller: &Caller) -> Vec<Value> {
    let Ok(catalog) = aegis_core::catalog::catalog() else {
        return Vec::new();
    };
    catalog
        .iter()
        .filter(|t| aegis_policy::may_see(caller, t))
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
        .collect()
}

fn session_caller(id: Uuid, context: &str, tier: aegis_core::caller::Tier) -> Caller {
    Caller {
        kind: CallerKind::Session,
        id: id.to_string(),
        label: context.to_owned(),
        tier,
        role: None,
        tenant: aegis_core::DEFAULT_TENANT.to_owned(),
        seal: None,
    }
}

fn anonymous(label: &str) -> Caller {
    Caller {
        kind: CallerKind::Session,
        id: "unauthenticated".to_owned(),
        label: label.to_owned(),
        tier: aegis_core::caller::Tier::User,
        role: None,
        tenant: aegis_core::DEFAULT_TENANT.to_owned(),
        seal: None,
    }
}
