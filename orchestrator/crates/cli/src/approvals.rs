//! `orchestrator approvals list|get|approve|reject`: privileged calls waiting for an operator.

use serde_json::json;

use super::client::{segment, Client};
use super::error::CliError;
use super::output;
use super::Connection;

/// Approval verbs.
#[derive(clap::Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// Requests still waiting (all of them with --all).
    List {
        /// Include approved, rejected and timed-out requests.
        #[arg(long)]
        all: bool,
    },
    /// One request.
    Get {
        /// Request id.
        id: String,
    },
    /// Let a waiting call run.
    Approve {
        /// Request id.
        id: String,
        /// Why (kept with the request).
        #[arg(long)]
        note: Option<String>,
    },
    /// Refuse a waiting call.
    Reject {
        /// Request id.
        id: String,
        /// Why (kept with the request and shown to the caller).
        #[arg(long)]
        note: Option<String>,
    },
}

const FIELDS: &[(&str, &str)] = &[
    ("id", "id"),
    ("state", "state"),
    ("tool", "tool"),
    ("caller", "caller.label"),
    ("context", "security_context"),
    ("arguments", "arguments"),
    ("created", "created_at"),
    ("expires", "expires_at"),
    ("decided by", "decided_by"),
    ("note", "note"),
];

/// Runs one approvals verb.
pub async fn run(conn: &Connection, command: ApprovalsCommand) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    let (out, verb) = match command {
        ApprovalsCommand::List { all } => {
            let path = if all {
                "/v1/approvals?all=true"
            } else {
                "/v1/approvals"
            };
            let out = client.get(path).await?;
            let cols = [
                ("id", "id"),
                ("state", "state"),
                ("tool", "tool"),
                ("caller", "caller.label"),
                ("created", "created_at"),
                ("expires", "expires_at"),
            ];
            output::listing(client.json, &out, &out, &cols, "no requests waiting");
            return Ok(());
        }
        ApprovalsCommand::Get { id } => (
            client
                .get(&format!("/v1/approvals/{}", segment(&id)))
                .await?,
            None,
        ),
        ApprovalsCommand::Approve { id, note } => (
            decide(&client, &id, "approve", note).await?,
            Some("approved"),
        ),
        ApprovalsCommand::Reject { id, note } => (
            decide(&client, &id, "reject", note).await?,
            Some("rejected"),
        ),
    };
    if client.json {
        output::json(&out);
    } else {
        if let Some(verb) = verb {
            eprintln!("{verb} {}", output::cell(&out["id"]));
        }
        print!("{}", output::record(&out, FIELDS));
    }
    Ok(())
}

/// An operator's decision on request `id`: `POST /v1/approvals/{id}/{decision}` (`approve` or
/// `reject`) with the note; both verbs send the same request but for the last segment.
async fn decide(
    client: &Client,
    id: &str,
    decision: &str,
    note: Option<String>,
) -> Result<serde_json::Value, CliError> {
    let path = format!("/v1/approvals/{}/{decision}", segment(id));
    client.post(&path, json!({"note": note})).await
}
