//! The runtime registry: which image runs an agent that names a language and version.
//!
//! The table is `runtime-images/registry.yaml`, embedded at build time so the binary and the
//! images it expects always agree; `runtime-images/build.sh` reads the same file.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// One standard runtime.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Language as written in manifests.
    pub language: String,
    /// Version string (always a string: "3.11" is not a float).
    pub version: String,
    /// Image tag the dispatcher runs.
    pub image: String,
    /// Dockerfile, relative to runtime-images/.
    #[serde(skip_serializing)]
    pub dockerfile: String,
    /// One-line description.
    pub description: String,
    /// E2B's name for this runtime as a template (`code-interpreter-v1`), where E2B's SDKs ask
    /// for it by a name of their own; the E2B door maps that name here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2b_template: Option<String>,
    /// A command line (words split on spaces, no shell) started in the background as the
    /// sandbox user when an E2B sandbox of this runtime is made: a server the template needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// A command line run after `start`; its exit 0 says the server is ready, and the create
    /// answers only then (as E2B's templates start and wait before a sandbox is handed out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
}

impl Runtime {
    /// The runtime E2B's SDKs name `template` (its `e2b_template`), if any.
    pub fn of_e2b_template(template: &str) -> Option<&'static Runtime> {
        registry()
            .ok()?
            .runtimes
            .iter()
            .find(|r| r.e2b_template.as_deref() == Some(template))
    }
}

/// The language/version used when a manifest names none.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DefaultRuntime {
    pub language: String,
    pub version: String,
}

/// The whole registry file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    /// Default runtime.
    pub default: DefaultRuntime,
    /// Every standard runtime.
    pub runtimes: Vec<Runtime>,
}

static REGISTRY: LazyLock<Result<Registry, String>> = LazyLock::new(|| {
    serde_yaml::from_str(include_str!("../../../../runtime-images/registry.yaml"))
        .map_err(|e| format!("runtime-images/registry.yaml: {e}"))
});

/// The embedded registry; an error only if the shipped file is malformed (a test guards it).
pub fn registry() -> Result<&'static Registry, &'static str> {
    REGISTRY.as_ref().map_err(String::as_str)
}

/// The image for a language and version, if registered.
pub fn lookup(language: &str, version: &str) -> Option<&'static Runtime> {
    registry()
        .ok()?
        .runtimes
        .iter()
        .find(|r| r.language == language && r.version == version)
}

/// The registered versions of `language`, in registry order (empty for an unknown language).
pub fn versions(language: &str) -> Vec<String> {
    registry()
        .map(|r| {
            r.runtimes
                .iter()
                .filter(|r| r.language == language)
                .map(|r| r.version.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// True when the pair is registered.
pub fn known(language: &str, version: &str) -> bool {
    lookup(language, version).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_registry_parses_and_its_default_exists() {
        let r = registry().expect("registry.yaml parses");
        assert!(known(&r.default.language, &r.default.version));
        assert!(known("python", "3.11"));
        assert!(!known("python", "2.7"));
    }

    #[test]
    fn e2b_templates_name_a_runtime_with_a_server_and_its_readiness() {
        let ci = Runtime::of_e2b_template("code-interpreter-v1").expect("the template is mapped");
        assert_eq!(
            (ci.language.as_str(), ci.version.as_str()),
            ("code-interpreter", "1")
        );
        assert!(ci.start.is_some() && ci.ready.is_some());
        assert!(Runtime::of_e2b_template("base").is_none());
    }
}
