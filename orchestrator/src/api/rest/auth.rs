//! Bearer-key authentication for `/v1/` routes, and the role checks handlers ask for.

use axum::extract::rejection::ExtensionRejection;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use axum::Extension;

use super::error::ApiError;
use crate::auth::{self, AuthError};
use crate::caller::{Caller, Role};
use crate::state::AppState;

/// What every `/v1/` handler starts from: the node's state and the caller whose key
/// [`require_key`] resolved (refused as a missing `Extension<Caller>` would be, where no key
/// was resolved).
pub struct Call {
    /// The node's state.
    pub state: AppState,
    /// Who asks.
    pub caller: Caller,
}

impl FromRequestParts<AppState> for Call {
    type Rejection = ExtensionRejection;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Extension(caller) = Extension::<Caller>::from_request_parts(parts, state).await?;
        Ok(Call {
            state: state.clone(),
            caller,
        })
    }
}

/// Resolves the bearer key and stores the `Caller` in the request; 401 otherwise.
pub async fn require_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .ok_or(AuthError::Missing)?
        .to_str()
        .map_err(|_| AuthError::Invalid("the header is not ASCII"))?;
    let key = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or(AuthError::Invalid("expected `Bearer <api key>`"))?
        .trim();
    let caller = auth::authenticate(&state.pool, &state.api_keys, key).await?;
    if let Some(scope) = &caller.seal {
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str)
            .unwrap_or_default();
        if !bound_key_may_use(request.method(), route) {
            let message = format!(
                "API key `{}` is bound to security context `{}`: it acts only through tool \
                 calls, which that context decides (POST /v1/tools/call, /mcp, and the \
                 routes that are tool calls); {} {route} is not one",
                caller.label,
                scope.context.name,
                request.method()
            );
            refusal_audited(&state, &caller, request.method(), route, &message).await;
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "key_bound",
                message,
            ));
        }
    }
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// A bound key's refused route as one audit row (denied, `key_bound`), as the router leaves
/// one for every call it refuses: the refusal happens here, before any handler. A row that
/// cannot be written is logged; the request is refused all the same.
async fn refusal_audited(
    state: &AppState,
    caller: &Caller,
    method: &Method,
    route: &str,
    message: &str,
) {
    let action = format!("{method} {route}");
    let entry = aegis_store::audit::Entry::denied(
        aegis_store::audit::EntryKind::Admin,
        action.clone(),
        "key_bound",
        message,
        aegis_store::audit::digest(&serde_json::json!({
            "method": method.as_str(),
            "route": route,
        })),
        std::time::Duration::ZERO,
    );
    if let Err(e) = aegis_store::audit::record(&state.pool, caller, entry).await {
        tracing::error!(action = %action, error = %e, "a bound key's refused route could not be audited");
    }
}

/// The routes a key bound to a security context may use: those whose work is a tool call
/// through the router (so the context decides it), the tool listing (filtered by the context)
/// and the static schemas. Everything else on `/v1/` acts outside the router (sandboxes,
/// approvals, keys, contexts, sessions, audit, listings of executions) and would let a
/// confined key do what its context does not grant.
const BOUND_KEY_ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/tools"),
    ("POST", "/v1/tools/call"),
    ("GET", "/v1/schemas/{*key}"),
    ("POST", "/v1/agents"),
    ("DELETE", "/v1/agents/{id}"),
    ("POST", "/v1/agents/{id}/execute"),
    ("GET", "/v1/agents/{id}/memories"),
    ("DELETE", "/v1/agents/{id}/memories"),
    ("DELETE", "/v1/agents/{id}/memories/{note_id}"),
    ("POST", "/v1/executions/{id}/cancel"),
    ("DELETE", "/v1/executions/{id}"),
    ("POST", "/v1/workflows"),
    ("DELETE", "/v1/workflows/{id}"),
    ("POST", "/v1/workflows/{id}/run"),
    ("GET", "/v1/workflows/executions"),
    ("GET", "/v1/workflows/executions/{id}"),
    ("DELETE", "/v1/workflows/executions/{id}"),
    ("POST", "/v1/workflows/executions/{id}/signal"),
    ("POST", "/v1/workflows/executions/{id}/cancel"),
    ("GET", "/v1/workflows/executions/{id}/events"),
];

/// True when a bound key may use `method route` (see [`BOUND_KEY_ROUTES`]).
fn bound_key_may_use(method: &Method, route: &str) -> bool {
    BOUND_KEY_ROUTES
        .iter()
        .any(|(m, r)| *r == route && method.as_str() == *m)
}

/// What a route needs from the caller's role.
#[derive(Debug, Clone, Copy)]
pub enum Need {
    /// Changes state: admin or operator.
    Write,
    /// Key management: admin only.
    Admin,
}

/// 403 unless the caller's role satisfies `need`.
pub fn require(caller: &Caller, need: Need) -> Result<(), ApiError> {
    let role = caller.role.unwrap_or(Role::Readonly);
    let ok = match need {
        Need::Write => role.may_write(),
        Need::Admin => role == Role::Admin,
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "the `{}` role may not do this (needs {})",
            role.as_str(),
            match need {
                Need::Write => "operator or admin",
                Need::Admin => "admin",
            }
        )))
    }
}
