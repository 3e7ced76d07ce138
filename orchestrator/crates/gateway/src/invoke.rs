//! A signed call (`/v1/seal/invoke`, gRPC `Invoke`): the envelope's checks as named steps, in the
//! order the notes give (§9), each refusing with its own SEAL code, then the request itself.
//!
//! 1. [`Envelope::parse`]: protocol and shape (`MalformedEnvelope`).
//! 2. [`Gateway::token_claims`]: the token's signature, issuer and times (`TokenVerificationFailed`,
//!    `TokenExpired`).
//! 3. [`Gateway::bound_session`]: the session the token names, and the token is that session's
//!    (`SessionNotFound`, `TokenVerificationFailed`).
//! 4. [`live`]: the session is neither revoked nor expired (`SessionInactive`, `TokenExpired`).
//! 5. [`Envelope::check_freshness`]: the envelope's timestamp is inside the window.
//! 6. [`signed_by_session`]: Ed25519 over the canonical bytes, with the session's key
//!    (`SignatureVerificationFailed`).
//! 7. [`Gateway::admitted`]: the replay guard records the signature and reads what may change
//!    (revocation, sandbox, context version) in one statement (`SignatureVerificationFailed` for a
//!    replay, `SessionInactive`).
//! 8. [`Gateway::cached_context`]: the session's security context as it is now (`ScopeNotFound`).
//! 9. [`Gateway::run_request`]: `tools/list`, or `tools/call`: the context previews the call
//!    (before any sandbox is made), the session's sandbox, then the router, which decides, audits
//!    and runs the call.
//!
//! Refusals before the router are audited here, once ([`Gateway::invoke`]); the router audits
//! its own. A client that goes away before the router takes over is audited by [`Unfinished`].

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use super::sessions::{self, Admission, Session};
use super::Services;
use super::{anonymous, list_tools, session_caller, Gateway, Refusal};
use aegis_core::caller::{Caller, SealScope, Tier};
use aegis_engines::call::{CallError, OutputSink};
use aegis_seal::context::SecurityContext;
use aegis_seal::envelope::Envelope;
use aegis_seal::error::{SealCode, SealError};
use aegis_seal::token::Claims;
use aegis_store::audit::{self, Entry, EntryKind};

impl Gateway {
    /// Checks an envelope and runs its request; the success body or a refusal.
    pub async fn invoke(&self, services: &Services, body: &str) -> Result<Value, Refusal> {
        self.invoke_with(services, body, None).await
    }

    /// [`Gateway::invoke`] in its streaming form (gRPC `InvokeStream`): the same steps and
    /// answer, and a `tools/call` of a foreground `cmd.run` sends its output to `output` as it
    /// comes (`tools::invoke_streaming`). Every refusal comes back before anything is sent.
    pub async fn invoke_streaming(
        &self,
        services: &Services,
        body: &str,
        output: OutputSink,
    ) -> Result<Value, Refusal> {
        self.invoke_with(services, body, Some(output)).await
    }

    async fn invoke_with(
        &self,
        services: &Services,
        body: &str,
        output: Option<OutputSink>,
    ) -> Result<Value, Refusal> {
        let mut call = Unfinished::new(services.pool.clone(), body);
        let result = self.check_and_run(services, body, &mut call, output).await;
        call.armed = false;
        if let Err(failure) = &result {
            aegis_metrics::seal_refusal(failure.error.code.as_u32());
            if !failure.routed {
                call.audit_refusal(failure).await;
            }
        }
        result.map_err(|failure| Refusal {
            error: failure.error,
            request_id: call.request_id.take(),
        })
    }

    /// The steps of the module doc, in order; what each learns is kept in `call` so that a
    /// refusal is reported (and audited) with the request id, tool and session known so far.
    async fn check_and_run(
        &self,
        services: &Services,
        body: &str,
        call: &mut Unfinished<'_>,
        output: Option<OutputSink>,
    ) -> Result<Value, Failure> {
        let envelope = Envelope::parse(body).map_err(Failure::before_router)?;
        call.request_id = envelope.request_id();
        call.tool = envelope.tool_call().map(|(name, _)| name);
        let now = Utc::now();
        let claims = self
            .token_claims(&envelope.security_token, now.timestamp())
            .map_err(Failure::before_router)?;
        let session = self
            .bound_session(&services.pool, &claims)
            .await
            .map_err(Failure::before_router)?;
        call.session = Some((session.id, session.context_name.clone()));
        live(&session, now).map_err(Failure::before_router)?;
        envelope
            .check_freshness(now.timestamp(), self.config.freshness_secs)
            .map_err(Failure::before_router)?;
        signed_by_session(&envelope, &session).map_err(Failure::before_router)?;
        let admission = self
            .admitted(&services.pool, &envelope, &session)
            .await
            .map_err(Failure::before_router)?;
        let context = self
            .cached_context(
                &services.pool,
                &session.context_name,
                admission.context_version.as_deref(),
            )
            .await
            .map_err(|e| {
                Failure::before_router(SealError::new(SealCode::ScopeNotFound, e.to_string()))
            })?;

        let session = Session {
            status: admission.status,
            sandbox_id: admission.sandbox_id,
            ..(*session).clone()
        };
        let caller = Caller {
            seal: Some(SealScope {
                context: context.clone(),
                limiter: self.limiter.clone(),
                session_key: session.id.to_string(),
                ceilings: Vec::new(),
            }),
            ..session_caller(session.id, &session.context_name, context.tier)
        };
        let result = self
            .run_request(
                services, &envelope, &session, &context, &caller, call, output,
            )
            .await?;
        Ok(json!({
            "protocol": "seal/v1",
            "status": "success",
            "payload": {"jsonrpc": "2.0", "id": call.request_id.clone().unwrap_or(Value::Null), "result": result},
        }))
    }

    /// Step 2: [`aegis_seal::token::TokenIssuer::verify`], with the signature checked once per
    /// token (that answer depends on the token's bytes alone) and its times on every call.
    pub(super) fn token_claims(
        &self,
        token: &str,
        now_unix: i64,
    ) -> Result<Arc<Claims>, SealError> {
        let cached = super::lock(&self.tokens).get(token).cloned();
        let claims = match cached {
            Some(claims) => claims,
            None => {
                let claims = Arc::new(self.issuer.verify_signed(token)?);
                let mut cache = super::lock(&self.tokens);
                if cache.len() >= super::MAX_CACHED_SESSIONS {
                    cache.clear();
                }
                cache.insert(token.to_owned(), claims.clone());
                claims
            }
        };
        aegis_seal::token::check_times(&claims, now_unix)?;
        Ok(claims)
    }

    /// Step 3: the session the token names, and the token is the one that session was issued
    /// (a token of an earlier attestation of the same workload is not).
    pub(super) async fn bound_session(
        &self,
        pool: &PgPool,
        claims: &Claims,
    ) -> Result<Arc<Session>, SealError> {
        let id = Uuid::parse_str(&claims.sub)
            .map_err(|_| SealError::new(SealCode::SessionNotFound, "the token names no session"))?;
        let session = self
            .cached_session(pool, id)
            .await
            .map_err(|e| SealError::new(SealCode::SessionNotFound, e.to_string()))?
            .ok_or_else(|| {
                SealError::new(
                    SealCode::SessionNotFound,
                    format!("session {id} does not exist"),
                )
            })?;
        issued_for(&session, claims)?;
        Ok(session)
    }

    /// Step 7: records the envelope's signature in the replay guard and reads, in the same
    /// statement, what may have changed since attestation through any replica.
    async fn admitted(
        &self,
        pool: &PgPool,
        envelope: &Envelope,
        session: &Session,
    ) -> Result<Admission, SealError> {
        let admission = self
            .admissions
            .admit(
                pool,
                sessions::AdmitRequest {
                    tenant: aegis_core::DEFAULT_TENANT.to_owned(),
                    session: session.id,
                    signature: envelope.signature.clone(),
                    context_name: session.context_name.clone(),
                },
            )
            .await
            .map_err(|e| SealError::new(SealCode::MalformedEnvelope, e.to_string()))?;
        let Some(admission) = admission else {
            self.forget_session(session.id);
            return Err(SealError::new(
                SealCode::SessionNotFound,
                format!("session {} does not exist", session.id),
            ));
        };
        if admission.status == "revoked" {
            self.forget_session(session.id);
            return Err(SealError::new(
                SealCode::SessionInactive,
                format!("session {} was revoked", session.id),
            ));
        }
        if !admission.fresh {
            return Err(SealError::new(
                SealCode::SignatureVerificationFailed,
                "this envelope was already used (replay refused); sign every request anew",
            ));
        }
        Ok(admission)
    }

    /// Step 9: the request the envelope carries.
    #[allow(clippy::too_many_arguments)]
    async fn run_request(
        &self,
        services: &Services,
        envelope: &Envelope,
        session: &Session,
        context: &SecurityContext,
        caller: &Caller,
        call: &mut Unfinished<'_>,
        output: Option<OutputSink>,
    ) -> Result<Value, Failure> {
        match envelope.method() {
            "tools/call" => {
                let (name, arguments) = envelope.tool_call().ok_or_else(|| {
                    Failure::before_router(SealError::new(
                        SealCode::MalformedEnvelope,
                        "tools/call needs params.name",
                    ))
                })?;
                // The security context is previewed first, for every tool (the RFC evaluates name
                // and arguments, implemented or not), so a refused call never creates a sandbox;
                // the router then decides the call itself (and counts its rate limit once).
                let size_limit = match caller.seal.as_ref() {
                    Some(scope) => aegis_policy::preview_seal(scope, &name, &arguments)
                        .map_err(|denial| Failure::before_router(preview_refusal(denial)))?,
                    None => None,
                };
                call.allowed = true;
                let sandbox = if aegis_policy::needs_sandbox(&name) {
                    Some(
                        self.session_sandbox(services, session, context)
                            .await
                            .map_err(Failure::before_router)?,
                    )
                } else {
                    None
                };
                // The router audits from here on (its intent row), whatever the client does.
                call.armed = false;
                // A capability's `max_response_size` judges the whole result, which output
                // sent as it comes would escape: under one, the call does not stream.
                let output = output.filter(|_| size_limit.is_none());
                let invoked = match output {
                    Some(output) => {
                        services
                            .tools
                            .invoke_streaming(caller, &name, arguments, sandbox, output)
                            .await
                    }
                    None => {
                        services
                            .tools
                            .invoke(caller, &name, arguments, sandbox, None)
                            .await
                    }
                };
                let outcome = invoked.map_err(|e| Failure {
                    error: call_error(e),
                    routed: true,
                })?;
                Ok(within_response_limit(&name, outcome.into_mcp(), size_limit))
            }
            "tools/list" => Ok(json!({"tools": list_tools(caller)})),
            other => Err(Failure::before_router(SealError::new(
                SealCode::MalformedEnvelope,
                format!("method `{other}` is not supported; use tools/call or tools/list"),
            ))),
        }
    }
}

/// Part of step 3: the token is the one the session was issued.
pub(super) fn issued_for(session: &Session, claims: &Claims) -> Result<(), SealError> {
    if session.token_id == claims.jti {
        Ok(())
    } else {
        Err(SealError::new(
            SealCode::TokenVerificationFailed,
            "the token does not belong to this session",
        ))
    }
}

/// Step 4: a revoked or expired session refuses every call (and its tool list).
pub(super) fn live(session: &Session, now: DateTime<Utc>) -> Result<(), SealError> {
    match session.state(now) {
        "revoked" => Err(SealError::new(
            SealCode::SessionInactive,
            format!("session {} was revoked", session.id),
        )),
        "expired" => Err(SealError::new(
            SealCode::TokenExpired,
            format!("session {} expired at {}", session.id, session.expires_at),
        )),
        _ => Ok(()),
    }
}

/// Step 6: the envelope is signed by the key the session attested with.
fn signed_by_session(envelope: &Envelope, session: &Session) -> Result<(), SealError> {
    let key: [u8; 32] =
        session.public_key.as_slice().try_into().map_err(|_| {
            SealError::new(SealCode::SessionNotFound, "the session has no usable key")
        })?;
    envelope.verify_signature(&key)
}

/// The security context's refusal of a previewed call, with its own SEAL code.
fn preview_refusal(denial: aegis_policy::Denial) -> SealError {
    let code = denial
        .seal_code
        .and_then(SealCode::from_u32)
        .unwrap_or(SealCode::NoMatchingCapability);
    let error = SealError::new(code, denial.message);
    if code == SealCode::RateLimitExceeded {
        error.with_retry_after(denial.retry_after_secs.unwrap_or(1))
    } else {
        error
    }
}

/// The capability's `max_response_size`: a larger result is withheld, not truncated. Measured
/// (without building the text) only when the capability sets a limit.
fn within_response_limit(name: &str, result: Value, limit: Option<u64>) -> Value {
    let Some(limit) = limit else {
        return result;
    };
    let size = aegis_core::arguments::serialized_len(&result) as u64;
    if size <= limit {
        return result;
    }
    json!({
        "content": [{"type": "text", "text": format!(
            "the result of {name} is {size} bytes; the security context allows {limit} (max_response_size)")}],
        "structuredContent": {"error": {"code": "response_too_large", "size_bytes": size, "max_response_size": limit}},
        "isError": true,
    })
}

/// A refusal inside `invoke`, with whether the router already audited it.
struct Failure {
    error: SealError,
    routed: bool,
}

impl Failure {
    /// A step's refusal before the router (audited by [`Gateway::invoke`]).
    fn before_router(error: SealError) -> Failure {
        Failure {
            error,
            routed: false,
        }
    }
}

/// Maps a router refusal to its SEAL code.
fn call_error(e: CallError) -> SealError {
    match e {
        CallError::Denied { denial, .. } => {
            let code = denial
                .seal_code
                .and_then(SealCode::from_u32)
                .unwrap_or(match denial.code {
                    "path_not_allowed" => SealCode::PathNotAllowed,
                    "command_not_allowed" => SealCode::CommandNotAllowed,
                    "tier" | "tool_not_in_manifest" => SealCode::ToolNotAllowed,
                    _ => SealCode::NoMatchingCapability,
                });
            SealError::new(code, denial.message)
        }
        CallError::UnknownTool { .. } => SealError::new(SealCode::ToolNotAllowed, e.to_string()),
        CallError::InvalidArguments { ref violations, .. } => {
            let details = serde_json::to_value(violations).unwrap_or_default();
            SealError::new(SealCode::MalformedEnvelope, e.to_string())
                .with_details(json!({"violations": details}))
        }
        other => SealError::new(SealCode::NoMatchingCapability, other.to_string()),
    }
}

/// What the log records of an envelope that never reached the router: the digest of its text.
fn envelope_digest(body: &str) -> String {
    audit::digest(&json!({"envelope_sha": audit::digest_text(body)}))
}

/// An envelope being checked, and what is known of it so far. If the client goes away before
/// the router takes over (say while the session's first sandbox is being made), dropping this
/// records that in the audit log.
struct Unfinished<'a> {
    pool: PgPool,
    /// The envelope as received (digested only if this ends up in the log).
    body: &'a str,
    started: Instant,
    /// `payload.id`, echoed in the answer.
    request_id: Option<Value>,
    tool: Option<String>,
    /// The session's id and context name, once the token named a session.
    session: Option<(Uuid, String)>,
    /// The security context allowed the call.
    allowed: bool,
    armed: bool,
}

impl<'a> Unfinished<'a> {
    fn new(pool: PgPool, body: &'a str) -> Self {
        Self {
            pool,
            body,
            started: Instant::now(),
            request_id: None,
            tool: None,
            session: None,
            allowed: false,
            armed: true,
        }
    }

    /// Who the log names: the session when the token named one, else nobody.
    fn caller(&self) -> Caller {
        match &self.session {
            Some((id, ctx)) => session_caller(*id, ctx, Tier::User),
            None => anonymous("unauthenticated"),
        }
    }

    fn entry(&self, allowed: bool, code: String, reason: String, outcome: &'static str) -> Entry {
        Entry {
            kind: EntryKind::Tool,
            action: self
                .tool
                .clone()
                .unwrap_or_else(|| "seal.invoke".to_owned()),
            allowed,
            reason_code: Some(code),
            reason: Some(reason),
            args_digest: envelope_digest(self.body),
            outcome,
            result_digest: None,
            duration_ms: self.started.elapsed().as_millis() as i64,
            sandbox_id: None,
        }
    }

    /// The audit row of a refusal before the router.
    async fn audit_refusal(&self, failure: &Failure) {
        let entry = self.entry(
            false,
            failure.error.code.as_u32().to_string(),
            failure.error.message.clone(),
            "denied",
        );
        if let Err(e) = audit::record(&self.pool, &self.caller(), entry).await {
            tracing::error!(error = %e, "audit log unavailable for a SEAL refusal");
        }
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let caller = self.caller();
        let entry = self.entry(
            self.allowed,
            "client_disconnected".to_owned(),
            "the client disconnected before the call reached its tool; nothing ran".to_owned(),
            "cancelled",
        );
        let pool = self.pool.clone();
        runtime.spawn(async move {
            if let Err(e) = audit::record(&pool, &caller, entry).await {
                tracing::error!(error = %e, "audit log unavailable for an abandoned SEAL call");
            }
        });
    }
}
