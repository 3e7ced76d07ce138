//! Bearer-key authentication for `/v1/` routes, and the role checks handlers ask for.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use crate::auth::{self, AuthError};
use crate::caller::{Caller, Role};
use crate::state::AppState;

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
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
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
