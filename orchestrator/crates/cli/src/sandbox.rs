//! `orchestrator sandbox create|list|exec|read|write|rm`: a sandbox and a command in two lines,
//! `ID=$(orchestrator sandbox create --runtime shell)` then `orchestrator sandbox exec $ID -- ls -la`.

use std::io::Write;
use std::process::ExitCode;

use base64::Engine as _;
use serde_json::{json, Value};

use super::client::{segment, Client};
use super::error::CliError;
use super::output;
use super::tool_call::call;
use super::{read_argument, Connection};

/// Sandbox verbs.
#[derive(clap::Subcommand, Debug)]
pub enum SandboxCommand {
    /// Create a sandbox from a runtime (any program may run, in /workspace, without a shell or
    /// network) or from an agent's manifest (its allowlists); prints the sandbox id.
    Create {
        /// Runtime `LANGUAGE` or `LANGUAGE:VERSION` from `aegis.runtime.list` (e.g. shell, python:3.11).
        #[arg(long, conflicts_with = "agent", required_unless_present = "agent")]
        runtime: Option<String>,
        /// With --runtime: only these programs (or `program subcommand` entries) may run.
        #[arg(long = "allow", value_name = "COMMAND", requires = "runtime")]
        allow: Vec<String>,
        /// Agent name or id whose manifest decides image, limits and allowlists.
        #[arg(long)]
        agent: Option<String>,
        /// With --agent: a specific version.
        #[arg(long = "agent-version", value_name = "VERSION", requires = "agent")]
        version: Option<String>,
    },
    /// Live sandboxes.
    List,
    /// Run a command (no shell: argv as given) and print its output; exits with its exit code.
    Exec {
        /// Sandbox id.
        id: String,
        /// Working directory (default /workspace).
        #[arg(long)]
        cwd: Option<String>,
        /// Deadline in seconds (may only lower the node's ceiling).
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Print a file of the sandbox.
    Read {
        /// Sandbox id.
        id: String,
        /// Path (relative ones are under /workspace).
        path: String,
    },
    /// Write a file into the sandbox from --content, --from FILE, or stdin.
    Write {
        /// Sandbox id.
        id: String,
        /// Path (relative ones are under /workspace).
        path: String,
        /// The content.
        #[arg(long, conflicts_with = "from")]
        content: Option<String>,
        /// Read the content from this local file (`-` for stdin, the default).
        #[arg(long, value_name = "FILE")]
        from: Option<String>,
    },
    /// Destroy a sandbox and its workspace.
    Rm {
        /// Sandbox id.
        id: String,
    },
}

/// Runs one sandbox verb.
pub async fn run(conn: &Connection, command: SandboxCommand) -> Result<ExitCode, CliError> {
    let client = Client::new(conn)?;
    match command {
        SandboxCommand::Create {
            runtime,
            allow,
            agent,
            version,
        } => create(&client, runtime, allow, agent, version).await?,
        SandboxCommand::List => {
            let out = client.get("/v1/sandboxes").await?;
            let cols = [
                ("id", "id"),
                ("state", "state"),
                ("image", "image"),
                ("owner", "owner.kind"),
                ("agent", "spec.labels.agent"),
                ("created", "created_at"),
            ];
            output::listing(client.json, &out, &out, &cols, "no sandboxes");
        }
        SandboxCommand::Exec {
            id,
            cwd,
            timeout,
            command,
        } => return exec(&client, &id, cwd, timeout, &command).await,
        SandboxCommand::Read { id, path } => {
            let out = call(&client, &id, "fs.read", json!({"path": path})).await?;
            if client.json {
                output::json(&out);
            } else {
                let mut stdout = std::io::stdout();
                let ends_line = write_stream(&mut stdout, &out, "content")?;
                // On a terminal, a file without a final newline would leave the prompt on its
                // last line; into a pipe or a file the bytes go exactly as stored.
                if !ends_line && std::io::IsTerminal::is_terminal(&stdout) {
                    println!();
                }
            }
        }
        SandboxCommand::Write {
            id,
            path,
            content,
            from,
        } => {
            let content = match (content, from) {
                (Some(c), _) => c,
                (None, Some(f)) if f != "-" => read_argument("--from", &format!("@{f}"))?,
                _ => read_argument("stdin", "@-")?,
            };
            let out = call(
                &client,
                &id,
                "fs.write",
                json!({"path": path, "content": content}),
            )
            .await?;
            let wrote = output::cell(&out["path"]);
            output::done(client.json, &out, format!("wrote {wrote}"));
        }
        SandboxCommand::Rm { id } => {
            let out = client
                .delete(&format!("/v1/sandboxes/{}", segment(&id)))
                .await?;
            output::done(client.json, &out, format!("removed sandbox {id}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `create`: the request body from a runtime (with its allowed commands) or an agent.
async fn create(
    client: &Client,
    runtime: Option<String>,
    allow: Vec<String>,
    agent: Option<String>,
    version: Option<String>,
) -> Result<(), CliError> {
    let body = match (runtime, agent) {
        (Some(runtime), _) => {
            let mut b = json!({"runtime": runtime});
            if !allow.is_empty() {
                b["allow"] = json!(allow);
            }
            b
        }
        (None, Some(agent)) => json!({"agent": agent, "version": version}),
        (None, None) => {
            return Err(CliError::Usage("give --runtime or --agent".into()));
        }
    };
    output::progress("creating the sandbox (the first one of an image takes a few seconds)");
    let out = client.post("/v1/sandboxes", body).await?;
    output::done(client.json, &out, output::cell(&out["sandbox_id"]));
    Ok(())
}

/// `exec`: runs the command and exits with its exit code (1 when it has none that fits).
async fn exec(
    client: &Client,
    id: &str,
    cwd: Option<String>,
    timeout: Option<u64>,
    command: &[String],
) -> Result<ExitCode, CliError> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| CliError::Usage("give the command after `--`".into()))?;
    let mut arguments = json!({"command": shell_words::quote(program), "args": args});
    if let Some(cwd) = cwd {
        arguments["cwd"] = json!(cwd);
    }
    if let Some(t) = timeout {
        arguments["timeout_secs"] = json!(t);
    }
    let out = call(client, id, "cmd.run", arguments).await?;
    if client.json {
        output::json(&out);
    }
    let code = out["exit_code"].as_i64().unwrap_or(-1);
    if !client.json {
        write_stream(&mut std::io::stdout(), &out, "stdout")?;
        write_stream(&mut std::io::stderr(), &out, "stderr")?;
        if out["timed_out"] == true {
            eprintln!("error: the command timed out");
        }
        if let Some(notice) = out["notice"].as_str() {
            eprintln!("note: {notice}");
        }
    }
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// Writes `value[field]` as bytes, decoding base64 when `value[field_encoding]` says so; true
/// when what it wrote ends with a newline (or is empty).
fn write_stream(to: &mut dyn Write, value: &Value, field: &str) -> Result<bool, CliError> {
    let text = value[field].as_str().unwrap_or_default();
    let encoding = value[format!("{field}_encoding")]
        .as_str()
        .or(if field == "content" {
            value["encoding"].as_str()
        } else {
            None
        })
        .unwrap_or("utf-8");
    let bytes = if encoding == "base64" {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| {
                CliError::Failed(format!("the node sent {field} as invalid base64: {e}"))
            })?
    } else {
        text.as_bytes().to_vec()
    };
    to.write_all(&bytes)
        .and_then(|()| to.flush())
        .map_err(|e| CliError::Failed(format!("cannot write {field}: {e}")))?;
    Ok(bytes.last().is_none_or(|b| *b == b'\n'))
}
