//! What the task tools (`aegis.task.*`) and the workflow tools (`aegis.workflow.*`) do alike on
//! a stored run (`aegis_engines::runs`): read a page of its event log with the total, remove it
//! once it has ended, take a wait's arguments, refuse an input that does not match the input
//! schema. Each family loads and authorises the run its own way first.

use serde::Deserialize;
use uuid::Uuid;

use super::{ToolContext, ToolError};
use aegis_engines::runs::{self, Kind, RunEvent};

/// A page of run `id`'s events from `offset`, at most `limit`, with how many it has in all.
pub(super) async fn events_page<E>(
    ctx: &ToolContext<'_>,
    kind: Kind,
    id: Uuid,
    offset: i64,
    limit: i64,
) -> Result<(Vec<E>, i64), ToolError>
where
    E: RunEvent,
{
    let pool = &ctx.state.pool;
    let events = kind
        .events(pool, id, offset, limit)
        .await
        .map_err(ToolError::internal)?;
    let total = kind
        .event_count(pool, id)
        .await
        .map_err(ToolError::internal)?;
    Ok((events, total))
}

/// Removes run `id` (now in `status`) with its events; a live run is a `conflict` that says
/// how to end it first.
pub(super) async fn remove_ended(
    ctx: &ToolContext<'_>,
    kind: Kind,
    id: Uuid,
    status: &str,
) -> Result<(), ToolError> {
    if !runs::is_terminal(status) {
        return Err(ToolError::new(
            "conflict",
            format!(
                "{} {id} is {status}; only ended executions can be removed (cancel it first)",
                kind.noun
            ),
        ));
    }
    kind.remove(&ctx.state.pool, &ctx.caller.tenant, id)
        .await
        .map_err(ToolError::internal)?;
    Ok(())
}

/// The refusal of an input that does not match the input schema of `of` ("agent",
/// "workflow"), each mismatch also in the details.
pub(super) fn invalid_input(of: &str, errors: Vec<String>) -> ToolError {
    ToolError::new(
        "invalid_input",
        format!(
            "the input does not match the {of}'s input_schema: {}",
            errors.join("; ")
        ),
    )
    .with_details(serde_json::json!(errors))
}

/// The arguments of the tools that name one run and nothing else (`status`, `get`, `cancel`,
/// `remove`).
#[derive(Deserialize)]
pub(super) struct RunId {
    /// The execution.
    pub execution_id: String,
}

/// The arguments of `aegis.task.wait` and `aegis.workflow.wait`.
#[derive(Deserialize)]
pub(super) struct WaitArgs {
    /// The execution waited for.
    pub execution_id: String,
    /// Accepted (and type-checked) but only an upper bound on how late the answer may come:
    /// the waits poll finer than any value it may have.
    #[allow(dead_code)]
    poll_interval_seconds: Option<u64>,
    /// How long to wait: 300 s unless told, from 1 s to an hour.
    timeout_seconds: Option<u64>,
}

impl WaitArgs {
    /// When the wait gives up.
    pub fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
            + std::time::Duration::from_secs(self.timeout_seconds.unwrap_or(300).clamp(1, 3600))
    }
}
