//! `Human`: wait for `aegis.workflow.signal`, with a timeout and an optional default answer.
//!
//! The first run of a visit records `human_input_requested` with the rendered prompt and parks
//! the execution (`waiting`, no lease held, woken at the timeout). A signal is stored on the row
//! only while the execution waits in a Human state, and wakes the workers; the state then
//! consumes it. At the timeout the state answers `default_response`, or, without one, the
//! execution fails naming the state. The answer is also written to the blackboard key `human`
//! (`{{human.feedback}}` in later templates).

use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};

use super::{StateCtx, Step};
use crate::workflow::store::NewEvent;

/// AEGIS's default wait when the state sets no `timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The blackboard key `human`: the latest answer as `{{human.feedback}}`, whichever Human state
/// gave it (AEGIS's documented variable), next to `STATE.response`.
fn human_key(ctx: &StateCtx<'_>, response: &str, timeout: bool) -> Vec<(String, Value)> {
    vec![(
        "human".to_owned(),
        json!({"feedback": response, "state": ctx.name, "timeout": timeout}),
    )]
}

pub(super) async fn human(ctx: &StateCtx<'_>) -> Step {
    if let Some(response) = &ctx.exec.signal {
        return Step::Output(
            json!({"status": "completed", "response": response, "timeout": false}),
            human_key(ctx, response, false),
        );
    }
    let timeout = ctx.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let deadline = ctx.exec.state_entered_at
        + chrono::Duration::from_std(timeout).unwrap_or(chrono::Duration::MAX);
    let default = ctx.body.get("default_response").and_then(Value::as_str);
    if Utc::now() >= deadline {
        ctx.event(
            "human_input_timed_out",
            json!({"timeout_secs": timeout.as_secs(), "default_response": default}),
        )
        .await;
        return match default {
            Some(d) => Step::Output(
                json!({"status": "completed", "response": d, "timeout": true}),
                human_key(ctx, d, true),
            ),
            None => Step::Fail(format!(
                "Human state `{}` timed out after {} s with no answer and no default_response",
                ctx.name,
                timeout.as_secs()
            )),
        };
    }
    let mut events = Vec::new();
    if ctx.exec.waiting_for.is_none() {
        let prompt = match ctx.render("prompt", ctx.body["prompt"].as_str().unwrap_or_default()) {
            Ok(p) => p,
            Err(e) => return Step::Fail(e),
        };
        events.push(NewEvent::state(
            "human_input_requested",
            ctx.name,
            json!({"prompt": prompt, "default_response": default, "timeout_secs": timeout.as_secs(),
                   "deadline": deadline, "visit": ctx.visit}),
        ));
    }
    Step::Wait {
        waiting_for: "human",
        wake_at: Some(deadline),
        events,
    }
}
