//! Definitions the node ships: the intent pipeline's workflow and its writer agents, and the
//! judge of AEGIS's older `semantic` validation ([`SEMANTIC_JUDGE`]).
//!
//! The manifests are files in `orchestrator/builtin/`, embedded at build time and deployed
//! through the registry like any other definition, labelled `aegis/builtin` (so a search can leave
//! them out). A tenant gets them the first time it needs them (the pipeline with
//! `aegis.execute.intent`, the judge when an agent is first judged by it), and at every node start
//! the tenants that have them get the shipped version if theirs differs, so an upgrade of the
//! node upgrades them. Deploying them into every tenant at start instead would put five
//! definitions into every listing of tenants that never use them.
//!
//! Idempotent across replicas: an identical version already deployed is left alone; a racing
//! replica that deployed the same version first makes the second deploy a no-op
//! (`VersionExists`); a version whose text changed without a version bump is overwritten.

use sqlx::PgPool;

use aegis_manifest::{self as manifest, ManifestErrors, ManifestKind, NodeKnowledge};
use aegis_store::registry::{self, DeployMode, RegistryError};

/// Name of the intent pipeline workflow.
pub const INTENT_PIPELINE: &str = "aegis-intent-pipeline";

/// Every shipped manifest, agents before the workflow that names them.
pub const MANIFESTS: &[(ManifestKind, &str)] = &[
    (
        ManifestKind::Agent,
        include_str!("../../../builtin/intent-python.yaml"),
    ),
    (
        ManifestKind::Agent,
        include_str!("../../../builtin/intent-bash.yaml"),
    ),
    (
        ManifestKind::Agent,
        include_str!("../../../builtin/intent-javascript.yaml"),
    ),
    (
        ManifestKind::Workflow,
        include_str!("../../../builtin/intent-pipeline.yaml"),
    ),
];

pub use aegis_manifest::SEMANTIC_JUDGE;

/// The judge agent of older `semantic` validations, deployed on its own ([`ensure_judge`]).
pub const JUDGE_MANIFEST: &str = include_str!("../../../builtin/semantic-judge.yaml");

/// Why the shipped definitions could not be deployed.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    /// A shipped manifest does not validate (a packaging bug; a unit test guards it).
    #[error("a built-in manifest is invalid: {0}")]
    Invalid(#[from] ManifestErrors),
    /// The registry refused or failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Validates a shipped manifest against this node's tools and runtimes.
fn parse(kind: ManifestKind, text: &str) -> Result<manifest::ParsedManifest, ManifestErrors> {
    let tool_exists = |name: &str| aegis_core::catalog::catalog().is_ok_and(|c| c.contains(name));
    let runtime_known =
        |language: &str, version: &str| aegis_core::runtimes::known(language, version);
    manifest::parse(
        kind,
        text,
        &NodeKnowledge {
            tool_exists: &tool_exists,
            runtime_known: &runtime_known,
            // Shipped manifests carry their own allowlists; a node default never applies.
            default_command_allowlist: &|_| None,
            runs_in_sandbox: &aegis_policy::needs_sandbox,
            // Shipped manifests name installed runtimes.
            runtime_alias: &|_, _| None,
            runtime_versions: &aegis_core::runtimes::versions,
            mcp_servers: &[],
        },
    )
}

/// Deploys the intent pipeline's definitions into `tenant` unless that exact text is deployed
/// already.
pub async fn ensure(pool: &PgPool, tenant: &str) -> Result<(), BuiltinError> {
    for (kind, text) in MANIFESTS {
        ensure_one(pool, tenant, *kind, text).await?;
    }
    Ok(())
}

/// Deploys the judge of older `semantic` validations into `tenant` unless it is there already.
pub async fn ensure_judge(pool: &PgPool, tenant: &str) -> Result<(), BuiltinError> {
    ensure_one(pool, tenant, ManifestKind::Agent, JUDGE_MANIFEST).await
}

async fn ensure_one(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    text: &str,
) -> Result<(), BuiltinError> {
    let parsed = parse(kind, text)?;
    let version = parsed.version.to_string();
    let force = match registry::get(pool, tenant, kind, &parsed.name, Some(&version)).await {
        Ok(d) if d.manifest_yaml == parsed.yaml => return Ok(()),
        // The same version with another text: the shipped one wins.
        Ok(_) => true,
        Err(RegistryError::NotFound { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    match registry::deploy(pool, tenant, &parsed, DeployMode::Create, force).await {
        Ok(d) => {
            tracing::info!(tenant, name = %d.name, version = %d.version, "built-in definition deployed")
        }
        // Another replica deployed it meanwhile.
        Err(RegistryError::VersionExists { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// At start: brings the tenants that already have the pipeline up to the shipped version.
pub async fn upgrade(pool: &PgPool) -> Result<usize, BuiltinError> {
    let tenants = tenants_with(pool, "workflow", INTENT_PIPELINE).await?;
    for tenant in &tenants {
        ensure(pool, tenant).await?;
    }
    for tenant in &tenants_with(pool, "agent", SEMANTIC_JUDGE).await? {
        ensure_judge(pool, tenant).await?;
    }
    Ok(tenants.len())
}

/// The tenants that have a live definition of `kind` named `name`: the ones [`upgrade`] brings
/// up to the shipped version of that built-in.
async fn tenants_with(pool: &PgPool, kind: &str, name: &str) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT tenant_id FROM definitions WHERE kind = $1 AND name = $2 \
         AND deleted_at IS NULL",
    )
    .bind(kind)
    .bind(name)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_manifest_validates_on_this_node_and_is_labelled_builtin() {
        let judge = parse(ManifestKind::Agent, JUDGE_MANIFEST).expect("the judge validates");
        assert_eq!(judge.name, SEMANTIC_JUDGE);
        assert!(judge.agent().tools().is_empty(), "no tools, so no sandbox");
        for (kind, text) in MANIFESTS
            .iter()
            .chain(&[(ManifestKind::Agent, JUDGE_MANIFEST)])
        {
            let parsed = parse(*kind, text).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert_eq!(
                parsed
                    .labels
                    .get(registry::BUILTIN_LABEL)
                    .map(String::as_str),
                Some("true"),
                "{}",
                parsed.name
            );
        }
    }
}
