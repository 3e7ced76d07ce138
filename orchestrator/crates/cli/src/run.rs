//! `run AGENT` (start an execution, optionally follow it to its end) and `logs EXECUTION` (the
//! event log of an agent or a workflow execution, as a page or live), sharing one follower of
//! the SSE endpoints.

use std::process::ExitCode;

use serde_json::{json, Value};

use super::client::{query, segment, Client};
use super::error::CliError;
use super::output::{self, clip};
use super::{json_argument, sse, Connection};

/// `run` arguments.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Agent name or id.
    pub agent: String,
    /// Input as JSON, `@FILE`, or `@-` for stdin (checked against the agent's input_schema).
    #[arg(long, value_name = "JSON|@FILE")]
    pub input: Option<String>,
    /// What the agent should do, in words.
    #[arg(long)]
    pub intent: Option<String>,
    /// Agent version (default: the latest).
    #[arg(long = "agent-version", value_name = "VERSION")]
    pub version: Option<String>,
    /// Print the events live and wait for the end; exit 1 unless it completed.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// `logs` arguments.
#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    /// Execution id (an agent's or a workflow's).
    pub execution: String,
    /// Keep printing events until the execution ends.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only events after this sequence number.
    #[arg(long, default_value_t = 0)]
    pub after: i64,
}

/// Which engine an execution belongs to: the routes differ, the log does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/executions/{id}`.
    Agent,
    /// `/v1/workflows/executions/{id}`.
    Workflow,
}

impl Kind {
    fn path(self, id: &str) -> String {
        match self {
            Kind::Agent => format!("/v1/executions/{}", segment(id)),
            Kind::Workflow => format!("/v1/workflows/executions/{}", segment(id)),
        }
    }
}

/// `orchestrator run`.
pub async fn run(conn: &Connection, args: RunArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(conn)?;
    let input = match &args.input {
        Some(raw) => json_argument("--input", raw)?,
        None => json!({}),
    };
    let mut body = json!({"input": input});
    if let Some(intent) = args.intent {
        body["intent"] = json!(intent);
    }
    let path = format!(
        "/v1/agents/{}/execute{}",
        segment(&args.agent),
        query(&[("version", args.version)])
    );
    let started = client.post(&path, body).await?;
    let id = started["execution_id"]
        .as_str()
        .ok_or_else(|| {
            CliError::Failed(format!(
                "the node answered without an execution id: {started}"
            ))
        })?
        .to_owned();
    if !args.follow {
        if client.json {
            output::json(&started);
        } else {
            println!("{id}");
            output::progress(&format!(
                "started execution {id} of {}; follow it with `orchestrator logs {id} --follow`",
                args.agent
            ));
        }
        return Ok(ExitCode::SUCCESS);
    }
    output::progress(&format!(
        "execution {id} of {} started; following its events",
        args.agent
    ));
    finish(&client, Kind::Agent, &id, 0).await
}

/// `orchestrator workflow run --follow` ends here too.
pub async fn follow_workflow(client: &Client, id: &str) -> Result<ExitCode, CliError> {
    finish(client, Kind::Workflow, id, 0).await
}

/// `orchestrator logs`.
pub async fn logs(conn: &Connection, args: LogsArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(conn)?;
    let kind = kind_of(&client, &args.execution).await?;
    if args.follow {
        return finish(&client, kind, &args.execution, args.after).await;
    }
    let mut after = args.after;
    let mut all = Vec::new();
    loop {
        let page = client
            .get(&format!(
                "{}/events?after={after}&limit=500",
                kind.path(&args.execution)
            ))
            .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            break;
        }
        after = events
            .last()
            .and_then(|e| e["seq"].as_i64())
            .unwrap_or(after);
        if !client.json {
            for e in &events {
                println!("{}", event_line(e));
            }
        }
        all.extend(events);
        if page["next_after"].is_null() {
            break;
        }
    }
    if client.json {
        output::json(&Value::Array(all));
    }
    Ok(ExitCode::SUCCESS)
}

/// Finds whether an id is an agent or a workflow execution (agent first).
async fn kind_of(client: &Client, id: &str) -> Result<Kind, CliError> {
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(CliError::Usage(format!(
            "`{id}` is not an execution id (a UUID, as `run` and `workflow run` print)"
        )));
    }
    match client.get(&Kind::Agent.path(id)).await {
        Ok(_) => Ok(Kind::Agent),
        Err(CliError::NotFound(_)) => match client.get(&Kind::Workflow.path(id)).await {
            Ok(_) => Ok(Kind::Workflow),
            Err(CliError::NotFound(_)) => Err(CliError::NotFound(format!(
                "no agent or workflow execution {id} (or not one this key may see)"
            ))),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// Follows the log to its end, then prints the outcome; exit 0 only for `completed`.
async fn finish(client: &Client, kind: Kind, id: &str, after: i64) -> Result<ExitCode, CliError> {
    follow(client, kind, id, after).await?;
    let execution = client.get(&kind.path(id)).await?;
    let status = execution["status"].as_str().unwrap_or("unknown").to_owned();
    if client.json {
        output::json(&json!({"event_type": "result", "execution": execution}));
    } else {
        let result = match kind {
            Kind::Agent => &execution["last_output"],
            Kind::Workflow => &execution["final_output"],
        };
        match result {
            Value::Null => {}
            Value::String(s) => println!("{s}"),
            other => println!(
                "{}",
                serde_json::to_string_pretty(other).unwrap_or_default()
            ),
        }
    }
    if status == "completed" {
        output::progress(&format!("execution {id}: completed"));
        return Ok(ExitCode::SUCCESS);
    }
    let why = execution["last_error"]
        .as_str()
        .or(execution["error"].as_str())
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    Err(CliError::Failed(format!(
        "execution {id} ended {status}{why}"
    )))
}

/// Prints events from the SSE follow endpoint until its `end` message, reconnecting after the
/// last event seen if the stream breaks (at most 5 times in a row).
async fn follow(client: &Client, kind: Kind, id: &str, mut after: i64) -> Result<(), CliError> {
    let mut failures = 0;
    loop {
        let path = format!("{}/events?follow=true&after={after}", kind.path(id));
        let mut response = client.open(&path).await?;
        let mut parser = sse::Parser::default();
        let mut last_event = std::time::Instant::now();
        let mut last_progress = last_event;
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    output::progress(&format!("the event stream broke ({e}); reconnecting"));
                    break;
                }
            };
            for message in parser.push(&chunk) {
                match message.event.as_str() {
                    "events" => {
                        let events: Vec<Value> =
                            serde_json::from_str(&message.data).unwrap_or_default();
                        for e in events {
                            after = e["seq"].as_i64().unwrap_or(after).max(after);
                            if client.json {
                                println!("{e}");
                            } else {
                                println!("{}", event_line(&e));
                            }
                        }
                        failures = 0;
                        last_event = std::time::Instant::now();
                    }
                    "end" => return Ok(()),
                    _ => {}
                }
            }
            // Keep-alives arrive every 15 s: say that the wait goes on (on a terminal only).
            if last_event.elapsed().as_secs() >= 10 && last_progress.elapsed().as_secs() >= 10 {
                let quiet = last_event.elapsed().as_secs();
                output::progress(&format!(
                    "... {id} still running, no new event for {quiet} s"
                ));
                last_progress = std::time::Instant::now();
            }
        }
        failures += 1;
        if failures > 5 {
            return Err(CliError::Unreachable {
                url: client.base().to_owned(),
                reason: format!("the event stream of {id} kept breaking off"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// One event as a line: `#seq  type  [state]  summary`.
pub fn event_line(e: &Value) -> String {
    let seq = e["seq"].as_i64().unwrap_or(0);
    let kind = e["event_type"].as_str().unwrap_or("?");
    let state = e["state_name"]
        .as_str()
        .map(|s| format!(" [{s}]"))
        .unwrap_or_default();
    format!("#{seq:<4} {kind}{state}  {}", summary(kind, &e["payload"]))
}

/// The few payload fields worth a line, else the payload as compact JSON, cut.
fn summary(kind: &str, payload: &Value) -> String {
    let pick = |keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter_map(|k| {
                let v = &payload[*k];
                (!v.is_null()).then(|| format!("{k}={}", output::cell(v)))
            })
            .collect()
    };
    let picked = match kind {
        "tool_call" | "tool_result" => pick(&["tool", "name", "decision", "is_error", "error"]),
        "console_output" => pick(&["exit_code", "stdout", "stderr"]),
        "execution_failed" | "failed" => pick(&["error", "reason"]),
        _ => Vec::new(),
    };
    if picked.is_empty() {
        clip(&payload.to_string(), 160)
    } else {
        picked.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_print_as_one_line_each() {
        let e = json!({"seq": 4, "event_type": "human_input_requested", "state_name": "APPROVE",
                       "payload": {"prompt": "Ship?"}});
        assert_eq!(
            event_line(&e),
            "#4    human_input_requested [APPROVE]  {\"prompt\":\"Ship?\"}"
        );
        let e = json!({"seq": 7, "event_type": "tool_call",
                       "payload": {"tool": "cmd.run", "arguments": {"command": "ls"}}});
        assert_eq!(event_line(&e), "#7    tool_call  tool=cmd.run");
    }
}
