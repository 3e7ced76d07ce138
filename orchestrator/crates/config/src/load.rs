//! Loading: the file read on its own (so serde_yaml can report lines), the environment's
//! overrides merged in (so an override is blamed on its variable), and where each value came
//! from for the messages of a refusal.

use std::path::{Path, PathBuf};

use super::{NodeConfig, ENV_PREFIX};

/// Why a configuration was refused. Each message names where the bad value came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The file is not valid YAML or does not match the expected shape.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// serde_yaml's message: key path, what was expected, line and column.
        message: String,
    },
    /// An environment override does not fit the key it names.
    #[error("environment variable {var}: {message}")]
    Env {
        /// The variable.
        var: String,
        /// What was wrong.
        message: String,
    },
    /// A value has the right type but is unusable.
    #[error("config key `{key}` (from {origin}): {message}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// The file (with line when known) or the environment variable that set it.
        origin: String,
        /// What was expected.
        message: String,
    },
}

/// A loaded configuration plus where its values came from (for error messages).
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The effective configuration.
    pub config: NodeConfig,
    /// The file, if one was read.
    pub path: Option<PathBuf>,
    source_text: Option<String>,
    overridden: Vec<(String, String)>,
}

impl LoadedConfig {
    /// Where the entry `entry` of the map at `section` (dotted) was set: its file line, found
    /// below the section's own line (an entry's key may hold dots, so it is not a dotted path).
    pub fn origin_of_entry(&self, section: &str, entry: &str) -> String {
        let (Some(path), Some(text)) = (&self.path, &self.source_text) else {
            return "default".to_owned();
        };
        let Some(start) = line_of_key(text, section) else {
            return "default".to_owned();
        };
        let found = text.lines().enumerate().skip(start).find_map(|(n, line)| {
            let t = line.trim_start();
            [
                format!("{entry}:"),
                format!("\"{entry}\":"),
                format!("'{entry}':"),
            ]
            .iter()
            .any(|k| t.starts_with(k.as_str()))
            .then_some(n + 1)
        });
        match found {
            Some(line) => format!("{} line {line}", path.display()),
            None => "default".to_owned(),
        }
    }

    /// Where `key` (dotted) got its value: an environment variable, a file line, or the default.
    pub fn origin_of(&self, key: &str) -> String {
        // The variable that set the key, or a section around it (`mcp_servers` for
        // `mcp_servers[0].url`).
        let within = |k: &str| {
            key == k
                || key
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        };
        if let Some((_, var)) = self.overridden.iter().find(|(k, _)| within(k)) {
            return format!("environment variable {var}");
        }
        match (&self.path, &self.source_text) {
            (Some(path), Some(text)) => match line_of_key(text, key) {
                Some(line) => format!("{} line {line}", path.display()),
                None => "default".to_owned(),
            },
            _ => "default".to_owned(),
        }
    }
}

/// Reads the file (if any) and applies environment overrides from `env`; the values are
/// checked by the caller ([`crate::load`]).
pub(crate) fn read(
    path: Option<&Path>,
    env: &[(String, String)],
) -> Result<LoadedConfig, ConfigError> {
    let (text, from_file) = match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let parsed = parse_file(&text).map_err(|message| ConfigError::File {
                path: path.to_owned(),
                message,
            })?;
            (Some(text), parsed)
        }
        None => (None, NodeConfig::default()),
    };

    let mut tree = serde_yaml::to_value(&from_file).map_err(|e| ConfigError::File {
        path: path.map(Path::to_owned).unwrap_or_default(),
        message: e.to_string(),
    })?;
    let mut overridden = Vec::new();
    let mut vars: Vec<&(String, String)> = env.iter().collect();
    vars.sort();
    for (var, value) in vars {
        let Some(key) = override_key(var) else {
            continue;
        };
        // Compose passes `ORCHESTRATOR_ADMIN_KEY: ${ORCHESTRATOR_ADMIN_KEY:-}` through when .env
        // has none: an empty short-named variable means unset, not an empty value.
        if value.trim().is_empty() && !var.starts_with(ENV_PREFIX) {
            continue;
        }
        set_path(&mut tree, &key, value).map_err(|message| ConfigError::Env {
            var: var.clone(),
            message,
        })?;
        // Check each override on its own so the error names the variable that broke it.
        serde_yaml::from_value::<NodeConfig>(tree.clone()).map_err(|e| ConfigError::Env {
            var: var.clone(),
            message: e.to_string(),
        })?;
        overridden.push((key.join("."), var.clone()));
    }
    let config: NodeConfig = serde_yaml::from_value(tree).map_err(|e| ConfigError::Env {
        var: "(overrides)".to_owned(),
        message: e.to_string(),
    })?;

    let loaded = LoadedConfig {
        config,
        path: path.map(Path::to_owned),
        source_text: text,
        overridden,
    };
    Ok(loaded)
}

/// Parses the file text; an empty file means all defaults.
fn parse_file(text: &str) -> Result<NodeConfig, String> {
    if text.trim().is_empty() {
        return Ok(NodeConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| e.to_string())
}

/// Maps an environment variable to the config key path it overrides, if it is one of ours.
fn override_key(var: &str) -> Option<Vec<String>> {
    match var {
        "DATABASE_URL" => return Some(vec!["database".into(), "url".into()]),
        "DOCKER_HOST" => return Some(vec!["docker".into(), "host".into()]),
        "ORCHESTRATOR_ADMIN_KEY" => return Some(vec!["auth".into(), "admin_key".into()]),
        "SANDBOX_EXECUTOR_BIN" => return Some(vec!["sandbox".into(), "executor_path".into()]),
        "SANDBOX_CHANNEL_DIR" => return Some(vec!["sandbox".into(), "channel_dir".into()]),
        _ => {}
    }
    let rest = var.strip_prefix(ENV_PREFIX)?;
    let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    (!parts.is_empty() && parts.iter().all(|p| !p.is_empty())).then_some(parts)
}

/// Sets `key` inside `tree` to `raw` read as a YAML scalar; refuses keys that do not exist.
fn set_path(tree: &mut serde_yaml::Value, key: &[String], raw: &str) -> Result<(), String> {
    let mut node = tree;
    for (i, part) in key.iter().enumerate() {
        let map = node
            .as_mapping_mut()
            .ok_or_else(|| format!("`{}` is not a section", key[..i].join(".")))?;
        let k = serde_yaml::Value::String(part.clone());
        if !map.contains_key(&k) {
            let known: Vec<String> = map
                .keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect();
            return Err(format!(
                "unknown config key `{}`; expected one of: {}",
                key[..=i].join("."),
                known.join(", ")
            ));
        }
        node = map
            .get_mut(&k)
            .ok_or_else(|| format!("unknown config key `{}`", key.join(".")))?;
    }
    // Strings such as URLs must stay strings; everything else is read as a YAML scalar.
    *node = match node {
        serde_yaml::Value::String(_) | serde_yaml::Value::Null => {
            serde_yaml::Value::String(raw.to_owned())
        }
        _ => serde_yaml::from_str(raw).map_err(|e| format!("not a YAML scalar: {e}"))?,
    };
    Ok(())
}

/// Finds the 1-based line on which a dotted key is set in the file, by indentation. A segment
/// may index a block-style list (`mcp_servers[1].url`): the line of that item, or of the key
/// inside it.
pub(crate) fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let tokens = key_tokens(text);
    let mut next = 0usize;
    let mut min_col = 0usize;
    let mut line = None;
    for segment in key.split('.') {
        let (name, index) = match segment.split_once('[') {
            Some((name, rest)) => (name, Some(rest.strip_suffix(']')?.parse::<usize>().ok()?)),
            None => (segment, None),
        };
        // The key, at or below the current level, before the current block ends.
        let found = tokens[next..]
            .iter()
            .position(|t| t.key.as_deref() == Some(name) && t.col >= min_col)?;
        let ended = tokens[next..next + found]
            .iter()
            .any(|t| t.first_on_line && t.col < min_col);
        if ended {
            return None;
        }
        let at = next + found;
        let key_col = tokens[at].col;
        line = Some(tokens[at].line);
        next = at + 1;
        min_col = key_col + 1;
        let Some(index) = index else {
            continue;
        };
        // The index-th `- ` item of the list under the key (items may sit at the key's column).
        let mut item_col: Option<usize> = None;
        let mut seen = 0usize;
        let mut item = None;
        for (i, t) in tokens.iter().enumerate().skip(next) {
            if !t.first_on_line {
                continue;
            }
            let is_item = t.key.is_none();
            match item_col {
                None if !is_item || t.col < key_col => break,
                None => item_col = Some(t.col),
                Some(c) if t.col < c || (t.col == c && !is_item) => break,
                Some(c) if t.col > c => continue,
                Some(_) => {}
            }
            if seen == index {
                item = Some(i);
                break;
            }
            seen += 1;
        }
        let i = item?;
        line = Some(tokens[i].line);
        next = i + 1;
        min_col = tokens[i].col + 1;
    }
    line
}

/// One token of a block-style YAML line: a `- ` list item (`key: None`) or a `key:`.
struct KeyToken {
    line: usize,
    col: usize,
    key: Option<String>,
    first_on_line: bool,
}

fn key_tokens(text: &str) -> Vec<KeyToken> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let content = raw.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let mut col = raw.len() - content.len();
        let mut rest = content;
        let mut first = true;
        while rest == "-" || rest.starts_with("- ") {
            out.push(KeyToken {
                line: n + 1,
                col,
                key: None,
                first_on_line: first,
            });
            first = false;
            let after = rest[1..].trim_start();
            col += rest.len() - after.len();
            rest = after;
        }
        if let Some((k, v)) = rest.split_once(':') {
            if !k.starts_with(['{', '[', '"', '\'']) && (v.is_empty() || v.starts_with(' ')) {
                out.push(KeyToken {
                    line: n + 1,
                    col,
                    key: Some(k.trim().to_owned()),
                    first_on_line: first,
                });
            }
        }
    }
    out
}
