//! The run pages: executions and workflow runs with filters, one run as its state graph with
//! the current state marked and its events as they arrive, cancel, and a Human state's answer.

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::{Method, StatusCode};
use axum::Extension;
use serde_json::{json, Value};

use super::{
    after_action, button, compact, details, filter_form, or_refused, pre, query, refused, rows_of,
    shown, table, truncate, Button, Page, Params, TERMINAL,
};
use crate::api::console::layout::{csrf_field, esc, page, secure_headers, seg};
use crate::api::console::rest::{Answer, Rest};
use crate::api::console::session::Session;
use crate::api::console::{form_fields, ConsoleError};

/// `GET /console/runs?workflow_id=&status=`: workflow runs and agent executions.
pub async fn runs(s: Session, Extension(rest): Extension<Rest>, Query(q): Params) -> Page {
    let mut body = String::from("<h1>Runs</h1>");
    body += &filter_form(
        "/console/runs",
        &q,
        &[("workflow_id", "Workflow"), ("status", "Status")],
    );
    let workflows = rest
        .get(
            &s.key,
            &format!(
                "/v1/workflows/executions?limit=50&{}",
                query(&q, &["workflow_id", "status"])
            ),
        )
        .await?;
    body += "<h2>Workflow runs</h2>";
    body += &or_refused(&workflows, |b| {
        table(
            "workflow-runs",
            &rows_of(b),
            &[
                ("Run", "execution_id"),
                ("Workflow", "workflow"),
                ("Version", "version"),
                ("Status", "status"),
                ("State", "current_state"),
                ("Started", "started_at"),
                ("Ended", "ended_at"),
            ],
            Some(("execution_id", "/console/runs/")),
        )
    });
    let agents = rest
        .get(
            &s.key,
            &format!("/v1/executions?limit=50&{}", query(&q, &["status"])),
        )
        .await?;
    body += "<h2>Agent executions</h2>";
    body += &or_refused(&agents, |b| {
        table(
            "executions",
            &rows_of(b),
            &[
                ("Execution", "id"),
                ("Agent", "agent_name"),
                ("Status", "status"),
                ("Started", "started_at"),
                ("Ended", "ended_at"),
            ],
            Some(("id", "/console/executions/")),
        )
    });
    shown(&s, "Runs", "/console/runs", &body)
}

/// `GET /console/runs/{id}`: one workflow run as its state graph (the current state marked),
/// its events, followed live by `console.js` while it runs, and its buttons.
pub async fn run(s: Session, Extension(rest): Extension<Rest>, Path(id): Path<String>) -> Page {
    let answer = rest
        .get(&s.key, &format!("/v1/workflows/executions/{}", seg(&id)))
        .await?;
    let mut body = format!("<h1>Run <code>{}</code></h1>", esc(&id));
    if !answer.ok() {
        body += &refused(&answer);
        return Ok(page(answer.status, "Run", Some(&s), "/console/runs", &body));
    }
    let e = &answer.body;
    let status = e["status"].as_str().unwrap_or("unknown");
    let current = e["current_state"].as_str().unwrap_or("");
    body += &format!(
        "<p>Workflow <strong>{}</strong> {} · status <span id=\"run-status\" class=\"status\">{}</span> \
         · state <span id=\"run-state\">{}</span></p>",
        esc(e["workflow"].as_str().unwrap_or("")),
        esc(e["version"].as_str().unwrap_or("")),
        esc(status),
        esc(current)
    );
    // The graph, from the exact definition the run recorded (its version and revision).
    let definition = rest
        .get(
            &s.key,
            &format!(
                "/v1/workflows/{}?version={}&revision={}",
                seg(e["workflow"].as_str().unwrap_or("")),
                seg(e["version"].as_str().unwrap_or("")),
                e["revision"].as_i64().unwrap_or(1)
            ),
        )
        .await?;
    body += "<h2>States</h2>";
    body += &graph(&definition, e, current);
    let terminal = TERMINAL.contains(&status);
    if s.caller.role.is_some_and(|r| r.may_write()) && !terminal {
        body += "<div class=\"actions\">";
        if status == "waiting" {
            body += &format!(
                "<form method=\"post\" action=\"/console/runs/{}/signal\">{}\
                 <label for=\"response\">Answer the Human state</label>\
                 <input id=\"response\" name=\"response\" required>\
                 <button type=\"submit\" id=\"signal\">Send answer</button></form>",
                seg(&id),
                csrf_field(&s)
            );
        }
        body += &button(
            &s,
            &format!("/console/runs/{}/cancel", seg(&id)),
            "cancel",
            "Cancel run",
        );
        body += "</div>";
    }
    let events = rest
        .get(
            &s.key,
            &format!("/v1/workflows/executions/{}/events?limit=1000", seg(&id)),
        )
        .await?;
    body += "<h2>Events</h2>";
    let after = events.body["next_after"].as_i64().unwrap_or(0);
    if !terminal {
        body += &format!(
            "<p id=\"live\" data-events=\"/console/runs/{}/events?after={after}\" role=\"status\">Following live…</p>",
            seg(&id)
        );
    }
    body += &event_list(&events);
    body += "<h2>Outputs</h2>";
    body += &pre(&e["state_outputs"]);
    if !e["final_output"].is_null() {
        body += "<h2>Final output</h2>";
        body += &pre(&e["final_output"]);
    }
    shown(&s, "Run", "/console/runs", &body)
}

/// `GET /console/runs/{id}/events?after=`: the run's live event stream, REST's own SSE
/// (`?follow=true`) passed through as it comes.
pub async fn run_events(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    Query(q): Params,
) -> Page {
    let after = q
        .get("after")
        .and_then(|a| a.parse::<i64>().ok())
        .unwrap_or(0);
    let mut response = rest
        .send(
            &s.key,
            Method::GET,
            &format!(
                "/v1/workflows/executions/{}/events?follow=true&after={after}",
                seg(&id)
            ),
            None,
        )
        .await?;
    if response.status() == StatusCode::UNAUTHORIZED {
        return Err(ConsoleError::SignIn);
    }
    secure_headers(response.headers_mut());
    Ok(response)
}

/// `POST /console/runs/{id}/cancel`.
pub async fn cancel_run(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    body: Bytes,
) -> Page {
    let path = format!("/v1/workflows/executions/{}/cancel", seg(&id));
    let back = format!("/console/runs/{}", seg(&id));
    let to = Button::new(Method::POST, &path, &back, "Cancel run");
    to.press(&s, &rest, &body).await
}

/// `POST /console/runs/{id}/signal` (`response=`): answers the Human state the run waits in.
pub async fn signal_run(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    body: Bytes,
) -> Page {
    let fields = form_fields(&body);
    s.check_csrf(&fields)?;
    let response = fields.get("response").cloned().unwrap_or_default();
    let answer = rest
        .json(
            &s.key,
            Method::POST,
            &format!("/v1/workflows/executions/{}/signal", seg(&id)),
            Some(&json!({"response": response})),
        )
        .await?;
    Ok(after_action(
        &s,
        &answer,
        &format!("/console/runs/{}", seg(&id)),
        "Answer",
    ))
}

/// `GET /console/executions/{id}`: one agent execution and its events.
pub async fn execution(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
) -> Page {
    let answer = rest
        .get(&s.key, &format!("/v1/executions/{}", seg(&id)))
        .await?;
    let mut body = format!("<h1>Execution <code>{}</code></h1>", esc(&id));
    if !answer.ok() {
        body += &refused(&answer);
        return Ok(page(
            answer.status,
            "Execution",
            Some(&s),
            "/console/runs",
            &body,
        ));
    }
    let status = answer.body["status"].as_str().unwrap_or("unknown");
    body += &format!(
        "<p>Status <span id=\"run-status\" class=\"status\">{}</span></p>",
        esc(status)
    );
    if s.caller.role.is_some_and(|r| r.may_write()) && !TERMINAL.contains(&status) {
        body += &button(
            &s,
            &format!("/console/executions/{}/cancel", seg(&id)),
            "cancel",
            "Cancel execution",
        );
    }
    body += &details(
        &answer.body,
        &[
            "agent_name",
            "agent_version",
            "input",
            "output",
            "error",
            "iterations",
            "started_at",
            "ended_at",
        ],
    );
    let events = rest
        .get(
            &s.key,
            &format!("/v1/executions/{}/events?limit=1000", seg(&id)),
        )
        .await?;
    body += "<h2>Events</h2>";
    body += &event_list(&events);
    shown(&s, "Execution", "/console/runs", &body)
}

/// `POST /console/executions/{id}/cancel`.
pub async fn cancel_execution(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    body: Bytes,
) -> Page {
    let path = format!("/v1/executions/{}/cancel", seg(&id));
    let back = format!("/console/executions/{}", seg(&id));
    let to = Button::new(Method::POST, &path, &back, "Cancel execution");
    to.press(&s, &rest, &body).await
}

/// The states of a run's definition in the order they are reached from the initial state,
/// each with its kind and transitions; the current one marked, visited ones shaded.
pub(super) fn graph(definition: &Answer, e: &Value, current: &str) -> String {
    let spec = &definition.body["manifest"]["spec"];
    let visits = e["visits"].as_object();
    let Some(states) = spec["states"].as_object() else {
        // No definition to read (a bound key may not read it): the states the run visited.
        let names: Vec<String> = visits
            .map(|v| v.keys().cloned().collect())
            .unwrap_or_default();
        let mut out = String::new();
        if !definition.ok() {
            out += &refused(definition);
        }
        out += "<ol class=\"graph\">";
        for name in names {
            out += &state_box(&name, "", &[], name == current, true);
        }
        return out + "</ol>";
    };
    let mut order: Vec<String> = Vec::new();
    let mut queue: std::collections::VecDeque<String> = spec["initial_state"]
        .as_str()
        .map(str::to_owned)
        .into_iter()
        .collect();
    while let Some(name) = queue.pop_front() {
        if order.contains(&name) || !states.contains_key(&name) {
            continue;
        }
        for t in states[&name]["transitions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(target) = t["target"].as_str() {
                queue.push_back(target.to_owned());
            }
        }
        order.push(name);
    }
    order.extend(
        states
            .keys()
            .filter(|k| !order.contains(k))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut out = String::from("<ol class=\"graph\" aria-label=\"State graph\">");
    for name in order {
        let state = &states[&name];
        let transitions: Vec<String> = state["transitions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{} → {}",
                    t["condition"].as_str().unwrap_or("?"),
                    t["target"].as_str().unwrap_or("?")
                )
            })
            .collect();
        let visited = visits.is_some_and(|v| v.contains_key(&name));
        out += &state_box(
            &name,
            state["kind"].as_str().unwrap_or(""),
            &transitions,
            name == current,
            visited,
        );
    }
    out + "</ol>"
}

pub(super) fn state_box(
    name: &str,
    kind: &str,
    transitions: &[String],
    current: bool,
    visited: bool,
) -> String {
    let mut class = String::from("state");
    if current {
        class += " current";
    }
    if visited {
        class += " visited";
    }
    let aria = if current {
        " aria-current=\"step\""
    } else {
        ""
    };
    let list: String = transitions
        .iter()
        .map(|t| format!("<li>{}</li>", esc(t)))
        .collect();
    format!(
        "<li class=\"{class}\" data-state=\"{}\"{aria}><span class=\"name\">{}</span> <span class=\"kind\">{}</span><ul>{list}</ul></li>",
        esc(name),
        esc(name),
        esc(kind)
    )
}

pub(super) fn event_list(events: &Answer) -> String {
    if !events.ok() {
        return refused(events);
    }
    let mut out = String::from("<ol id=\"events\" class=\"events\">");
    for ev in events.body["events"].as_array().into_iter().flatten() {
        out += &format!(
            "<li data-seq=\"{}\"><span class=\"type\">{}</span> <span class=\"state\">{}</span> <code>{}</code></li>",
            ev["seq"].as_i64().unwrap_or(0),
            esc(ev["event_type"].as_str().unwrap_or("")),
            esc(ev["state_name"].as_str().unwrap_or("")),
            esc(&truncate(&compact(&ev["payload"]), 300))
        );
    }
    out + "</ol>"
}

// ---------------------------------------------------------------- approvals
