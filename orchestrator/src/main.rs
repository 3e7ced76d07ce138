//! The `orchestrator` command line: serve, check a config, apply migrations; and the clients of a
//! running node (SEAL calls, attestation tokens, approvals).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use orchestrator::app::Application;
use orchestrator::config::{self, LoadedConfig};
use orchestrator::{shutdown, store, telemetry};
use tokio_util::sync::CancellationToken;

/// Orchestrator for AI agents whose tool calls run in hardened, ephemeral containers.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Node config file (YAML). Every key can be overridden by the environment:
    /// ORCHESTRATOR__SECTION__KEY=value, plus DATABASE_URL and DOCKER_HOST.
    #[arg(long, global = true, env = "ORCHESTRATOR_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Connect to PostgreSQL (retrying while it comes up), apply migrations, serve REST and gRPC
    /// until SIGTERM or SIGINT.
    Serve {
        /// REST listen address (overrides server.http).
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
        /// gRPC listen address (overrides server.grpc).
        #[arg(long, value_name = "ADDR")]
        grpc: Option<std::net::SocketAddr>,
    },
    /// Validate the configuration and print the effective values (secrets redacted).
    CheckConfig,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Validate agent and workflow manifest files offline (schema and semantic checks against
    /// this build's tools and runtimes; references to deployed definitions are not checked).
    /// Prints PASS or FAIL per file with every error and note; exits 1 if any file fails.
    Validate {
        /// Manifest files (YAML or JSON), of either kind.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// SEAL client: attest to a gateway and call tools with signed envelopes; issue
    /// attestation tokens.
    Seal {
        #[command(subcommand)]
        command: SealCommand,
    },
    /// Privileged calls waiting for an operator: list, approve, reject (REST client).
    Approvals {
        #[command(flatten)]
        api: ApiArgs,
        #[command(subcommand)]
        command: ApprovalsCommand,
    },
}

/// Where the operator API is and the key to use.
#[derive(clap::Args, Clone)]
struct ApiArgs {
    /// REST base URL of the orchestrator.
    #[arg(
        long,
        global = true,
        env = "ORCHESTRATOR_URL",
        default_value = "http://127.0.0.1:8088"
    )]
    url: String,
    /// Operator API key (`aok_...`); approving and issuing tokens need an operator or admin key.
    #[arg(
        long,
        global = true,
        env = "ORCHESTRATOR_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
}

#[derive(Subcommand)]
enum ApprovalsCommand {
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

#[derive(Subcommand)]
enum TokenCommand {
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

#[derive(Subcommand)]
enum SealCommand {
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
        api: ApiArgs,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let client_command = match cli.command {
        Command::Seal { command } => Ok(ClientCommand::Seal(command)),
        Command::Approvals { api, command } => Ok(ClientCommand::Approvals(api, command)),
        other => Err(other),
    };
    if let Ok(command) = client_command {
        // The clients need no node configuration.
        return match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => match rt.block_on(client(command)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let Err(command) = client_command else {
        return ExitCode::FAILURE;
    };
    let env: Vec<(String, String)> = std::env::vars().collect();
    let loaded = match config::load(cli.config.as_deref(), &env) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(&loaded.config.log);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(command, loaded));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The subcommands that are clients of a running orchestrator.
enum ClientCommand {
    Seal(SealCommand),
    Approvals(ApiArgs, ApprovalsCommand),
}

async fn client(command: ClientCommand) -> anyhow::Result<()> {
    match command {
        ClientCommand::Seal(SealCommand::Token { api, command }) => {
            token_command(api, command).await
        }
        ClientCommand::Seal(command) => seal_command(command).await,
        ClientCommand::Approvals(api, command) => approvals_command(api, command).await,
    }
}

/// One operator API request; the JSON answer, or an error with the server's message.
async fn operator_request(
    api: &ApiArgs,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let key = api.api_key.as_deref().ok_or_else(|| {
        anyhow::anyhow!("give an operator API key with --api-key or ORCHESTRATOR_API_KEY")
    })?;
    let url = format!("{}{path}", api.url.trim_end_matches('/'));
    let mut request = reqwest::Client::new()
        .request(method, &url)
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    if !status.is_success() {
        let message = value["error"]["message"]
            .as_str()
            .or(value["message"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| value.to_string());
        anyhow::bail!("{url} answered {status}: {message}");
    }
    Ok(value)
}

async fn approvals_command(api: ApiArgs, command: ApprovalsCommand) -> anyhow::Result<()> {
    use reqwest::Method;
    let answer = match command {
        ApprovalsCommand::List { all } => {
            let path = if all {
                "/v1/approvals?all=true"
            } else {
                "/v1/approvals"
            };
            operator_request(&api, Method::GET, path, None).await?
        }
        ApprovalsCommand::Get { id } => {
            operator_request(&api, Method::GET, &format!("/v1/approvals/{id}"), None).await?
        }
        ApprovalsCommand::Approve { id, note } => {
            let path = format!("/v1/approvals/{id}/approve");
            operator_request(
                &api,
                Method::POST,
                &path,
                Some(serde_json::json!({"note": note})),
            )
            .await?
        }
        ApprovalsCommand::Reject { id, note } => {
            let path = format!("/v1/approvals/{id}/reject");
            operator_request(
                &api,
                Method::POST,
                &path,
                Some(serde_json::json!({"note": note})),
            )
            .await?
        }
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

async fn token_command(api: ApiArgs, command: TokenCommand) -> anyhow::Result<()> {
    use reqwest::Method;
    let answer = match command {
        TokenCommand::Issue {
            context,
            workload,
            ttl_secs,
        } => {
            let path = format!("/v1/security-contexts/{context}/attestation-tokens");
            let body = serde_json::json!({"workload_id": workload, "ttl_secs": ttl_secs});
            operator_request(&api, Method::POST, &path, Some(body)).await?
        }
        TokenCommand::List { context } => {
            let path = format!("/v1/security-contexts/{context}/attestation-tokens");
            operator_request(&api, Method::GET, &path, None).await?
        }
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}

async fn seal_command(command: SealCommand) -> anyhow::Result<()> {
    use orchestrator::seal_client::{SavedSession, SealClient, Transport};
    let load = |path: &PathBuf| -> anyhow::Result<SealClient> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot read {}: {e} (run `orchestrator seal attest` first)",
                path.display()
            )
        })?;
        let saved: SavedSession = serde_json::from_str(&text)?;
        Ok(SealClient::from_saved(&saved)?)
    };
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
            let mut client = SealClient::new(transport)?;
            let proof = orchestrator::seal_client::Proof { secret, token };
            let answer = client.attest_with(&workload, &context, &proof).await?;
            let saved = client
                .save()
                .ok_or_else(|| anyhow::anyhow!("the gateway returned no token"))?;
            std::fs::write(&session_file, serde_json::to_string_pretty(&saved)?)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&session_file, std::fs::Permissions::from_mode(0o600))?;
            }
            println!("{}", serde_json::to_string_pretty(&answer)?);
        }
        SealCommand::Call {
            name,
            arguments,
            session_file,
        } => {
            let client = load(&session_file)?;
            let arguments: serde_json::Value = serde_json::from_str(&arguments)
                .map_err(|e| anyhow::anyhow!("arguments must be a JSON object: {e}"))?;
            let result = client.call_tool(&name, arguments).await?;
            println!("{}", serde_json::to_string_pretty(&result)?);
        }
        SealCommand::Token { .. } => {
            anyhow::bail!("token subcommands are operator requests, handled by client()")
        }
        SealCommand::Tools { session_file } => {
            let client = load(&session_file)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&client.list_tools().await?)?
            );
        }
    }
    Ok(())
}

async fn run(command: Command, mut loaded: LoadedConfig) -> anyhow::Result<()> {
    match command {
        Command::Serve { http, grpc } => {
            if let Some(a) = http {
                loaded.config.server.http = a;
            }
            if let Some(a) = grpc {
                loaded.config.server.grpc = a;
            }
            let token = CancellationToken::new();
            shutdown::on_signal(token.clone());
            let app = tokio::select! {
                app = Application::build_from(loaded.config, loaded.path) => app?,
                _ = token.cancelled() => {
                    tracing::info!("shutdown requested during start-up");
                    return Ok(());
                }
            };
            app.run(token).await?;
        }
        Command::CheckConfig => {
            let shown = config::redacted(&loaded.config);
            print!("{}", serde_yaml::to_string(&shown)?);
        }
        Command::Migrate => {
            let pool = store::connect(&loaded.config.database).await?;
            let applied = store::migrate(&pool).await?;
            println!("applied {applied} migration(s)");
        }
        Command::Validate { files } => validate_files(&files, &loaded.config)?,
        Command::Seal { .. } | Command::Approvals { .. } => {
            anyhow::bail!("client subcommands are handled before the configuration is loaded")
        }
    }
    Ok(())
}

/// `orchestrator validate FILE...`: one line per file, then its errors and notes, indented.
fn validate_files(files: &[PathBuf], config: &config::NodeConfig) -> anyhow::Result<()> {
    let mut failed = 0;
    for file in files {
        let shown = file.display();
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) => {
                println!("FAIL {shown}\n  cannot read: {e}");
                failed += 1;
                continue;
            }
        };
        match orchestrator::tools::validate_offline(&text, config) {
            Err(errors) => {
                failed += 1;
                println!("FAIL {shown}");
                for e in errors.as_slice() {
                    println!("  error: {e}");
                }
            }
            Ok((kind, checked)) => {
                match &checked.manifest {
                    Ok(_) => println!("PASS {shown} ({kind})"),
                    Err(errors) => {
                        failed += 1;
                        println!("FAIL {shown} ({kind})");
                        for e in errors.as_slice() {
                            println!("  error: {e}");
                        }
                    }
                }
                for w in &checked.warnings {
                    println!("  note: {w}");
                }
            }
        }
    }
    println!("{} of {} valid", files.len() - failed, files.len());
    if failed > 0 {
        anyhow::bail!("{failed} of {} file(s) invalid", files.len());
    }
    Ok(())
}
