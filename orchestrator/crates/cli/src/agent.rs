//! `orchestrator agent deploy|list|get|export|delete`, and `memories|forget` for what an agent
//! remembers across executions.

use reqwest::Method;

use super::client::{query, segment, Body, Client};
use super::error::CliError;
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
    /// The notes an agent saved in its memory across executions, newest first.
    Memories {
        /// Agent name (a deleted agent's memory is still listed).
        agent: String,
        /// Only this principal's notes (`api_key:<key id>`, ...), or `*` for a shared memory.
        #[arg(long)]
        owner: Option<String>,
        /// Most notes shown (1-500).
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Erase notes from an agent's memory for good: one (--note), one owner's, or all.
    Forget {
        /// Agent name.
        agent: String,
        /// Only this note.
        #[arg(long)]
        note: Option<uuid::Uuid>,
        /// Only this principal's notes, or `*` for a shared memory.
        #[arg(long)]
        owner: Option<String>,
    },
}

/// Runs one agent verb.
pub async fn run(conn: &Connection, command: AgentCommand) -> Result<(), CliError> {
    let verb = match command {
        AgentCommand::Memories {
            agent,
            owner,
            limit,
        } => return memories(conn, &agent, owner, limit).await,
        AgentCommand::Forget { agent, note, owner } => {
            return forget(conn, &agent, note, owner).await
        }
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
    };
    definitions(conn, "agent", "/v1/agents", verb).await
}

/// `agent memories`: `GET /v1/agents/{name}/memories`.
async fn memories(
    conn: &Connection,
    agent: &str,
    owner: Option<String>,
    limit: u32,
) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    let out = client
        .get(&format!(
            "/v1/agents/{}/memories{}",
            segment(agent),
            query(&[("owner", owner), ("limit", Some(limit.to_string()))])
        ))
        .await?;
    let cols = [
        ("saved", "created_at"),
        ("owner", "owner"),
        ("note", "content"),
        ("tags", "tags"),
        ("id", "note_id"),
    ];
    let empty = format!("agent {agent} remembers nothing");
    output::listing(client.json, &out, &out["notes"], &cols, &empty);
    Ok(())
}

/// `agent forget`: `DELETE /v1/agents/{name}/memories[/{note}]`.
async fn forget(
    conn: &Connection,
    agent: &str,
    note: Option<uuid::Uuid>,
    owner: Option<String>,
) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    let note_path = note.map(|n| format!("/{n}")).unwrap_or_default();
    let out = client
        .delete(&format!(
            "/v1/agents/{}/memories{note_path}{}",
            segment(agent),
            query(&[("owner", owner)])
        ))
        .await?;
    let erased = output::cell(&out["erased"]);
    output::done(
        client.json,
        &out,
        format!("erased {erased} note(s) of agent {agent}"),
    );
    Ok(())
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

/// Runs a definition verb against `/v1/agents` or `/v1/workflows`.
pub async fn definitions(
    conn: &Connection,
    noun: &str,
    base: &str,
    verb: DefinitionVerb,
) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    match verb {
        DefinitionVerb::Deploy { file, force } => deploy(&client, noun, base, &file, force).await?,
        DefinitionVerb::List => list(&client, noun, base).await?,
        DefinitionVerb::Get { name, version } => get(&client, noun, base, &name, version).await?,
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
            output::done(client.json, &out, format!("deleted {noun} {name}"));
        }
    }
    Ok(())
}

/// `deploy`: the file sent as YAML, the outcome said as deployed, revised or unchanged.
async fn deploy(
    client: &Client,
    noun: &str,
    base: &str,
    file: &str,
    force: bool,
) -> Result<(), CliError> {
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
    Ok(())
}

/// `list`: the definitions as a table, with the columns of the noun.
async fn list(client: &Client, noun: &str, base: &str) -> Result<(), CliError> {
    let mut out = client.get(base).await?;
    if client.json {
        output::json(&out);
    } else {
        if let Some(rows) = out.as_array_mut() {
            rows.iter_mut().for_each(derived_fields);
        }
        let mut cols = with_kind(
            noun,
            vec![("name", "name"), ("version", "version")],
            [("scope", "scope"), ("next run", "next_run")],
        );
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
    Ok(())
}

/// `get`: one definition as a record, with the fields of the noun.
async fn get(
    client: &Client,
    noun: &str,
    base: &str,
    name: &str,
    version: Option<String>,
) -> Result<(), CliError> {
    let mut out = client
        .get(&format!(
            "{base}/{}{}",
            segment(name),
            query(&[("version", version)])
        ))
        .await?;
    if client.json {
        output::json(&out);
    } else {
        derived_fields(&mut out);
        let leading = vec![
            ("name", "name"),
            ("version", "version"),
            ("id", "id"),
            ("scope", "scope"),
        ];
        let schedule = [("schedule", "schedule_text"), ("next run", "next_run")];
        let mut fields = with_kind(noun, leading, schedule);
        fields.extend([
            ("description", "description"),
            ("labels", "labels"),
            ("deployed", "created_at"),
            ("updated", "updated_at"),
        ]);
        print!("{}", output::record(&out, &fields));
    }
    Ok(())
}

/// `leading` (title, JSON field) and then the noun's own: `workflow` for a workflow, an agent's
/// type (see [`derived_fields`]) for an agent.
fn with_kind<'a>(
    noun: &str,
    mut leading: Vec<(&'a str, &'a str)>,
    workflow: [(&'a str, &'a str); 2],
) -> Vec<(&'a str, &'a str)> {
    if noun == "workflow" {
        leading.extend(workflow);
    } else {
        leading.push(("type", "type"));
    }
    leading
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
