//! `GET /health/live` and `GET /health/ready`, unauthenticated by design (probes carry no keys).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use uuid::Uuid;

use crate::health;
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
}

/// The body of `/health/live`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Liveness {
    /// Always `live`.
    #[schema(example = "live")]
    pub status: String,
    /// This running instance (changes at every start).
    pub instance_id: Uuid,
    /// The orchestrator's version.
    pub version: String,
}

/// The process is up and serving HTTP.
#[utoipa::path(get, path = "/health/live", tag = "health",
    responses((status = 200, description = "The process serves HTTP", body = Liveness)))]
pub async fn live(State(state): State<AppState>) -> Json<Liveness> {
    Json(Liveness {
        status: "live".to_owned(),
        instance_id: state.instance_id,
        version: env!("CARGO_PKG_VERSION").to_owned(),
    })
}

/// 200 when every dependency answers, else 503 with the failing components named.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, description = "Every dependency answers", body = health::Readiness),
              (status = 503, description = "Not ready; `failing` names the components", body = health::Readiness)))]
pub async fn ready(State(state): State<AppState>) -> (StatusCode, Json<health::Readiness>) {
    let report = health::check(&state.pool, &state.docker, &state.sandboxes).await;
    let code = if report.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(report))
}
