//! `PUT /sandboxes/{id}/network` (the SDK's `update_network`): a sandbox's egress rules
//! replaced while it runs, as E2B's update does (omitted fields are cleared). The rules are its
//! row's, which its egress proxy reads for every connection, so the change holds from the next
//! connection on whichever replica runs the proxy, and survives a pause, resume or fork. They
//! stay bounded by what the operator grants the key (`e2b.egress`); a sandbox made without a
//! network cannot be given one (refused with 409, saying why).

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use aegis_e2b::api::{parse_body, ApiError};
use aegis_sandboxes::e2b_egress::NetworkRules;
use aegis_tools::state::AppState;

use super::{db, grant_of, known, WriteKey, MAX_BODY};
use crate::store;
use crate::Refusal;

/// E2B's `SandboxNetworkUpdateConfig`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkUpdate {
    #[serde(rename = "allowOut", default)]
    allow_out: Option<Vec<String>>,
    #[serde(rename = "denyOut", default)]
    deny_out: Option<Vec<String>>,
    #[serde(rename = "egressProxy", default)]
    egress_proxy: Option<serde_json::Value>,
    #[serde(default)]
    rules: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    allow_internet_access: Option<bool>,
}

/// 204 when the rules were replaced (or when a sandbox without network is asked for none, which
/// it has); 400 for an entry that is not a host, address or CIDR block, or for E2B's SOCKS
/// proxy and header rules (not offered); 409 for egress asked of a sandbox without network;
/// 404 when the key has no such sandbox. Each change is an admin audit row
/// (`e2b.sandbox.network`) and a line of the sandbox's log.
pub async fn update(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Refusal> {
    let update: NetworkUpdate = parse_body(&body, MAX_BODY).map_err(Refusal)?;
    let row = known(&state, &caller, &id).await?;
    if update.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(Refusal(ApiError::bad_request(
            "network.egressProxy: a SOCKS proxy of your own is not offered; egress leaves through the node's audited proxy",
        )));
    }
    if update.rules.as_ref().is_some_and(|r| !r.is_empty()) {
        return Err(Refusal(ApiError::bad_request(
            "network.rules: header transforms of egress requests are not offered (the node's proxy does not rewrite requests)",
        )));
    }
    let rules = NetworkRules::new(
        update.allow_out,
        update.deny_out,
        update.allow_internet_access,
    )
    .map_err(|e| Refusal(ApiError::bad_request(e.to_string())))?;
    let grant = grant_of(&state, &caller);
    if row.egress.is_none() || grant.is_nothing() {
        if !rules.admits_anything() {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let why = if grant.is_nothing() {
            "this node's operator grants this API key no egress (e2b.egress), so its sandboxes have no network"
        } else {
            "the sandbox was made without a network (its create allowed no egress), and a running sandbox cannot be given one; create a sandbox with allow_internet_access or network.allowOut"
        };
        return Err(Refusal(ApiError::new(409, why)));
    }
    let value =
        serde_json::to_value(&rules).map_err(|e| Refusal(ApiError::new(500, e.to_string())))?;
    let started = Instant::now();
    let changed = store::set_egress(&state.pool, row.sandbox_id, &caller.id, &value)
        .await
        .map_err(db)?;
    aegis_store::audit::record_admin_of(
        &state.pool,
        &caller,
        "e2b.sandbox.network",
        &json!({"sandboxID": row.sandbox_id, "allowOut": rules.allow_out.len(),
                "denyOut": rules.deny_out.len()}),
        changed,
        started,
        Some(row.current),
    )
    .await
    .map_err(db)?;
    if !changed {
        return Err(super::not_found(&id));
    }
    store::log(
        &state.pool,
        row.sandbox_id,
        "info",
        "network rules replaced",
        json!({"allowOut": rules.allow_out.join(","), "denyOut": rules.deny_out.join(",")}),
    )
    .await;
    Ok(StatusCode::NO_CONTENT.into_response())
}
