//! The rest of E2B's API (issue 42): what its OpenAPI spec (`spec/openapi.yml`, and envd's
//! `spec/envd/envd.yaml`) and its latest SDK's client name beyond the routes [`super::router`]
//! serves elsewhere. The simple ones are served here: `GET /templates/aliases/{alias}` (the
//! SDK's `Template.exists`: a runtime, or a name of one of the key's snapshots).
//! The others are refused by [`refuse`] with 501 in E2B's error shape, naming what is not
//! offered and why, rather than a bare 404 the SDK would read as "not found"; and anything
//! else under `/e2b` gets a 404 in the same shape ([`no_route`]).

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, MethodRouter};
use axum::Router;

use aegis_e2b::api::ApiError;

use super::control::{db, to_json, Key};
use super::{Refusal, PREFIX};
use aegis_tools::state::AppState;

type Answer = Result<Response, Refusal>;

/// Why a family of E2B's routes is not offered here; the message a refusal carries.
#[derive(Clone, Copy)]
pub enum Unoffered {
    /// Template builds, listings, tags (E2B's build service).
    Templates,
    /// Teams and their metrics (E2B's accounts).
    Teams,
    /// API keys and access tokens (E2B's accounts).
    Keys,
    /// Volumes.
    Volumes,
    /// Secrets.
    Secrets,
    /// E2B's cluster administration (nodes, admin).
    Admin,
    /// envd's routes for E2B's own orchestrator (init, freeze, thaw, collapse).
    EnvdInternal,
    /// envd's `/metrics` (the SDK reads metrics through the control API).
    EnvdMetrics,
    /// envd's `POST /files/compose`.
    Compose,
}

impl Unoffered {
    fn why(self) -> &'static str {
        match self {
            Unoffered::Templates => {
                "templates are the node's runtimes (`base`, or a language such as `python:3.11`, built by runtime-images/build.sh); there is no template build service, listing or tags"
            }
            Unoffered::Teams => {
                "a key here belongs to no E2B team; the node's own metrics are at /metrics"
            }
            Unoffered::Keys => "keys are the node's: an operator makes them with POST /v1/api-keys",
            Unoffered::Volumes => "E2B sandboxes here have one workspace, /home/user, and no volumes",
            Unoffered::Secrets => "secrets are not stored through the E2B door",
            Unoffered::Admin => "this is E2B's cluster administration; the node has its own (/v1)",
            Unoffered::EnvdInternal => {
                "this envd route is for E2B's own orchestrator; the node starts and stops sandboxes itself"
            }
            Unoffered::EnvdMetrics => {
                "a sandbox's metrics are at GET /sandboxes/{id}/metrics (the SDK's get_metrics)"
            }
            Unoffered::Compose => {
                "files are written whole or in chunks by POST /files; there is no compose"
            }
        }
    }
}

/// The answer to a route of E2B's API not offered here: 501, `{"code", "message"}`.
pub fn refusal(method: &Method, path: &str, what: Unoffered) -> ApiError {
    ApiError::new(
        501,
        format!(
            "{method} {path} is not offered by this node's E2B door: {} (see README, E2B clients)",
            what.why()
        ),
    )
}

/// A handler refusing every method it is routed for with [`refusal`].
fn refuse(what: Unoffered) -> MethodRouter<AppState> {
    axum::routing::any(move |method: Method, uri: Uri| async move {
        Refusal(refusal(&method, unprefixed(&uri), what))
    })
}

fn unprefixed(uri: &Uri) -> &str {
    let path = uri.path();
    path.strip_prefix(PREFIX).unwrap_or(path)
}

/// Anything else under `/e2b`: 404 in E2B's error shape (the node's REST fallback would answer
/// in its own).
pub async fn no_route(method: Method, uri: Uri) -> Refusal {
    Refusal(ApiError::new(
        404,
        format!(
            "there is no route {method} {} on this node's E2B door",
            unprefixed(&uri)
        ),
    ))
}

/// A served path asked with another method: 405 in E2B's error shape.
pub async fn wrong_method(method: Method, uri: Uri) -> Refusal {
    Refusal(ApiError::new(
        405,
        format!(
            "{} is served by this node's E2B door, but not with {method}",
            unprefixed(&uri)
        ),
    ))
}

/// The routes of E2B's API refused here, to be merged into the door's router. Paths that share
/// a route with something served (`/sandboxes/{id}/...`, `DELETE /templates/{id}`, which
/// deletes snapshots) are added beside it in [`super::router`].
pub fn refused() -> Router<AppState> {
    use Unoffered::*;
    Router::new()
        .route("/teams", refuse(Teams))
        .route("/teams/{team}/metrics", refuse(Teams))
        .route("/teams/{team}/metrics/max", refuse(Teams))
        .route("/v3/templates", refuse(Templates))
        .route("/v2/templates", refuse(Templates))
        .route("/v2/templates/{id}", refuse(Templates))
        .route("/v2/templates/{id}/builds/{build}", refuse(Templates))
        .route("/templates", refuse(Templates))
        .route("/default-templates", refuse(Templates))
        .route("/templates/tags", refuse(Templates))
        .route("/templates/{id}/tags", refuse(Templates))
        .route("/templates/{id}/tags/{*rest}", refuse(Templates))
        .route("/templates/{id}/files/{hash}", refuse(Templates))
        .route("/templates/{id}/builds/{build}", refuse(Templates))
        .route("/templates/{id}/builds/{build}/status", refuse(Templates))
        .route("/templates/{id}/builds/{build}/logs", refuse(Templates))
        .route("/nodes", refuse(Admin))
        .route("/nodes/{node}", refuse(Admin))
        .route("/admin/{*rest}", refuse(Admin))
        .route("/access-tokens", refuse(Keys))
        .route("/access-tokens/{id}", refuse(Keys))
        .route("/api-keys", refuse(Keys))
        .route("/api-keys/{id}", refuse(Keys))
        .route("/volumes", refuse(Volumes))
        .route("/volumes/{id}", refuse(Volumes))
        .route("/secrets", refuse(Secrets))
        .route("/secrets/{id}", refuse(Secrets))
        .route("/init", refuse(EnvdInternal))
        .route("/freeze", refuse(EnvdInternal))
        .route("/unfreeze", refuse(EnvdInternal))
        .route("/collapse", refuse(EnvdInternal))
        .route("/fsfreeze", refuse(EnvdInternal))
        .route("/fsthaw", refuse(EnvdInternal))
        .route("/metrics", refuse(EnvdMetrics))
        .route("/files/compose", refuse(Compose))
        .route("/templates/aliases/{alias}", get(template_alias))
}

/// `GET /templates/{id}`, `POST /templates/{id}` and `PATCH /templates/{id}` beside the served
/// `DELETE` (a snapshot's deletion).
pub fn template_by_id(served_delete: MethodRouter<AppState>) -> MethodRouter<AppState> {
    let what = Unoffered::Templates;
    let one = move |method: Method, uri: Uri| async move {
        Refusal(refusal(&method, unprefixed(&uri), what))
    };
    served_delete.get(one).post(one).patch(one)
}

/// The answer of `GET /templates/aliases/{alias}` (E2B's `TemplateAliasResponse`).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct TemplateAlias {
    #[serde(rename = "templateID")]
    template_id: String,
    public: bool,
}

/// `GET /templates/aliases/{alias}`: 200 for a runtime of the node (public: every key may
/// start it) or a name of one of the key's snapshots (its id, not public); 404 otherwise, which
/// the SDK's `Template.exists` reads as false.
pub async fn template_alias(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(alias): Path<String>,
) -> Answer {
    if aegis_sandboxes::find_runtime(&alias).is_ok() {
        return Ok(to_json(
            StatusCode::OK,
            &TemplateAlias {
                template_id: alias,
                public: true,
            },
        ));
    }
    match super::snapshots::find(&state.pool, &caller.id, &alias)
        .await
        .map_err(db)?
    {
        Some(snapshot) if snapshot.name.as_deref() == Some(alias.as_str()) => Ok(to_json(
            StatusCode::OK,
            &TemplateAlias {
                template_id: snapshot.id.to_string(),
                public: false,
            },
        )),
        _ => Err(Refusal(ApiError::new(
            404,
            format!("template \"{alias}\" not found: templates are the node's runtimes and the key's snapshots"),
        ))),
    }
}
