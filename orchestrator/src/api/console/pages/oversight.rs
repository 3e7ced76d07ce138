//! What operators and reviewers look at and decide: the audit rows with filters and the chain's
//! verification, the approvals waiting (approve or reject, the second-person rule held by REST),
//! and the keys (admin: create, the secret shown once, revoke).

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::{Method, StatusCode};
use axum::Extension;
use serde_json::json;

use super::{
    cell, details, filter_form, or_refused, outcome, query, refused, rows_of, shown, table, Button,
    Page, Params,
};
use crate::api::console::layout::{csrf_field, esc, page, seg};
use crate::api::console::rest::Rest;
use crate::api::console::session::Session;
use crate::api::console::{form_fields, ConsoleError};

/// `GET /console/audit?tool=&caller=&sandbox=&decision=&since=&until=&limit=`: `GET /v1/audit`.
pub async fn audit(s: Session, Extension(rest): Extension<Rest>, Query(q): Params) -> Page {
    let filters = [
        "tool", "caller", "sandbox", "decision", "since", "until", "limit",
    ];
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
            ("sandbox", "Sandbox"),
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
                ("Sandbox", "sandbox_id"),
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
