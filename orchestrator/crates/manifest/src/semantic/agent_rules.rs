//! The semantic rules of an agent manifest: its tools (built-in and `mcp:` entries), runtime,
//! paths, dispatchers, volumes, JSON schemas, validators and output handler.

use std::collections::HashSet;

use serde_json::Value;

use super::{array_at, indexed, strings_at, Errors};
use crate::agent::{AgentView, CMD_DISPATCHER, CMD_RUN, MEMORY_TOOLS};
use crate::normalise::MCP_PREFIX;
use crate::volumes::paths_overlap;
use crate::{pointer, NodeKnowledge};

pub(super) fn agent(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    let memory = AgentView(value).memory().is_some();
    for (i, tool) in strings_at(value, "/spec/tools") {
        let at = pointer::join_index("/spec/tools", i);
        if let Some(rest) = tool.strip_prefix(MCP_PREFIX) {
            if let Some(problem) = mcp_entry(rest, node) {
                errors.push(at, problem);
            }
        } else if !(node.tool_exists)(tool) {
            errors.push(
                at,
                format!("unknown tool `{tool}`: this node has no tool of that name"),
            );
        } else if MEMORY_TOOLS.contains(&tool) && !memory {
            errors.push(
                pointer::join_index("/spec/tools", i),
                format!(
                    "`{tool}` reads and writes the agent's memory across executions, which is \
                     off: set `spec.execution.memory: true` (the memory tools are then offered \
                     without being listed here)"
                ),
            );
        }
    }
    runtime(value, node, errors);
    for list in ["read", "write"] {
        let at = format!("/spec/security/filesystem/{list}");
        for (i, path) in strings_at(value, &at) {
            if let Err(problem) = check_path(path) {
                errors.push(pointer::join_index(&at, i), problem);
            }
        }
    }
    dispatchers(value, node, errors);
    volumes(value, node, errors);
    if let Some(schema) = value.pointer("/spec/input_schema") {
        check_json_schema("/spec/input_schema", schema, errors);
    }
    for (i, validator) in array_at(value, "/spec/execution/validation") {
        let at = format!("/spec/execution/validation/{i}");
        validator_rules(&at, validator, errors);
    }
    if let Some(handler) = value.pointer("/spec/output_handler") {
        output_handler("/spec/output_handler", handler, node, errors);
    }
}

/// `mcp:<server>` or `mcp:<server>/<tool>` (after normalisation, which rewrote `mcp:<built-in>`):
/// the server must be one of the node's. Whether the tool exists is the server's to say, at run
/// time (a server may be down at deploy time, and its tools change).
pub(super) fn mcp_entry(rest: &str, node: &NodeKnowledge<'_>) -> Option<String> {
    let server = rest.split_once('/').map_or(rest, |(server, _)| server);
    if node.mcp_servers.iter().any(|s| s == server) {
        return None;
    }
    let configured = if node.mcp_servers.is_empty() {
        "this node has no external MCP servers (node config `mcp_servers`)".to_owned()
    } else {
        format!(
            "the node's MCP servers are: {} (node config `mcp_servers`)",
            node.mcp_servers.join(", ")
        )
    };
    Some(if server.contains('.') {
        format!(
            "`{MCP_PREFIX}{rest}` names neither a built-in tool (see aegis.tools.list) nor an \
             MCP server of this node; {configured}"
        )
    } else {
        format!(
            "`{MCP_PREFIX}{rest}` names the MCP server `{server}`, which this node does not \
             have; {configured}"
        )
    })
}

pub(super) fn runtime(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    let Some(runtime) = value.pointer("/spec/runtime") else {
        return;
    };
    if runtime.get("image").is_some() {
        return;
    }
    let language = runtime.get("language").and_then(Value::as_str);
    let version = runtime.get("version").and_then(Value::as_str);
    if let (Some(language), Some(version)) = (language, version) {
        if !(node.runtime_known)(language, version) {
            let versions = (node.runtime_versions)(language);
            let installed = if versions.is_empty() {
                format!("this node has no `{language}` runtime (see aegis.runtime.list)")
            } else {
                let list: Vec<String> = versions.iter().map(|v| format!("\"{v}\"")).collect();
                format!("write `version: {}` instead", list.join("` or `version: "))
            };
            errors.push(
                "/spec/runtime",
                format!(
                    "unknown runtime `{language}` `{version}`: not in this node's runtime registry \
                     and no custom `image` is given; {installed}, or ask the operator to map it to \
                     an installed runtime in the node config (`sandbox.runtime_aliases: \
                     {{\"{language}:{version}\": \"<language>:<version>\"}}`)"
                ),
            );
        }
    }
}

/// Allowlist paths: absolute or relative, but normalised and without `..`, so that what the
/// author reads is exactly what the sandbox resolves.
pub(super) fn check_path(path: &str) -> Result<(), String> {
    let body = path.strip_prefix('/').unwrap_or(path);
    if path.is_empty() {
        return Err("a path must not be empty".to_owned());
    }
    if path == "/" {
        return Ok(());
    }
    for segment in body.split('/') {
        match segment {
            ".." => return Err(format!("path `{path}` must not contain `..`")),
            "." | "" => {
                return Err(format!(
                    "path `{path}` is not normalised (write it without `.`, `//` or a trailing `/`)"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn dispatchers(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    let mut names = HashSet::new();
    // Every tool's limits live in one place; two would be ambiguous.
    let mut configured = HashSet::new();
    for (i, dispatcher) in array_at(value, "/spec/builtin_dispatchers") {
        let at = pointer::join_index("/spec/builtin_dispatchers", i);
        let name = pointer::member_str(dispatcher, "name");
        if !names.insert(name) {
            errors.push(
                pointer::join(&at, "name"),
                format!("dispatcher `{name}` is configured more than once"),
            );
        }
        for (j, capability) in indexed(dispatcher.get("capabilities")) {
            let cap_at = format!("{at}/capabilities/{j}/name");
            let tool = pointer::member_str(capability, "name");
            if !configured.insert(tool) {
                errors.push(cap_at, format!("`{tool}` is configured more than once"));
            } else if tool == CMD_RUN && name != CMD_DISPATCHER {
                errors.push(
                    cap_at,
                    format!(
                        "`{CMD_RUN}` belongs to the `{CMD_DISPATCHER}` dispatcher, not `{name}`"
                    ),
                );
            } else if !(node.tool_exists)(tool) {
                errors.push(
                    cap_at,
                    format!("unknown tool `{tool}`: this node has no tool of that name"),
                );
            }
        }
    }
    // cmd.run without an allowlist could never run anything: refuse the manifest rather than
    // fail every call.
    let has_allowlist = AgentView(value).subcommand_allowlist().is_some();
    for (i, tool) in strings_at(value, "/spec/tools") {
        if tool == CMD_RUN && !has_allowlist {
            errors.push(
                pointer::join_index("/spec/tools", i),
                format!(
                    "`{CMD_RUN}` is offered but has no subcommand_allowlist, and this node has \
                     no default for the agent's runtime (sandbox.default_command_allowlists): \
                     add a `{CMD_DISPATCHER}` entry to spec.builtin_dispatchers with a \
                     `{CMD_RUN}` capability"
                ),
            );
        }
    }
}

pub(super) fn volumes(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    // Volumes live in the execution's sandbox, which exists only for sandbox tools.
    if array_at(value, "/spec/volumes").next().is_some()
        && !strings_at(value, "/spec/tools").any(|(_, t)| (node.runs_in_sandbox)(t))
    {
        errors.warn(
            "/spec/volumes",
            "spec.volumes has no effect: the agent offers no tool that runs in a sandbox \
             (cmd.run, fs.*, ...), so its executions get no sandbox to mount them in",
        );
    }
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for (i, volume) in array_at(value, "/spec/volumes") {
        let at = pointer::join_index("/spec/volumes", i);
        let name = pointer::member_str(volume, "name");
        let mount = volume
            .get("mount_path")
            .or_else(|| volume.get("mount_point"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        for (old, new) in [
            ("mount_point", "mount_path"),
            ("size_limit_mb", "size_limit"),
        ] {
            if volume.get(old).is_some() {
                errors.warn(
                    pointer::join(&at, old),
                    format!("`{old}` is the older spelling of `{new}`; read as `{new}`"),
                );
            }
        }
        let mount_trimmed = mount.trim_end_matches('/');
        for (other_name, other_mount, j) in &seen {
            if *other_name == name {
                errors.push(
                    pointer::join(&at, "name"),
                    format!("volume name `{name}` is already used by volume {j}"),
                );
            }
            if paths_overlap(mount_trimmed, other_mount) {
                errors.push(
                    pointer::join(&at, "mount_path"),
                    format!("mount path `{mount}` overlaps `{other_mount}` of volume {j}"),
                );
            }
        }
        seen.push((name, mount_trimmed, i));
    }
}

pub(super) fn check_json_schema(at: &str, schema: &Value, errors: &mut Errors) {
    if let Err(e) = jsonschema::meta::validate(schema) {
        let inner = e.instance_path().as_str();
        let place = if inner.is_empty() {
            String::new()
        } else {
            format!(" (at {inner})")
        };
        errors.push(at, format!("not a valid JSON Schema{place}: {e}"));
        return;
    }
    if let Err(e) = jsonschema::options().build(schema) {
        errors.push(at, format!("not a usable JSON Schema: {e}"));
    }
}

/// Validator rules beyond the schema: a json_schema validator's schema compiles, and a
/// multi_judge validator can get the answers it requires.
pub(super) fn validator_rules(at: &str, validator: &Value, errors: &mut Errors) {
    match validator.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            if let Some(schema) = validator.get("schema") {
                check_json_schema(&pointer::join(at, "schema"), schema, errors);
            }
        }
        Some("multi_judge") => {
            let judges = validator
                .get("judges")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let required = validator.get("min_judges_required").and_then(Value::as_u64);
            if let Some(required) = required.filter(|r| *r > judges as u64) {
                errors.push(
                    pointer::join(at, "min_judges_required"),
                    format!(
                        "min_judges_required ({required}) exceeds the number of judges ({judges})"
                    ),
                );
            }
        }
        _ => {}
    }
}

pub(super) fn output_handler(
    at: &str,
    handler: &Value,
    node: &NodeKnowledge<'_>,
    errors: &mut Errors,
) {
    if handler.get("type").and_then(Value::as_str) == Some("mcp_tool") {
        if let Some(tool) = handler.get("tool_name").and_then(Value::as_str) {
            if !(node.tool_exists)(tool) {
                errors.push(
                    pointer::join(at, "tool_name"),
                    format!("unknown tool `{tool}`: this node has no tool of that name"),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Workflows
