//! `aegis.workflow.promote` and `aegis.workflow.demote`: moving a workflow between scopes.
//!
//! Both tools are the same registry operation (`registry::change_scope`) in one direction each:
//! promote widens (`tenant` -> `global`), demote narrows (`global` -> `tenant`). The schema accepts
//! either `target_scope`, as AEGIS does; the wrong direction is refused with the reason rather
//! than quietly doing the opposite of the tool's name. Who may call them is the router's tier
//! check (operator); AEGIS's `roles` and `user_id` arguments are accepted and ignored, so a caller
//! cannot raise its own rights by naming a role.

use serde::Deserialize;
use serde_json::{json, Value};

use super::check_tenant;
use super::definitions::registry_error;
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_store::registry::{self, Scope};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.workflow.promote", promote),
        ("aegis.workflow.demote", demote),
    ]
}

fn promote<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(change(ctx, a, Direction::Promote))
}

fn demote<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(change(ctx, a, Direction::Demote))
}

/// Which way a tool moves a workflow.
#[derive(Clone, Copy)]
enum Direction {
    Promote,
    Demote,
}

impl Direction {
    /// The only scope this direction can reach (also the argument's default).
    fn target(self) -> Scope {
        match self {
            Direction::Promote => Scope::Global,
            Direction::Demote => Scope::Tenant,
        }
    }
}

async fn change(ctx: &ToolContext<'_>, a: Value, direction: Direction) -> Result<Value, ToolError> {
    check_tenant(ctx, &a)?;
    #[derive(Deserialize)]
    struct A {
        name: String,
        target_scope: Option<Scope>,
    }
    let a: A = args(a)?;
    let target = a.target_scope.unwrap_or(direction.target());
    if target != direction.target() {
        let (tool, widen_or_narrow, other) = match direction {
            Direction::Promote => ("promote", "widens", "aegis.workflow.demote"),
            Direction::Demote => ("demote", "narrows", "aegis.workflow.promote"),
        };
        return Err(ToolError::new(
            "invalid_arguments",
            format!(
                "target_scope: {tool} {widen_or_narrow} a workflow's scope, so the target can only be \
                 `{}`; use {other} to move it to `{target}`",
                direction.target()
            ),
        ));
    }
    let changed = registry::change_scope(&ctx.state.pool, ctx.caller, &a.name, target)
        .await
        .map_err(registry_error)?;
    let flag = match direction {
        Direction::Promote => "promoted",
        Direction::Demote => "demoted",
    };
    tracing::info!(
        workflow = %changed.name,
        from = %changed.previous_scope,
        to = %changed.new_scope,
        caller = %ctx.caller.id,
        "workflow scope changed"
    );
    Ok(json!({
        flag: true,
        "workflow_id": changed.id,
        "name": changed.name,
        "previous_scope": changed.previous_scope,
        "new_scope": changed.new_scope,
        "target_scope": changed.new_scope,
    }))
}
