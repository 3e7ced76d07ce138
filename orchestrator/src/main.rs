//! The `orchestrator` command line: serve, check a config, apply migrations.

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
    /// SEAL client: attest to a gateway and call tools with signed envelopes.
    Seal {
        #[command(subcommand)]
        command: SealCommand,
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
    if let Command::Seal { command } = cli.command {
        // The client needs no node configuration.
        return match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => match rt.block_on(seal_command(command)) {
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
    let result = runtime.block_on(run(cli.command, loaded));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
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
        } => {
            let transport = if grpc {
                Transport::Grpc(url)
            } else {
                Transport::Http(url)
            };
            let mut client = SealClient::new(transport)?;
            let answer = client.attest(&workload, &context).await?;
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
        Command::Seal { .. } => {
            anyhow::bail!("seal subcommands are handled before the configuration is loaded")
        }
    }
    Ok(())
}
