//! `aegis.system.info` and `aegis.system.config`: the node, as an operator sees it.
//!
//! The configuration is shown with every secret replaced, so handing an operator tool to a model
//! does not hand it the database password or the admin key.

use serde_json::{json, Value};

use super::{Handler, HandlerFuture, ToolContext, ToolError};
use aegis_sandboxes::health;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![("aegis.system.info", info), ("aegis.system.config", config)]
}

fn info<'a>(ctx: &'a ToolContext<'a>, _: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let report = health::check(&ctx.state.pool, &ctx.state.docker, &ctx.state.sandboxes).await;
        let capabilities: Vec<&str> = vec!["registry", "audit", "grpc"];
        Ok(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "status": if report.is_ready() { "healthy" } else { "unhealthy" },
            "capabilities": capabilities,
            "instance_id": ctx.state.instance_id,
            "started_at": ctx.state.started_at,
            "failing": report.failing,
        }))
    })
}

fn config<'a>(ctx: &'a ToolContext<'a>, _: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let redacted = aegis_config::redacted(&ctx.state.config);
        let content_yaml = serde_yaml::to_string(&redacted).map_err(ToolError::internal)?;
        Ok(json!({
            "config_path": ctx.state.config_path.as_ref().map(|p| p.display().to_string()),
            "content_yaml": content_yaml,
        }))
    })
}
