//! `orchestrator tools list|call`.

use super::client::Client;
use super::error::CliError;
use super::output;
use super::tool_call;
use super::{json_argument, Connection};

/// Tool verbs.
#[derive(clap::Subcommand, Debug)]
pub enum ToolsCommand {
    /// The tools this key may call.
    List,
    /// Call one tool through the router (validated, authorised, audited like any call).
    Call {
        /// Tool name, e.g. aegis.agent.list or cmd.run.
        name: String,
        /// Arguments as a JSON object, `@FILE`, or `@-` for stdin.
        #[arg(default_value = "{}", value_name = "JSON|@FILE")]
        arguments: String,
        /// The sandbox `cmd.run` and `fs.*` act in (from `sandbox create`).
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
    },
}

/// Runs one tools verb.
pub async fn run(conn: &Connection, command: ToolsCommand) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    match command {
        ToolsCommand::List => {
            let out = client.get("/v1/tools").await?;
            let cols = [("name", "name"), ("description", "description")];
            output::listing(
                client.json,
                &out,
                &out,
                &cols,
                "no tools visible to this key",
            );
        }
        ToolsCommand::Call {
            name,
            arguments,
            sandbox,
        } => {
            let arguments = json_argument("ARGUMENTS", &arguments)?;
            let out = match sandbox {
                Some(id) => tool_call::call(&client, &id, &name, arguments).await?,
                None => tool_call::call_outside_sandboxes(&client, &name, arguments).await?,
            };
            output::json(&out);
        }
    }
    Ok(())
}
