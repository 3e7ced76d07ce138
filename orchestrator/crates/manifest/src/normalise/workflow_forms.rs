//! Older forms of a workflow manifest rewritten to the current one: system blackboard updates,
//! container steps without names, the volume list, the shared workspace, storage size limits
//! and the volume mounts of states.

use serde_json::{Map, Value};

use super::{mapping_at, Normalised, UPDATE_BLACKBOARD_COMMAND};
use crate::pointer;
use crate::units::parse_quantity;
use crate::volumes::WORKSPACE_VOLUME;

/// Older AEGIS manifests wrote blackboard keys with a System state whose command is
/// `update_blackboard` and whose `env` holds the values (`ITERATION_NUMBER: "{{...}}"`). That
/// becomes the state's `update_blackboard` mapping (keys in lower case, as the templates of those
/// manifests read them); the state runs nothing.
pub(super) fn system_blackboard_updates(value: &mut Value, out: &mut Normalised) {
    let Some(states) = mapping_at(value, "/spec/states") else {
        return;
    };
    for (name, state) in states.iter_mut() {
        let Some(object) = state.as_object_mut() else {
            continue;
        };
        let is_update = object.get("kind").and_then(Value::as_str) == Some("System")
            && object.get("command").and_then(Value::as_str).map(str::trim)
                == Some(UPDATE_BLACKBOARD_COMMAND);
        if !is_update || object.contains_key("update_blackboard") {
            continue;
        }
        let env = match object.remove("env") {
            Some(Value::Object(env)) => env,
            Some(other) => {
                object.insert("env".into(), other);
                continue;
            }
            None => Map::new(),
        };
        let keys: Vec<String> = env.keys().map(|k| k.to_lowercase()).collect();
        let writes: Map<String, Value> = env
            .into_iter()
            .map(|(k, v)| (k.to_lowercase(), v))
            .collect();
        object.insert("update_blackboard".into(), Value::Object(writes));
        out.note(
            pointer::join(&pointer::join("/spec/states", name), "command"),
            format!(
                "a System state with `command: {UPDATE_BLACKBOARD_COMMAND}` (older AEGIS form) \
                 runs nothing and writes its `env` to the blackboard: it now has \
                 `update_blackboard` with the keys {} (lower case)",
                if keys.is_empty() {
                    "(none)".to_owned()
                } else {
                    keys.iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// ContainerRun step names

/// A ContainerRun name (or ParallelContainerRun step name) written as a phrase (`Run unit
/// tests`) becomes a name (`run-unit-tests`) and keeps the phrase as `display_name`.
pub(super) fn container_step_names(value: &mut Value, out: &mut Normalised) {
    each_state_or_step(value, &["ContainerRun"], |at, step| {
        step_name(at, step, out)
    });
}

/// Calls `visit` with the pointer and value of every state whose kind is one of `kinds`, and of
/// every step of a ParallelContainerRun (each step is a container run of its own): the rewrites
/// of a container run reach both the same way.
fn each_state_or_step(value: &mut Value, kinds: &[&str], mut visit: impl FnMut(&str, &mut Value)) {
    let Some(states) = mapping_at(value, "/spec/states") else {
        return;
    };
    for (name, state) in states.iter_mut() {
        let at = pointer::join("/spec/states", name);
        match state.get("kind").and_then(Value::as_str) {
            Some("ParallelContainerRun") => {
                if let Some(steps) = state.get_mut("steps").and_then(Value::as_array_mut) {
                    for (i, step) in steps.iter_mut().enumerate() {
                        visit(&format!("{at}/steps/{i}"), step);
                    }
                }
            }
            Some(kind) if kinds.contains(&kind) => visit(&at, state),
            _ => {}
        }
    }
}

pub(super) fn step_name(at: &str, step: &mut Value, out: &mut Normalised) {
    let Some(object) = step.as_object_mut() else {
        return;
    };
    let Some(name) = object.get("name").and_then(Value::as_str) else {
        return;
    };
    if !name.contains(char::is_whitespace) || object.contains_key("display_name") {
        return;
    }
    let slug = slug(name);
    if slug.is_empty() {
        return;
    }
    let display = name.to_owned();
    object.insert("display_name".into(), Value::String(display.clone()));
    object.insert("name".into(), Value::String(slug.clone()));
    out.note(
        pointer::join(at, "name"),
        format!(
            "the step name `{display}` has spaces: it is kept as `display_name` and the step is \
             named `{slug}` (its key in the state's output)"
        ),
    );
}

/// Lower case, runs of anything but letters and digits as one '-', no '-' at either end, at
/// most 63 characters.
pub(super) fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(63);
    out.trim_end_matches('-').to_owned()
}

// ---------------------------------------------------------------------------------------------
// Workflow volumes: `spec.volumes`, `size_limit`, and the mounts of Agent and System states

/// AEGIS examples declare a workflow's volumes as `spec.volumes: [{name, persistent}]`; the
/// current form is `spec.storage`: the entry named `workspace` becomes `spec.storage.workspace`,
/// the others `spec.storage.shared_volumes`, `persistent` becomes `storage_class`.
pub(super) fn workflow_volume_list(value: &mut Value, out: &mut Normalised) {
    let Some(spec) = mapping_at(value, "/spec") else {
        return;
    };
    let Some(list) = spec.get("volumes") else {
        return;
    };
    let Some(items) = list.as_array() else {
        out.refuse(
            "/spec/volumes",
            "`spec.volumes` (older AEGIS form) is a list of volumes `{name, persistent}`; the \
             current form is `spec.storage`",
        );
        return;
    };
    let mut workspace: Option<Map<String, Value>> = None;
    let mut shared: Vec<Value> = Vec::new();
    let errors_before = out.errors.len();
    let has_workspace = spec
        .get("storage")
        .and_then(|s| s.get(WORKSPACE_VOLUME))
        .is_some();
    for (i, item) in items.iter().enumerate() {
        let at = pointer::join_index("/spec/volumes", i);
        let Some(fields) = item.as_object() else {
            out.refuse(at, "a volume is an object `{name, persistent}`");
            continue;
        };
        let Some(name) = fields.get("name").and_then(Value::as_str) else {
            out.refuse(pointer::join(&at, "name"), "a volume needs a `name`");
            continue;
        };
        let is_workspace = name == WORKSPACE_VOLUME;
        let mut volume = Map::new();
        if !is_workspace {
            volume.insert("name".into(), name.into());
        }
        let class = match (fields.get("persistent"), fields.get("storage_class")) {
            (Some(_), Some(_)) => {
                out.refuse(
                    pointer::join(&at, "persistent"),
                    "give `persistent` or `storage_class`, not both",
                );
                continue;
            }
            (Some(Value::Bool(true)), None) => "persistent",
            (Some(Value::Bool(false)), None) | (None, None) => "ephemeral",
            (Some(_), None) => {
                out.refuse(
                    pointer::join(&at, "persistent"),
                    "`persistent` is true or false",
                );
                continue;
            }
            (None, Some(class)) => match class.as_str() {
                Some(c @ ("ephemeral" | "persistent")) => c,
                _ => {
                    out.refuse(
                        pointer::join(&at, "storage_class"),
                        "`storage_class` is `ephemeral` or `persistent`",
                    );
                    continue;
                }
            },
        };
        volume.insert("storage_class".into(), class.into());
        for (key, v) in fields {
            match key.as_str() {
                "name" | "persistent" | "storage_class" => {}
                "ttl_hours" => {
                    volume.insert(key.clone(), v.clone());
                }
                // Sizes are converted with spec.storage's own (see storage_size_limits).
                "size_limit" | "size_limit_mb" | "size_limit_bytes" => {
                    volume.insert(key.clone(), v.clone());
                }
                other => out.refuse(
                    pointer::join(&at, other),
                    format!(
                        "`{other}` is not a setting of a workflow volume (name, persistent or \
                         storage_class, size_limit, ttl_hours); where a volume is mounted is \
                         said by each state's own `volumes`"
                    ),
                ),
            }
        }
        if is_workspace {
            if workspace.is_some() || has_workspace {
                out.refuse(
                    pointer::join(&at, "name"),
                    "the workspace volume is declared twice (spec.storage.workspace and \
                     spec.volumes, or twice in spec.volumes)",
                );
                continue;
            }
            workspace = Some(volume);
        } else {
            shared.push(Value::Object(volume));
        }
    }
    if out.errors.len() > errors_before {
        return;
    }
    spec.remove("volumes");
    let storage = spec
        .entry("storage")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(storage) = storage.as_object_mut() else {
        return;
    };
    if let Some(w) = workspace {
        storage.insert(WORKSPACE_VOLUME.into(), Value::Object(w));
    }
    if !shared.is_empty() {
        let list = storage
            .entry("shared_volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(list) = list.as_array_mut() {
            list.extend(shared);
        }
    }
    out.note(
        "/spec/volumes",
        "`spec.volumes` (older AEGIS form) declares the run's volumes: it is now `spec.storage` \
         (the volume `workspace` as `spec.storage.workspace`, the others as \
         `spec.storage.shared_volumes`, `persistent` as `storage_class`)",
    );
}

/// AEGIS examples also declare the workspace as a shared volume named `workspace` (AEGIS wants
/// every mounted name in `shared_volumes` once that list is used); it is the run's workspace,
/// `spec.storage.workspace`, with `size_limit_bytes` as `size_limit_mb` (rounded up).
pub(super) fn shared_workspace(value: &mut Value, out: &mut Normalised) {
    let Some(storage) = mapping_at(value, "/spec/storage") else {
        return;
    };
    if storage.contains_key(WORKSPACE_VOLUME) {
        return; // declared twice: the semantic stage names the duplicate
    }
    let Some(list) = storage
        .get_mut("shared_volumes")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let Some(index) = list
        .iter()
        .position(|v| v.get("name").and_then(Value::as_str) == Some(WORKSPACE_VOLUME))
    else {
        return;
    };
    let Value::Object(mut fields) = list.remove(index) else {
        return;
    };
    if list.is_empty() {
        storage.remove("shared_volumes");
    }
    fields.remove("name");
    let mut parts = Vec::new();
    if let Some(bytes) = fields.remove("size_limit_bytes") {
        match bytes.as_u64().filter(|b| *b > 0) {
            Some(b) => {
                let mb = b.div_ceil(1 << 20);
                fields.insert("size_limit_mb".into(), mb.into());
                parts.push(format!("`size_limit_bytes: {b}` is `size_limit_mb: {mb}`"));
            }
            // Not a size: left for the schema to name.
            None => {
                fields.insert("size_limit_bytes".into(), bytes);
            }
        }
    }
    storage.insert(WORKSPACE_VOLUME.into(), Value::Object(fields));
    out.note(
        pointer::join_index("/spec/storage/shared_volumes", index),
        format!(
            "a shared volume named `workspace` (older AEGIS form) is the run's workspace: it is \
             now `spec.storage.workspace`{}",
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join("; "))
            }
        ),
    );
}

/// `size_limit` written as a quantity (`2Gi`, as AEGIS examples do) is the current
/// `size_limit_mb` of the workspace (rounded up to whole MiB) and `size_limit_bytes` of a
/// shared volume.
pub(super) fn storage_size_limits(value: &mut Value, out: &mut Normalised) {
    let mut volumes: Vec<(String, &mut Value, bool)> = Vec::new();
    let Some(storage) = mapping_at(value, "/spec/storage") else {
        return;
    };
    for (key, entry) in storage.iter_mut() {
        match key.as_str() {
            WORKSPACE_VOLUME => volumes.push(("/spec/storage/workspace".into(), entry, true)),
            "shared_volumes" => {
                if let Some(list) = entry.as_array_mut() {
                    for (i, v) in list.iter_mut().enumerate() {
                        volumes.push((format!("/spec/storage/shared_volumes/{i}"), v, false));
                    }
                }
            }
            _ => {}
        }
    }
    for (at, volume, is_workspace) in volumes {
        let Some(fields) = volume.as_object_mut() else {
            continue;
        };
        let Some(limit) = fields.get("size_limit").cloned() else {
            continue;
        };
        let current = if is_workspace {
            "size_limit_mb"
        } else {
            "size_limit_bytes"
        };
        let limit_at = pointer::join(&at, "size_limit");
        if gives_both(fields, "size_limit", current, &at, out) {
            continue;
        }
        let Some(bytes) = parse_quantity(&limit) else {
            out.refuse(
                limit_at,
                "`size_limit` is a size: bytes, or a number with Ki, Mi, Gi or Ti (e.g. 2Gi)",
            );
            continue;
        };
        fields.remove("size_limit");
        let written = match &limit {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if is_workspace {
            let mb = bytes.div_ceil(1 << 20);
            fields.insert(current.into(), mb.into());
            let rounded = if bytes % (1 << 20) != 0 {
                " (rounded up to whole MiB)"
            } else {
                ""
            };
            out.note(
                limit_at,
                format!(
                    "`size_limit: {written}` (older AEGIS spelling) is `size_limit_mb: {mb}`{rounded}"
                ),
            );
        } else {
            fields.insert(current.into(), bytes.into());
            out.note(
                limit_at,
                format!(
                    "`size_limit: {written}` (older AEGIS spelling) is `size_limit_bytes: {bytes}`"
                ),
            );
        }
    }
}

/// The template AEGIS manifests mount the run's workspace with.
pub(super) const WORKSPACE_TEMPLATE: &str = "workflow.storage.workspace";

/// The volume a `volume:` value names: the workspace template, or a plain volume name.
pub(super) fn mounted_volume(text: &str) -> Result<String, String> {
    let t = text.trim();
    if let Some(inner) = t.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
        if inner.trim() == WORKSPACE_TEMPLATE {
            return Ok(WORKSPACE_VOLUME.to_owned());
        }
    }
    if t.contains("{{") || t.contains("}}") {
        return Err(format!(
            "`{text}`: a state mounts a volume its workflow declares, by name (`workspace` or a \
             name of spec.storage.shared_volumes) or as `{{{{{WORKSPACE_TEMPLATE}}}}}`; a volume \
             chosen at run time is not supported"
        ));
    }
    Ok(t.to_owned())
}

/// Refuses an entry at `at` that gives both `old`, a key's older spelling, and `new`, its
/// current one (it holds `old`); true when it did.
fn gives_both(
    fields: &Map<String, Value>,
    old: &str,
    new: &str,
    at: &str,
    out: &mut Normalised,
) -> bool {
    let both = fields.contains_key(new);
    if both {
        out.refuse(
            pointer::join(at, old),
            format!("`{old}` is the older spelling of `{new}`: give only one"),
        );
    }
    both
}

/// Agent and System states of AEGIS examples mount the workspace as `{volume:
/// "{{workflow.storage.workspace}}", mount_point | mount_path, access_mode}`; the current form of
/// every state's mount is `{name, mount_path, read_only}`.
pub(super) fn state_volume_mounts(value: &mut Value, out: &mut Normalised) {
    let kinds = ["Agent", "System", "ContainerRun"];
    each_state_or_step(value, &kinds, |at, item| mounts_of(at, item, out));
}

pub(super) fn mounts_of(at: &str, item: &mut Value, out: &mut Normalised) {
    let Some(list) = item.get_mut("volumes").and_then(Value::as_array_mut) else {
        return;
    };
    for (i, entry) in list.iter_mut().enumerate() {
        let v_at = pointer::join_index(&pointer::join(at, "volumes"), i);
        let Some(fields) = entry.as_object_mut() else {
            continue;
        };
        let mut changes = Vec::new();
        let mut refused = false;
        if let Some(volume) = fields.get("volume").cloned() {
            if gives_both(fields, "volume", "name", &v_at, out) {
                refused = true;
            } else {
                match volume.as_str().map(mounted_volume) {
                    Some(Ok(name)) => {
                        changes.push(format!(
                            "`volume: {}` is `name: {name}`",
                            volume.as_str().unwrap_or_default()
                        ));
                        fields.remove("volume");
                        fields.insert("name".into(), name.into());
                    }
                    Some(Err(problem)) => {
                        out.refuse(pointer::join(&v_at, "volume"), problem);
                        refused = true;
                    }
                    None => {
                        out.refuse(pointer::join(&v_at, "volume"), "`volume` is a volume name");
                        refused = true;
                    }
                }
            }
        }
        if let Some(point) = fields.get("mount_point").cloned() {
            if gives_both(fields, "mount_point", "mount_path", &v_at, out) {
                refused = true;
            } else {
                fields.remove("mount_point");
                fields.insert("mount_path".into(), point);
                changes.push("`mount_point` is `mount_path`".to_owned());
            }
        }
        if let Some(mode) = fields.get("access_mode").cloned() {
            let read_only = match mode.as_str() {
                Some("read-only") => Some(true),
                Some("read-write") => Some(false),
                _ => None,
            };
            match read_only {
                _ if gives_both(fields, "access_mode", "read_only", &v_at, out) => {
                    refused = true;
                }
                Some(ro) => {
                    fields.remove("access_mode");
                    fields.insert("read_only".into(), ro.into());
                    changes.push(format!(
                        "`access_mode: {}` is `read_only: {ro}`",
                        mode.as_str().unwrap_or_default()
                    ));
                }
                None => {
                    out.refuse(
                        pointer::join(&v_at, "access_mode"),
                        "`access_mode` is `read-write` or `read-only`",
                    );
                    refused = true;
                }
            }
        }
        if !changes.is_empty() && !refused {
            out.note(
                v_at,
                format!(
                    "this mount was written in the older AEGIS form: {}",
                    changes.join("; ")
                ),
            );
        }
    }
}
