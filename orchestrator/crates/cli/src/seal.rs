//! `orchestrator seal attest|call|tools|token`: a SEAL client (ephemeral key, signed envelopes,
//! over HTTP or gRPC) and the operator side of attestation tokens. Answers print as JSON: they
//! are SEAL documents, read by scripts.

use std::path::PathBuf;

use serde_json::json;

use super::client::{segment, Client};
use super::error::CliError;
use super::{output, Connection};
use crate::seal_client::{Proof, SavedSession, SealClient, Transport};

/// Attestation token verbs (operator side; REST with an API key).
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Issue a one-time attestation token for a context (printed once; hand it to the workload).
    Issue {
        /// Security context the token admits into.
        #[arg(long)]
        context: String,
        /// Only this workload id may use it.
        #[arg(long)]
        workload: Option<String>,
        /// Lifetime in seconds (default 3600).
        #[arg(long)]
        ttl_secs: Option<i64>,
    },
    /// The tokens of a context (never the tokens themselves).
    List {
        /// Security context.
        #[arg(long)]
        context: String,
    },
}

/// SEAL verbs.
#[derive(clap::Subcommand, Debug)]
pub enum SealCommand {
    /// Attest with a fresh ephemeral key; saves the session (key, token) to --session-file.
    Attest {
        /// Gateway URL: the REST base (http://127.0.0.1:8088) or, with --grpc, the gRPC endpoint.
        #[arg(long, default_value = "http://127.0.0.1:8088")]
        url: String,
        /// Speak gRPC (seal.v1.Gateway) instead of HTTP.
        #[arg(long)]
        grpc: bool,
        /// Workload identity to attest as.
        #[arg(long)]
        workload: String,
        /// Security context to ask for.
        #[arg(long)]
        context: String,
        /// Where to save the session (contains the private key: keep it private).
        #[arg(long, default_value = "seal-session.json")]
        session_file: PathBuf,
        /// The context's enrolment secret, as proof of identity.
        #[arg(long, env = "SEAL_ATTESTATION_SECRET", hide_env_values = true)]
        secret: Option<String>,
        /// A one-time attestation token from an operator, as proof of identity.
        #[arg(long, env = "SEAL_ATTESTATION_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Attestation tokens (operator side; REST with an API key).
    Token {
        #[command(flatten)]
        conn: Connection,
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Call a tool with a signed envelope, using a saved session.
    Call {
        /// Tool name, e.g. fs.read.
        name: String,
        /// Arguments as a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
        /// The session saved by `seal attest`.
        #[arg(long, default_value = "seal-session.json")]
        session_file: PathBuf,
    },
    /// List the tools the saved session may call.
    Tools {
        /// The session saved by `seal attest`.
        #[arg(long, default_value = "seal-session.json")]
        session_file: PathBuf,
    },
}

/// Runs one seal verb.
pub async fn run(command: SealCommand) -> Result<(), CliError> {
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(format!("{e:#}"));
    match command {
        SealCommand::Attest {
            url,
            grpc,
            workload,
            context,
            session_file,
            secret,
            token,
        } => {
            let transport = if grpc {
                Transport::Grpc(url)
            } else {
                Transport::Http(url)
            };
            let mut client = SealClient::new(transport).map_err(|e| failed(&e))?;
            let answer = client
                .attest_with(&workload, &context, &Proof { secret, token })
                .await
                .map_err(|e| failed(&e))?;
            let saved = client
                .save()
                .ok_or_else(|| CliError::Failed("the gateway returned no token".into()))?;
            let text = serde_json::to_string_pretty(&saved).map_err(|e| failed(&e))?;
            write_private(&session_file, &text)?;
            output::json(&answer);
        }
        SealCommand::Call {
            name,
            arguments,
            session_file,
        } => {
            let client = load(&session_file)?;
            let arguments: serde_json::Value = serde_json::from_str(&arguments)
                .map_err(|e| CliError::Usage(format!("ARGUMENTS must be a JSON object: {e}")))?;
            let result = client
                .call_tool(&name, arguments)
                .await
                .map_err(|e| failed(&e))?;
            output::json(&result);
        }
        SealCommand::Tools { session_file } => {
            let client = load(&session_file)?;
            output::json(&client.list_tools().await.map_err(|e| failed(&e))?);
        }
        SealCommand::Token { conn, command } => {
            let client = Client::new(&conn)?;
            let answer = match command {
                TokenCommand::Issue {
                    context,
                    workload,
                    ttl_secs,
                } => {
                    let path = format!(
                        "/v1/security-contexts/{}/attestation-tokens",
                        segment(&context)
                    );
                    client
                        .post(
                            &path,
                            json!({"workload_id": workload, "ttl_secs": ttl_secs}),
                        )
                        .await?
                }
                TokenCommand::List { context } => {
                    let path = format!(
                        "/v1/security-contexts/{}/attestation-tokens",
                        segment(&context)
                    );
                    client.get(&path).await?
                }
            };
            output::json(&answer);
        }
    }
    Ok(())
}

/// A saved session, or a message saying to attest first.
fn load(path: &PathBuf) -> Result<SealClient, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::Usage(format!(
            "cannot read {}: {e} (run `orchestrator seal attest` first)",
            path.display()
        ))
    })?;
    let saved: SavedSession = serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{} is not a saved session: {e}", path.display())))?;
    SealClient::from_saved(&saved).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
}

/// Writes a file only its owner may read (it holds a private key): created 0600, never
/// readable by others even for a moment.
fn write_private(path: &PathBuf, text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let fail =
        |e: std::io::Error| CliError::Failed(format!("cannot write {}: {e}", path.display()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        if path.exists() {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
        }
    }
    let mut file = options.open(path).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)
}
