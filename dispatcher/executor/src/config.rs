//! The executor's configuration, read once at start from `SANDBOX_EXECUTOR_CONFIG`.
//!
//! The dispatcher sets this variable on the container. Every field has a default, so an absent
//! variable gives a working sandbox for uid 65534 with `/workspace` readable and writable. The
//! configuration is validated here (absolute, normalized roots; non-root identity) so the rest of
//! the executor can trust it.

use serde::Deserialize;

use crate::paths;

/// Name of the environment variable holding the JSON configuration.
pub const CONFIG_ENV: &str = "SANDBOX_EXECUTOR_CONFIG";

/// Validated configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// User every command and file operation runs as; never 0.
    pub uid: u32,
    /// Group every command and file operation runs as; never 0.
    pub gid: u32,
    /// Roots under which reading operations (and `cmd.run`'s `cwd`) may resolve.
    pub read_roots: Vec<String>,
    /// Roots under which changing operations may resolve.
    pub write_roots: Vec<String>,
    /// `PATH` used to find `argv[0]` and given to commands.
    pub path: String,
    /// `HOME` given to commands.
    pub home: String,
    /// Ceiling on file sizes read, written or edited.
    pub max_file_bytes: u64,
    /// Directory relative paths are resolved against; chowned to `uid:gid` at start if root-owned.
    pub workspace: String,
    /// Whether a requested path may pass through symlinks (still never out of its root). False
    /// when a root stands for a narrower allowlist entry (`/a/b/*`: direct children only), so a
    /// planted link cannot reach what the entry does not name.
    pub follow_symlinks: bool,
    /// The sandbox has network egress: commands may connect over TCP (else the kernel refuses).
    pub egress: bool,
    /// Refuse to run a command the kernel cannot confine (no Landlock); default `true`.
    pub require_landlock: bool,
    /// Live processes (`proc.start`) running at once; more are refused (`limit_reached`).
    pub max_live_processes: usize,
    /// Ceiling of the bytes a live process's stream forwards (`max_output_bytes`).
    pub max_live_output_bytes: u64,
    /// Directory watches (`fs.watch`) at once; more are refused (`limit_reached`).
    pub max_watches: usize,
    /// Directory (a bind mount the node shares, root-owned, mode 0700) where the executor
    /// listens on `executor.sock`, the node's direct channel; `None`: the attach stream only.
    pub channel_dir: Option<String>,
    /// Start sub-reapers through the fork server (`spawn/forkserver.rs`); `false`: the handler
    /// thread forks each one itself. The node sets it false in gVisor sandboxes, whose kernel
    /// (runsc 2022) never reports to the executor the exit of a child cloned with
    /// `CLONE_PARENT` by another process, so a command would never end.
    pub fork_server: bool,
    /// Requests may ask to run as root (`user: "root"`): the executor then keeps
    /// [`ROOT_CAPABILITIES`](crate::protocol::ROOT_CAPABILITIES) in its permitted set for them.
    /// The dispatcher sets it only for gVisor-class sandboxes whose spec asks for root, where
    /// uid 0 is root of gVisor's kernel, not the host's. Default `false`: every request runs as
    /// `uid`, and one asking for root is refused (`permission_denied`).
    pub allow_root: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            uid: 65534,
            gid: 65534,
            read_roots: vec!["/workspace".into()],
            write_roots: vec!["/workspace".into()],
            path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            home: "/workspace".into(),
            max_file_bytes: 10 * 1024 * 1024,
            workspace: "/workspace".into(),
            follow_symlinks: true,
            egress: false,
            require_landlock: true,
            max_live_processes: 16,
            max_live_output_bytes: 256 * 1024 * 1024,
            max_watches: 8,
            channel_dir: None,
            fork_server: true,
            allow_root: false,
        }
    }
}

/// Why the configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The variable is not valid JSON for [`Config`].
    #[error("{CONFIG_ENV} is not valid: {0}")]
    Json(#[from] serde_json::Error),
    /// A field has a value the executor refuses.
    #[error("{CONFIG_ENV}: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads the configuration from the environment (defaults when unset).
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(CONFIG_ENV) {
            Ok(text) if !text.trim().is_empty() => Self::from_json(&text),
            Ok(_) | Err(std::env::VarError::NotPresent) => Self::default().validated(),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::Invalid(
                "the variable is not valid UTF-8".into(),
            )),
        }
    }

    /// Parses and validates a JSON configuration.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let config: Config = serde_json::from_str(text)?;
        config.validated()
    }

    fn validated(mut self) -> Result<Self, ConfigError> {
        if self.uid == 0 || self.gid == 0 {
            return Err(ConfigError::Invalid(
                "uid and gid must not be 0: they are the sandbox user's (root, where allowed, is asked for per request with allow_root)".into(),
            ));
        }
        if self.max_file_bytes == 0 {
            return Err(ConfigError::Invalid(
                "max_file_bytes must be positive".into(),
            ));
        }
        let root = |p: &str| -> Result<String, ConfigError> {
            if !p.starts_with('/') {
                return Err(ConfigError::Invalid(format!(
                    "'{p}' is not an absolute path"
                )));
            }
            paths::normalize("/", p)
                .map_err(|e| ConfigError::Invalid(format!("root '{p}': {}", e.message)))
        };
        self.read_roots = self
            .read_roots
            .iter()
            .map(|p| root(p))
            .collect::<Result<_, _>>()?;
        self.write_roots = self
            .write_roots
            .iter()
            .map(|p| root(p))
            .collect::<Result<_, _>>()?;
        self.workspace = root(&self.workspace)?;
        self.channel_dir = self.channel_dir.as_deref().map(root).transpose()?;
        if self.allow_root && self.channel_dir.is_some() {
            // The channel trusts any uid-0 peer as the node; a root command is one.
            return Err(ConfigError::Invalid(
                "allow_root cannot go with channel_dir: the channel accepts any root peer as the \
                 node, and a root command would be one"
                    .into(),
            ));
        }
        if self.max_live_output_bytes == 0 {
            return Err(ConfigError::Invalid(
                "max_live_output_bytes must be positive".into(),
            ));
        }
        if self.max_live_processes > 1024 || self.max_watches > 256 {
            return Err(ConfigError::Invalid(
                "max_live_processes is at most 1024 and max_watches at most 256".into(),
            ));
        }
        if self.path.split(':').all(|dir| !dir.starts_with('/')) {
            return Err(ConfigError::Invalid(
                "path has no absolute directory to look commands up in".into(),
            ));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_to_missing_fields() {
        let c = Config::from_json(r#"{"uid":1000,"gid":1000}"#).unwrap();
        assert_eq!(c.uid, 1000);
        assert_eq!(c.read_roots, vec!["/workspace"]);
        assert_eq!(c.max_file_bytes, 10 * 1024 * 1024);
    }

    #[test]
    fn roots_are_normalized_and_checked() {
        let c = Config::from_json(r#"{"read_roots":["/workspace/","/tmp/./x"]}"#).unwrap();
        assert_eq!(c.read_roots, vec!["/workspace", "/tmp/x"]);
        assert!(Config::from_json(r#"{"read_roots":["workspace"]}"#).is_err());
        assert!(Config::from_json(r#"{"write_roots":["/../etc"]}"#).is_err());
        assert!(Config::from_json(r#"{"uid":0}"#).is_err());
        assert!(Config::from_json(r#"{"uidd":5}"#).is_err());
        assert!(Config::from_json(r#"{"max_live_processes":1025}"#).is_err());
        assert!(Config::from_json(r#"{"max_watches":257}"#).is_err());
        assert!(Config::from_json(r#"{"max_live_output_bytes":0}"#).is_err());
        let c = Config::from_json(r#"{"max_live_processes":3,"max_watches":0}"#).unwrap();
        assert_eq!((c.max_live_processes, c.max_watches), (3, 0));
        assert!(Config::from_json(r#"{"channel_dir":"run/x"}"#).is_err());
        let c = Config::from_json(r#"{"channel_dir":"/run/x/"}"#).unwrap();
        assert_eq!(c.channel_dir.as_deref(), Some("/run/x"));
    }

    #[test]
    fn root_is_off_by_default_and_never_the_sandbox_user() {
        assert!(!Config::default().allow_root);
        let c = Config::from_json(r#"{"allow_root":true}"#).unwrap();
        assert!(c.allow_root);
        assert_eq!(c.uid, 65534, "allow_root leaves the sandbox user as it is");
        let e = Config::from_json(r#"{"allow_root":true,"uid":0}"#).unwrap_err();
        assert!(e.to_string().contains("uid"), "{e}");
        let e = Config::from_json(r#"{"allow_root":true,"channel_dir":"/run/x"}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("allow_root cannot go with channel_dir"),
            "{e}"
        );
    }
}
