//! `orchestrator audit list|verify`.

use super::client::{query, Client};
use super::error::CliError;
use super::output;
use super::Connection;

/// Audit verbs.
#[derive(clap::Subcommand, Debug)]
pub enum AuditCommand {
    /// Audit rows, oldest first, filtered.
    List {
        /// Only this tool or admin action.
        #[arg(long)]
        tool: Option<String>,
        /// Only this caller id.
        #[arg(long)]
        caller: Option<String>,
        /// Only calls that ran in (or were refused for) this sandbox, and its create/destroy.
        #[arg(long)]
        sandbox: Option<String>,
        /// allowed or denied.
        #[arg(long)]
        decision: Option<String>,
        /// From this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Until this time (RFC 3339).
        #[arg(long)]
        until: Option<String>,
        /// Rows after this sequence number (to page).
        #[arg(long)]
        after: Option<i64>,
        /// At most this many rows (1 to 500, default 100).
        #[arg(long)]
        limit: Option<i64>,
    },
    /// Recompute the hash chain (admin key); exit 1 when it is broken.
    Verify {
        /// From the first row instead of the last checkpoint.
        #[arg(long)]
        full: bool,
        /// A published head to check against: its row count...
        #[arg(long, requires = "anchor_hash")]
        anchor_count: Option<i64>,
        /// ...and its hash.
        #[arg(long, requires = "anchor_count")]
        anchor_hash: Option<String>,
    },
}

/// Runs one audit verb.
pub async fn run(conn: &Connection, command: AuditCommand) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    match command {
        AuditCommand::List {
            tool,
            caller,
            sandbox,
            decision,
            since,
            until,
            after,
            limit,
        } => {
            let q = query(&[
                ("tool", tool),
                ("caller", caller),
                ("sandbox", sandbox),
                ("decision", decision),
                ("since", since),
                ("until", until),
                ("after", after.map(|a| a.to_string())),
                ("limit", limit.map(|l| l.to_string())),
            ]);
            let out = client.get(&format!("/v1/audit{q}")).await?;
            let cols = [
                ("seq", "seq"),
                ("at", "at"),
                ("action", "action"),
                ("decision", "decision"),
                ("outcome", "outcome"),
                ("caller", "caller_kind"),
                ("caller id", "caller_id"),
                ("reason", "reason_code"),
                ("ms", "duration_ms"),
            ];
            output::listing(
                client.json,
                &out,
                &out["rows"],
                &cols,
                "no audit rows match",
            );
            if !client.json {
                if let Some(next) = out["next_after"].as_i64() {
                    eprintln!("more rows: --after {next}");
                }
            }
        }
        AuditCommand::Verify {
            full,
            anchor_count,
            anchor_hash,
        } => {
            let q = query(&[
                ("full", full.then(|| "true".to_owned())),
                ("anchor_count", anchor_count.map(|c| c.to_string())),
                ("anchor_hash", anchor_hash),
            ]);
            let out = client.get(&format!("/v1/audit/verify{q}")).await?;
            if client.json {
                output::json(&out);
            }
            if out["valid"] != true {
                let broken = &out["first_broken"];
                return Err(CliError::Failed(format!(
                    "the audit chain is broken: {} at row {} ({})",
                    broken["problem"].as_str().unwrap_or("unknown"),
                    output::cell(&broken["seq"]),
                    broken["detail"].as_str().unwrap_or("no details"),
                )));
            }
            if !client.json {
                println!(
                    "audit chain intact: {} rows checked, {} in the chain, head {}",
                    output::cell(&out["rows_checked"]),
                    output::cell(&out["count"]),
                    out["head_hash"].as_str().unwrap_or("-"),
                );
            }
        }
    }
    Ok(())
}
