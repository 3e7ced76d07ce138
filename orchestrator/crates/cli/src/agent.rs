//! `orchestrator agent deploy|list|get|export|delete`.

use reqwest::Method;

use super::client::{query, segment, Body, CliError, Client};
use super::output::{self, columns};
use super::{read_argument, Connection};

/// Agent verbs.
#[derive(clap::Subcommand, Debug)]
pub enum AgentCommand {
    /// Deploy a manifest (YAML or JSON) from a file, or `-` for stdin.
    Deploy {
        /// Manifest file.
        file: String,
        /// Overwrite the version if it is already deployed.
        #[arg(long)]
        force: bool,
    },
    /// Every agent with its latest version.
    List,
    /// One agent (latest version unless --agent-version).
    Get {
        /// Agent name or id.
        agent: String,
        /// A specific version.
        #[arg(long = "agent-version", value_name = "VERSION")]
        version: Option<String>,
    },
    /// Print an agent's manifest as YAML (what `deploy` takes back).
    Export {
        /// Agent name or id.
        agent: String,
        /// A specific version.
        #[arg(long = "agent-version", value_name = "VERSION")]
        version: Option<String>,
    },
    /// Delete an agent and all its versions.
    Delete {
        /// Agent name or id.
        agent: String,
    },
}

/// Runs one agent verb.
pub async fn run(conn: &Connection, command: AgentCommand) -> Result<(), CliError> {
    definitions(conn, "agent", "/v1/agents", command.into()).await
}

/// The verbs agents and workflows share, so both nouns behave the same.
pub enum DefinitionVerb {
    /// Deploy a manifest file.
    Deploy { file: String, force: bool },
    /// List.
    List,
    /// Show one.
    Get {
        name: String,
        version: Option<String>,
    },
    /// Print the YAML.
    Export {
        name: String,
        version: Option<String>,
    },
    /// Delete.
    Delete { name: String },
}

impl From<AgentCommand> for DefinitionVerb {
    fn from(c: AgentCommand) -> Self {
        match c {
            AgentCommand::Deploy { file, force } => DefinitionVerb::Deploy { file, force },
            AgentCommand::List => DefinitionVerb::List,
            AgentCommand::Get { agent, version } => DefinitionVerb::Get {
                name: agent,
                version,
            },
            AgentCommand::Export { agent, version } => DefinitionVerb::Export {
                name: agent,
                version,
            },
            AgentCommand::Delete { agent } => DefinitionVerb::Delete { name: agent },
        }
    }
}

/// Runs a definition verb against `/v1/agents` or `/v1/workflows`.
pub async fn definitions(
    conn: &Connection,
    noun: &str,
    base: &str,
    verb: DefinitionVerb,
) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    match verb {
        DefinitionVerb::Deploy { file, force } => {
            let text = if file == "-" {
                read_argument("FILE", "@-")?
            } else {
                read_argument("FILE", &format!("@{file}"))?
            };
            let path = format!(
                "{base}{}",
                query(&[("force", force.then(|| "true".into()))])
            );
            let out = client.send(Method::POST, &path, Body::Yaml(text)).await?;
            if client.json {
                output::json(&out);
            } else {
                // A forced deploy never rewrites a version: it adds a revision or changes nothing.
                let verb = if out["unchanged"] == true {
                    "unchanged"
                } else if out["replaced"] == true {
                    "revised"
                } else {
                    "deployed"
                };
                println!(
                    "{verb} {noun} {} {} revision {} ({}, {})",
                    output::cell(&out["name"]),
                    output::cell(&out["version"]),
                    output::cell(&out["revision"]),
                    output::cell(&out[format!("{noun}_id")]),
                    output::cell(&out["manifest_digest"])
                );
                for w in out["warnings"].as_array().into_iter().flatten() {
                    // Whole: a warning's reason is at its end (no table cell to fit).
                    eprintln!("warning: {}", w["message"].as_str().unwrap_or_default());
                }
            }
        }
        DefinitionVerb::List => {
            let mut out = client.get(base).await?;
            if client.json {
                output::json(&out);
            } else {
                if let Some(rows) = out.as_array_mut() {
                    rows.iter_mut().for_each(derived_fields);
                }
                let mut cols = vec![("name", "name"), ("version", "version")];
                if noun == "workflow" {
                    cols.extend([("scope", "scope"), ("next run", "next_run")]);
                } else {
                    cols.push(("type", "type"));
                }
                cols.extend([
                    ("description", "description"),
                    ("updated", "updated_at"),
                    ("id", "id"),
                ]);
                print!(
                    "{}",
                    output::table(&out, &columns(&cols), &format!("no {noun}s deployed"))
                );
            }
        }
        DefinitionVerb::Get { name, version } => {
            let mut out = client
                .get(&format!(
                    "{base}/{}{}",
                    segment(&name),
                    query(&[("version", version)])
                ))
                .await?;
            if client.json {
                output::json(&out);
            } else {
                derived_fields(&mut out);
                let mut fields = vec![
                    ("name", "name"),
                    ("version", "version"),
                    ("id", "id"),
                    ("scope", "scope"),
                ];
                if noun == "workflow" {
                    fields.extend([("schedule", "schedule_text"), ("next run", "next_run")]);
                } else {
                    fields.push(("type", "type"));
                }
                fields.extend([
                    ("description", "description"),
                    ("labels", "labels"),
                    ("deployed", "created_at"),
                    ("updated", "updated_at"),
                ]);
                print!("{}", output::record(&out, &fields));
            }
        }
        DefinitionVerb::Export { name, version } => {
            let out = client
                .get(&format!(
                    "{base}/{}{}",
                    segment(&name),
                    query(&[("version", version)])
                ))
                .await?;
            if client.json {
                output::json(&out["manifest"]);
            } else {
                let yaml = out["manifest_yaml"].as_str().unwrap_or_default();
                print!("{yaml}");
                if !yaml.ends_with('\n') {
                    println!();
                }
            }
        }
        DefinitionVerb::Delete { name } => {
            // The route takes the id; a name is resolved first (a missing one is then 5).
            let id = match uuid::Uuid::parse_str(&name) {
                Ok(id) => id.to_string(),
                Err(_) => {
                    let found = client.get(&format!("{base}/{}", segment(&name))).await?;
                    found["id"].as_str().unwrap_or_default().to_owned()
                }
            };
            let out = client.delete(&format!("{base}/{}", segment(&id))).await?;
            if client.json {
                output::json(&out);
            } else {
                println!("deleted {noun} {name}");
            }
        }
    }
    Ok(())
}

/// Fields the tables show that the node's JSON holds elsewhere: an agent's `type` (AEGIS's
/// `spec.type`, `user` when not written), a workflow's schedule and the start of its next run.
fn derived_fields(row: &mut serde_json::Value) {
    let agent_type = row["manifest"]["spec"]["type"]
        .as_str()
        .unwrap_or("user")
        .to_owned();
    let schedule = row["schedule"].clone();
    let Some(map) = row.as_object_mut() else {
        return;
    };
    if map.get("manifest").is_some_and(|m| m["kind"] == "Agent") {
        map.insert("type".into(), agent_type.into());
    }
    if schedule.is_object() {
        let mut text = format!(
            "{} ({})",
            schedule["cron"].as_str().unwrap_or_default(),
            schedule["timezone"].as_str().unwrap_or("UTC")
        );
        if let Some(jitter) = schedule["jitter_seconds"].as_u64().filter(|j| *j > 0) {
            text.push_str(&format!(", jitter up to {jitter} s"));
        }
        if schedule["enabled"] == false {
            text.push_str(", disabled");
        }
        map.insert("schedule_text".into(), text.into());
        map.insert("next_run".into(), schedule["next_run_at"].clone());
    }
}
