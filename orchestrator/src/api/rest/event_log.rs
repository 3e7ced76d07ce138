//! An execution's event log over REST, for agent and workflow executions alike: one JSON page,
//! or live Server-Sent Events (`?follow=true`) until the execution has ended and every event was
//! sent. Both engines keep an append-only, sequence-numbered log read the same way
//! (`aegis_engines::runs`); a route names its kind and its page type, and this module answers.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::ApiError;
use crate::runs::{self, Kind, RunEvent};
use crate::state::AppState;

/// How often a followed log is read again while nothing new arrived.
const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// Events per SSE message.
const FOLLOW_BATCH: i64 = 100;

/// `GET .../{id}/events` parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct EventsQuery {
    /// Events with a sequence number greater than this.
    pub after: Option<i64>,
    /// Page size (default 100).
    pub limit: Option<i64>,
    /// Stream live as Server-Sent Events until the execution ends.
    #[serde(default)]
    pub follow: bool,
}

/// One read of a followed log. `ended` must be read before `events`, so that no event written
/// just before the end is missed.
pub struct Poll<E> {
    /// The execution had ended when the log was read.
    pub ended: bool,
    /// Events after the last one sent, at most `FOLLOW_BATCH`.
    pub events: Vec<E>,
}

/// What `GET .../{id}/events` answers with 200, for both engines' routes (their OpenAPI text).
pub const EVENTS_ANSWERED: &str = "A page of events; with `follow=true`, Server-Sent Events `events` (a JSON array of events, id = the last one's sequence number) until the execution has ended, then `end`";

/// A page of one engine's event log: what [`answer`] sends as JSON.
pub trait EventPage: Serialize {
    /// The events the page holds.
    type Event: RunEvent;
    /// The page of `events` of `execution_id`; `next_after` is where the next one starts.
    fn new(execution_id: Uuid, events: Vec<Self::Event>, next_after: Option<i64>) -> Self;
}

/// A page of an agent execution's log (`GET /v1/executions/{id}/events`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AgentEventPage {
    /// The execution.
    pub execution_id: Uuid,
    /// Events after `after`, oldest first.
    #[schema(inline)]
    pub events: Vec<crate::engine::store::Event>,
    /// Pass as `after` for the next page; null when the page is empty.
    pub next_after: Option<i64>,
}

/// A page of a workflow execution's log (`GET /v1/workflows/executions/{id}/events`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkflowEventPage {
    /// The execution.
    pub execution_id: Uuid,
    /// Events after `after`, oldest first.
    #[schema(inline)]
    pub events: Vec<crate::workflow::store::Event>,
    /// Pass as `after` for the next page; null when the page is empty.
    pub next_after: Option<i64>,
}

impl EventPage for AgentEventPage {
    type Event = crate::engine::store::Event;
    fn new(execution_id: Uuid, events: Vec<Self::Event>, next_after: Option<i64>) -> Self {
        AgentEventPage {
            execution_id,
            events,
            next_after,
        }
    }
}

impl EventPage for WorkflowEventPage {
    type Event = crate::workflow::store::Event;
    fn new(execution_id: Uuid, events: Vec<Self::Event>, next_after: Option<i64>) -> Self {
        WorkflowEventPage {
            execution_id,
            events,
            next_after,
        }
    }
}

/// Where the next page starts: the last event's sequence number.
pub fn next_after<E: RunEvent>(events: &[E]) -> Option<i64> {
    events.last().map(RunEvent::seq)
}

/// The answer to `GET .../{id}/events` for run `id` of `tenant` (already authorised by the
/// route): a JSON page `P`, or with `follow`, live events until the run has ended.
pub async fn answer<P: EventPage>(
    state: AppState,
    tenant: String,
    kind: Kind,
    id: Uuid,
    q: &EventsQuery,
) -> Result<Response, ApiError> {
    let pool = state.pool;
    let after = q.after.unwrap_or(0);
    if !q.follow {
        let events: Vec<P::Event> = kind
            .events(&pool, id, after, q.limit.unwrap_or(100))
            .await?;
        let next = next_after(&events);
        return Ok(Json(P::new(id, events, next)).into_response());
    }
    Ok(follow(after, move |after, limit| {
        let (pool, tenant) = (pool.clone(), tenant.clone());
        async move {
            let status = kind.status(&pool, &tenant, id).await;
            let ended = matches!(status, Ok(Some(s)) if runs::is_terminal(&s));
            let events: Vec<P::Event> = kind
                .events(&pool, id, after, limit)
                .await
                .unwrap_or_default();
            Poll { ended, events }
        }
    }))
}

/// Live Server-Sent Events: `events` messages (JSON arrays, id = last sequence number) until the
/// execution has ended, then one `end` message. `read(after, limit)` reads the log.
fn follow<E, F, Fut>(after: i64, read: F) -> Response
where
    E: RunEvent,
    F: Fn(i64, i64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Poll<E>> + Send + 'static,
{
    Sse::new(stream_of(after, Arc::new(read)))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn stream_of<E, F, Fut>(
    after: i64,
    read: Arc<F>,
) -> impl Stream<Item = Result<SseEvent, Infallible>>
where
    E: RunEvent,
    F: Fn(i64, i64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Poll<E>> + Send + 'static,
{
    stream::unfold((after, false), move |(after, finished)| {
        let read = read.clone();
        async move {
            if finished {
                return None;
            }
            loop {
                let Poll { ended, events } = read(after, FOLLOW_BATCH).await;
                if let Some(last) = events.last().map(RunEvent::seq) {
                    let data = serde_json::to_string(&events).unwrap_or_default();
                    let event = SseEvent::default()
                        .event("events")
                        .id(last.to_string())
                        .data(data);
                    return Some((Ok(event), (last, false)));
                }
                if ended {
                    let event = SseEvent::default().event("end").data("{}");
                    return Some((Ok(event), (after, true)));
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        }
    })
}
