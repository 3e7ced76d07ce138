//! The dispatcher's configuration: ceilings, timings, the warm pool, the executor binary.
//!
//! These are the operator's decisions, not the caller's: a sandbox spec can lower limits but
//! never raise them above `ceilings`, and the timings decide how fast a dead instance's sandboxes
//! are collected. Defaults suit a single node; tests shorten `dead_after`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::spec::Limits;

/// How the dispatcher runs.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// The static `sandbox-executor` binary installed into every sandbox.
    pub executor_path: PathBuf,
    /// Upper bounds on every sandbox's limits.
    pub ceilings: Limits,
    /// Warm pool: image -> number of started, unused sandboxes to keep ready.
    pub pool: BTreeMap<String, usize>,
    /// Limits of pool sandboxes (clamped like any spec); `acquire` matches against them.
    pub pool_limits: Limits,
    /// Warm pools of sandboxes of a given shape, by name (e.g. `e2b:base`): the spec a caller
    /// will ask for (workspace, roots, labels; its owner and limits are the pool's) and how
    /// many to keep ready. `acquire` hands one out when the asked spec is the same sandbox.
    pub pool_shapes: BTreeMap<String, (crate::spec::SandboxSpec, usize)>,
    /// A command run once in each new sandbox of a pool (by pool name: an image, or a shape's
    /// name) before it is offered, as the sandbox user under the executor's rules, granted its
    /// own program alone; e.g. the shell every command of an E2B template runs under. Why: the
    /// first start of a program in a new container reads it and its libraries through the
    /// engine's storage driver (with `fuse-overlayfs`, through a userspace daemon, into that
    /// container's own page cache); measured, a pooled sandbox's first command took 25-50 ms
    /// longer than its second. Warmed, the first command of the owner is as quick as the next.
    /// A warm-up that fails is logged and the sandbox offered all the same.
    pub pool_warmup: BTreeMap<String, Vec<String>>,
    /// How long a pool's refill waits after the hand-out (or loss) that woke it. Why: the
    /// sandbox just handed out is about to run its owner's first command, and creating its
    /// replacement at that moment (the engine's create and start, the executor's start-up, the
    /// warm-up) takes the CPU that command needs. Zero refills at once.
    pub pool_refill_delay: Duration,
    /// The most client data (snapshot captures, restores, forks) the node holds in memory at
    /// once, bytes (`budget.rs`); a request past it is refused at once.
    pub max_buffered_bytes: u64,
    /// An instance whose heartbeat is older than this is dead and its sandboxes are reaped
    /// (default 120 s; the orchestrator heartbeats every 15 s).
    pub dead_after: Duration,
    /// How long one renewal of this instance's hold on its sandboxes lasts (`lease.rs`): set,
    /// the dispatcher renews `node_instances.heartbeat_at` itself every quarter of it, stops
    /// using its sandboxes when it could not renew for this long, and takes over the
    /// sandboxes of peers silent past `dead_after`, which must exceed it by a margin (the
    /// orchestrator's config checks it). `None` (the default): the embedder beats, nothing
    /// lapses and nothing is taken over; dead instances' sandboxes are reaped.
    pub lease: Option<Duration>,
    /// Period of the reaper (default 60 s).
    pub reap_interval: Duration,
    /// How long a new sandbox may take from start to the executor's ready line (default 15 s).
    pub ready_timeout: Duration,
    /// Default deadline of one call (default 30 s); `cmd.run` gets its own timeout plus grace.
    pub call_timeout: Duration,
    /// Ceiling on file sizes the executor reads or writes (default 10 MiB).
    pub max_file_bytes: u64,
    /// Longest response line accepted from an executor (default 256 MiB); longer breaks the
    /// stream. A `cmd.run` may keep 16 MiB per stream, and JSON escaping can grow control
    /// characters sixfold, so this is a safety valve, not an output limit: callers should ask
    /// for far smaller `max_*_bytes`.
    pub max_response_bytes: usize,
    /// Image used for the stopped helper container that fills the executor volume; default the
    /// first pool image, else any local image.
    pub helper_image: Option<String>,
    /// Previous instances whose running sandboxes `start` takes over before its first reap (a
    /// graceful restart keeps its sandboxes; everything else of a dead instance is reaped).
    pub adopt_from: Vec<uuid::Uuid>,
    /// Refuse sandboxes whose executor reports no Landlock, and have executors refuse commands
    /// the kernel cannot confine (default `true`; the operator may opt out).
    pub require_landlock: bool,
    /// Starts and stops the egress proxy of each sandbox with
    /// [`NetworkMode::Egress`](crate::NetworkMode::Egress); `None` refuses such sandboxes.
    pub egress_host: Option<std::sync::Arc<dyn crate::network::EgressHost>>,
    /// How calls reach sandboxes another live instance holds ([`crate::Forwarder`]); without
    /// one they fail with `SandboxNotFound { attached_elsewhere: true }`.
    pub forwarder: Option<std::sync::Arc<dyn crate::Forwarder>>,
    /// Live processes (`start_process`) one sandbox runs at once; its executor refuses more
    /// (default 16, at most 1024).
    pub max_live_processes: usize,
    /// Directory watches one sandbox holds at once (default 8, at most 256).
    pub max_watches: usize,
    /// Output bytes kept per live process for its slowest reader (default 256 KiB: 4 MiB per
    /// sandbox at the default process bound); older output is dropped and the reader told how
    /// much ([`ProcessEvent::Dropped`](crate::ProcessEvent)).
    pub live_buffer_bytes: usize,
    /// Events kept per watch for its reader (default 4096); older ones are dropped and counted.
    pub watch_buffer_events: usize,
    /// Host directory under which each sandbox gets its executor's socket (the direct channel,
    /// `channel.rs`); the same path must reach the Docker daemon's host, and it is at most
    /// [`MAX_BASE_LEN`](crate::channel::MAX_BASE_LEN) bytes long (a socket address is short).
    /// `None` (the default): every call goes over the attach stream.
    pub channel_dir: Option<PathBuf>,
    /// How much this instance's engine takes (`placement.rs`): a sandbox is created here only
    /// while the engine's live sandboxes and reserved memory stay within it, counted over every
    /// replica driving the same engine. Unbounded by default.
    pub engine_limit: EngineLimit,
    /// The isolation class of sandboxes that do not ask for one: a default and overrides per
    /// image (`isolation.rs`). A class the engine cannot run is refused, never replaced.
    pub isolation: crate::isolation::IsolationPolicy,
}

/// The node-level bound of one Docker engine, checked when a sandbox's row is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineLimit {
    /// Live sandboxes (creating, running, destroying; warm-pool ones included) at most.
    pub sandboxes: Option<u64>,
    /// Sum of the live sandboxes' memory limits at most, bytes.
    pub memory_bytes: Option<u64>,
}

impl DispatcherConfig {
    /// `spec` checked and clamped to the ceilings, with its isolation class decided (its own,
    /// else the node's for its image).
    pub(crate) fn admitted(
        &self,
        spec: crate::spec::SandboxSpec,
    ) -> crate::error::Result<crate::spec::SandboxSpec> {
        let mut spec = spec.validated(&self.ceilings)?;
        if spec.isolation.is_none() {
            spec.isolation = Some(self.isolation.of_image(&spec.image));
        }
        Ok(spec)
    }

    /// Defaults around the given executor binary.
    pub fn new(executor_path: impl Into<PathBuf>) -> Self {
        DispatcherConfig {
            executor_path: executor_path.into(),
            ceilings: Limits {
                memory_bytes: 2 * 1024 * 1024 * 1024,
                nano_cpus: 2_000_000_000,
                pids: 512,
                tmpfs_bytes: 256 * 1024 * 1024,
                workspace_bytes: 4 * 1024 * 1024 * 1024,
            },
            pool: BTreeMap::new(),
            pool_limits: Limits::default(),
            pool_shapes: BTreeMap::new(),
            pool_warmup: BTreeMap::new(),
            pool_refill_delay: Duration::from_millis(250),
            max_buffered_bytes: 256 * 1024 * 1024,
            dead_after: Duration::from_secs(120),
            lease: None,
            reap_interval: Duration::from_secs(60),
            ready_timeout: Duration::from_secs(15),
            call_timeout: Duration::from_secs(30),
            max_file_bytes: 10 * 1024 * 1024,
            max_response_bytes: 256 * 1024 * 1024,
            helper_image: None,
            adopt_from: Vec::new(),
            require_landlock: true,
            egress_host: None,
            forwarder: None,
            max_live_processes: 16,
            max_watches: 8,
            live_buffer_bytes: 256 * 1024,
            watch_buffer_events: 4096,
            channel_dir: None,
            engine_limit: EngineLimit::default(),
            isolation: crate::isolation::IsolationPolicy::default(),
        }
    }
}
