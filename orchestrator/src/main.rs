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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    }
    Ok(())
}
