//! `GET /metrics`: the Prometheus text exposition of [`crate::metrics`].
//!
//! Unauthenticated, like `/health/*`: scrapers do not carry API keys, and the series hold no
//! tenant data, ids or arguments (only tool names, doors, decisions, states and SEAL codes).
//! Operators who do not want it reachable set `metrics.enabled: false` or keep the HTTP port
//! private behind their proxy.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::state::AppState;

/// The content type of the Prometheus text format, version 0.0.4.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders the metrics.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
              (status = 404, description = "Metrics are disabled (`metrics.enabled: false`)", body = super::ErrorBody)))]
pub async fn render(State(state): State<AppState>) -> Response {
    if !state.config.metrics.enabled {
        return ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            "metrics are disabled on this node (metrics.enabled: false)",
        )
        .into_response();
    }
    match crate::metrics::render(&state.pool, state.sandboxes.dispatcher().ok()).await {
        Ok(text) => ([(header::CONTENT_TYPE, TEXT_FORMAT)], text).into_response(),
        Err(e) => ApiError::internal(e).into_response(),
    }
}
