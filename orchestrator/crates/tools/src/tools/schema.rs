//! `aegis.schema.get` and `aegis.schema.validate`: the manifest schemas, served and applied.

use serde::Deserialize;
use serde_json::Value;

use super::definitions::{check, validation_report};
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_manifest::{self as manifest, ManifestKind};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.schema.get", get),
        ("aegis.schema.validate", validate),
    ]
}

/// Looks a schema up by key (`agent/manifest/v1`, `workflow/manifest/v1`).
pub fn lookup(key: &str) -> Result<&'static Value, ToolError> {
    manifest::schema(key).ok_or_else(|| {
        ToolError::new(
            "not_found",
            format!(
                "no schema `{key}`; known keys: {}",
                manifest::schema_keys().join(", ")
            ),
        )
    })
}

fn get<'a>(_: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            key: String,
        }
        let a: A = args(a)?;
        lookup(&a.key).cloned()
    })
}

fn validate<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            kind: String,
            manifest_yaml: String,
        }
        let a: A = args(a)?;
        let kind = match a.kind.as_str() {
            "agent" => ManifestKind::Agent,
            "workflow" => ManifestKind::Workflow,
            other => {
                return Err(ToolError::new(
                    "invalid_arguments",
                    format!("kind `{other}` is not `agent` or `workflow`"),
                ))
            }
        };
        let checked = check(ctx, kind, &a.manifest_yaml).await?;
        Ok(validation_report(&checked))
    })
}
