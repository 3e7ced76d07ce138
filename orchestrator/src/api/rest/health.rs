//! `GET /health/live` and `GET /health/ready`, unauthenticated by design (probes carry no keys).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::health;
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
}

/// The process is up and serving HTTP.
async fn live(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "live",
        "instance_id": state.instance_id,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// 200 when every dependency answers, else 503 with the failing components named.
async fn ready(State(state): State<AppState>) -> (StatusCode, Json<health::Readiness>) {
    let report = health::check(&state).await;
    let code = if report.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(report))
}
