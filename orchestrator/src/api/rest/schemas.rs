//! `GET /v1/schemas/{key}`: the manifest schemas (`agent/manifest/v1`, `workflow/manifest/v1`).

use axum::extract::Path;
use axum::Json;
use serde_json::Value;

use super::error::{ApiError, ErrorBody};

/// What a manifest schema (`schemas/*/manifest/v1.json`, JSON Schema 2020-12) holds at its top;
/// the file is served as written, so this describes it for the OpenAPI document.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the file is served as written
pub struct ManifestSchema {
    /// The JSON Schema dialect.
    #[schema(rename = "$schema")]
    dialect: String,
    /// `urn:aegis-orchestrator:schema:<key>`.
    #[schema(rename = "$id")]
    id: String,
    /// Its title.
    title: String,
    /// What the manifest declares.
    description: String,
    /// `object`.
    #[schema(rename = "type")]
    kind: String,
    /// The manifest's top-level keys.
    #[schema(value_type = std::collections::HashMap<String, Object>)]
    properties: Value,
    /// Keys a manifest must have.
    required: Vec<String>,
    /// `false`: no other key.
    #[schema(rename = "additionalProperties")]
    additional_properties: bool,
    /// Shared definitions.
    #[schema(rename = "$defs", value_type = std::collections::HashMap<String, Object>)]
    defs: Value,
}

/// A manifest JSON Schema by key.
#[utoipa::path(get, path = "/v1/schemas/{key}", operation_id = "get_schema", tag = "schemas", params(("key" = String, Path, description = "e.g. agent/manifest/v1")),
    responses((status = 200, description = "JSON Schema", body = ManifestSchema), (status = 404, description = "Unknown key", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get(Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(crate::tools::schema_by_key(&key)?.clone()))
}
