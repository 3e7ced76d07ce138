//! `orchestrator workflow deploy|list|get|export|delete|run|signal|cancel`.

use std::process::ExitCode;

use serde_json::json;

use super::agent::{definitions, DefinitionVerb};
use super::client::{segment, Client};
use super::error::CliError;
use super::output;
use super::{json_argument, Connection};

/// Workflow verbs.
#[derive(clap::Subcommand, Debug)]
pub enum WorkflowCommand {
    /// Deploy a manifest (YAML or JSON) from a file, or `-` for stdin.
    Deploy {
        /// Manifest file.
        file: String,
        /// Overwrite the version if it is already deployed.
        #[arg(long)]
        force: bool,
    },
    /// Every workflow this tenant sees, with its latest version.
    List,
    /// One workflow.
    Get {
        /// Workflow name or id.
        workflow: String,
        /// A specific version.
        #[arg(long = "workflow-version", value_name = "VERSION")]
        version: Option<String>,
    },
    /// Print a workflow's manifest as YAML.
    Export {
        /// Workflow name or id.
        workflow: String,
        /// A specific version.
        #[arg(long = "workflow-version", value_name = "VERSION")]
        version: Option<String>,
    },
    /// Delete a workflow and all its versions.
    Delete {
        /// Workflow name or id.
        workflow: String,
    },
    /// Start an execution; prints its id, or with --follow its events and final output.
    Run {
        /// Workflow name or id.
        workflow: String,
        /// Input as JSON, `@FILE`, or `@-` for stdin.
        #[arg(long, value_name = "JSON|@FILE")]
        input: Option<String>,
        /// What the workflow should achieve, in words (`{{intent}}`).
        #[arg(long)]
        intent: Option<String>,
        /// Workflow version (default: the latest).
        #[arg(long = "workflow-version", value_name = "VERSION")]
        version: Option<String>,
        /// Print the events live and wait for the end; exit 1 unless it completed.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Answer the Human state an execution waits in.
    Signal {
        /// Workflow execution id.
        execution: String,
        /// The answer (e.g. yes / no).
        #[arg(long)]
        response: String,
    },
    /// Cancel a workflow execution.
    Cancel {
        /// Workflow execution id.
        execution: String,
    },
}

/// Runs one workflow verb.
pub async fn run(conn: &Connection, command: WorkflowCommand) -> Result<ExitCode, CliError> {
    let base = "/v1/workflows";
    let verb = match command {
        WorkflowCommand::Deploy { file, force } => DefinitionVerb::Deploy { file, force },
        WorkflowCommand::List => DefinitionVerb::List,
        WorkflowCommand::Get { workflow, version } => DefinitionVerb::Get {
            name: workflow,
            version,
        },
        WorkflowCommand::Export { workflow, version } => DefinitionVerb::Export {
            name: workflow,
            version,
        },
        WorkflowCommand::Delete { workflow } => DefinitionVerb::Delete { name: workflow },
        WorkflowCommand::Run {
            workflow,
            input,
            intent,
            version,
            follow,
        } => {
            let client = Client::new(conn)?;
            let mut body = json!({"input": match &input {
                Some(raw) => json_argument("--input", raw)?,
                None => json!({}),
            }});
            if let Some(intent) = intent {
                body["intent"] = json!(intent);
            }
            if let Some(version) = version {
                body["version"] = json!(version);
            }
            let out = client
                .post(&format!("{base}/{}/run", segment(&workflow)), body)
                .await?;
            let id = out["execution_id"].as_str().unwrap_or_default().to_owned();
            if follow {
                output::progress(&format!(
                    "workflow execution {id} started; following its events"
                ));
                return super::run::follow_workflow(&client, &id).await;
            }
            if client.json {
                output::json(&out);
            } else {
                println!("{id}");
                output::progress(&format!(
                    "started workflow execution {id}; follow it with `orchestrator logs {id} --follow`"
                ));
            }
            return Ok(ExitCode::SUCCESS);
        }
        WorkflowCommand::Signal {
            execution,
            response,
        } => {
            let client = Client::new(conn)?;
            let out = client
                .post(
                    &format!("{base}/executions/{}/signal", segment(&execution)),
                    json!({"response": response}),
                )
                .await?;
            if client.json {
                output::json(&out);
            } else {
                println!("signalled {execution}: {}", output::cell(&out["state"]));
            }
            return Ok(ExitCode::SUCCESS);
        }
        WorkflowCommand::Cancel { execution } => {
            let client = Client::new(conn)?;
            let out = client
                .post(
                    &format!("{base}/executions/{}/cancel", segment(&execution)),
                    json!({}),
                )
                .await?;
            if client.json {
                output::json(&out);
            } else {
                println!("cancelled {execution}");
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    definitions(conn, "workflow", base, verb)
        .await
        .map(|()| ExitCode::SUCCESS)
}
