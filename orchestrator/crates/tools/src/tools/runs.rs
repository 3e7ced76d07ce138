//! What the task tools (`aegis.task.*`) and the workflow tools (`aegis.workflow.*`) do alike on
//! a stored run (`aegis_engines::runs`): read a page of its event log with the total, and remove
//! it once it has ended. Each family loads and authorises the run its own way first.

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
