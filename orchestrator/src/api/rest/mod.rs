//! The REST surface (axum): health today; the operator API and SEAL over HTTP join it here.

mod health;

use axum::Router;
use tower_http::trace::TraceLayer;

use crate::state::AppState;

/// Builds the whole HTTP router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::routes())
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
