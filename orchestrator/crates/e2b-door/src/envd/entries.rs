//! envd's filesystem entries from the executor's answers: a directory listed or a path
//! stat'ed through `fs.list`, with the executor's mode, size and time, a
//! symlink shown with what it points at when that is inside the roots.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use aegis_e2b::connect::{Code, ConnectError};
use aegis_e2b::envd::filesystem::{EntryInfo, FileType};
use aegis_e2b::envd::Timestamp;
use aegis_tools::state::AppState;
use serde_json::{json, Value};

use super::{call, refuse, Target, SANDBOX_USER};

pub(super) fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some((parent, name)) => (parent, name),
        None => ("/", path),
    }
}

pub(super) fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// One entry of a directory as `fs.list` reports it: its name, type (`file`, `directory`,
/// `symlink`, `other`), a file's size, and what its stat says (absent when the executor could
/// not read it).
pub(super) struct Listed {
    pub(super) name: String,
    pub(super) kind: String,
    pub(super) size: u64,
    pub(super) mode: Option<u32>,
    pub(super) modified_ns: Option<i64>,
    pub(super) inode_size: Option<u64>,
    pub(super) link_target: Option<String>,
    /// A regular file's user metadata (its `user.e2b.*` extended attributes).
    pub(super) metadata: BTreeMap<String, String>,
}

impl Listed {
    pub(super) fn of(e: &Value) -> Self {
        Listed {
            name: e["name"].as_str().unwrap_or_default().to_owned(),
            kind: e["type"].as_str().unwrap_or_default().to_owned(),
            size: e["size_bytes"].as_u64().unwrap_or(0),
            mode: e["mode"].as_u64().and_then(|m| u32::try_from(m).ok()),
            modified_ns: e["modified_ns"].as_i64(),
            inode_size: e["inode_size"].as_u64(),
            link_target: e["link_target"].as_str().map(str::to_owned),
            metadata: e["metadata"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// What is known of an entry that was not listed (a directory just made, a root).
    pub(super) fn assumed(kind: &str, size: u64) -> Self {
        Listed {
            name: String::new(),
            kind: kind.to_owned(),
            size,
            mode: None,
            modified_ns: None,
            inode_size: None,
            link_target: None,
            metadata: BTreeMap::new(),
        }
    }
}

/// envd's entry of `path`: a file's size, any other entry's inode size (what envd reports for a
/// directory), the permission bits (the usual ones when unknown), the modification time.
pub(super) fn entry(path: &str, listed: &Listed) -> EntryInfo {
    let (_, name) = split(path);
    let (file_type, usual) = match listed.kind.as_str() {
        "file" => (FileType::File, 0o644),
        "directory" => (FileType::Directory, 0o755),
        "symlink" => (FileType::Symlink, 0o777),
        _ => (FileType::Unspecified, 0),
    };
    let mode = listed.mode.map_or(usual, |m| m & 0o777);
    let size = match file_type {
        FileType::File => listed.size,
        _ => listed.inode_size.unwrap_or(listed.size),
    };
    const NANOS: i64 = 1_000_000_000;
    EntryInfo {
        name: name.to_owned(),
        r#type: file_type as i32,
        path: path.to_owned(),
        size: i64::try_from(size).unwrap_or(i64::MAX),
        mode,
        permissions: permissions(file_type, mode),
        owner: SANDBOX_USER.to_owned(),
        group: SANDBOX_USER.to_owned(),
        modified_time: listed.modified_ns.map(|ns| Timestamp {
            seconds: ns.div_euclid(NANOS),
            nanos: i32::try_from(ns.rem_euclid(NANOS)).unwrap_or(0),
        }),
        symlink_target: None,
        metadata: listed.metadata.clone(),
    }
}

pub(super) fn permissions(kind: FileType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The entries of one directory (`fs.list`).
pub(super) async fn list(
    state: &AppState,
    target: &Target,
    dir: &str,
) -> Result<Vec<Listed>, ConnectError> {
    let out = call(state, target, "fs.list", json!({"path": dir})).await?;
    Ok(out["entries"]
        .as_array()
        .map(|entries| entries.iter().map(Listed::of).collect())
        .unwrap_or_default())
}

/// The entry at `path` itself, a symlink not followed: found by listing the parent; a path
/// that is itself a root of the sandbox's policy (its parent is outside) is a directory if it
/// can be listed.
pub(super) async fn lstat(
    state: &AppState,
    target: &Target,
    path: &str,
) -> Result<Listed, ConnectError> {
    let (parent, name) = split(path);
    if name.is_empty() {
        list(state, target, path).await?;
        return Ok(Listed::assumed("directory", 0));
    }
    match list(state, target, parent).await {
        Ok(entries) => entries
            .into_iter()
            .find(|e| e.name == name)
            .ok_or_else(|| refuse(Code::NotFound, format!("path {path:?} does not exist"))),
        Err(e) if e.code == Code::PermissionDenied => {
            list(state, target, path).await?;
            Ok(Listed::assumed("directory", 0))
        }
        Err(e) => Err(e),
    }
}

/// envd's entry of `path`, as its `Stat` and `ListDir` report one: a symlink shows what it
/// points at (its type, size and mode, when that is inside the sandbox's roots and exists,
/// found by a second, policy-checked listing; the link itself otherwise) and where, as an
/// absolute path.
pub(super) async fn described(
    state: &AppState,
    target: &Target,
    path: &str,
    listed: &Listed,
) -> EntryInfo {
    if listed.kind != "symlink" {
        return entry(path, listed);
    }
    let Some(link) = listed.link_target.as_deref() else {
        return entry(path, listed);
    };
    let (parent, _) = split(path);
    let to = resolve_link(parent, link);
    let mut info = match lstat(state, target, &to).await {
        Ok(pointed) if pointed.kind != "symlink" => entry(path, &pointed),
        _ => entry(path, listed),
    };
    info.symlink_target = Some(to);
    info
}

/// Where a symlink in `dir` holding `link` points, as an absolute path (`.` and `..` taken
/// lexically; the listing of the result is checked by the policy like any path).
pub(super) fn resolve_link(dir: &str, link: &str) -> String {
    let joined = if link.starts_with('/') {
        link.to_owned()
    } else {
        join(dir, link)
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The entries of `paths` that exist now (what watch events with `include_entry` carry), each
/// directory listed once (so once audited); a path whose directory cannot be listed, or that
/// is gone, has none.
pub(crate) async fn entries_at(
    state: &AppState,
    target: &Target,
    paths: &[String],
) -> HashMap<String, EntryInfo> {
    let mut dirs: HashMap<String, Vec<Listed>> = HashMap::new();
    let mut found = HashMap::new();
    for path in paths {
        let (parent, name) = split(path);
        if let Entry::Vacant(slot) = dirs.entry(parent.to_owned()) {
            slot.insert(list(state, target, parent).await.unwrap_or_default());
        }
        if let Some(listed) = dirs
            .get(parent)
            .and_then(|l| l.iter().find(|e| e.name == name))
        {
            found.insert(path.clone(), entry(path, listed));
        }
    }
    found
}

/// `Stat`: the entry at `path`, a symlink followed as envd follows it ([`described`]).
pub async fn stat(
    state: &AppState,
    target: &Target,
    path: &str,
) -> Result<EntryInfo, ConnectError> {
    let listed = lstat(state, target, path).await?;
    Ok(described(state, target, path, &listed).await)
}
