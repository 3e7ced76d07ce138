//! The sandbox pages: the live list (CPU and memory), one sandbox (its processes, its files to
//! browse and download), one process's output followed live, and destroy; every figure and
//! file through REST's tool calls as the signed-in key.

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::IntoResponse;
use axum::Extension;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{
    button, cell, compact, details, json_answer, or_refused, outcome, pre, refused, rows_of, shown,
    table, tool, tool_failed, tool_result, Button, Page, Params,
};
use crate::api::console::layout::{esc, page, secure_headers, seg};
use crate::api::console::rest::Rest;
use crate::api::console::session::Session;
use crate::api::console::ConsoleError;

/// The most bytes of one file the console downloads (`fs.read`'s `max_bytes`); a larger file
/// is refused with its size rather than cut short without a word.
pub(super) const DOWNLOAD_MAX: u64 = 8 * 1024 * 1024;

/// How long one request for a process's output waits for the first new bytes (`proc.output`'s
/// `wait_ms`): a long poll, so a quiet process costs one audited call per this interval.
pub(super) const OUTPUT_WAIT_MS: u64 = 10_000;

/// `GET /console/sandboxes`: the sandboxes this key may list (`GET /v1/sandboxes`).
pub async fn sandboxes(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let answer = rest.get(&s.key, "/v1/sandboxes").await?;
    let mut body = String::from("<h1>Sandboxes</h1>");
    body += &or_refused(&answer, |b| {
        let mut rows = rows_of(b);
        for row in &mut rows {
            row["limits"] = json!(limits_text(&row["spec"]["limits"]));
            row["engine_name"] = json!(engine_name(&row["engine"]));
        }
        table(
            "sandboxes",
            &rows,
            &[
                ("Id", "id"),
                ("State", "state"),
                ("Kind", "owner.kind"),
                ("Owner id", "owner.id"),
                ("Image", "image"),
                ("Class", "spec.isolation"),
                ("Replica", "instance_id"),
                ("Engine", "engine_name"),
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

/// The engine's name from its recorded identity (`<ID>@<name>:<data root>`), the part an
/// operator recognises; the whole identity when it has another form, empty when unrecorded.
pub(super) fn engine_name(engine: &Value) -> String {
    let Some(id) = engine.as_str() else {
        return String::new();
    };
    id.split_once('@')
        .and_then(|(_, rest)| rest.split_once(':').map(|(name, _)| name))
        .filter(|name| !name.is_empty())
        .unwrap_or(id)
        .to_owned()
}

/// A sandbox's limits in words (`1 CPU · 512 MiB · 256 pids · workspace 1024 MiB`), the
/// units an operator compares with the CPU and memory columns beside them.
pub(super) fn limits_text(limits: &Value) -> String {
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
        Some(r) => body += &summary(&id, r),
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

/// What an operator looks for first in a sandbox's row (state, where it runs, limits), the whole
/// spec folded below, and the way to its audit rows (REST decides who may read them); the
/// processes and files follow on the page.
fn summary(id: &str, mut r: Value) -> String {
    r["limits"] = json!(limits_text(&r["spec"]["limits"]));
    r["network"] = r["spec"]["network"].clone();
    r["class"] = r["spec"]["isolation"].clone();
    r["owner"] = json!(format!(
        "{} {}",
        r["owner"]["kind"].as_str().unwrap_or(""),
        r["owner"]["id"].as_str().unwrap_or("")
    ));
    let fields = [
        "state",
        "image",
        "owner",
        "class",
        "instance_id",
        "engine",
        "limits",
        "network",
        "created_at",
        "ready_at",
    ];
    format!(
        "{}<details><summary>Spec</summary>{}</details>\
         <p><a id=\"sandbox-audit\" href=\"/console/audit?sandbox={}\">Its audit rows</a></p>",
        details(&r, &fields),
        pre(&r["spec"]),
        esc(id)
    )
}

/// The entries of a directory: a directory's name lists it, a file's name downloads it.
pub(super) fn file_table(id: &str, dir: &str, out: &Value) -> String {
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

/// A process's state in words, from `proc.output`'s `ended`.
pub(super) fn process_status(out: &Value) -> String {
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
