//! Verifying the chain: from the last checkpoint (cheap, the default) or from the first row, and
//! against an anchor an operator published earlier.
//!
//! Hashes inside the database reveal an edited row, but not the removal of the newest rows: the
//! chain that remains is still a valid chain. That is what the anchor is for. The head (position
//! and hash) is published by `GET /v1/audit/head` and a periodic log line; whoever kept one can
//! ask verification to confirm that the row at that position still exists with that hash.
//!
//! A checkpoint is the last row a verification found intact. The next verification checks that
//! this row is still there with the same hash and content, then recomputes only what came after.
//! Rewriting history before a checkpoint with recomputed hashes changes the checkpoint row's hash
//! and is reported; an edit that leaves the stored hashes alone needs `full` to be found.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::{list, row_hash, AuditRow, Query, COLUMNS, GENESIS};

/// What to verify, from `GET /v1/audit/verify`'s query.
#[derive(Debug, Default, Clone, Deserialize, utoipa::IntoParams)]
pub struct Anchor {
    /// Recompute from the first row instead of the last checkpoint.
    #[serde(default)]
    pub full: bool,
    /// A chain position published earlier (`count` of `GET /v1/audit/head`).
    pub anchor_count: Option<i64>,
    /// The head hash published with that position.
    pub anchor_hash: Option<String>,
}

/// The outcome of recomputing the chain.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Verification {
    /// True when every row checked matches, the checkpoint holds, and the anchor (if given) is found.
    pub valid: bool,
    /// Rows recomputed by this verification.
    pub rows_checked: i64,
    /// Chain position verification started after (0: from the first row).
    pub from_count: i64,
    /// Chain position of the last row (the number of rows in the chain).
    pub count: i64,
    /// Hash of the last row.
    pub head_hash: String,
    /// The first problem found, if any.
    pub first_broken: Option<BrokenRow>,
}

/// Where and why the chain breaks.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BrokenRow {
    /// The row's sequence number (absent when the problem is a missing row).
    pub seq: Option<i64>,
    /// The row's id (absent when the problem is a missing row).
    pub id: Option<Uuid>,
    /// `content_changed` (hash does not match content), `chain_broken` (prev_hash mismatch),
    /// `index_mismatch` (position out of order: a row was removed or inserted),
    /// `checkpoint_changed` / `checkpoint_missing` (the last verified row was altered or
    /// removed), `rows_missing` (the chain is shorter than the anchor) or `anchor_mismatch`.
    pub problem: String,
    /// What was expected and found.
    pub detail: String,
}

impl BrokenRow {
    fn at(row: &AuditRow, problem: &str, detail: String) -> Self {
        Self {
            seq: Some(row.seq),
            id: Some(row.id),
            problem: problem.to_owned(),
            detail,
        }
    }
}

/// Why a verification request cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// `anchor_count` and `anchor_hash` must come together.
    #[error("give both anchor_count and anchor_hash (from GET /v1/audit/head), or neither")]
    IncompleteAnchor,
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The tenant's first row (by `seq`) whose `column` is `value`: the row a checkpoint names
/// (`seq`, unique) or the one at an anchor's position in the chain (`chain_index`).
async fn first_row_where(
    pool: &PgPool,
    tenant: &str,
    column: &'static str,
    value: i64,
) -> Result<Option<AuditRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM audit_log WHERE tenant_id = $1 AND {column} = $2 ORDER BY seq LIMIT 1"
    ))
    .bind(tenant)
    .bind(value)
    .fetch_optional(pool)
    .await
}

/// Verifies the chain (see the module doc); a valid verification moves the checkpoint forward.
pub async fn verify(
    pool: &PgPool,
    tenant: &str,
    anchor: &Anchor,
) -> Result<Verification, VerifyError> {
    let wanted_anchor = wanted_anchor(anchor)?;
    let head = super::head(pool, tenant).await?;
    let mut result = Verification {
        valid: true,
        rows_checked: 0,
        from_count: 0,
        count: head.count,
        head_hash: head.head_hash.clone(),
        first_broken: None,
    };
    let broken = |mut result: Verification, b: BrokenRow| {
        result.valid = false;
        result.first_broken = Some(b);
        Ok(result)
    };

    let start = match start_after_checkpoint(pool, tenant, anchor.full).await? {
        Ok(start) => start,
        Err(b) => return broken(result, b),
    };
    result.from_count = start.index;

    let (last, index) = match recompute(pool, tenant, start, &mut result).await? {
        Ok(end) => end,
        Err(b) => return broken(result, b),
    };

    if let Some((count, hash)) = wanted_anchor {
        if let Some(b) = check_anchor(pool, tenant, head.count, count, &hash).await? {
            return broken(result, b);
        }
    }

    if let Some(row) = last {
        record_checkpoint(pool, tenant, &row, index).await?;
    }
    Ok(result)
}

/// Validating the request comes first: an anchor is a position and a hash, or nothing.
fn wanted_anchor(anchor: &Anchor) -> Result<Option<(i64, String)>, VerifyError> {
    match (&anchor.anchor_count, &anchor.anchor_hash) {
        (Some(count), Some(hash)) => Ok(Some((*count, hash.clone()))),
        (None, None) => Ok(None),
        _ => Err(VerifyError::IncompleteAnchor),
    }
}

/// Where recomputing starts: the previous hash, the chain position and the `seq` to list after.
struct Start {
    prev: String,
    index: i64,
    after: i64,
}

/// A step of its own: the checkpoint is checked (still there, same hash and content) before it
/// is trusted as the place to start from; `full` (or no checkpoint) starts at the first row.
async fn start_after_checkpoint(
    pool: &PgPool,
    tenant: &str,
    full: bool,
) -> Result<Result<Start, BrokenRow>, sqlx::Error> {
    let from_first = Start {
        prev: GENESIS.to_owned(),
        index: 0,
        after: 0,
    };
    let checkpoint: Option<(i64, i64, String)> = if full {
        None
    } else {
        sqlx::query_as("SELECT seq, chain_index, hash FROM audit_checkpoints WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_optional(pool)
            .await?
    };
    let Some((seq, cp_index, cp_hash)) = checkpoint else {
        return Ok(Ok(from_first));
    };
    Ok(match first_row_where(pool, tenant, "seq", seq).await? {
        None => Err(BrokenRow {
            seq: Some(seq),
            id: None,
            problem: "checkpoint_missing".into(),
            detail: format!(
                "row {seq} (chain position {cp_index}) was verified before and is gone"
            ),
        }),
        Some(row)
            if row.hash != cp_hash
                || row_hash(&row) != row.hash
                || row.chain_index != Some(cp_index) =>
        {
            Err(BrokenRow::at(
                &row,
                "checkpoint_changed",
                format!(
                    "verified with hash {cp_hash} at position {cp_index}; it no longer matches"
                ),
            ))
        }
        Some(_) => Ok(Start {
            prev: cp_hash,
            index: cp_index,
            after: seq,
        }),
    })
}

/// The recomputation proper, page by page from `start`: counts into `result.rows_checked` and
/// gives the last row checked with its chain position, or the first row that breaks the chain.
async fn recompute(
    pool: &PgPool,
    tenant: &str,
    start: Start,
    result: &mut Verification,
) -> Result<Result<(Option<AuditRow>, i64), BrokenRow>, sqlx::Error> {
    let Start {
        mut prev,
        mut index,
        mut after,
    } = start;
    let mut last: Option<AuditRow> = None;
    loop {
        let page = list(
            pool,
            tenant,
            &Query {
                after: Some(after),
                limit: Some(500),
                ..Query::default()
            },
        )
        .await?;
        if page.is_empty() {
            break;
        }
        for row in page {
            result.rows_checked += 1;
            index += 1;
            after = row.seq;
            if let Some((problem, detail)) = row_problem(&row, &prev, index) {
                return Ok(Err(BrokenRow::at(&row, problem, detail)));
            }
            prev = row.hash.clone();
            last = Some(row);
        }
    }
    Ok(Ok((last, index)))
}

/// One row against the chain: the link to the previous hash, its own content, its position.
fn row_problem(row: &AuditRow, prev: &str, index: i64) -> Option<(&'static str, String)> {
    if row.prev_hash != prev {
        Some((
            "chain_broken",
            format!(
                "prev_hash {} but the previous row's hash is {prev}",
                row.prev_hash
            ),
        ))
    } else if row_hash(row) != row.hash {
        Some((
            "content_changed",
            "the stored hash does not match the row's content".to_owned(),
        ))
    } else if row.chain_index != Some(index) {
        Some((
            "index_mismatch",
            format!(
                "chain position {:?}, expected {index}",
                row.chain_index.unwrap_or_default()
            ),
        ))
    } else {
        None
    }
}

/// The anchor is checked after the recomputation: the row an operator published must still be
/// at its position with its hash, which catches the removal of the newest rows.
async fn check_anchor(
    pool: &PgPool,
    tenant: &str,
    head_count: i64,
    count: i64,
    hash: &str,
) -> Result<Option<BrokenRow>, sqlx::Error> {
    if head_count < count {
        return Ok(Some(BrokenRow {
            seq: None,
            id: None,
            problem: "rows_missing".into(),
            detail: format!(
                "the anchor names chain position {count}, but the chain ends at {head_count}"
            ),
        }));
    }
    Ok(
        match first_row_where(pool, tenant, "chain_index", count).await? {
            Some(row) if row.hash == hash => None,
            found => {
                let detail = format!(
                    "the anchor names hash {hash} at chain position {count}; found {}",
                    found.as_ref().map_or("no row", |r| r.hash.as_str())
                );
                Some(BrokenRow {
                    seq: found.as_ref().map(|r| r.seq),
                    id: found.as_ref().map(|r| r.id),
                    problem: "anchor_mismatch".into(),
                    detail,
                })
            }
        },
    )
}

/// Recording comes last, and only for a valid verification: the checkpoint moves to `row`.
async fn record_checkpoint(
    pool: &PgPool,
    tenant: &str,
    row: &AuditRow,
    index: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit_checkpoints (tenant_id, seq, chain_index, hash) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (tenant_id) DO UPDATE SET seq = $2, chain_index = $3, hash = $4, verified_at = now()",
    )
    .bind(tenant)
    .bind(row.seq)
    .bind(row.chain_index.unwrap_or(index))
    .bind(&row.hash)
    .execute(pool)
    .await?;
    Ok(())
}
