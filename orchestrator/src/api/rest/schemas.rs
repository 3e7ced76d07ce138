//! `GET /v1/schemas/{key}`: the manifest schemas (`agent/manifest/v1`, `workflow/manifest/v1`).

use axum::extract::Path;
use axum::Json;
use serde_json::Value;

use super::error::{ApiError, ErrorBody};

/// A manifest JSON Schema by key.
#[utoipa::path(get, path = "/v1/schemas/{key}", operation_id = "get_schema", tag = "schemas", params(("key" = String, Path, description = "e.g. agent/manifest/v1")),
    responses((status = 200, description = "JSON Schema", body = Value), (status = 404, description = "Unknown key", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get(Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(crate::tools::schema_by_key(&key)?.clone()))
}
