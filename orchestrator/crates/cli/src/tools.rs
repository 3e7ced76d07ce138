//! `orchestrator tools list|call`.

use serde_json::{json, Value};

use super::client::{CliError, Client};
use super::output::{self, columns};
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
            if client.json {
                output::json(&out);
            } else {
                let cols = columns(&[("name", "name"), ("description", "description")]);
                print!(
                    "{}",
                    output::table(&out, &cols, "no tools visible to this key")
                );
            }
        }
        ToolsCommand::Call {
            name,
            arguments,
            sandbox,
        } => {
            let arguments = json_argument("ARGUMENTS", &arguments)?;
            let out = match sandbox {
                Some(id) => super::sandbox::call(&client, &id, &name, arguments).await?,
                None => {
                    let out = client
                        .post(
                            "/v1/tools/call",
                            json!({"name": name, "arguments": arguments}),
                        )
                        .await?;
                    result(&name, out)?
                }
            };
            output::json(&out);
        }
    }
    Ok(())
}

/// The structured result of an MCP-shaped tool answer; `isError` becomes a failed call.
pub fn result(tool: &str, answer: Value) -> Result<Value, CliError> {
    if answer["isError"] == true {
        let error = &answer["structuredContent"]["error"];
        let code = error["code"].as_str().unwrap_or("error");
        let message = error["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| answer["content"][0]["text"].to_string());
        let text = format!("{tool} failed ({code}): {message}");
        return Err(
            if matches!(code, "not_found" | "sandbox_gone" | "sandbox_unavailable") {
                CliError::NotFound(text)
            } else {
                CliError::Failed(text)
            },
        );
    }
    Ok(match answer.get("structuredContent") {
        Some(v) => v.clone(),
        None => answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_are_failed_calls_and_results_are_unwrapped() {
        let ok = json!({"content": [], "structuredContent": {"a": 1}, "isError": false});
        assert_eq!(result("t", ok).unwrap(), json!({"a": 1}));
        let bad = json!({"isError": true, "structuredContent": {"error": {"code": "not_found", "message": "no file x"}}});
        let e = result("fs.read", bad).unwrap_err();
        assert_eq!(e.exit_code(), 5);
        assert_eq!(e.to_string(), "fs.read failed (not_found): no file x");
    }
}
