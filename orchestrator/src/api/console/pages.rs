//! The console's pages and forms. Each handler asks REST (as the signed-in key, through
//! [`Rest`]) and renders its JSON answer; a refusal is shown as REST gave it (status, code,
//! message). Buttons appear only for roles REST would let act, and REST decides again anyway.
//! Every `POST` here checks the session's form token before anything is sent.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use serde_json::{json, Value};

use base64::Engine as _;

use super::layout::{csrf_field, esc, page, secure_headers, seg};
use super::rest::{Answer, Rest};
use super::session::Session;
use super::{form_fields, ConsoleError};

type Page = Result<Response, ConsoleError>;
type Params = Query<HashMap<String, String>>;

/// Statuses after which a run changes no more.
const TERMINAL: &[&str] = &["completed", "failed", "cancelled", "timed_out"];

/// `GET /console`: the sandboxes page for a signed-in browser, else the sign-in form.
pub async fn home(_session: Session) -> Response {
    Redirect::to("/console/sandboxes").into_response()
}

// ---------------------------------------------------------------- sandboxes

/// The most bytes of one file the console downloads (`fs.read`'s `max_bytes`); a larger file
/// is refused with its size rather than cut short without a word.
const DOWNLOAD_MAX: u64 = 8 * 1024 * 1024;

/// How long one request for a process's output waits for the first new bytes (`proc.output`'s
/// `wait_ms`): a long poll, so a quiet process costs one audited call per this interval.
const OUTPUT_WAIT_MS: u64 = 10_000;

/// `GET /console/sandboxes`: the sandboxes this key may list (`GET /v1/sandboxes`).
pub async fn sandboxes(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let answer = rest.get(&s.key, "/v1/sandboxes").await?;
    let mut body = String::from("<h1>Sandboxes</h1>");
    body += &or_refused(&answer, |b| {
        let mut rows = rows_of(b);
        for row in &mut rows {
            row["limits"] = json!(limits_text(&row["spec"]["limits"]));
        }
        table(
            "sandboxes",
            &rows,
            &[
                ("Id", "id"),
                ("State", "state"),
                ("Owner", "owner.kind"),
                ("Owner id", "owner.id"),
                ("Image", "image"),
                ("Limits", "limits"),
                ("Network", "spec.network"),
                ("CPU", "usage.cpu_used_pct"),
                ("Memory", "usage.mem_used"),
                ("Created", "created_at"),
            ],
            Some(("id", "/console/sandboxes/")),
        )
    });
    if answer.ok() {
        body += "<p id=\"usage-live\" data-usage=\"/console/sandboxes/usage\" role=\"status\" \
                 class=\"hint\">CPU and memory: measuring…</p>";
    }
    shown(&s, "Sandboxes", "/console/sandboxes", &body)
}

/// A sandbox's limits in words (`1 CPU · 512 MiB · 256 pids · workspace 1024 MiB`), the
/// units an operator compares with the CPU and memory columns beside them.
fn limits_text(limits: &Value) -> String {
    let mib = |field: &str| limits[field].as_u64().map(|b| b / (1024 * 1024));
    let mut parts = Vec::new();
    if let Some(nano) = limits["nano_cpus"].as_u64() {
        parts.push(format!("{} CPU", nano as f64 / 1e9));
    }
    if let Some(m) = mib("memory_bytes") {
        parts.push(format!("{m} MiB"));
    }
    if let Some(p) = limits["pids"].as_u64() {
        parts.push(format!("{p} pids"));
    }
    if let Some(w) = mib("workspace_bytes") {
        parts.push(format!("workspace {w} MiB"));
    }
    parts.join(" · ")
}

/// `GET /console/sandboxes/usage`: what each listed sandbox uses now, `{id: usage}` as JSON
/// (`GET /v1/sandboxes?usage=true`: the same sandboxes the key may list, one sample each),
/// which `console.js` asks for every few seconds to keep the list's CPU and memory live.
pub async fn sandbox_usage(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let answer = rest.get(&s.key, "/v1/sandboxes?usage=true").await?;
    let (status, value) = if answer.ok() {
        let by_id: serde_json::Map<String, Value> = rows_of(&answer.body)
            .into_iter()
            .filter_map(|r| Some((r["id"].as_str()?.to_owned(), r["usage"].clone())))
            .collect();
        (StatusCode::OK, Value::Object(by_id))
    } else {
        (answer.status, json!({"error": answer.refusal()}))
    };
    Ok(json_answer(status, &value))
}

/// `GET /console/sandboxes/{id}[?path=]`: one sandbox, its processes (`proc.list`, with each
/// one's CPU and memory) and the files of a directory (`fs.list`), both tool calls through the
/// router in that sandbox, so another key's sandbox is "not found" exactly as on REST.
pub async fn sandbox(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    Query(q): Params,
) -> Page {
    let dir = q.get("path").map(String::as_str).unwrap_or("/workspace");
    let listed = rest.get(&s.key, "/v1/sandboxes").await?;
    let row = rows_of(&listed.body)
        .into_iter()
        .find(|r| r["id"].as_str() == Some(id.as_str()));
    let mut body = format!("<h1>Sandbox <code>{}</code></h1>", esc(&id));
    match row {
        Some(mut r) => {
            // The figures an operator looks for first; the whole spec folded below them, so
            // the processes and files stay in sight.
            r["limits"] = json!(limits_text(&r["spec"]["limits"]));
            r["network"] = r["spec"]["network"].clone();
            r["owner"] = json!(format!(
                "{} {}",
                r["owner"]["kind"].as_str().unwrap_or(""),
                r["owner"]["id"].as_str().unwrap_or("")
            ));
            body += &details(
                &r,
                &[
                    "state",
                    "image",
                    "owner",
                    "limits",
                    "network",
                    "created_at",
                    "ready_at",
                ],
            );
            body += &format!(
                "<details><summary>Spec</summary>{}</details>",
                pre(&r["spec"])
            );
        }
        None if listed.ok() => {
            // Not listed for this key: REST would answer "not found", and so does the page.
            body += "<p class=\"error refused\" role=\"alert\">Sandbox not found.</p>";
            return Ok(page(
                StatusCode::NOT_FOUND,
                "Sandbox",
                Some(&s),
                "/console/sandboxes",
                &body,
            ));
        }
        None => body += &refused(&listed),
    }
    let procs = tool(&rest, &s, "proc.list", json!({}), &id).await?;
    body += "<h2>Processes</h2>";
    body += &tool_result(&procs, |out| {
        let rows: Vec<Value> = out["processes"].as_array().cloned().unwrap_or_default();
        let prefix = format!("/console/sandboxes/{}/processes/", seg(&id));
        table(
            "processes",
            &rows,
            &[
                ("Pid", "pid"),
                ("Name", "name"),
                ("Command", "command"),
                ("State", "state"),
                ("CPU %", "cpu_percent"),
                ("Memory (RSS bytes)", "memory_rss_bytes"),
                ("Ports", "listening_ports"),
            ],
            Some(("pid", &prefix)),
        )
    });
    let files = tool(&rest, &s, "fs.list", json!({"path": dir}), &id).await?;
    body += &format!(
        "<h2>Files in <code>{}</code></h2>\
         <form method=\"get\" class=\"filters\"><label for=\"path\">Directory</label>\
         <input id=\"path\" name=\"path\" value=\"{}\"><button type=\"submit\">List</button></form>",
        esc(dir),
        esc(dir)
    );
    body += &tool_result(&files, |out| file_table(&id, dir, out));
    if s.may_write() {
        body += "<h2>Destroy</h2>";
        body += &button(
            &s,
            &format!("/console/sandboxes/{}/destroy", seg(&id)),
            "destroy",
            "Destroy this sandbox",
        );
    }
    shown(&s, "Sandbox", "/console/sandboxes", &body)
}

/// The entries of a directory: a directory's name lists it, a file's name downloads it.
fn file_table(id: &str, dir: &str, out: &Value) -> String {
    let entries = out["entries"].as_array().cloned().unwrap_or_default();
    if entries.is_empty() {
        return "<p>None.</p>".to_owned();
    }
    let mut html = String::from(
        "<div class=\"scroll\"><table id=\"entries\"><thead><tr><th scope=\"col\">Name</th>\
         <th scope=\"col\">Type</th><th scope=\"col\">Size</th></tr></thead><tbody>",
    );
    for e in &entries {
        let name = e["name"].as_str().unwrap_or("");
        let path = format!("{}/{name}", dir.trim_end_matches('/'));
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("path", &path)
            .finish();
        let link = match e["type"].as_str() {
            Some("directory") => format!("/console/sandboxes/{}?{query}", seg(id)),
            Some("file") => format!("/console/sandboxes/{}/file?{query}", seg(id)),
            _ => String::new(),
        };
        let shown_name = if link.is_empty() {
            esc(name)
        } else {
            format!("<a href=\"{}\">{}</a>", esc(&link), esc(name))
        };
        html += &format!(
            "<tr><td>{shown_name}</td><td>{}</td><td>{}</td></tr>",
            cell(&e["type"]),
            cell(&e["size_bytes"])
        );
    }
    if out["truncated"] == true {
        html += "<tr><td colspan=\"3\">(more entries not listed)</td></tr>";
    }
    html + "</tbody></table></div>"
}

/// `GET /console/sandboxes/{id}/file?path=`: the file as a download, read by `fs.read` through
/// the router (the sandbox's read roots, its owner only, an audit row), never from the volume.
pub async fn download(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    Query(q): Params,
) -> Page {
    let path = q
        .get("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ConsoleError::BadForm("no `path` to download".into()))?;
    let answer = tool(
        &rest,
        &s,
        "fs.read",
        json!({"path": path, "max_bytes": DOWNLOAD_MAX}),
        &id,
    )
    .await?;
    let back = format!("/console/sandboxes/{}", seg(&id));
    if !answer.ok() {
        return Ok(outcome(&s, &back, "Download", &answer));
    }
    let out = &answer.body["structuredContent"];
    if answer.body["isError"] == true {
        return Ok(tool_failed(&s, &back, "Download", &answer));
    }
    if out["truncated"] == true {
        return Err(ConsoleError::BadForm(format!(
            "{path} is {} bytes, more than the console downloads ({DOWNLOAD_MAX})",
            out["size_bytes"]
        )));
    }
    let text = out["content"].as_str().unwrap_or("");
    let bytes = match out["encoding"].as_str() {
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ConsoleError::Internal(format!("fs.read answered bad base64: {e}")))?,
        _ => text.as_bytes().to_vec(),
    };
    let name: String = path
        .rsplit('/')
        .next()
        .unwrap_or("file")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    let disposition = format!(
        "attachment; filename=\"{}\"",
        if name.is_empty() { "file" } else { &name }
    );
    let mut response = bytes.into_response();
    let h = response.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        CONTENT_DISPOSITION,
        HeaderValue::from_str(&disposition).map_err(|e| ConsoleError::Internal(e.to_string()))?,
    );
    secure_headers(h);
    Ok(response)
}

/// `GET /console/sandboxes/{id}/processes/{pid}`: one process's output so far
/// (`proc.output`), followed live by `console.js` through [`process_output`] until it ends.
pub async fn process(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path((id, pid)): Path<(String, u32)>,
) -> Page {
    let answer = tool(&rest, &s, "proc.output", json!({"pid": pid}), &id).await?;
    let back = format!("/console/sandboxes/{}", seg(&id));
    let mut body = format!(
        "<h1>Process {pid} in <a href=\"{}\"><code>{}</code></a></h1>",
        esc(&back),
        esc(&id)
    );
    if !answer.ok() {
        body += &refused(&answer);
        return Ok(page(
            answer.status,
            "Process",
            Some(&s),
            "/console/sandboxes",
            &body,
        ));
    }
    let out = &answer.body["structuredContent"];
    if answer.body["isError"] == true {
        body += &format!(
            "<p class=\"error\" role=\"alert\">The tool failed: {}</p>",
            esc(&compact(&answer.body["content"]))
        );
        return shown(&s, "Process", "/console/sandboxes", &body);
    }
    let ended = !out["ended"].is_null();
    body += &format!(
        "<p>Status <span id=\"proc-status\" class=\"status\">{}</span></p>",
        esc(&process_status(out))
    );
    if !ended {
        body += &format!(
            "<p id=\"proc-live\" data-output=\"/console/sandboxes/{}/processes/{pid}/output\" \
             role=\"status\">Following live…</p>",
            seg(&id)
        );
    }
    for stream in ["stdout", "stderr", "pty"] {
        let text = out[stream].as_str().unwrap_or("");
        if stream == "pty" && text.is_empty() {
            continue;
        }
        body += &format!(
            "<h2>{stream}</h2><pre id=\"proc-{stream}\" class=\"output\">{}</pre>",
            esc(text)
        );
    }
    body += "<p class=\"hint\">Output is read as <code>proc.output</code> reads it: each byte \
             once, so what this page shows is no longer there for the next reader.</p>";
    shown(&s, "Process", "/console/sandboxes", &body)
}

/// `GET /console/sandboxes/{id}/processes/{pid}/output`: the process's new output as JSON
/// (`proc.output`'s result, waiting up to [`OUTPUT_WAIT_MS`] for the first bytes), or REST's
/// refusal with its status; what `console.js` polls while the process runs.
pub async fn process_output(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path((id, pid)): Path<(String, u32)>,
) -> Page {
    let answer = tool(
        &rest,
        &s,
        "proc.output",
        json!({"pid": pid, "wait_ms": OUTPUT_WAIT_MS}),
        &id,
    )
    .await?;
    let (status, mut value) = if !answer.ok() {
        (answer.status, json!({"error": answer.refusal()}))
    } else if answer.body["isError"] == true {
        (
            StatusCode::OK,
            json!({"error": compact(&answer.body["content"])}),
        )
    } else {
        (StatusCode::OK, answer.body["structuredContent"].clone())
    };
    if value.get("error").is_none() {
        value["status"] = json!(process_status(&value));
    }
    Ok(json_answer(status, &value))
}

/// A JSON answer for `console.js`, with the headers every console answer carries.
fn json_answer(status: StatusCode, value: &Value) -> Response {
    let mut response = (status, compact(value)).into_response();
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    secure_headers(h);
    response
}

/// A process's state in words, from `proc.output`'s `ended`.
fn process_status(out: &Value) -> String {
    let end = &out["ended"];
    if end.is_null() {
        return "running".to_owned();
    }
    match (end["exit_code"].as_i64(), end["signal"].as_i64()) {
        (Some(code), _) => format!("exited {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended".to_owned(),
    }
}

/// `POST /console/sandboxes/{id}/destroy`: `DELETE /v1/sandboxes/{id}`.
pub async fn destroy_sandbox(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    body: Bytes,
) -> Page {
    let path = format!("/v1/sandboxes/{}", seg(&id));
    let to = Button::new(
        Method::DELETE,
        &path,
        "/console/sandboxes",
        "Destroy sandbox",
    );
    to.press(&s, &rest, &body).await
}

/// A tool call in `sandbox` as the session's key: `POST /v1/tools/call`, the router's policy
/// and audit included.
async fn tool(
    rest: &Rest,
    s: &Session,
    name: &str,
    arguments: Value,
    sandbox: &str,
) -> Result<Answer, ConsoleError> {
    rest.json(
        &s.key,
        Method::POST,
        "/v1/tools/call",
        Some(&json!({"name": name, "arguments": arguments, "sandbox_id": sandbox})),
    )
    .await
}

/// A tool's answer: `render` of its structured content, else REST's refusal or the tool's
/// failure.
fn tool_result(answer: &Answer, render: impl FnOnce(&Value) -> String) -> String {
    if !answer.ok() {
        return refused(answer);
    }
    if answer.body["isError"] == true {
        return format!(
            "<p class=\"error\" role=\"alert\">The tool failed: {}</p>",
            esc(&compact(&answer.body["content"]))
        );
    }
    render(&answer.body["structuredContent"])
}

/// The page for a tool that ran and failed (a file that is not there, a process that ended).
fn tool_failed(s: &Session, back: &str, what: &str, answer: &Answer) -> Response {
    let body = format!(
        "<h1>{}</h1><p id=\"outcome\" class=\"error\" role=\"alert\">The tool failed: {}</p>\
         <p><a href=\"{}\">Back</a></p>",
        esc(what),
        esc(&compact(&answer.body["content"])),
        esc(back)
    );
    page(StatusCode::NOT_FOUND, what, Some(s), back, &body)
}

// ---------------------------------------------------------------- audit

/// `GET /console/audit?tool=&caller=&decision=&since=&until=&limit=`: `GET /v1/audit`.
pub async fn audit(s: Session, Extension(rest): Extension<Rest>, Query(q): Params) -> Page {
    let filters = ["tool", "caller", "decision", "since", "until", "limit"];
    let answer = rest
        .get(&s.key, &format!("/v1/audit?{}", query(&q, &filters)))
        .await?;
    let mut body = String::from("<h1>Audit</h1>");
    body += &filter_form(
        "/console/audit",
        &q,
        &[
            ("tool", "Tool"),
            ("caller", "Caller"),
            ("decision", "Decision"),
            ("since", "Since (RFC 3339)"),
            ("until", "Until (RFC 3339)"),
            ("limit", "Rows"),
        ],
    );
    body += "<form method=\"get\" action=\"/console/audit/verify\"><button type=\"submit\" id=\"verify\">Verify chain</button></form>";
    if answer.ok() {
        let rows = rows_of(&answer.body["rows"]);
        body += &table(
            "audit",
            &rows,
            &[
                ("Seq", "seq"),
                ("At", "at"),
                ("Caller", "caller_kind"),
                ("Caller id", "caller_id"),
                ("Kind", "kind"),
                ("Action", "action"),
                ("Decision", "decision"),
                ("Reason", "reason_code"),
                ("Outcome", "outcome"),
            ],
            None,
        );
        if let Some(next) = answer.body["next_after"].as_i64() {
            let mut q = q.clone();
            q.insert("after".into(), next.to_string());
            let mut keys = filters.to_vec();
            keys.push("after");
            body += &format!(
                "<p><a href=\"/console/audit?{}\">Next rows</a></p>",
                esc(&query(&q, &keys))
            );
        }
    } else {
        body += &refused(&answer);
    }
    shown(&s, "Audit", "/console/audit", &body)
}

/// `GET /console/audit/verify`: `GET /v1/audit/verify`, the chain checked from the last
/// checkpoint.
pub async fn verify_audit(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let answer = rest.get(&s.key, "/v1/audit/verify").await?;
    let mut body = String::from("<h1>Audit chain</h1>");
    if answer.ok() {
        let valid = answer.body["valid"] == true;
        body += &format!(
            "<p id=\"verify-result\" class=\"{}\" role=\"status\">{}</p>",
            if valid { "good" } else { "error" },
            if valid {
                "The chain is valid."
            } else {
                "The chain is BROKEN."
            }
        );
        body += &details(
            &answer.body,
            &[
                "valid",
                "rows_checked",
                "from_count",
                "count",
                "head_hash",
                "first_broken",
            ],
        );
    } else {
        body += &refused(&answer);
    }
    body += "<p><a href=\"/console/audit\">Back to the audit rows</a></p>";
    shown(&s, "Audit chain", "/console/audit", &body)
}

// ---------------------------------------------------------------- runs

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
fn graph(definition: &Answer, e: &Value, current: &str) -> String {
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

fn state_box(
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

fn event_list(events: &Answer) -> String {
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

/// `GET /console/approvals[?all=true]`: what waits for an operator (`GET /v1/approvals`).
pub async fn approvals(s: Session, Extension(rest): Extension<Rest>, Query(q): Params) -> Page {
    let all = q.get("all").is_some_and(|a| a == "true");
    let answer = rest
        .get(&s.key, &format!("/v1/approvals?all={all}"))
        .await?;
    let mut body = String::from("<h1>Approvals</h1>");
    body += if all {
        "<p><a href=\"/console/approvals\">Only pending</a></p>"
    } else {
        "<p><a href=\"/console/approvals?all=true\">Include decided</a></p>"
    };
    if !answer.ok() {
        body += &refused(&answer);
        return shown(&s, "Approvals", "/console/approvals", &body);
    }
    let rows = rows_of(&answer.body);
    if rows.is_empty() {
        body += "<p>Nothing waits.</p>";
    }
    for a in rows {
        let id = a["id"].as_str().unwrap_or("");
        body += &format!(
            "<section class=\"card\" id=\"approval-{}\" aria-label=\"Approval {}\"><h2><code>{}</code> <span class=\"status\">{}</span></h2>",
            esc(id),
            esc(id),
            esc(a["tool"].as_str().unwrap_or("")),
            esc(a["state"].as_str().unwrap_or(""))
        );
        body += &details(
            &a,
            &[
                "id",
                "caller",
                "security_context",
                "created_at",
                "expires_at",
                "arguments",
                "decided_by",
                "decided_at",
                "note",
            ],
        );
        if s.may_write() && a["state"] == "pending" {
            for verdict in ["approve", "reject"] {
                body += &format!(
                    "<form method=\"post\" action=\"/console/approvals/{}/{verdict}\" class=\"inline\">{}\
                     <label for=\"note-{verdict}-{}\">Note</label><input id=\"note-{verdict}-{}\" name=\"note\">\
                     <button type=\"submit\" id=\"{verdict}-{}\"{}>{}</button></form>",
                    seg(id),
                    csrf_field(&s),
                    esc(id),
                    esc(id),
                    esc(id),
                    if verdict == "reject" { " class=\"danger\"" } else { "" },
                    if verdict == "approve" { "Approve" } else { "Reject" }
                );
            }
        }
        body += "</section>";
    }
    shown(&s, "Approvals", "/console/approvals", &body)
}

/// `POST /console/approvals/{id}/{approve|reject}` (`note=`): REST decides, the second-person
/// rule included.
pub async fn decide_approval(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path((id, verdict)): Path<(String, String)>,
    body: Bytes,
) -> Page {
    let fields = form_fields(&body);
    s.check_csrf(&fields)?;
    if verdict != "approve" && verdict != "reject" {
        return Err(ConsoleError::BadForm(format!("no verdict `{verdict}`")));
    }
    let note = fields.get("note").filter(|n| !n.is_empty());
    let answer = rest
        .json(
            &s.key,
            Method::POST,
            &format!("/v1/approvals/{}/{verdict}", seg(&id)),
            Some(&json!({"note": note})),
        )
        .await?;
    Ok(outcome(
        &s,
        "/console/approvals",
        if verdict == "approve" {
            "Approve"
        } else {
            "Reject"
        },
        &answer,
    ))
}

// ---------------------------------------------------------------- keys

/// `GET /console/keys`: API keys and security contexts (admin).
pub async fn keys(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let answer = rest.get(&s.key, "/v1/api-keys").await?;
    let mut body = String::from("<h1>API keys</h1>");
    if answer.ok() {
        body += "<table id=\"keys\"><thead><tr><th scope=\"col\">Name</th><th scope=\"col\">Id</th><th scope=\"col\">Role</th>\
                 <th scope=\"col\">Context</th><th scope=\"col\">Created</th><th scope=\"col\">Expires</th><th scope=\"col\">Revoked</th><th scope=\"col\"></th></tr></thead><tbody>";
        for k in rows_of(&answer.body) {
            let id = k["id"].as_str().unwrap_or("");
            let revoke = if k["revoked_at"].is_null() && s.is_admin() {
                format!(
                    "<form method=\"post\" action=\"/console/keys/{}/revoke\">{}<button type=\"submit\" class=\"danger\" aria-label=\"Revoke {}\">Revoke</button></form>",
                    seg(id),
                    csrf_field(&s),
                    esc(k["name"].as_str().unwrap_or(id))
                )
            } else {
                String::new()
            };
            body += &format!(
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{revoke}</td></tr>",
                cell(&k["name"]),
                cell(&k["id"]),
                cell(&k["role"]),
                cell(&k["security_context"]),
                cell(&k["created_at"]),
                cell(&k["expires_at"]),
                cell(&k["revoked_at"])
            );
        }
        body += "</tbody></table>";
    } else {
        body += &refused(&answer);
    }
    if s.is_admin() {
        body += &format!(
            "<h2>Create a key</h2><form method=\"post\" action=\"/console/keys\" class=\"filters\">{}\
             <label for=\"name\">Name</label><input id=\"name\" name=\"name\" required>\
             <label for=\"role\">Role</label><select id=\"role\" name=\"role\">\
             <option>readonly</option><option>operator</option><option>admin</option></select>\
             <label for=\"security_context\">Bound to context (optional)</label><input id=\"security_context\" name=\"security_context\">\
             <button type=\"submit\" id=\"create-key\">Create</button></form>",
            csrf_field(&s)
        );
    }
    let contexts = rest.get(&s.key, "/v1/security-contexts").await?;
    body += "<h2>Security contexts</h2>";
    body += &or_refused(&contexts, |b| {
        table(
            "contexts",
            &rows_of(b),
            &[
                ("Name", "name"),
                ("Description", "description"),
                ("Enrolment secret", "enrolment_secret"),
                ("Digest", "digest"),
            ],
            None,
        )
    });
    shown(&s, "Keys", "/console/keys", &body)
}

/// `POST /console/keys` (`name=&role=&security_context=`): creates a key and shows its secret
/// this once.
pub async fn create_key(s: Session, Extension(rest): Extension<Rest>, body: Bytes) -> Page {
    let fields = form_fields(&body);
    s.check_csrf(&fields)?;
    let mut request = json!({
        "name": fields.get("name").cloned().unwrap_or_default(),
        "role": fields.get("role").cloned().unwrap_or_default(),
    });
    if let Some(context) = fields
        .get("security_context")
        .filter(|c| !c.trim().is_empty())
    {
        request["security_context"] = json!(context.trim());
    }
    let answer = rest
        .json(&s.key, Method::POST, "/v1/api-keys", Some(&request))
        .await?;
    if !answer.ok() {
        return Ok(outcome(&s, "/console/keys", "Create key", &answer));
    }
    let body = format!(
        "<h1>Key created</h1><p role=\"status\">This is the only time the secret is shown: copy it now.</p>\
         <p><label for=\"new-key-secret\">Secret of <strong>{}</strong></label>\
         <input id=\"new-key-secret\" readonly value=\"{}\" size=\"80\"></p>\
         <p><a href=\"/console/keys\">Back to the keys</a></p>",
        cell(&answer.body["name"]),
        esc(answer.body["key"].as_str().unwrap_or(""))
    );
    Ok(page(
        StatusCode::CREATED,
        "Key created",
        Some(&s),
        "/console/keys",
        &body,
    ))
}

/// `POST /console/keys/{id}/revoke`: `DELETE /v1/api-keys/{id}`.
pub async fn revoke_key(
    s: Session,
    Extension(rest): Extension<Rest>,
    Path(id): Path<String>,
    body: Bytes,
) -> Page {
    let path = format!("/v1/api-keys/{}", seg(&id));
    let to = Button::new(Method::DELETE, &path, "/console/keys", "Revoke key");
    to.press(&s, &rest, &body).await
}

// ---------------------------------------------------------------- node

/// `GET /console/node`: this instance, readiness (each dependency, the replicas of this database
/// and the engine each drives), the metrics at a glance (sandboxes, pool, engines, calls: the
/// series of `/metrics`), and the tools this key may call. Every figure is one REST already
/// serves: `/health/live`, `/health/ready`, `/metrics`, `GET /v1/tools`.
pub async fn node(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let live = rest.get(&s.key, "/health/live").await?;
    let ready = rest.get(&s.key, "/health/ready").await?;
    let (metrics_status, metrics) = rest.text(&s.key, "/metrics").await?;
    let tools = rest.get(&s.key, "/v1/tools").await?;
    let mut body = String::from("<h1>Node</h1>");
    body += &details(&live.body, &["version", "instance_id", "status"]);
    let checks = &ready.body["checks"];
    body += &format!(
        "<h2>Readiness <span class=\"status\" id=\"ready\">{}</span></h2>",
        if ready.ok() { "ready" } else { "not ready" }
    );
    let components: Vec<Value> = ["database", "migrations", "docker", "sandboxes"]
        .iter()
        .map(|name| json!({"component": name, "status": checks[*name]["status"], "error": checks[*name]["error"]}))
        .collect();
    body += &table(
        "checks",
        &components,
        &[
            ("Component", "component"),
            ("Status", "status"),
            ("Error", "error"),
        ],
        None,
    );
    body += &details(checks, &["kernel_policy"]);
    body += "<h2>Replicas and their engines</h2>";
    body += &table(
        "replicas",
        &rows_of(&checks["cluster"]["replicas"]),
        &[
            ("Instance", "instance_id"),
            ("This one", "this"),
            ("Engine", "engine"),
            ("Peer URL", "peer_url"),
            ("Sandboxes held", "sandboxes_held"),
            ("Heartbeat age (s)", "heartbeat_age_secs"),
        ],
        None,
    );
    body += "<h2>Metrics at a glance</h2>";
    if metrics_status.is_success() {
        body += &table(
            "metrics",
            &glance(&metrics),
            &[("Series", "name"), ("Labels", "labels"), ("Value", "value")],
            None,
        );
    } else {
        body += &format!(
            "<p class=\"error refused\" role=\"alert\">REST refused: {} (<code>/metrics</code>)</p>",
            metrics_status.as_u16()
        );
    }
    body += "<h2>Tools this key may call</h2>";
    body += &or_refused(&tools, |b| {
        table(
            "tools",
            &rows_of(b),
            &[("Name", "name"), ("Tier", "tier"), ("Category", "category")],
            None,
        )
    });
    shown(&s, "Node", "/console/node", &body)
}

/// The series of `/metrics` an operator reads at a glance: the gauges of sandboxes, runs, the
/// warm pool, engines, replicas and database connections, and the counters of calls and pool
/// acquisitions; histogram buckets are left to Prometheus.
const GLANCE: &[&str] = &[
    "aegis_sandboxes",
    "aegis_executions",
    "aegis_workflow_executions",
    "aegis_pool_idle_sandboxes",
    "aegis_pool_acquisitions_total",
    "aegis_engine_sandboxes",
    "aegis_engine_replicas",
    "aegis_cluster_replicas",
    "aegis_db_pool_connections",
    "aegis_forwarded_calls_total",
    "aegis_tool_calls_total",
    "aegis_seal_refusals_total",
    "aegis_audit_rows_written_total",
];

/// The samples of the [`GLANCE`] series in Prometheus text, in that order, as rows of
/// `name`, `labels`, `value`.
fn glance(text: &str) -> Vec<Value> {
    let mut rows: Vec<(usize, Value)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let order = GLANCE.iter().position(|g| *g == name)?;
            Some((
                order,
                json!({"name": name, "labels": labels, "value": value}),
            ))
        })
        .collect();
    rows.sort_by_key(|(order, _)| *order);
    rows.into_iter().map(|(_, row)| row).collect()
}

// ---------------------------------------------------------------- rendering helpers

/// A signed-in page answered 200 (a refusal of REST is shown inside it, as REST gave it).
fn shown(s: &Session, title: &str, active: &str, body: &str) -> Page {
    Ok(page(StatusCode::OK, title, Some(s), active, body))
}

/// `render` of REST's answer when REST agreed, else its refusal in its place: every section
/// of every page reads REST this way, so a refusal is never mistaken for an empty list.
fn or_refused(answer: &Answer, render: impl FnOnce(&Value) -> String) -> String {
    if answer.ok() {
        render(&answer.body)
    } else {
        refused(answer)
    }
}

/// A one-button form posting to `action` with this session's form token (the token is what
/// lets the console tell the page's own button from another site's forged post).
fn button(s: &Session, action: &str, id: &str, label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{}\">{}<button type=\"submit\" class=\"danger\" id=\"{}\">{}</button></form>",
        esc(action),
        csrf_field(s),
        esc(id),
        esc(label)
    )
}

/// What a one-button form does on REST: the handlers of destroy, cancel and revoke differ only
/// in this, so the token check and the answer are written once ([`Button::press`]).
struct Button<'a> {
    method: Method,
    rest_path: &'a str,
    back: &'a str,
    what: &'a str,
}

impl<'a> Button<'a> {
    fn new(method: Method, rest_path: &'a str, back: &'a str, what: &'a str) -> Self {
        Self {
            method,
            rest_path,
            back,
            what,
        }
    }

    /// Checks the form token first (nothing reaches REST without it), sends the request as the
    /// session's key, and answers as [`after_action`].
    async fn press(self, s: &Session, rest: &Rest, form: &[u8]) -> Page {
        s.check_csrf(&form_fields(form))?;
        let answer = rest.json(&s.key, self.method, self.rest_path, None).await?;
        Ok(after_action(s, &answer, self.back, self.what))
    }
}

/// After a button: back to `to` when REST agreed, else REST's refusal.
fn after_action(s: &Session, answer: &Answer, to: &str, what: &str) -> Response {
    if answer.ok() {
        return Redirect::to(to).into_response();
    }
    outcome(s, to, what, answer)
}

/// The page after a form: REST's answer, with REST's status.
fn outcome(s: &Session, back: &str, what: &str, answer: &Answer) -> Response {
    let mut body = format!("<h1>{}</h1>", esc(what));
    if answer.ok() {
        body += "<p id=\"outcome\" class=\"good\" role=\"status\">Done.</p>";
        body += &pre(&answer.body);
    } else {
        body += &format!(
            "<p id=\"outcome\" class=\"error\" role=\"alert\">Refused: {}</p>",
            esc(&answer.refusal())
        );
    }
    body += &format!("<p><a href=\"{}\">Back</a></p>", esc(back));
    page(answer.status, what, Some(s), back, &body)
}

/// REST's refusal of a read, shown in place of what it would have shown.
fn refused(answer: &Answer) -> String {
    format!(
        "<p class=\"error refused\" role=\"alert\">REST refused: {}</p>",
        esc(&answer.refusal())
    )
}

/// The rows of a list answer: the array itself or the first array under a usual field.
fn rows_of(v: &Value) -> Vec<Value> {
    if let Some(a) = v.as_array() {
        return a.clone();
    }
    [
        "items",
        "executions",
        "rows",
        "keys",
        "contexts",
        "tools",
        "sandboxes",
    ]
    .iter()
    .find_map(|f| v[*f].as_array().cloned())
    .unwrap_or_default()
}

/// The value at a dotted path (`owner.kind`).
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| &v[k])
}

/// A value as escaped cell text: strings as they are, null empty, the rest compact JSON.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => esc(s),
        other => esc(&truncate(&compact(other), 200)),
    }
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn pre(v: &Value) -> String {
    format!(
        "<pre>{}</pre>",
        esc(&serde_json::to_string_pretty(v).unwrap_or_default())
    )
}

/// A table of `rows` with the given (header, dotted path) columns; `link` makes one column's
/// value a link under a prefix.
fn table(id: &str, rows: &[Value], cols: &[(&str, &str)], link: Option<(&str, &str)>) -> String {
    if rows.is_empty() {
        return "<p>None.</p>".to_owned();
    }
    let mut out = format!(
        "<div class=\"scroll\"><table id=\"{}\"><thead><tr>",
        esc(id)
    );
    for (header, _) in cols {
        out += &format!("<th scope=\"col\">{}</th>", esc(header));
    }
    out += "</tr></thead><tbody>";
    for row in rows {
        // The linked id names the row and each cell its column, for `console.js` to update
        // a row in place (the sandboxes' usage).
        match link.and_then(|(field, _)| at(row, field).as_str()) {
            Some(id) => out += &format!("<tr data-id=\"{}\">", esc(id)),
            None => out += "<tr>",
        }
        for (_, path) in cols {
            let v = at(row, path);
            // An id is a string (sandboxes, runs) or a number (a process's pid).
            let text = match v {
                Value::String(t) => Some(t.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            match (link, text) {
                (Some((field, prefix)), Some(text)) if field == *path => {
                    out += &format!(
                        "<td><a href=\"{}{}\"><code>{}</code></a></td>",
                        esc(prefix),
                        seg(&text),
                        esc(&text)
                    );
                }
                _ => out += &format!("<td data-col=\"{}\">{}</td>", esc(path), cell(v)),
            }
        }
        out += "</tr>";
    }
    out + "</tbody></table></div>"
}

/// A definition list of some fields of an object (absent ones left out).
fn details(v: &Value, fields: &[&str]) -> String {
    let mut out = String::from("<dl class=\"details\">");
    for f in fields {
        let x = &v[*f];
        if x.is_null() {
            continue;
        }
        let shown = match x {
            Value::Object(_) | Value::Array(_) => pre(x),
            _ => cell(x),
        };
        out += &format!("<dt>{}</dt><dd>{shown}</dd>", esc(f));
    }
    out + "</dl>"
}

/// A GET form of text filters, filled with the current values.
fn filter_form(action: &str, q: &HashMap<String, String>, fields: &[(&str, &str)]) -> String {
    let mut out = format!(
        "<form method=\"get\" action=\"{}\" class=\"filters\">",
        esc(action)
    );
    for (name, label) in fields {
        out += &format!(
            "<label for=\"f-{name}\">{}</label><input id=\"f-{name}\" name=\"{name}\" value=\"{}\">",
            esc(label),
            esc(q.get(*name).map(String::as_str).unwrap_or(""))
        );
    }
    out + "<button type=\"submit\">Filter</button></form>"
}

/// The non-empty parameters among `keys`, as a query string.
fn query(q: &HashMap<String, String>, keys: &[&str]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for k in keys {
        if let Some(v) = q.get(*k).filter(|v| !v.trim().is_empty()) {
            s.append_pair(k, v.trim());
        }
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glance_keeps_the_named_series_in_order_and_leaves_histograms_out() {
        let text = "# HELP aegis_tool_calls_total calls\n\
                    aegis_tool_calls_total{tool=\"cmd.run\",decision=\"allowed\"} 3\n\
                    aegis_tool_call_duration_seconds_bucket{le=\"0.1\"} 2\n\
                    aegis_sandboxes{state=\"running\"} 1\n\
                    aegis_pool_idle_sandboxes 0\n";
        let rows = glance(text);
        let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "aegis_sandboxes",
                "aegis_pool_idle_sandboxes",
                "aegis_tool_calls_total"
            ]
        );
        assert_eq!(rows[0]["labels"], "state=\"running\"");
        assert_eq!(rows[2]["value"], "3");
    }

    #[test]
    fn limits_read_in_the_units_of_the_usage_columns() {
        let limits = json!({"nano_cpus": 1_500_000_000u64, "memory_bytes": 536_870_912u64,
                            "pids": 256, "workspace_bytes": 1_073_741_824u64});
        assert_eq!(
            limits_text(&limits),
            "1.5 CPU · 512 MiB · 256 pids · workspace 1024 MiB"
        );
        assert_eq!(limits_text(&Value::Null), "");
    }

    #[test]
    fn a_process_status_says_how_it_ended() {
        assert_eq!(process_status(&json!({"ended": null})), "running");
        assert_eq!(
            process_status(&json!({"ended": {"exit_code": 0}})),
            "exited 0"
        );
        assert_eq!(
            process_status(&json!({"ended": {"exit_code": null, "signal": 9}})),
            "killed by signal 9"
        );
    }
}
