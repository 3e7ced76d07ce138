//! Adapters: they parse requests, call the core, and map errors once. No policy lives here.

pub mod cluster;
pub mod console;
/// The E2B door lives in its own crate (`orchestrator/crates/e2b-door`) and the HTTP
/// connection the doors share in `aegis-http`; re-exported under their old names.
pub use aegis_e2b_door as e2b;
pub use aegis_http as connection;
pub mod grpc;
pub mod mcp;
pub mod request_id;
pub mod rest;
pub mod streaming;

use axum::Router;

use crate::state::AppState;

/// The HTTP port's routes but MCP's (added at start with the instance's shutdown): REST, the
/// E2B door under [`e2b::PREFIX`] (and signed `/files` URLs at the root, where the SDK's `urljoin`
/// sends them), all answering unknown routes and bare errors as REST does;
/// and the console. Assembled here so that no door names another.
pub fn http_router(state: AppState) -> Router {
    let doors = rest::routes(&state)
        .nest(e2b::PREFIX, e2b::router())
        .merge(e2b::signed_files());
    rest::with_errors(doors)
        .merge(console::routes(state.clone()))
        .with_state(state)
}

/// `router` behind the sandbox ports' layer (`e2b::ports`): a request addressed to a sandbox
/// port (by `Host` or E2B's headers) is relayed there, any other goes on to `router`.
pub fn with_ports(router: Router, state: AppState) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        e2b::ports::Ports::new(state),
        e2b::ports::route,
    ))
}
