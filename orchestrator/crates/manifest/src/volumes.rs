//! Workflow volumes: what `spec.storage` declares and what each state mounts.
//!
//! The states of one run share files through the run's volumes: `spec.storage.workspace` (the
//! volume named `workspace`, which every workflow has, with the defaults below when it does not
//! declare it) and `spec.storage.shared_volumes`. A state mounts them with `volumes: [{name,
//! mount_path, read_only}]`: Agent, System and ContainerRun states, and each step of a
//! ParallelContainerRun. This module reads both and finds what would make a mount unsafe or
//! ambiguous (an undeclared name, a path outside the sandbox's workspace, two volumes at
//! overlapping paths, parallel steps writing one volume); the node's `workspaces` module does
//! the mounting. The same checks run at deploy (semantic stage) and when a run starts (for
//! versions stored before they existed).

use std::collections::BTreeMap;

use serde_json::Value;

use super::pointer;

/// The name of the run's workspace volume (`spec.storage.workspace`).
pub const WORKSPACE_VOLUME: &str = "workspace";
/// The sandbox directory every volume is mounted in or beneath.
pub const WORKSPACE_DIR: &str = "/workspace";
/// Size limit of a volume that does not give one, MiB (AEGIS's `size_limit_mb` default).
pub const DEFAULT_VOLUME_MB: u64 = 256;

/// A volume of the run, as `spec.storage` declares it (or the default workspace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredVolume {
    /// `workspace` or a name of `spec.storage.shared_volumes`.
    pub name: String,
    /// `storage_class: persistent`: kept `ttl_hours` after the run ends.
    pub persistent: bool,
    /// Largest content a state may leave in it, bytes.
    pub size_limit_bytes: u64,
    /// How long a persistent volume is kept after the run, if given.
    pub ttl_hours: Option<u64>,
}

/// One entry of a state's (or step's) `volumes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// The volume mounted.
    pub name: String,
    /// Where, without a trailing `/`.
    pub mount_path: String,
    /// Changes made through this mount are not kept.
    pub read_only: bool,
}

/// Every volume of the run: the workspace (declared or default), then the shared volumes.
pub fn declared_volumes(manifest: &Value) -> Vec<DeclaredVolume> {
    let storage = manifest.pointer("/spec/storage");
    let workspace = storage.and_then(|s| s.get(WORKSPACE_VOLUME));
    let class = |v: Option<&Value>| {
        v.and_then(|v| v.get("storage_class"))
            .and_then(Value::as_str)
            == Some("persistent")
    };
    let ttl = |v: Option<&Value>| v.and_then(|v| v.get("ttl_hours")).and_then(Value::as_u64);
    let mut out = vec![DeclaredVolume {
        name: WORKSPACE_VOLUME.to_owned(),
        persistent: class(workspace),
        size_limit_bytes: workspace
            .and_then(|w| w.get("size_limit_mb"))
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_VOLUME_MB)
            .saturating_mul(1 << 20),
        ttl_hours: ttl(workspace),
    }];
    let shared = storage
        .and_then(|s| s.get("shared_volumes"))
        .and_then(Value::as_array);
    for volume in shared.into_iter().flatten() {
        let Some(name) = volume.get("name").and_then(Value::as_str) else {
            continue;
        };
        out.push(DeclaredVolume {
            name: name.to_owned(),
            persistent: class(Some(volume)),
            size_limit_bytes: volume
                .get("size_limit_bytes")
                .and_then(Value::as_u64)
                .unwrap_or(DEFAULT_VOLUME_MB << 20),
            ttl_hours: ttl(Some(volume)),
        });
    }
    out
}

/// The `volumes` of a state or a ParallelContainerRun step (entries without a name or a path
/// are left out: the schema refuses them).
pub fn volume_mounts(item: &Value) -> Vec<VolumeMount> {
    item.get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            Some(VolumeMount {
                name: v.get("name")?.as_str()?.to_owned(),
                mount_path: trimmed(v.get("mount_path")?.as_str()?).to_owned(),
                read_only: v.get("read_only").and_then(Value::as_bool).unwrap_or(false),
            })
        })
        .collect()
}

/// Whether any state of the workflow mounts a volume.
pub fn mounts_volumes(manifest: &Value) -> bool {
    mounting_items(manifest)
        .iter()
        .any(|(_, _, item)| !volume_mounts(item).is_empty())
}

/// `path` without trailing `/` (but `/` itself stays).
fn trimmed(path: &str) -> &str {
    let t = path.trim_end_matches('/');
    if t.is_empty() {
        "/"
    } else {
        t
    }
}

/// Why `path` cannot be a mount point: it must be the workspace or a normalised path beneath it
/// (volumes live in the sandbox's workspace; nothing else of a sandbox is writable).
pub fn mount_path_problem(path: &str) -> Option<String> {
    let t = trimmed(path);
    let beneath = t == WORKSPACE_DIR
        || t.strip_prefix(WORKSPACE_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|rest| {
                rest.split('/')
                    .all(|c| !c.is_empty() && c != "." && c != "..")
            });
    if !beneath || t.contains('\0') {
        return Some(format!(
            "mount path `{path}` is outside the sandbox's workspace: a volume is mounted at \
             {WORKSPACE_DIR} or a normalised path beneath it (no `.`, `..` or empty components)"
        ));
    }
    None
}

/// (pointer, kind, item) of every state and ParallelContainerRun step that may mount volumes.
fn mounting_items(manifest: &Value) -> Vec<(String, &str, &Value)> {
    let mut out = Vec::new();
    let Some(states) = manifest.pointer("/spec/states").and_then(Value::as_object) else {
        return out;
    };
    for (name, state) in states {
        let at = pointer::join("/spec/states", name);
        match state.get("kind").and_then(Value::as_str) {
            Some(kind @ ("Agent" | "System" | "ContainerRun")) => out.push((at, kind, state)),
            Some("ParallelContainerRun") => {
                for (i, step) in state
                    .get("steps")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let step_at = pointer::join_index(&pointer::join(&at, "steps"), i);
                    out.push((step_at, "ParallelContainerRun", step));
                }
            }
            _ => {}
        }
    }
    out
}

/// Everything that keeps the workflow's mounts from being safe and unambiguous, as (pointer,
/// message): a name `spec.storage` does not declare, a mount path outside the workspace, one
/// volume mounted twice or two at overlapping paths by one state, a shared volume declared
/// twice, and a volume written by two steps of one ParallelContainerRun (they run at once, so
/// one's changes would silently replace the other's: refused rather than serialised).
pub fn volume_problems(manifest: &Value) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let declared = declared_volumes(manifest);
    let mut seen = Vec::new();
    for (i, volume) in declared.iter().enumerate().skip(1) {
        if seen.contains(&volume.name.as_str()) || volume.name == WORKSPACE_VOLUME {
            problems.push((
                format!("/spec/storage/shared_volumes/{}/name", i - 1),
                format!(
                    "volume name `{}` is already taken{}",
                    volume.name,
                    if volume.name == WORKSPACE_VOLUME {
                        " (by spec.storage.workspace, which every workflow has)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        seen.push(volume.name.as_str());
    }
    for (at, _, item) in mounting_items(manifest) {
        let mut mounted: Vec<(&str, &str)> = Vec::new();
        let entries = item.get("volumes").and_then(Value::as_array);
        for (i, entry) in entries.into_iter().flatten().enumerate() {
            let v_at = pointer::join_index(&pointer::join(&at, "volumes"), i);
            let name = pointer::member_str(entry, "name");
            let path = pointer::member_str(entry, "mount_path");
            if !declared.iter().any(|d| d.name == name) {
                problems.push((
                    pointer::join(&v_at, "name"),
                    format!(
                        "volume `{name}` is not declared: a state mounts `workspace` or a volume \
                         of spec.storage.shared_volumes"
                    ),
                ));
            }
            if let Some(problem) = mount_path_problem(path) {
                problems.push((pointer::join(&v_at, "mount_path"), problem));
                continue;
            }
            let path = trimmed(path);
            if mounted.iter().any(|(n, _)| *n == name) {
                problems.push((
                    pointer::join(&v_at, "name"),
                    format!("volume `{name}` is mounted twice by this state"),
                ));
            } else if let Some((other, other_path)) =
                mounted.iter().find(|(_, p)| paths_overlap(p, path))
            {
                problems.push((
                    pointer::join(&v_at, "mount_path"),
                    format!(
                        "mount path `{path}` overlaps `{other_path}` of volume `{other}`: \
                         volumes of one state are mounted side by side, never one in another"
                    ),
                ));
            }
            mounted.push((name, path));
        }
    }
    problems.extend(parallel_writers(manifest));
    problems
}

/// A volume written (mounted without `read_only`) by two or more steps of one
/// ParallelContainerRun, reported at the second writer's mount.
fn parallel_writers(manifest: &Value) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let Some(states) = manifest.pointer("/spec/states").and_then(Value::as_object) else {
        return problems;
    };
    for (state_name, state) in states {
        if state.get("kind").and_then(Value::as_str) != Some("ParallelContainerRun") {
            continue;
        }
        // volume -> (step name, pointer of its mount), in step order.
        let mut writers: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        let steps = state.get("steps").and_then(Value::as_array);
        for (i, step) in steps.into_iter().flatten().enumerate() {
            let step_name = step.get("name").and_then(Value::as_str).unwrap_or_default();
            let entries = step.get("volumes").and_then(Value::as_array);
            for (j, entry) in entries.into_iter().flatten().enumerate() {
                if entry.get("read_only").and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                let Some(volume) = entry.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let at = format!(
                    "{}/steps/{i}/volumes/{j}",
                    pointer::join("/spec/states", state_name)
                );
                writers
                    .entry(volume.to_owned())
                    .or_default()
                    .push((step_name.to_owned(), at));
            }
        }
        for (volume, list) in writers {
            if list.len() < 2 {
                continue;
            }
            let names: Vec<String> = list.iter().map(|(s, _)| format!("`{s}`")).collect();
            problems.push((
                list[1].1.clone(),
                format!(
                    "volume `{volume}` is mounted read-write by steps {} of ParallelContainerRun \
                     state `{state_name}`, which run at the same time: one step's changes would \
                     silently replace another's, so this is refused (not serialised). Mount it \
                     with `read_only: true` in every step but one, or give each writer a state of \
                     its own",
                    names.join(" and ")
                ),
            ));
        }
    }
    problems
}

/// Whether two mount paths (without trailing `/`) are one inside the other: a volume inside
/// another would be saved twice, once as its own and once in the outer one.
pub fn paths_overlap(a: &str, b: &str) -> bool {
    let under = |inner: &str, outer: &str| {
        inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    under(a, b) || under(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workflow(storage: Value, states: Value) -> Value {
        json!({"spec": {"storage": storage, "states": states}})
    }

    #[test]
    fn declared_volumes_have_defaults_and_the_workspace_always_exists() {
        let none = json!({"spec": {"states": {}}});
        assert_eq!(
            declared_volumes(&none),
            [DeclaredVolume {
                name: "workspace".into(),
                persistent: false,
                size_limit_bytes: 256 << 20,
                ttl_hours: None
            }]
        );
        let w = workflow(
            json!({"workspace": {"storage_class": "persistent", "size_limit_mb": 2, "ttl_hours": 3},
                   "shared_volumes": [{"name": "cache", "storage_class": "ephemeral", "size_limit_bytes": 10}]}),
            json!({}),
        );
        let v = declared_volumes(&w);
        assert_eq!(
            (v[0].persistent, v[0].size_limit_bytes, v[0].ttl_hours),
            (true, 2 << 20, Some(3))
        );
        assert_eq!((v[1].name.as_str(), v[1].size_limit_bytes), ("cache", 10));
    }

    #[test]
    fn mount_paths_stay_in_the_workspace() {
        for ok in ["/workspace", "/workspace/", "/workspace/a/b"] {
            assert_eq!(mount_path_problem(ok), None, "{ok}");
        }
        for bad in [
            "/",
            "/etc",
            "/workspaces",
            "/workspace/../etc",
            "/workspace//a",
            "/workspace/./a",
            "relative",
        ] {
            assert!(mount_path_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn problems_name_the_state_and_the_volume() {
        let w = workflow(
            json!({"shared_volumes": [{"name": "cache", "storage_class": "ephemeral"},
                                      {"name": "cache", "storage_class": "ephemeral"}]}),
            json!({
                "A": {"kind": "Agent", "volumes": [
                    {"name": "workspace", "mount_path": "/workspace"},
                    {"name": "cache", "mount_path": "/workspace/cache"},
                    {"name": "nope", "mount_path": "/etc"}]},
                "P": {"kind": "ParallelContainerRun", "steps": [
                    {"name": "test", "volumes": [{"name": "workspace", "mount_path": "/workspace"}]},
                    {"name": "fmt", "volumes": [{"name": "workspace", "mount_path": "/workspace", "read_only": true}]},
                    {"name": "lint", "volumes": [{"name": "workspace", "mount_path": "/workspace/x"}]}]},
                "H": {"kind": "Human", "volumes": [{"name": "nope", "mount_path": "/etc"}]},
            }),
        );
        let problems = volume_problems(&w);
        let at: Vec<&str> = problems.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            at,
            [
                "/spec/storage/shared_volumes/1/name",
                "/spec/states/A/volumes/1/mount_path",
                "/spec/states/A/volumes/2/name",
                "/spec/states/A/volumes/2/mount_path",
                "/spec/states/P/steps/2/volumes/0",
            ],
            "{problems:?}"
        );
        let parallel = &problems[4].1;
        assert!(
            parallel.contains("`workspace`")
                && parallel.contains("`test` and `lint`")
                && parallel.contains("state `P`"),
            "{parallel}"
        );
        assert!(mounts_volumes(&w));
        assert!(!mounts_volumes(
            &json!({"spec": {"states": {"H": {"kind": "Human"}}}})
        ));
    }
}
