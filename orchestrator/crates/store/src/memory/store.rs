//! The `agent_memories` rows: write a note under the memory's bounds, recall by full-text rank,
//! list and erase for operators.
//!
//! Ranking is PostgreSQL's own: each row has a generated `search_vector` (tags weighted above the
//! note's words, migration `20261126000010`); a query matches a note when any of its words
//! (stemmed, stop words dropped) occurs there, and notes are ordered by `ts_rank`, newer first
//! among equals. A write takes a transaction-scoped advisory lock on its memory, so the count
//! checked against `max_notes_per_scope` is the count the insert adds to, even when executions
//! of one agent write at the same time.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::{MemoryConfig, MemoryError, Scope};

/// One saved note.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Note {
    /// Its id.
    #[serde(rename = "note_id")]
    pub id: Uuid,
    /// The note.
    pub content: String,
    /// Its keywords (a JSON array of strings).
    pub tags: Value,
    /// When it was saved.
    pub created_at: DateTime<Utc>,
    /// Full-text relevance to the query; `None` when listed newest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[sqlx(default)]
    pub score: Option<f64>,
}

/// A note as operators list it: whose, and which execution saved it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct OwnedNote {
    /// Its id.
    #[serde(rename = "note_id")]
    pub id: Uuid,
    /// The principal whose note it is, or `*` for a shared memory.
    pub owner: String,
    /// The note.
    pub content: String,
    /// Its keywords.
    pub tags: Value,
    /// When it was saved.
    pub created_at: DateTime<Utc>,
    /// The execution that saved it.
    pub execution_id: Option<Uuid>,
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The note's id (the equal note's, when one was saved before).
    pub id: Uuid,
    /// False when an equal note was there already.
    pub created: bool,
    /// Notes in the memory afterwards.
    pub notes: i64,
}

/// Saves `content` (with `tags`) in `scope`, unless an equal note is there; refuses a note over
/// `max_note_bytes` and a write to a memory holding `max_notes_per_scope` notes.
pub async fn write(
    pool: &PgPool,
    scope: &Scope,
    content: &str,
    tags: &[String],
    limits: &MemoryConfig,
) -> Result<Written, MemoryError> {
    if content.len() as u64 > limits.max_note_bytes {
        return Err(MemoryError::TooLarge {
            bytes: content.len(),
            max: limits.max_note_bytes,
        });
    }
    let mut tx = pool.begin().await?;
    // One writer per memory at a time (released at commit or rollback). The separator cannot
    // occur in a tenant or an agent name.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!(
            "agent_memories\u{1f}{}\u{1f}{}\u{1f}{}",
            scope.tenant, scope.agent, scope.owner
        ))
        .execute(&mut *tx)
        .await?;
    let notes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_memories WHERE tenant_id = $1 AND agent_name = $2 AND owner = $3",
    )
    .bind(&scope.tenant)
    .bind(&scope.agent)
    .bind(&scope.owner)
    .fetch_one(&mut *tx)
    .await?;
    let equal: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM agent_memories WHERE tenant_id = $1 AND agent_name = $2 AND owner = $3 \
         AND md5(content) = md5($4) AND content = $4",
    )
    .bind(&scope.tenant)
    .bind(&scope.agent)
    .bind(&scope.owner)
    .bind(content)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(id) = equal {
        return Ok(Written {
            id,
            created: false,
            notes,
        });
    }
    if notes as u64 >= limits.max_notes_per_scope {
        return Err(MemoryError::Full {
            agent: scope.agent.clone(),
            notes,
            max: limits.max_notes_per_scope,
        });
    }
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO agent_memories (id, tenant_id, agent_name, owner, content, tags, execution_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(id)
    .bind(&scope.tenant)
    .bind(&scope.agent)
    .bind(&scope.owner)
    .bind(content)
    .bind(Value::from(tags.to_vec()))
    .bind(scope.execution)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Written {
        id,
        created: true,
        notes: notes + 1,
    })
}

/// How recalled notes are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// By full-text relevance to the query.
    Rank,
    /// Newest first (the query had no searchable word).
    Newest,
}

/// The notes of `scope` that match `query` (any of its words), best first, at most `limit`.
/// Without a searchable word in `query`: the newest notes when `newest_otherwise`, else none.
pub async fn recall(
    pool: &PgPool,
    scope: &Scope,
    query: Option<&str>,
    limit: i64,
    newest_otherwise: bool,
) -> Result<(Order, Vec<Note>), MemoryError> {
    // A blank query is NULL here (not ''), so PostgreSQL has no empty query to warn about.
    let query = query.map(search_words).filter(|q| !q.is_empty());
    // `plainto_tsquery` joins words with AND; recall should match on any of them.
    let searchable: Option<String> = sqlx::query_scalar(
        "SELECT NULLIF(replace(plainto_tsquery('english', $1)::text, ' & ', ' | '), '')",
    )
    .bind(query)
    .fetch_one(pool)
    .await?;
    let Some(tsquery) = searchable else {
        if !newest_otherwise {
            return Ok((Order::Rank, Vec::new()));
        }
        let notes = sqlx::query_as(
            "SELECT id, content, tags, created_at FROM agent_memories \
             WHERE tenant_id = $1 AND agent_name = $2 AND owner = $3 \
             ORDER BY created_at DESC, id LIMIT $4",
        )
        .bind(&scope.tenant)
        .bind(&scope.agent)
        .bind(&scope.owner)
        .bind(limit)
        .fetch_all(pool)
        .await?;
        return Ok((Order::Newest, notes));
    };
    let notes = sqlx::query_as(
        "SELECT id, content, tags, created_at, ts_rank(search_vector, $4::tsquery)::float8 AS score \
         FROM agent_memories \
         WHERE tenant_id = $1 AND agent_name = $2 AND owner = $3 AND search_vector @@ $4::tsquery \
         ORDER BY score DESC, created_at DESC, id LIMIT $5",
    )
    .bind(&scope.tenant)
    .bind(&scope.agent)
    .bind(&scope.owner)
    .bind(tsquery)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok((Order::Rank, notes))
}

/// Longest text of distinct words a recall searches for (a prompt's beginning is plenty).
const MAX_QUERY_CHARS: usize = 4000;

/// The distinct words of `text` (letters and digits; first occurrence, case ignored), joined by
/// spaces, at most [`MAX_QUERY_CHARS`]: a prompt repeats its words, and each repetition would be
/// one more term for every note to be matched and ranked against (a 4000-character prompt of
/// repeated sentences took 38 ms over a memory of 1000 notes, its distinct words 6 ms).
pub fn search_words(text: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut words = String::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() || !seen.insert(word.to_lowercase()) {
            continue;
        }
        if words.len() + word.len() + 1 > MAX_QUERY_CHARS {
            break;
        }
        if !words.is_empty() {
            words.push(' ');
        }
        words.push_str(word);
    }
    words
}

/// One page of an agent's notes, newest first, optionally of one owner; and how many there are.
pub async fn list(
    pool: &PgPool,
    tenant: &str,
    agent: &str,
    owner: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<OwnedNote>, i64), MemoryError> {
    let notes = sqlx::query_as(
        "SELECT id, owner, content, tags, created_at, execution_id FROM agent_memories \
         WHERE tenant_id = $1 AND agent_name = $2 AND ($3::text IS NULL OR owner = $3) \
         ORDER BY created_at DESC, id LIMIT $4 OFFSET $5",
    )
    .bind(tenant)
    .bind(agent)
    .bind(owner)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    let total = sqlx::query_scalar(
        "SELECT count(*) FROM agent_memories \
         WHERE tenant_id = $1 AND agent_name = $2 AND ($3::text IS NULL OR owner = $3)",
    )
    .bind(tenant)
    .bind(agent)
    .bind(owner)
    .fetch_one(pool)
    .await?;
    Ok((notes, total))
}

/// Deletes an agent's notes: `note` only, or those of `owner`, or all. A `note` that is not one
/// of them is an error; otherwise the count deleted (possibly 0).
pub async fn erase(
    pool: &PgPool,
    tenant: &str,
    agent: &str,
    owner: Option<&str>,
    note: Option<Uuid>,
) -> Result<u64, MemoryError> {
    let erased = sqlx::query(
        "DELETE FROM agent_memories WHERE tenant_id = $1 AND agent_name = $2 \
         AND ($3::text IS NULL OR owner = $3) AND ($4::uuid IS NULL OR id = $4)",
    )
    .bind(tenant)
    .bind(agent)
    .bind(owner)
    .bind(note)
    .execute(pool)
    .await?
    .rows_affected();
    match note {
        Some(note) if erased == 0 => Err(MemoryError::NoSuchNote {
            agent: agent.to_owned(),
            note,
            owner: owner.map(str::to_owned),
        }),
        _ => Ok(erased),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_its_distinct_words_bounded() {
        assert_eq!(
            search_words("What is the deploy-password? The DEPLOY password, please!"),
            "What is the deploy password please"
        );
        assert_eq!(search_words("  ?! "), "");
        let long = (0..2000)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let bounded = search_words(&long);
        assert!(bounded.len() <= MAX_QUERY_CHARS && bounded.starts_with("w0 w1 w2"));
    }
}
