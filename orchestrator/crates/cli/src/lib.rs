//! The operator command line's client half: one noun per module (`agent`, `workflow`, `run` and
//! `logs`, `sandbox`, `tools`, `keys`, `audit`, `approvals`, `seal`), all speaking REST to a
//! running node with an API key.
//!
//! Also the Rust SEAL client ([`seal_client`]) behind `orchestrator seal ...` and the tests.
//!
//! It lives in a library (not in `main.rs`) so the pieces that decide things (where the key
//! comes from, how an answer maps to an exit code, how an SSE stream is cut into events) are
//! unit-tested; `main.rs` only parses the command line and hands the client verbs here.
//!
//! Exit codes (stable, documented in the README): 0 success; 1 the call failed or was refused
//! (or an execution ended other than `completed`); 2 usage (bad flags, unreadable input file);
//! 3 the node cannot be reached; 4 authentication or permission (no key, bad key, role too
//! low, unsafe credentials file); 5 not found. `sandbox exec` exits with the command's own exit
//! code once the command ran, as `docker exec` does.

mod agent;
mod approvals;
mod audit;
pub mod client;
pub mod credentials;
pub mod error;
mod keys;
pub mod output;
mod run;
mod sandbox;
mod seal;
pub mod seal_client;
pub mod sse;
mod tool_call;
mod tools;
mod workflow;

use std::process::ExitCode;

pub use client::Client;
pub use error::CliError;

/// Where the node is, the key to use, and how to print: shared by every client verb.
#[derive(clap::Args, Clone, Debug)]
pub struct Connection {
    /// REST base URL of the node (else the credentials file's `url`, else
    /// http://127.0.0.1:8088).
    #[arg(long, global = true, env = "ORCHESTRATOR_URL", value_name = "URL")]
    pub url: Option<String>,
    /// API key, `aok_...` (else ORCHESTRATOR_API_KEY, the older name, else the credentials
    /// file).
    #[arg(
        long,
        global = true,
        env = "ORCHESTRATOR_KEY",
        hide_env_values = true,
        visible_alias = "api-key",
        value_name = "KEY"
    )]
    pub key: Option<String>,
    /// Credentials file holding `key = aok_...` and optionally `url = ...`, mode 0600 (default:
    /// ~/.config/aegis-orchestrator/credentials, under $XDG_CONFIG_HOME when set).
    #[arg(
        long,
        global = true,
        env = "ORCHESTRATOR_CREDENTIALS",
        value_name = "PATH"
    )]
    pub credentials: Option<std::path::PathBuf>,
    /// Print the node's JSON answers instead of tables (for scripts).
    #[arg(long, global = true)]
    pub json: bool,
}

/// The client verbs of the `orchestrator` binary.
#[derive(clap::Subcommand, Debug)]
pub enum ClientCommand {
    /// Agents: deploy a manifest, list, show, export its YAML, delete.
    Agent {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: agent::AgentCommand,
    },
    /// Workflows: deploy, list, run, answer a Human state, cancel.
    Workflow {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: workflow::WorkflowCommand,
    },
    /// Run an agent; with --follow, print its events live and wait for the result.
    Run {
        #[command(flatten)]
        conn: Connection,
        #[command(flatten)]
        args: run::RunArgs,
    },
    /// The event log of an agent or workflow execution (live with --follow).
    Logs {
        #[command(flatten)]
        conn: Connection,
        #[command(flatten)]
        args: run::LogsArgs,
    },
    /// Sandboxes: create one (from a runtime or an agent), run commands, read and write files,
    /// remove it.
    Sandbox {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: sandbox::SandboxCommand,
    },
    /// The tool catalog, and calling one tool.
    Tools {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: tools::ToolsCommand,
    },
    /// API keys: create (the secret is shown once), list, revoke (admin key).
    Keys {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// The audit log: list rows, verify the hash chain.
    Audit {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// Privileged calls waiting for an operator: list, approve, reject.
    Approvals {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: approvals::ApprovalsCommand,
    },
    /// SEAL client: attest to a gateway and call tools with signed envelopes; issue
    /// attestation tokens.
    Seal {
        #[command(subcommand)]
        command: seal::SealCommand,
    },
}

/// Runs one client verb on a small runtime of its own and maps the outcome to the exit code.
pub fn main(command: ClientCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn dispatch(command: ClientCommand) -> Result<ExitCode, CliError> {
    let ok = |()| ExitCode::SUCCESS;
    match command {
        ClientCommand::Agent { conn, command } => agent::run(&conn, command).await.map(ok),
        ClientCommand::Workflow { conn, command } => workflow::run(&conn, command).await,
        ClientCommand::Run { conn, args } => run::run(&conn, args).await,
        ClientCommand::Logs { conn, args } => run::logs(&conn, args).await,
        ClientCommand::Sandbox { conn, command } => sandbox::run(&conn, command).await,
        ClientCommand::Tools { conn, command } => tools::run(&conn, command).await.map(ok),
        ClientCommand::Keys { conn, command } => keys::run(&conn, command).await.map(ok),
        ClientCommand::Audit { conn, command } => audit::run(&conn, command).await.map(ok),
        ClientCommand::Approvals { conn, command } => approvals::run(&conn, command).await.map(ok),
        ClientCommand::Seal { command } => seal::run(command).await.map(ok),
    }
}

/// Reads a JSON argument given inline, as `@FILE`, or as `@-` (stdin); usage errors name the
/// flag and what was wrong.
pub fn json_argument(flag: &str, raw: &str) -> Result<serde_json::Value, CliError> {
    let text = read_argument(flag, raw)?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{flag}: not valid JSON ({e}): {}", excerpt(&text))))
}

/// The text of an argument given inline, as `@FILE`, or as `@-` (stdin).
pub fn read_argument(flag: &str, raw: &str) -> Result<String, CliError> {
    match raw.strip_prefix('@') {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| CliError::Usage(format!("{flag}: cannot read stdin: {e}")))?;
            Ok(text)
        }
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| CliError::Usage(format!("{flag}: cannot read {path}: {e}"))),
        None => Ok(raw.to_owned()),
    }
}

fn excerpt(text: &str) -> String {
    let t = text.trim();
    if t.chars().count() > 80 {
        format!("{}...", t.chars().take(80).collect::<String>())
    } else {
        t.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_arguments_inline_and_from_files() {
        assert_eq!(
            json_argument("--input", r#"{"a": 1}"#).unwrap(),
            serde_json::json!({"a": 1})
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.json");
        std::fs::write(&path, "[1, 2]").unwrap();
        let arg = format!("@{}", path.display());
        assert_eq!(
            json_argument("--input", &arg).unwrap(),
            serde_json::json!([1, 2])
        );
        let e = json_argument("--input", "{nope").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("--input: not valid JSON"), "{e}");
        let e = json_argument("--input", "@/does/not/exist").unwrap_err();
        assert!(e.to_string().contains("cannot read /does/not/exist"), "{e}");
    }
}
