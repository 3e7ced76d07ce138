//! The console's pages and forms. Each handler asks REST (as the signed-in key, through
//! [`Rest`]) and renders its JSON answer; a refusal is shown as REST gave it (status, code,
//! message). Buttons appear only for roles REST would let act, and REST decides again anyway.
//! Every `POST` here checks the session's form token before anything is sent.

mod node;
mod oversight;
mod runs;
mod sandboxes;

pub use node::node;
pub use oversight::{
    approvals, audit, create_key, decide_approval, keys, revoke_key, verify_audit,
};
pub use runs::{cancel_execution, cancel_run, execution, run, run_events, runs, signal_run};
pub use sandboxes::{
    destroy_sandbox, download, process, process_output, sandbox, sandbox_usage, sandboxes,
};

use std::collections::HashMap;

use axum::extract::Query;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{json, Value};

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

/// A JSON answer for `console.js`, with the headers every console answer carries.
fn json_answer(status: StatusCode, value: &Value) -> Response {
    let mut response = (status, compact(value)).into_response();
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    secure_headers(h);
    response
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
    use super::node::glance;
    use super::sandboxes::{engine_name, limits_text, process_status};
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
    fn an_engine_is_named_as_its_daemon_calls_itself() {
        assert_eq!(
            engine_name(&json!("ABCD:EFGH@node-a:/var/lib/docker")),
            "node-a"
        );
        assert_eq!(engine_name(&json!("no-form")), "no-form");
        assert_eq!(engine_name(&json!("x@:/root")), "x@:/root");
        assert_eq!(engine_name(&Value::Null), "");
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
