//! `GET /openapi.json`: the OpenAPI 3 document, generated from the handlers' annotations.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{
    api_keys, approvals, audit, definitions, error, executions, health, memories, metrics,
    previews, sandboxes, schemas, seal, tools, workflow_executions,
};

struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("Operator API key (`aok_...`)"))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Orchestrator operator API", description = "Agents, workflows, tools, audit and API keys."),
    paths(
        health::live, health::ready, metrics::render,
        definitions::create_agent, definitions::list_agents, definitions::get_agent,
        definitions::agent_versions, definitions::delete_agent,
        memories::list, memories::erase, memories::erase_one,
        definitions::create_workflow, definitions::list_workflows, definitions::get_workflow,
        definitions::workflow_versions, definitions::delete_workflow,
        schemas::get, tools::list, tools::call, audit::list, audit::head, audit::verify,
        api_keys::create, api_keys::list, api_keys::revoke,
        sandboxes::create, sandboxes::list, sandboxes::destroy,
        previews::create, previews::list, previews::revoke,
        seal::attest, seal::invoke, seal::tools, seal::list_sessions, seal::get_session,
        seal::revoke_session, seal::list_contexts, seal::get_context, seal::put_context,
        seal::delete_context, seal::issue_token, seal::list_tokens,
        approvals::list, approvals::get, approvals::approve, approvals::reject,
        executions::execute, executions::list, executions::get, executions::cancel,
        executions::remove, executions::events, executions::deliveries,
        workflow_executions::run, workflow_executions::list, workflow_executions::get,
        workflow_executions::signal, workflow_executions::cancel, workflow_executions::remove,
        workflow_executions::events,
    ),
    components(schemas(error::ErrorBody, health::Liveness, crate::health::Readiness)),
    modifiers(&BearerKey)
)]
struct ApiDoc;

/// The OpenAPI document.
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
