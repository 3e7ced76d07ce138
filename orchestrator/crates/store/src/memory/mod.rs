//! Agent memory across executions (`spec.execution.memory`): what an agent chose to remember.
//!
//! An agent with memory on is offered two tools: `aegis.memory.write` saves a note (a fact, a
//! preference, a lesson), `aegis.memory.recall` searches its notes. When one of its executions
//! starts, the notes that best match the task are put into its prompt, in a delimited section,
//! within a token budget ([`prompt`]). The notes live in PostgreSQL (`agent_memories`, [`store`]),
//! ranked by full text.
//!
//! A memory is a [`Scope`]: tenant, agent name and owner. The owner is the principal at the root
//! of the execution tree (the API key or SEAL session that started it, or that started the
//! workflow whose state started it, see [`owner_of`]), so two principals running one agent never
//! see each other's notes, unless the manifest says `shared: true`, in which case the owner is
//! [`SHARED_OWNER`] for everyone. The scope comes from the calling execution, never from a tool's
//! arguments: the router resolves it (`Scope::of_caller`) and `policy::check_memory_call` refuses
//! every other caller, and agents whose memory is off.
//!
//! Bounds (node config `memory:`): a note is at most `max_note_bytes`; a memory holds at most
//! `max_notes_per_scope` notes, and a write to a full memory is refused (nothing is evicted: a
//! memory never loses a note silently; operators erase); an equal note is not saved twice. The
//! prompt gets at most `recall_tokens` (the manifest's, capped by `max_recall_tokens`).
//! Operators list and erase notes (`aegis.memory.list|erase`, REST under
//! `/v1/agents/{name}/memories`); erased rows are deleted, so they are never recalled again.

pub mod prompt;
pub mod store;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use aegis_core::caller::{Caller, CallerKind};
use aegis_manifest::{AgentView, MemorySpec};

pub use aegis_manifest::MEMORY_TOOLS;

/// The owner of a shared memory (`spec.execution.memory.shared: true`); a principal key always
/// has the form `kind:id`, so it never collides with one.
pub const SHARED_OWNER: &str = "*";

/// How many links of "started by" are followed from a workflow's agent to the principal that
/// started the tree (workflow -> the agent execution that ran it -> its principal, ...).
const MAX_OWNER_HOPS: usize = 8;

/// `memory:` in the node configuration: the bounds of every memory.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Largest note, in bytes of UTF-8 (at most [`MemoryConfig::NOTE_BYTES_CEILING`]).
    pub max_note_bytes: u64,
    /// Most notes one memory (tenant, agent, owner) holds; a write beyond is refused.
    pub max_notes_per_scope: u64,
    /// Ceiling of a manifest's `recall_tokens` (the notes put into one prompt).
    pub max_recall_tokens: u64,
}

impl MemoryConfig {
    /// The `memory:` section on its own: bounds of at least 1, notes no larger than the ceiling.
    pub fn check(&self) -> Result<(), aegis_core::settings::Invalid> {
        aegis_core::settings::at_least_one(&[
            ("max_note_bytes", self.max_note_bytes),
            ("max_notes_per_scope", self.max_notes_per_scope),
        ])?;
        if self.max_note_bytes > Self::NOTE_BYTES_CEILING {
            return Err(aegis_core::settings::Invalid::new(
                "max_note_bytes",
                format!(
                    "expected at most {} bytes (a note is text put into prompts)",
                    Self::NOTE_BYTES_CEILING
                ),
            ));
        }
        Ok(())
    }

    /// Largest `max_note_bytes` the node accepts (the write tool's schema refuses longer notes
    /// before anything runs).
    pub const NOTE_BYTES_CEILING: u64 = 65536;
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_note_bytes: 4096,
            max_notes_per_scope: 1000,
            max_recall_tokens: 4000,
        }
    }
}

/// True for the tools an agent calls on its own memory (not the operators' list and erase).
pub fn is_agent_tool(tool: &str) -> bool {
    MEMORY_TOOLS.contains(&tool)
}

/// One memory: whose notes a call reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Tenant.
    pub tenant: String,
    /// Agent name.
    pub agent: String,
    /// Principal key (`api_key:<id>`, ...) or [`SHARED_OWNER`].
    pub owner: String,
    /// The manifest's settings.
    pub spec: MemorySpec,
    /// The execution acting on it (recorded with the notes it writes).
    pub execution: Uuid,
}

impl Scope {
    /// The memory of an execution of `agent` (tenant `tenant`, manifest `manifest`); `None` when
    /// the manifest has memory off.
    pub async fn resolve(
        pool: &PgPool,
        tenant: &str,
        agent: &str,
        manifest: &Value,
        execution: Uuid,
    ) -> Result<Option<Self>, MemoryError> {
        let Some(spec) = AgentView(manifest).memory() else {
            return Ok(None);
        };
        let owner = if spec.shared {
            SHARED_OWNER.to_owned()
        } else {
            owner_of(pool, execution)
                .await?
                .ok_or(MemoryError::NoExecution(execution))?
        };
        Ok(Some(Self {
            tenant: tenant.to_owned(),
            agent: agent.to_owned(),
            owner,
            spec,
            execution,
        }))
    }

    /// The memory of a caller: an agent execution's, by the manifest version it runs; `None`
    /// for any other caller, and for an execution whose agent has memory off.
    pub async fn of_caller(pool: &PgPool, caller: &Caller) -> Result<Option<Self>, MemoryError> {
        if caller.kind != CallerKind::Execution {
            return Ok(None);
        }
        let Ok(id) = Uuid::parse_str(&caller.id) else {
            return Ok(None);
        };
        let row: Option<(String, String, Value)> = sqlx::query_as(
            "SELECT e.tenant_id, e.agent_name, v.manifest FROM executions e \
             JOIN definition_versions v ON v.id = e.agent_version_id WHERE e.id = $1",
        )
        .bind(id)
        .fetch_optional(pool)
        .await?;
        let Some((tenant, agent, manifest)) = row else {
            return Ok(None);
        };
        // An execution acts in its own tenant; a caller claiming another is not this execution.
        if tenant != caller.tenant {
            return Ok(None);
        }
        Self::resolve(pool, &tenant, &agent, &manifest, id).await
    }
}

/// Why memory could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The note is over `memory.max_note_bytes`.
    #[error(
        "the note is {bytes} bytes; a note may have at most {max} bytes (memory.max_note_bytes): \
         keep one fact per note, in a sentence or two"
    )]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The bound.
        max: u64,
    },
    /// The memory holds `memory.max_notes_per_scope` notes already.
    #[error(
        "this memory holds {notes} notes, the most it may (memory.max_notes_per_scope = {max}); \
         nothing was saved and no note was dropped: an operator can erase notes \
         (DELETE /v1/agents/{agent}/memories)"
    )]
    Full {
        /// The agent.
        agent: String,
        /// Notes held.
        notes: i64,
        /// The bound.
        max: u64,
    },
    /// `note_id` is not one of the agent's notes (or not of the owner given).
    #[error("agent `{agent}` has no note {note}{}", owner.as_deref().map(|o| format!(" of owner `{o}`")).unwrap_or_default())]
    NoSuchNote {
        /// The agent.
        agent: String,
        /// The note asked for.
        note: Uuid,
        /// The owner filter given.
        owner: Option<String>,
    },
    /// The execution's row is gone (removed while it ran).
    #[error("execution {0} is not recorded, so its memory is unknown")]
    NoExecution(Uuid),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The principal whose memory an execution reads and writes: the principal recorded with it (the
/// key or session at the root of its tree of child executions). An agent a workflow state
/// started records the workflow execution as its principal (`execution:<id>`); its memory's
/// owner is whoever started that workflow (for a subworkflow, the top workflow's starter; for a
/// workflow an agent started, that agent's principal), so a pipeline's agents remember per person
/// who runs the pipeline, not per run.
pub async fn owner_of(pool: &PgPool, execution: Uuid) -> Result<Option<String>, sqlx::Error> {
    let Some(mut principal) = principal_of(pool, execution).await? else {
        return Ok(None);
    };
    for _ in 0..MAX_OWNER_HOPS {
        let Some(id) = principal
            .strip_prefix("execution:")
            .and_then(|s| Uuid::parse_str(s).ok())
        else {
            break;
        };
        let workflow: Option<(String, String)> =
            sqlx::query_as("SELECT caller_kind, caller_id FROM workflow_executions WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await?;
        let next = match workflow {
            Some((kind, caller)) => aegis_policy::executions::principal_key(&kind, &caller),
            None => match principal_of(pool, id).await? {
                Some(p) => p,
                None => break,
            },
        };
        if next == principal {
            break;
        }
        principal = next;
    }
    Ok(Some(principal))
}

/// The principal recorded with an agent execution (rows from before the column: its caller).
async fn principal_of(pool: &PgPool, execution: Uuid) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(principal, caller_kind || ':' || caller_id) FROM executions WHERE id = $1",
    )
    .bind(execution)
    .fetch_optional(pool)
    .await
}
