//! The `sandbox:` section: the operator's ceilings over every sandbox, its runtimes and their
//! aliases, its pools, and the checks of its own values.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use aegis_core::settings::{at_least_one, Invalid};

/// Sandbox settings: the operator's ceilings, which manifests and callers can only lower.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// The static `sandbox-executor` binary installed into every sandbox.
    pub executor_path: PathBuf,
    /// Warm pool: runtime image -> number of started, unused sandboxes kept ready.
    pub pool: std::collections::BTreeMap<String, usize>,
    /// How long every warm pool (these and `e2b.pool`'s) waits after a hand-out before making
    /// its replacement, milliseconds: the sandbox handed out runs its first command meanwhile
    /// without a create beside it. 0 refills at once.
    pub pool_refill_delay_ms: u64,
    /// Memory ceiling per sandbox, MiB.
    pub max_memory_mb: u64,
    /// CPU ceiling per sandbox, thousandths of a CPU.
    pub max_cpu_millis: u64,
    /// Process ceiling per sandbox.
    pub max_pids: u64,
    /// Longest `cmd.run`, seconds.
    pub cmd_timeout_secs: u64,
    /// Largest captured `cmd.run` output per stream, bytes.
    pub max_output_bytes: u64,
    /// Largest file `fs.*` reads or writes, bytes.
    pub max_file_bytes: u64,
    /// The most client data the node holds in memory at once, MiB: E2B snapshot captures,
    /// and snapshots loaded for a resume, a create from a snapshot or a fork; past it such a
    /// request is refused at once (503 `node_memory_bound`), nothing stored.
    pub max_buffered_mb: u64,
    /// An instance silent for this long is dead: a live replica fences it off and takes over
    /// its sandboxes (those of sessions and operators; the others are reaped).
    pub dead_after_secs: u64,
    /// How long one renewal of a replica's hold on its sandboxes lasts: it renews every quarter
    /// of it, and one that could not renew for this long stops using its sandboxes (refusing
    /// calls with a clear error) before `dead_after_secs` lets a peer take them over. At most
    /// three quarters of `dead_after_secs`; 0 (the default): two thirds of it.
    pub lease_secs: u64,
    /// Period of the reaper, seconds.
    pub reap_interval_secs: u64,
    /// Live sandboxes allowed on the node (every owner, every replica sharing the database).
    pub max_live_sandboxes: u64,
    /// Live sandboxes allowed per SEAL security context.
    pub max_sandboxes_per_context: u64,
    /// Live sandboxes allowed per operator API key.
    pub max_sandboxes_per_api_key: u64,
    /// Workspace size ceiling per sandbox, MiB (a size-limited volume; manifests ask with
    /// `spec.security.resources.disk`).
    pub max_workspace_mb: u64,
    /// Refuse to start sandboxes when the kernel has no Landlock, since the command policy
    /// could then not be held by the kernel. `false` runs them with the argv policy alone.
    pub require_landlock: bool,
    /// Runtime language -> the `cmd.run` allowlist an agent of that runtime gets when its
    /// manifest offers `cmd.run` without one (AEGIS manifests carry none: the allowlist lived in
    /// AEGIS's node config). Written into the manifest at deploy, with a note. Empty: such a
    /// manifest is refused.
    pub default_command_allowlists: std::collections::BTreeMap<String, Vec<String>>,
    /// `language:version` -> `language:version`: a runtime this node does not have, run in one
    /// it has (AEGIS manifests name versions such as `python:3.10`). Applied at deploy, written
    /// into the manifest with a `normalised:` note; the target must be in the runtime registry
    /// and a key may not name a runtime the registry has.
    pub runtime_aliases: std::collections::BTreeMap<String, String>,
    /// Host directory under which each sandbox gets its executor's socket: calls then reach the
    /// executor directly instead of through Docker's attach relay. The same path must be seen by
    /// this process and the Docker daemon (compose: a host directory bind-mounted at the same
    /// path). Unset or empty: every call uses the attach stream (`SANDBOX_CHANNEL_DIR`).
    pub channel_dir: Option<PathBuf>,
    /// Live sandboxes (warm-pool ones included) the Docker engine this replica drives may
    /// carry, counted over every replica driving it; past it, new sandboxes go to another
    /// replica's engine (placement). Unset: no bound. Replicas of one engine should agree.
    pub max_per_engine: Option<u64>,
    /// Memory, MiB, the live sandboxes of this replica's engine may reserve (each its memory
    /// limit plus its workspace, the container's limit); past it, as `max_per_engine`.
    pub max_memory_per_engine_mb: Option<u64>,
    /// The isolation class of this node's sandboxes: `container` (runc on the host's kernel)
    /// or `gvisor` (gVisor's `runsc`, a kernel of its own; the engine must list a `runsc`
    /// runtime, else such sandboxes are refused, never run as containers)
    /// (`ORCHESTRATOR__SANDBOX__ISOLATION`).
    pub isolation: aegis_sandboxes::Isolation,
    /// Runtime -> class, overriding `isolation` for that runtime's sandboxes (and so for the
    /// E2B template of that name): a runtime as REST's `runtime` names it, `language` or
    /// `language:version` (`base`, `python:3.11`).
    pub runtime_isolation: std::collections::BTreeMap<String, aegis_sandboxes::Isolation>,
}

/// Longest `pool_refill_delay_ms`.
const MAX_POOL_REFILL_DELAY_MS: u64 = 5_000;

impl SandboxConfig {
    /// The lease of a replica's hold on its sandboxes: `lease_secs`, or when it is 0 two
    /// thirds of `dead_after_secs` (so a node told to count peers dead after one second works).
    pub fn lease(&self) -> std::time::Duration {
        match self.lease_secs {
            0 => std::time::Duration::from_secs(self.dead_after_secs) * 2 / 3,
            secs => std::time::Duration::from_secs(secs),
        }
    }

    /// The class of each runtime image `runtime_isolation` names (a runtime key names every
    /// version of its language when it has no `:version`); keys the runtime registry does not
    /// know are left out here and refused by the config check.
    pub fn isolation_by_image(
        &self,
    ) -> std::collections::BTreeMap<String, aegis_sandboxes::Isolation> {
        let mut by_image = std::collections::BTreeMap::new();
        for (key, class) in &self.runtime_isolation {
            for runtime in runtimes_named(key) {
                by_image.insert(runtime.image.clone(), *class);
            }
        }
        by_image
    }

    /// The channel directory, if one is set (an empty path means none).
    pub fn channel_dir(&self) -> Option<&std::path::Path> {
        self.channel_dir
            .as_deref()
            .filter(|dir| !dir.as_os_str().is_empty())
    }

    /// The installed runtime `language` `version` is mapped to, if the operator mapped it.
    pub fn runtime_alias(&self, language: &str, version: &str) -> Option<(String, String)> {
        let target = self.runtime_aliases.get(&format!("{language}:{version}"))?;
        let (language, version) = split_runtime(target)?;
        Some((language.to_owned(), version.to_owned()))
    }
}

/// The installed runtimes `key` names: `language` (all its versions) or `language:version`.
pub(crate) fn runtimes_named(key: &str) -> Vec<&'static aegis_core::runtimes::Runtime> {
    let (language, version) = match key.split_once(':') {
        Some((l, v)) => (l, Some(v)),
        None => (key, None),
    };
    aegis_core::runtimes::registry()
        .map(|r| {
            r.runtimes
                .iter()
                .filter(|r| r.language == language && version.is_none_or(|v| r.version == v))
                .collect()
        })
        .unwrap_or_default()
}

/// `language:version` as the runtime registry spells them, or None.
pub(crate) fn split_runtime(text: &str) -> Option<(&str, &str)> {
    let (language, version) = text.split_once(':')?;
    let language_ok = language.starts_with(|c: char| c.is_ascii_lowercase())
        && language
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_+-".contains(c));
    let version_ok = version.starts_with(|c: char| c.is_ascii_alphanumeric())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    (language_ok && version_ok && language.len() <= 64 && version.len() <= 64)
        .then_some((language, version))
}

impl SandboxConfig {
    /// `pool_refill_delay_ms` at most [`MAX_POOL_REFILL_DELAY_MS`].
    fn check_pool_refill_delay(&self) -> Result<(), Invalid> {
        if self.pool_refill_delay_ms > MAX_POOL_REFILL_DELAY_MS {
            return Err(Invalid::new(
                "pool_refill_delay_ms",
                format!(
                    "is {}; expected at most {MAX_POOL_REFILL_DELAY_MS} (the delay only lets a \
                     sandbox just handed out run its first command before its replacement is \
                     made; a longer one leaves the pool empty)",
                    self.pool_refill_delay_ms
                ),
            ));
        }
        Ok(())
    }

    /// The `sandbox:` section on its own: limits of at least 1, default allowlists of bare
    /// programs. (Runtime aliases are checked against the installed runtimes, across sections.)
    pub fn check(&self) -> Result<(), Invalid> {
        at_least_one(&[
            ("max_memory_mb", self.max_memory_mb),
            ("max_cpu_millis", self.max_cpu_millis),
            ("max_pids", self.max_pids),
            ("cmd_timeout_secs", self.cmd_timeout_secs),
            ("max_output_bytes", self.max_output_bytes),
            ("max_file_bytes", self.max_file_bytes),
            ("max_buffered_mb", self.max_buffered_mb),
            ("dead_after_secs", self.dead_after_secs),
            ("reap_interval_secs", self.reap_interval_secs),
            ("max_live_sandboxes", self.max_live_sandboxes),
            ("max_sandboxes_per_context", self.max_sandboxes_per_context),
            ("max_sandboxes_per_api_key", self.max_sandboxes_per_api_key),
            ("max_workspace_mb", self.max_workspace_mb),
        ])?;
        let lease = self.lease_secs;
        if lease != 0 {
            // The holder stops at `lease` after sending its last renewal; peers take over at
            // `dead_after` after it was recorded. The quarter between absorbs a slow renewal
            // and the two clocks' rates.
            if lease.saturating_mul(4) > self.dead_after_secs.saturating_mul(3) {
                return Err(Invalid::new(
                    "lease_secs",
                    format!(
                        "is {lease}; expected 0 (two thirds of dead_after_secs) or at most three quarters of \
                         dead_after_secs ({}), so a replica that cannot renew stops using its \
                         sandboxes before a peer may take them over",
                        self.dead_after_secs
                    ),
                ));
            }
        }
        self.check_pool_refill_delay()?;
        if self.max_per_engine == Some(0) {
            return Err(Invalid::new(
                "max_per_engine",
                "expected at least 1 (leave it out for no bound)",
            ));
        }
        match self.max_memory_per_engine_mb {
            Some(mb) if mb < self.max_memory_mb => {
                return Err(Invalid::new(
                    "max_memory_per_engine_mb",
                    format!(
                        "{mb} MiB is below one sandbox's ceiling (max_memory_mb: {}); \
                         expected at least that, or leave it out for no bound",
                        self.max_memory_mb
                    ),
                ))
            }
            _ => {}
        }
        if let Some(dir) = self.channel_dir() {
            if !dir.is_absolute() {
                return Err(Invalid::new(
                    "channel_dir",
                    format!("`{}` is not an absolute path", dir.display()),
                ));
            }
            // A socket address holds 107 bytes: `<dir>/<sandbox id>/executor.sock` must fit.
            if dir.as_os_str().len() > 56 {
                return Err(Invalid::new(
                    "channel_dir",
                    format!(
                        "`{}` is {} bytes long; at most 56, so that its sockets' paths fit in a \
                         Unix socket address",
                        dir.display(),
                        dir.as_os_str().len()
                    ),
                ));
            }
        }
        for (language, allowlist) in &self.default_command_allowlists {
            let key = format!("default_command_allowlists.{language}");
            if allowlist.is_empty() {
                return Err(Invalid::new(
                    key,
                    "expected at least one command (leave the language out to give it no default)",
                ));
            }
            if let Some(bad) = allowlist.iter().find(|e| !allowlist_entry_ok(e)) {
                return Err(Invalid::new(
                    key,
                    format!(
                        "`{bad}` is not a bare program name optionally followed by subcommand \
                         words (no paths, no shell metacharacters), as in `python` or `git status`"
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            executor_path: PathBuf::from("/usr/local/libexec/orchestrator/sandbox-executor"),
            pool: Default::default(),
            pool_refill_delay_ms: 250,
            max_memory_mb: 2048,
            max_cpu_millis: 2000,
            max_pids: 512,
            cmd_timeout_secs: 600,
            max_output_bytes: 1024 * 1024,
            max_file_bytes: 10 * 1024 * 1024,
            max_buffered_mb: 256,
            dead_after_secs: 30,
            lease_secs: 0,
            reap_interval_secs: 60,
            max_live_sandboxes: 256,
            max_sandboxes_per_context: 32,
            max_sandboxes_per_api_key: 32,
            max_workspace_mb: 4096,
            require_landlock: true,
            default_command_allowlists: Default::default(),
            runtime_aliases: Default::default(),
            channel_dir: None,
            max_per_engine: None,
            max_memory_per_engine_mb: None,
            isolation: aegis_sandboxes::Isolation::Container,
            runtime_isolation: Default::default(),
        }
    }
}

/// A `cmd.run` allowlist entry as the agent schema accepts it: a bare program name, then
/// optional subcommand words.
fn allowlist_entry_ok(entry: &str) -> bool {
    let mut words = entry.split(' ');
    let program_ok = words.next().is_some_and(|p| {
        p.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c))
    });
    program_ok
        && entry.len() <= 256
        && words.all(|w| {
            !w.is_empty()
                && !w.starts_with('/')
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.:=,@%+/-".contains(c))
        })
}
