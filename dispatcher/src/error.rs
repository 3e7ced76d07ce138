//! What can go wrong when the dispatcher manages a sandbox, said so that an operator can act.
//!
//! Every variant names the step that failed and the object it failed on (image, sandbox, path), so
//! the orchestrator can map it to an API error without parsing messages, and a log line alone is
//! enough to know what to fix.

use std::path::PathBuf;
use std::time::Duration;

use crate::id::SandboxId;

/// Why a dispatcher operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The runtime image is not on this engine; images are built locally, never pulled.
    #[error(
        "image {image} is not present on the Docker engine (images cannot be pulled here); \
         build it with runtime-images/build.sh (e.g. `runtime-images/build.sh --only busybox`)"
    )]
    ImageMissing {
        /// The image reference that was asked for.
        image: String,
    },
    /// The executor binary is not where the configuration says.
    #[error(
        "sandbox executor binary not found at {path}; build it with \
         `RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build --release -p sandbox-executor \
         --target x86_64-unknown-linux-gnu` and point executor_path at it"
    )]
    ExecutorMissing {
        /// The configured path.
        path: PathBuf,
    },
    /// The file exists but cannot serve as the in-container executor.
    #[error("sandbox executor at {path} is unusable: {reason}")]
    ExecutorInvalid {
        /// The configured path.
        path: PathBuf,
        /// What is wrong with it (not executable, not ELF, dynamically linked, wrong architecture).
        reason: String,
    },
    /// Installing the executor into its shared volume failed.
    #[error("installing the sandbox executor into volume {volume} failed while {step}: {source}")]
    ExecutorInstall {
        /// The executor volume.
        volume: String,
        /// The step that failed.
        step: &'static str,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// The sandbox's isolation class needs a runtime this node's engine does not have; nothing
    /// was created (no row, no object) and no other class was used instead.
    #[error("cannot create a {isolation} sandbox: {detail}")]
    IsolationUnavailable {
        /// The class asked for.
        isolation: crate::isolation::Isolation,
        /// What the engine lacks and how to give it that.
        detail: String,
    },
    /// The spec asks for something the dispatcher refuses before touching Docker.
    #[error("invalid sandbox spec: {reason}")]
    InvalidSpec {
        /// What is wrong.
        reason: String,
    },
    /// Creating the workspace volume or the container failed.
    #[error("creating the {what} of sandbox {id} (image {image}) failed: {source}")]
    Create {
        /// The sandbox being created.
        id: SandboxId,
        /// The image asked for.
        image: String,
        /// `"workspace volume"` or `"container"`.
        what: &'static str,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// Starting the container failed.
    #[error("starting the container of sandbox {id} failed: {source}")]
    Start {
        /// The sandbox being started.
        id: SandboxId,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// Attaching to the container's stdin/stdout failed.
    #[error("attaching to the executor stream of sandbox {id} failed: {source}")]
    Attach {
        /// The sandbox.
        id: SandboxId,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// The executor did not announce itself in time, or exited first.
    #[error(
        "the executor of sandbox {id} did not become ready (waited up to {timeout:?}): {detail}"
    )]
    ExecutorNotReady {
        /// The sandbox.
        id: SandboxId,
        /// How long the dispatcher waited.
        timeout: Duration,
        /// What was seen instead (exit, stderr tail, wrong protocol version).
        detail: String,
    },
    /// No such sandbox (never existed, or not attached on this instance).
    #[error("sandbox {id} not found{}", if *.attached_elsewhere { " on this orchestrator instance (it is held by another one)" } else { "" })]
    SandboxNotFound {
        /// The id asked for.
        id: SandboxId,
        /// The row exists but another instance holds the stream.
        attached_elsewhere: bool,
    },
    /// The sandbox's executor stream is gone: the container died, was removed or destroyed.
    #[error("sandbox {id} is gone: {reason}")]
    SandboxGone {
        /// The sandbox.
        id: SandboxId,
        /// Why the stream ended.
        reason: String,
    },
    /// A call got no answer before its deadline.
    #[error("{op} in sandbox {id} got no answer within {after:?}")]
    Timeout {
        /// The sandbox.
        id: SandboxId,
        /// The operation's wire name.
        op: &'static str,
        /// The deadline that expired.
        after: Duration,
    },
    /// The executor said something the dispatcher cannot understand.
    #[error("executor protocol error in sandbox {id}: {detail}")]
    Protocol {
        /// The sandbox.
        id: SandboxId,
        /// What was wrong.
        detail: String,
    },
    /// The sandbox's egress network, its proxy or its host firewall rules could not be set up;
    /// nothing of the sandbox is left running (fail closed).
    #[error("egress network of sandbox {id}: {detail}")]
    Network {
        /// The sandbox.
        id: SandboxId,
        /// Which step failed and why.
        detail: String,
    },
    /// Another Docker Engine request failed.
    #[error("Docker engine request failed while {action}: {source}")]
    Engine {
        /// What the dispatcher was doing.
        action: String,
        /// The engine's answer.
        #[source]
        source: bollard::errors::Error,
    },
    /// A database statement failed.
    #[error("database statement failed while {action}: {source}")]
    Db {
        /// What the dispatcher was doing.
        action: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The node holds as much client data in memory as it allows (`budget.rs`).
    #[error(transparent)]
    MemoryBound(#[from] crate::budget::Exhausted),
    /// The sandbox is checkpointed (paused with its memory, `checkpoint.rs`): no call reaches
    /// it until it is restored.
    #[error("sandbox {id} is paused with its memory (checkpointed): resume it first")]
    Checkpointed {
        /// The sandbox.
        id: SandboxId,
    },
    /// The sandbox cannot be checkpointed here (its class, or the engine); nothing changed.
    #[error("sandbox {id} cannot be paused with its memory: {detail}")]
    CheckpointUnavailable {
        /// The sandbox.
        id: SandboxId,
        /// Why, and what would make it possible.
        detail: String,
    },
    /// The sandbox holds more memory than its checkpoint may take; nothing changed.
    #[error(
        "sandbox {id} holds {bytes} bytes of memory, more than the {max_bytes} bytes its \
         checkpoint may take"
    )]
    CheckpointTooLarge {
        /// The sandbox.
        id: SandboxId,
        /// The memory it holds (its container's usage, gVisor's own included).
        bytes: u64,
        /// The caller's bound.
        max_bytes: u64,
    },
    /// The sandbox's checkpoint is on another Docker engine: only a replica driving that
    /// engine can restore it.
    #[error(
        "sandbox {id} was paused with its memory on Docker engine {engine}; only a replica \
         driving that engine can resume it"
    )]
    CheckpointElsewhere {
        /// The sandbox.
        id: SandboxId,
        /// The engine holding its checkpoint.
        engine: String,
    },
    /// A directory copied out of a sandbox is larger than the caller allows.
    #[error("{dir} of sandbox {id} holds more than {max_bytes} bytes (as a tar archive)")]
    ArchiveTooLarge {
        /// The sandbox.
        id: SandboxId,
        /// The directory.
        dir: String,
        /// The caller's bound.
        max_bytes: u64,
    },
    /// An archive copied out of or into a sandbox is not data beneath the directory it names
    /// (the directory is a symbolic link or missing, or the archive is not a tar stream); nothing
    /// was copied.
    #[error("archive of {dir} in sandbox {id} refused: {reason}")]
    ArchiveRefused {
        /// The sandbox.
        id: SandboxId,
        /// The directory.
        dir: String,
        /// What is wrong.
        reason: String,
    },
    /// The executor refused an operation on a live process or watch (not found, a limit of the
    /// sandbox, a program or path not allowed); nothing was started or changed.
    #[error("{op} in sandbox {id} was refused: {kind}: {message}")]
    Refused {
        /// The sandbox.
        id: SandboxId,
        /// The operation's wire name.
        op: &'static str,
        /// The executor's error kind (`limit_reached`, `not_found`, `path_not_allowed`, ...).
        kind: sandbox_executor::protocol::ErrorKind,
        /// The executor's explanation.
        message: String,
    },
    /// A file transfer stopped because its caller went away (an upload's source ended before
    /// its last byte, a download's reader left); the executor was told to cancel it, which
    /// removes a half-written file.
    #[error("{op} in sandbox {id} was abandoned: {reason}")]
    Abandoned {
        /// The sandbox.
        id: SandboxId,
        /// The operation's wire name.
        op: &'static str,
        /// What went away.
        reason: String,
    },
    /// Another live instance holds the sandbox and could not be asked to run the call.
    #[error("sandbox {id} is held by instance {holder}, which could not be reached: {detail}")]
    Forward {
        /// The sandbox.
        id: SandboxId,
        /// The instance holding its stream.
        holder: uuid::Uuid,
        /// What went wrong on the way.
        detail: String,
    },
    /// The holder did not take the call and certainly did not run it: it is recorded as
    /// stopped, said it is stopping, or its peer port refused the connection. The caller's
    /// dispatcher hands the sandbox over to a live replica and retries (`takeover.rs`); this
    /// error reaches a caller only when nobody could take the sandbox over in time.
    #[error("sandbox {id} is held by instance {holder}, which is not taking calls: {detail}")]
    HolderUnavailable {
        /// The sandbox.
        id: SandboxId,
        /// The instance recorded as holding it.
        holder: uuid::Uuid,
        /// Why it took no call.
        detail: String,
        /// It said it is stopping (it records its stop shortly): worth waiting for.
        stopping: bool,
    },
    /// This instance's lease on its sandboxes does not hold (it could not renew it in time, or
    /// a peer fenced it off as silent), so it serves none of them until it renews and takes
    /// back what nobody else claimed meanwhile; another instance may hold the sandbox now.
    #[error(
        "this orchestrator instance does not hold {} now: {reason}; another instance may hold \
         it, retry",
        match id { Some(id) => format!("sandbox {id}"), None => "its sandboxes".to_owned() }
    )]
    LeaseLapsed {
        /// The sandbox asked for (`None`: a new one).
        id: Option<SandboxId>,
        /// Why the lease does not hold.
        reason: String,
    },
    /// Another replica could not be asked to create a sandbox on its engine.
    #[error("replica {target} could not be asked to create a sandbox: {detail}")]
    ForwardCreate {
        /// The replica asked.
        target: uuid::Uuid,
        /// What went wrong on the way.
        detail: String,
    },
    /// The Docker engine's ID could not be read, so placement could not tell it from others.
    #[error("cannot tell which Docker engine this is: {detail}")]
    EngineUnknown {
        /// Why.
        detail: String,
    },
    /// No Docker engine of the cluster has room for the sandbox (each engine's live sandboxes
    /// and reserved memory are bounded by the replicas driving it); nothing was created.
    #[error("no Docker engine has room for another sandbox: {detail}")]
    NoRoom {
        /// What each engine tried had (or why it could not be asked).
        detail: String,
    },
    /// The dispatcher is shutting down and takes no new work.
    #[error("the dispatcher is shutting down")]
    ShuttingDown,
}

/// Shorthand used throughout the crate.
pub type Result<T, E = DispatchError> = std::result::Result<T, E>;

/// Wraps a driver error with what was being done.
pub(crate) fn db(action: &'static str) -> impl FnOnce(sqlx::Error) -> DispatchError {
    move |source| DispatchError::Db { action, source }
}

/// Wraps an engine error with what was being done.
pub(crate) fn engine(
    action: impl Into<String>,
) -> impl FnOnce(bollard::errors::Error) -> DispatchError {
    let action = action.into();
    move |source| DispatchError::Engine { action, source }
}

/// True when the engine answered 404 (the object is already gone).
pub(crate) fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// True when the engine answered 409 (conflict: in use, already in progress).
pub(crate) fn is_conflict(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}
