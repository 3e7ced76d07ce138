//! The `orchestrator` command line: serve, check a config, apply migrations, print the admin
//! key; and the operator client verbs of `orchestrator::cli` (agents, runs, logs, sandboxes,
//! tools, keys, audit, approvals, SEAL), which talk to a running node over REST.

use std::path::PathBuf;
use std::process::ExitCode;

use aegis_cli as cli;
use clap::{Parser, Subcommand};
use orchestrator::app::Application;
use orchestrator::config::{self, LoadedConfig};
use orchestrator::{database, shutdown, telemetry};
use tokio_util::sync::CancellationToken;

/// Orchestrator for AI agents whose tool calls run in hardened, ephemeral containers.
///
/// Exit codes of the client verbs: 0 ok, 1 the call failed or was refused, 2 usage,
/// 3 cannot reach the node, 4 authentication or permission, 5 not found.
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
    /// Print this node's admin API key: the configured one (ORCHESTRATOR_ADMIN_KEY), else the
    /// one in auth.admin_key_file (under compose:
    /// `docker-compose exec orchestrator orchestrator admin-key`).
    AdminKey,
    /// Validate agent and workflow manifest files offline (schema and semantic checks against
    /// this build's tools and runtimes; references to deployed definitions are not checked).
    /// Prints PASS or FAIL per file with every error and note; exits 1 if any file fails.
    Validate {
        /// Manifest files (YAML or JSON), of either kind.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    #[command(flatten)]
    Client(cli::ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        // The clients need no node configuration.
        Command::Client(command) => return cli::main(command),
        other => other,
    };
    let env: Vec<(String, String)> = std::env::vars().collect();
    let loaded = match config::load(cli.config.as_deref(), &env) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Command::AdminKey = command {
        return admin_key(&loaded);
    }
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

/// `orchestrator admin-key`: prints the key on stdout, or says where it should be and why not.
fn admin_key(loaded: &LoadedConfig) -> ExitCode {
    let auth = &loaded.config.auth;
    if let Some(key) = &auth.admin_key {
        println!("{key}");
        return ExitCode::SUCCESS;
    }
    let Some(path) = &auth.admin_key_file else {
        eprintln!(
            "error: this node has no ORCHESTRATOR_ADMIN_KEY and no auth.admin_key_file, so its \
             first start printed a generated key once in its log; if that is lost, set \
             ORCHESTRATOR_ADMIN_KEY=aok_<64 hex> (e.g. aok_$(openssl rand -hex 32)) and restart: \
             the node registers it as an admin key"
        );
        return ExitCode::FAILURE;
    };
    match orchestrator::auth::key_file::read(path) {
        Ok(Some(key)) => {
            println!("{key}");
            ExitCode::SUCCESS
        }
        Ok(None) => {
            eprintln!(
                "error: no admin key file at {} yet: the node writes it at its first start \
                 (is it running? see its log)",
                path.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
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
            let pool = database::connect(&loaded.config.database).await?;
            let applied = database::migrate(&pool).await?;
            println!("applied {applied} migration(s)");
        }
        Command::Validate { files } => validate_files(&files, &loaded.config)?,
        Command::AdminKey | Command::Client(_) => {
            anyhow::bail!("admin-key and the client verbs are handled before this point")
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
