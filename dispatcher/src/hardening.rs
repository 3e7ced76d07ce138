//! The container settings of a sandbox: the security boundary, written down in one place.
//!
//! Everything an agent can do runs inside this configuration, so every field below says why it is
//! set. Nothing here comes from the caller except the image, the (already clamped) limits, the
//! network choice between "none" and the default bridge, and the executor's path roots. In
//! particular there is no way to reach binds, devices, privileged mode, extra capabilities, the
//! host's namespaces or the Docker socket from a [`SandboxSpec`].

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, HealthConfig, HostConfig, HostConfigLogConfig, Mount, MountBindOptions,
    MountBindOptionsPropagationEnum, MountType, MountVolumeOptions, ResourcesUlimits,
    VolumeCreateRequest,
};
use serde::Serialize;

use crate::config::DispatcherConfig;
use crate::install::{ExecutorVolume, EXECUTOR_DIR};
use crate::spec::{NetworkMode, SandboxId, SandboxSpec};

/// The unprivileged user every agent process and file operation runs as.
pub const SANDBOX_UID: u32 = 65534;
/// Its group.
pub const SANDBOX_GID: u32 = 65534;

/// Capabilities the executor keeps, and only those: it starts as root to set up the workspace
/// and then runs every request as [`SANDBOX_UID`].
pub const CAPABILITIES: [&str; 4] = [
    // setgroups/setgid to the sandbox group before spawning a command.
    "SETGID", // setuid to the sandbox user before spawning a command.
    "SETUID",
    // Signal process groups of sandbox-user commands (timeouts, cancel) from a root executor.
    "KILL",
    // Give a fresh, root-owned workspace volume to the sandbox user; the executor drops it after.
    "CHOWN",
];

/// The container's capabilities: [`CAPABILITIES`], and for a gVisor sandbox whose requests may
/// run as root also the root set a root command gets
/// ([`ROOT_CAPABILITIES`](sandbox_executor::protocol::ROOT_CAPABILITIES)): they act on gVisor's
/// kernel, and the executor keeps them permitted only for root requests (its effective set and
/// every non-root command's stay as in a container-class sandbox). A container-class sandbox
/// gets exactly [`CAPABILITIES`], whatever its spec asked.
pub(crate) fn capabilities(spec: &SandboxSpec) -> Vec<String> {
    let mut caps: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
    if spec.root_allowed() {
        for cap in sandbox_executor::protocol::ROOT_CAPABILITIES {
            if !caps.iter().any(|c| c == cap) {
                caps.push(cap.to_owned());
            }
        }
    }
    caps
}

/// The executor's configuration, passed as JSON in `SANDBOX_EXECUTOR_CONFIG`.
///
/// Mirrors the executor's `Config` (see `dispatcher/executor/README.md`); fields not sent keep the
/// executor's defaults (`PATH`, `HOME`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ExecutorConfig<'a> {
    pub uid: u32,
    pub gid: u32,
    pub read_roots: &'a [String],
    pub write_roots: &'a [String],
    pub follow_symlinks: bool,
    pub max_file_bytes: u64,
    pub workspace: &'a str,
    pub home: &'a str,
    pub egress: bool,
    pub require_landlock: bool,
    pub max_live_processes: usize,
    pub max_watches: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel_dir: Option<&'static str>,
    /// Sent (false) only for gVisor sandboxes: their kernel does not report the exit of a
    /// sub-reaper the fork server clones with `CLONE_PARENT`, so each is forked directly.
    #[serde(skip_serializing_if = "is_true")]
    pub fork_server: bool,
    /// Requests may run as root: sent (true) only for a gVisor sandbox that asked
    /// ([`SandboxSpec::root_allowed`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_root: bool,
}

/// For `skip_serializing_if`: the executor's default need not be sent.
fn is_true(value: &bool) -> bool {
    *value
}

/// Open files per process (the executor's own descriptors included; it keeps a few per command).
pub const NOFILE: u64 = 4096;
/// Processes of the sandbox user. The kernel counts `RLIMIT_NPROC` per uid across the whole
/// host (every sandbox's user is 65534), so this is a backstop against a runaway fork on the
/// host; the per-sandbox bound is the pids cgroup limit.
pub const NPROC: u64 = 8192;

/// The workspace volume: a size-limited tmpfs from the local volume driver, so neither a command
/// nor `fs.write` can fill the host's disk (writes past the size fail with `ENOSPC`).
///
/// Why tmpfs: Docker 20.10 offers no size limit for ordinary named volumes (the local driver's
/// `size` option only exists for tmpfs; `--storage-opt size` needs overlay2 on xfs with project
/// quotas and covers only the container's root, which is read-only here; a loop-mounted image
/// would need root on the host). Its pages are charged to the container's memory cgroup, so the
/// container's memory limit is raised by the workspace size (see [`sandbox_container`]).
/// `noexec`: nothing written by an agent is executable, not even through the dynamic loader
/// (`mmap(PROT_EXEC)` fails on a noexec mount); `nosuid`, `nodev` for good measure; owned by the
/// sandbox user from the start.
pub(crate) fn workspace_volume(
    spec: &SandboxSpec,
    name: &str,
    labels: HashMap<String, String>,
) -> VolumeCreateRequest {
    let options = format!(
        "size={},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_GID},noexec,nosuid,nodev",
        spec.limits.workspace_bytes
    );
    VolumeCreateRequest {
        name: Some(name.to_owned()),
        driver: Some("local".to_owned()),
        driver_opts: Some(HashMap::from([
            ("type".to_owned(), "tmpfs".to_owned()),
            ("device".to_owned(), "tmpfs".to_owned()),
            ("o".to_owned(), options),
        ])),
        labels: Some(labels),
        ..Default::default()
    }
}

/// The container's mounts: the executor (read-only), the workspace, and the sandbox's own
/// channel directory when the socket channel is on.
fn mounts(
    executor: &ExecutorVolume,
    workspace_volume: &str,
    workspace_dir: &str,
    channel: Option<&std::path::Path>,
) -> Vec<Mount> {
    let mut mounts = vec![
        // The executor, read-only: agent code cannot replace the program that polices it.
        Mount {
            volume_options: Some(MountVolumeOptions {
                no_copy: Some(true),
                ..Default::default()
            }),
            ..mount(MountType::VOLUME, &executor.name, EXECUTOR_DIR, true)
        },
        // The sandbox's own workspace, destroyed with it.
        mount(MountType::VOLUME, workspace_volume, workspace_dir, false),
    ];
    if let Some(dir) = channel {
        // This sandbox's directory only (root's, 0700): the executor binds its socket there.
        // Private propagation: nothing mounted later on the host side shows up inside.
        mounts.push(Mount {
            bind_options: Some(MountBindOptions {
                propagation: Some(MountBindOptionsPropagationEnum::RPRIVATE),
                ..Default::default()
            }),
            ..mount(
                MountType::BIND,
                &dir.to_string_lossy(),
                crate::channel::TARGET,
                false,
            )
        });
    }
    mounts
}

/// A mount of `source` (a volume's name, or a host path for [`MountType::BIND`]) at `target`
/// in a container, with no further options: the base of every mount the node makes.
pub(crate) fn mount(typ: MountType, source: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_owned()),
        source: Some(source.to_owned()),
        typ: Some(typ),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The name of the environment variable the executor reads its configuration from.
pub const EXECUTOR_CONFIG_ENV: &str = "SANDBOX_EXECUTOR_CONFIG";

/// Builds the create request of a sandbox container.
pub(crate) fn sandbox_container(
    id: SandboxId,
    spec: &SandboxSpec,
    executor: &ExecutorVolume,
    workspace_volume: &str,
    labels: HashMap<String, String>,
    config: &DispatcherConfig,
    channel: Option<&std::path::Path>,
) -> ContainerCreateBody {
    let executor_json = executor_json(spec, config, channel);
    let host_config = host_config(id, spec, executor, workspace_volume, channel);

    ContainerCreateBody {
        image: Some(spec.image.clone()),
        // The executor from the read-only volume is the only process the container starts.
        entrypoint: Some(vec![ExecutorVolume::entrypoint()]),
        cmd: Some(Vec::new()),
        // Root, because the executor needs uid 0 (with the four capabilities of `host_config`)
        // to switch to the sandbox user; it runs nothing as root itself.
        user: Some("0:0".to_owned()),
        working_dir: Some(spec.workspace_dir().to_owned()),
        // The executor's stdin/stdout is the request stream: open stdin, keep it open when we
        // detach (StdinOnce=false, so a restarted orchestrator can re-attach), and no TTY so
        // stdout and stderr stay separate and bytes pass unmodified.
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(false),
        tty: Some(false),
        env: Some(vec![format!("{EXECUTOR_CONFIG_ENV}={executor_json}")]),
        // An image's HEALTHCHECK would run a program in the sandbox outside the executor (and
        // outside its policy); the executor's stream is the only health signal we use.
        healthcheck: Some(HealthConfig {
            test: Some(vec!["NONE".to_owned()]),
            ..Default::default()
        }),
        network_disabled: Some(spec.network == NetworkMode::None),
        labels: Some(labels),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// The executor's configuration, as the JSON it reads from [`EXECUTOR_CONFIG_ENV`]: the
/// sandbox's filesystem policy and the node's limits.
fn executor_json(
    spec: &SandboxSpec,
    config: &DispatcherConfig,
    channel: Option<&std::path::Path>,
) -> String {
    let executor_config = ExecutorConfig {
        uid: SANDBOX_UID,
        gid: SANDBOX_GID,
        read_roots: &spec.read_roots,
        write_roots: &spec.write_roots,
        follow_symlinks: spec.follow_symlinks,
        max_file_bytes: config.max_file_bytes,
        workspace: spec.workspace_dir(),
        home: spec.workspace_dir(),
        // The executor's Landlock rules refuse TCP connect unless the sandbox has egress.
        egress: spec.network != NetworkMode::None,
        require_landlock: config.require_landlock,
        max_live_processes: config.max_live_processes,
        max_watches: config.max_watches,
        channel_dir: channel.map(|_| crate::channel::TARGET),
        fork_server: spec.isolation() != crate::isolation::Isolation::Gvisor,
        allow_root: spec.root_allowed(),
    };
    // Serializing plain strings and integers cannot fail; an empty config would still give the
    // executor's safe defaults.
    serde_json::to_string(&executor_config).unwrap_or_default()
}

/// The container's host configuration: where the hardening is (capabilities, read-only root,
/// limits, network, mounts), each setting with its reason.
fn host_config(
    id: SandboxId,
    spec: &SandboxSpec,
    executor: &ExecutorVolume,
    workspace_volume: &str,
    channel: Option<&std::path::Path>,
) -> HostConfig {
    let limits = &spec.limits;
    // The workspace tmpfs is charged to this cgroup: processes keep `memory_bytes` to
    // themselves however full the workspace is.
    let memory = i64::try_from(limits.memory_bytes.saturating_add(limits.workspace_bytes))
        .unwrap_or(i64::MAX);

    HostConfig {
        // Drop every capability, then give back only what the executor needs to step down to
        // the sandbox user and to signal it. Agent processes end with empty CapPrm/CapEff/CapAmb.
        cap_drop: Some(vec!["ALL".to_owned()]),
        cap_add: Some(capabilities(spec)),
        // setuid binaries and file capabilities in the image cannot raise privileges again.
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        // Agent code cannot alter the image (planted binaries, edited /etc); writes go to the
        // workspace volume and the bounded tmpfs below.
        readonly_rootfs: Some(true),
        // A small scratch space: noexec so downloaded binaries cannot run from it, nosuid and
        // nodev for good measure; its size counts against the memory limit.
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            format!("rw,noexec,nosuid,nodev,size={}", limits.tmpfs_bytes),
        )])),
        // Fork bombs stop at the pids limit instead of exhausting the host.
        pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
        // Memory (plus the workspace, see above) with swap equal to it: no swap, so a balloon
        // is OOM-killed, not slowed down.
        memory: Some(memory),
        memory_swap: Some(memory),
        // CPU share, in billionths of a CPU.
        nano_cpus: Some(i64::try_from(limits.nano_cpus).unwrap_or(i64::MAX)),
        // No network unless the manifest grants egress, and then the sandbox's own internal
        // network whose only way out is the egress proxy; never the host's network.
        network_mode: Some(spec.network.docker_mode(id)),
        // No binds (so no Docker socket); the only host path is the sandbox's own channel
        // directory (a mount below, root's with mode 0700), when the socket channel is on.
        binds: Some(Vec::new()),
        mounts: Some(mounts(
            executor,
            workspace_volume,
            spec.workspace_dir(),
            channel,
        )),
        devices: Some(Vec::new()),
        privileged: Some(false),
        // The executor is PID 1 and reaps orphans itself; docker-init would sit in between.
        init: Some(false),
        // Own IPC namespace: no shared memory with other containers or the host.
        ipc_mode: Some("private".to_owned()),
        // We remove explicitly (destroy or reaper), so a crashed sandbox stays visible to the
        // reaper instead of vanishing with its workspace volume still around.
        auto_remove: Some(false),
        // The stream carries every response; a log driver would copy all of it to the host's
        // disk (unbounded) and replay old responses on re-attach. Diagnostics arrive on stderr
        // through the attach stream instead.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        // No core dumps on the (read-only) root or in the workspace; bounded descriptors and
        // processes (see NOFILE and NPROC).
        ulimits: Some(
            [("core", 0), ("nofile", NOFILE), ("nproc", NPROC)]
                .into_iter()
                .map(|(name, limit)| ResourcesUlimits {
                    name: Some(name.to_owned()),
                    soft: Some(i64::try_from(limit).unwrap_or(i64::MAX)),
                    hard: Some(i64::try_from(limit).unwrap_or(i64::MAX)),
                })
                .collect(),
        ),
        // /dev/shm is another writable tmpfs; keep it as small as /tmp.
        shm_size: Some(i64::try_from(limits.tmpfs_bytes).unwrap_or(i64::MAX)),
        // The isolation class: `runsc` (gVisor, a kernel of its own) or the engine's default
        // (runc). Every setting above holds under both; `create.rs` refused the class before
        // this when the engine does not list its runtime.
        runtime: spec.isolation().docker_runtime().map(str::to_owned),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::Isolation;
    use crate::spec::{Owner, OwnerKind};

    /// A spec of `class` that asks for root or not, and what its container and executor get.
    fn made(class: Isolation, asks: bool) -> (Vec<String>, serde_json::Value) {
        let mut spec = SandboxSpec::new("img", Owner::new(OwnerKind::Operator, "op"));
        spec.isolation = Some(class);
        spec.allow_root = asks;
        let config = DispatcherConfig::new("/executor");
        let json: serde_json::Value =
            serde_json::from_str(&executor_json(&spec, &config, None)).expect("JSON");
        (capabilities(&spec), json)
    }

    #[test]
    fn only_a_gvisor_sandbox_that_asks_gets_root() {
        let exactly_today: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        for (class, asks) in [
            (Isolation::Container, false),
            (Isolation::Container, true),
            (Isolation::Gvisor, false),
        ] {
            let (caps, json) = made(class, asks);
            assert_eq!(caps, exactly_today, "{class} asking {asks}");
            assert!(
                json.get("allow_root").is_none(),
                "{class} asking {asks}: {json}"
            );
        }
        let (caps, json) = made(Isolation::Gvisor, true);
        assert_eq!(json["allow_root"], true, "{json}");
        for cap in CAPABILITIES
            .iter()
            .chain(sandbox_executor::protocol::ROOT_CAPABILITIES.iter())
        {
            assert_eq!(
                caps.iter().filter(|c| c == cap).count(),
                1,
                "{cap} in {caps:?}"
            );
        }
        for never in [
            "SYS_ADMIN",
            "SYS_PTRACE",
            "NET_RAW",
            "NET_ADMIN",
            "MKNOD",
            "SETPCAP",
        ] {
            assert!(!caps.iter().any(|c| c == never), "{never} in {caps:?}");
        }
    }
}
