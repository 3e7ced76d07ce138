//! Search over the registry: full-text ranking plus trigram similarity, in PostgreSQL alone.
//!
//! Each version row carries a generated `search_vector` (migration `20261124000050`): its name,
//! description, labels, tools, workflow state kinds and names, instructions and prompts, weighted
//! in that order of importance. A query matches a definition's latest version when any of its
//! words (stemmed, stop words dropped) occurs there, or when the definition's name is close to
//! the query by trigrams (so `imge-resizr` still finds `image-resizer`).
//!
//! The score is in `[0, 1]`: a full-text hit scores `0.5 + 0.5 * rank / (rank + 1)` (any hit at
//! least 0.5, more and weightier hits higher), a name resemblance scores its trigram similarity
//! (`word_similarity`, so the name may be part of a longer query), and a definition gets the
//! better of the two. Which definitions are searched is exactly what the list tools show
//! ([`ScopeFilter`]), so a search never reveals what a listing would not.

use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::{kind_str, RegistryError, Scope, ScopeFilter, LATEST_FIRST};
use aegis_manifest::ManifestKind;

/// What to search for, and where.
#[derive(Debug, Clone)]
pub struct SearchQuery<'a> {
    /// Free text.
    pub text: &'a str,
    /// Which definitions are candidates, relative to the caller's tenant.
    pub filter: ScopeFilter,
    /// Labels that must all be present with these values.
    pub labels: Option<&'a Value>,
    /// Leave out definitions carrying [`BUILTIN_LABEL`].
    pub exclude_builtin: bool,
    /// Lowest score returned.
    pub min_score: f64,
    /// Page size.
    pub limit: i64,
    /// Matches skipped before the page.
    pub offset: i64,
}

/// The label the node puts on the definitions it ships (the intent pipeline's workflow and
/// agents), so a search can leave these platform templates out.
pub const BUILTIN_LABEL: &str = "aegis/builtin";

/// One match.
#[derive(Debug, Clone, Serialize)]
pub struct SearchHit {
    /// Definition id.
    pub id: Uuid,
    pub name: String,
    /// Latest version.
    pub version: String,
    pub description: Option<String>,
    pub labels: Value,
    /// `tenant` or `global`.
    pub scope: Scope,
    /// Relevance in `[0, 1]`.
    pub score: f64,
}

/// A page of matches, best first, and how many matched in all.
#[derive(Debug, Clone)]
pub struct SearchPage {
    /// This page.
    pub hits: Vec<SearchHit>,
    /// Matches above `min_score`, across all pages.
    pub total: i64,
}

#[derive(sqlx::FromRow)]
struct Row {
    total: i64,
    id: Option<Uuid>,
    name: Option<String>,
    version: Option<String>,
    description: Option<String>,
    labels: Option<Value>,
    scope: Option<String>,
    score: Option<f64>,
}

/// Searches the latest versions of the definitions of `kind` that `q.filter` lets the tenant see.
pub async fn search(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    q: &SearchQuery<'_>,
) -> Result<SearchPage, RegistryError> {
    // `plainto_tsquery` joins words with AND; a description of what one looks for should match
    // on any of its words, so the `&` become `|` (phrases from hyphenated words stay phrases).
    let sql = format!(
        "WITH latest AS ( \
           SELECT DISTINCT ON (d.name, d.tenant_id <> $1, d.id) d.id, d.name, d.scope, v.version, \
                  v.description, v.labels, v.search_vector \
           FROM definitions d JOIN definition_versions v ON v.definition_id = d.id \
           WHERE {condition} AND d.kind = $2 AND d.deleted_at IS NULL \
           ORDER BY d.name, d.tenant_id <> $1, d.id, {LATEST_FIRST} \
         ), \
         q AS ( \
           SELECT NULLIF(replace(plainto_tsquery('english', $3)::text, ' & ', ' | '), '')::tsquery AS tsq \
         ), \
         scored AS ( \
           SELECT l.*, greatest( \
                    CASE WHEN l.search_vector @@ q.tsq \
                         THEN 0.5 + 0.5 * ts_rank(l.search_vector, q.tsq, 32) ELSE 0 END, \
                    word_similarity(lower(l.name), lower($3)), \
                    similarity(lower(l.name), lower($3)) \
                  )::float8 AS score \
           FROM latest l CROSS JOIN q \
         ), \
         matched AS ( \
           SELECT * FROM scored \
           WHERE score >= $4 AND ($5::jsonb IS NULL OR labels @> $5) \
             AND (NOT $6 OR NOT labels ? '{BUILTIN_LABEL}') \
         ) \
         SELECT t.total, m.id, m.name, m.version, m.description, m.labels, m.scope, m.score \
         FROM (SELECT count(*) AS total FROM matched) t \
         LEFT JOIN LATERAL ( \
           SELECT * FROM matched ORDER BY score DESC, name, id LIMIT $7 OFFSET $8 \
         ) m ON true",
        condition = q.filter.condition(),
    );
    let rows: Vec<Row> = sqlx::query_as(&sql)
        .bind(tenant)
        .bind(kind_str(kind))
        .bind(q.text)
        .bind(q.min_score)
        .bind(q.labels)
        .bind(q.exclude_builtin)
        .bind(q.limit)
        .bind(q.offset)
        .fetch_all(pool)
        .await?;
    let total = rows.first().map(|r| r.total).unwrap_or(0);
    let mut hits = Vec::with_capacity(rows.len());
    for r in rows {
        let (Some(id), Some(name), Some(version), Some(scope), Some(score)) =
            (r.id, r.name, r.version, r.scope, r.score)
        else {
            continue; // the row that only carries the total of an empty page
        };
        hits.push(SearchHit {
            id,
            name,
            version,
            description: r.description,
            labels: r.labels.unwrap_or(Value::Null),
            scope: Scope::try_from(scope)
                .map_err(|e| RegistryError::Db(sqlx::Error::Decode(e.into())))?,
            score,
        });
    }
    Ok(SearchPage { hits, total })
}
