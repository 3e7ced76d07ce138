//! The checks across sections, once a configuration is loaded: each refusal names the key and
//! where its value came from.

use aegis_core::settings::Invalid;

use super::load::{ConfigError, LoadedConfig};
use super::sandbox::split_runtime;
use super::ExecutionsConfig;

/// Every check of a loaded configuration, in two steps: each section on its own, with the
/// check that lives beside its type (in this crate or the crate that owns the section), then the
/// checks that need two sections or something outside the file. The first problem is the error,
/// named by its full key and where it came from (file line or environment variable).
pub(crate) fn validate(loaded: &LoadedConfig) -> Result<(), ConfigError> {
    let c = &loaded.config;
    let section = |name: &str, result: Result<(), Invalid>| {
        result.map_err(|e| {
            let key = match (name, e.key.as_str()) {
                (name, "") => name.to_owned(),
                ("", key) => key.to_owned(),
                (name, key) => format!("{name}.{key}"),
            };
            ConfigError::Invalid {
                origin: loaded.origin_of(&key),
                key,
                message: e.message,
            }
        })
    };
    section("database", c.database.check())?;
    section("server", c.server.check())?;
    section("sandbox", c.sandbox.check())?;
    section("docker", c.docker.check())?;
    section("e2b", c.e2b.check())?;
    section("seal", c.seal.check())?;
    section("mcp", c.mcp.check())?;
    section("llm", c.llm.validate().map_err(|m| Invalid::new("", m)))?;
    section("executions", c.executions.check())?;
    section("workflows", c.workflows.check())?;
    section("volumes", c.volumes.check())?;
    section("memory", c.memory.check())?;
    section("delivery", c.delivery.check())?;
    section("audit", c.audit.check())?;
    section("log", c.log.check())?;
    section("cluster", c.cluster.check())?;
    let egress = match aegis_egress::Egress::from_config(&c.egress) {
        Ok(egress) => egress,
        Err(e) => return section("egress", Err(Invalid::new(e.key, e.message))),
    };

    // Across sections (their keys are whole).
    section("", mcp_servers_under_egress(&c.mcp_servers, &egress))?;
    section("", skip_judge_tools_exist(&c.executions))?;
    runtime_aliases_installed(loaded)?;
    runtime_isolation_installed(loaded)?;
    e2b_pool_templates_installed(loaded)
}

/// Most idle sandboxes one E2B template's warm pool may keep.
pub const MAX_E2B_POOL: usize = 64;

/// `e2b.pool` names templates this node has (its runtimes) and keeps a bounded number of each.
fn e2b_pool_templates_installed(loaded: &LoadedConfig) -> Result<(), ConfigError> {
    for (template, size) in &loaded.config.e2b.pool {
        let invalid = |message: String| ConfigError::Invalid {
            key: format!("e2b.pool.\"{template}\""),
            origin: loaded.origin_of_entry("e2b.pool", template),
            message,
        };
        if let Err(e) = aegis_sandboxes::find_runtime(template) {
            return Err(invalid(format!(
                "{e}; an E2B template's pool names one of the node's runtimes (e.g. `base`)"
            )));
        }
        if *size > MAX_E2B_POOL {
            return Err(invalid(format!(
                "{size} idle sandboxes is more than {MAX_E2B_POOL}; a pool keeps a few warm, the \
                 rest are made on demand"
            )));
        }
    }
    Ok(())
}

/// The external MCP servers are reached under the egress rules: a server whose address the
/// rules block is refused here rather than on its first call.
fn mcp_servers_under_egress(
    servers: &[aegis_egress::mcp_servers::McpServerConfig],
    egress: &aegis_egress::Egress,
) -> Result<(), Invalid> {
    let address_allowed = |ip: std::net::IpAddr| {
        egress.resolver.policy().check(ip).map_err(|blocked| {
            format!(
                "{blocked}; MCP servers are reached under the egress rules (open an internal \
                 range with egress.allow_cidrs; cloud-metadata addresses stay refused)"
            )
        })
    };
    aegis_egress::mcp_servers::config::validate(servers, &address_allowed)
        .map_err(|e| Invalid::new(e.key, e.message))
}

/// `executions.skip_judge_tools` names tools of this node's catalog.
fn skip_judge_tools_exist(executions: &ExecutionsConfig) -> Result<(), Invalid> {
    match executions
        .skip_judge_tools
        .iter()
        .find(|t| !aegis_core::catalog::catalog().is_ok_and(|cat| cat.contains(t)))
    {
        Some(unknown) => Err(Invalid::new(
            "executions.skip_judge_tools",
            format!("unknown tool `{unknown}`; see aegis.tools.list for the tools of this node"),
        )),
        None => Ok(()),
    }
}

/// `sandbox.runtime_isolation` names installed runtimes, and gives one image one class (two
/// runtimes of one image, such as `shell` and `bash`, cannot be given different classes).
fn runtime_isolation_installed(loaded: &LoadedConfig) -> Result<(), ConfigError> {
    let mut by_image: std::collections::BTreeMap<&str, (&str, aegis_sandboxes::Isolation)> =
        Default::default();
    for (key, class) in &loaded.config.sandbox.runtime_isolation {
        let invalid = |message: String| ConfigError::Invalid {
            key: format!("sandbox.runtime_isolation.\"{key}\""),
            origin: loaded.origin_of_entry("sandbox.runtime_isolation", key),
            message,
        };
        let named = crate::sandbox::runtimes_named(key);
        if named.is_empty() {
            return Err(invalid(format!(
                "`{key}` is not an installed runtime (runtime-images/registry.yaml); expected                  `language` or `language:version`, e.g. `base` or `python:3.11`"
            )));
        }
        for runtime in named {
            match by_image.insert(runtime.image.as_str(), (key.as_str(), *class)) {
                Some((other, theirs)) if theirs != *class => {
                    return Err(invalid(format!(
                        "`{key}` ({class}) and `{other}` ({theirs}) run the same image {}; \
                         give them the same class",
                        runtime.image
                    )))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// `sandbox.runtime_aliases` maps runtimes this node lacks to installed ones (the runtime
/// registry), never an installed runtime to another.
fn runtime_aliases_installed(loaded: &LoadedConfig) -> Result<(), ConfigError> {
    for (from, to) in &loaded.config.sandbox.runtime_aliases {
        let key = format!("sandbox.runtime_aliases.\"{from}\"");
        let invalid = |message: String| ConfigError::Invalid {
            key: key.clone(),
            origin: loaded.origin_of_entry("sandbox.runtime_aliases", from),
            message,
        };
        let Some((language, version)) = split_runtime(from) else {
            return Err(invalid(format!(
                "`{from}` is not `language:version` as a manifest's spec.runtime names it \
                 (e.g. `python:3.10`)"
            )));
        };
        if aegis_core::runtimes::known(language, version) {
            return Err(invalid(format!(
                "`{from}` is installed on this node (runtime-images/registry.yaml): an alias \
                 cannot replace it; remove the entry"
            )));
        }
        let installed = split_runtime(to).filter(|(l, v)| aegis_core::runtimes::known(l, v));
        if installed.is_none() {
            let known: Vec<String> = aegis_core::runtimes::registry()
                .map(|r| {
                    r.runtimes
                        .iter()
                        .map(|r| format!("{}:{}", r.language, r.version))
                        .collect()
                })
                .unwrap_or_default();
            return Err(invalid(format!(
                "`{to}` is not an installed runtime; map `{from}` to one of {}",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod isolation_tests {
    use aegis_sandboxes::Isolation;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<crate::LoadedConfig, String> {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        crate::load(Some(f.path()), &env).map_err(|e| e.to_string())
    }

    #[test]
    fn the_class_is_the_nodes_default_and_the_environment_sets_it() {
        let loaded = load("", &[]).expect("valid");
        assert_eq!(loaded.config.sandbox.isolation, Isolation::Container);
        let loaded = load("", &[("ORCHESTRATOR__SANDBOX__ISOLATION", "gvisor")]).expect("valid");
        assert_eq!(loaded.config.sandbox.isolation, Isolation::Gvisor);
        let err = load("", &[("ORCHESTRATOR__SANDBOX__ISOLATION", "kata")]).unwrap_err();
        assert!(err.contains("ORCHESTRATOR__SANDBOX__ISOLATION"), "{err}");
        let err = load("sandbox:\n  isolation: vm\n", &[]).unwrap_err();
        assert!(err.contains("isolation"), "{err}");
    }

    #[test]
    fn a_runtime_override_names_an_installed_runtime_and_one_class_per_image() {
        let loaded = load(
            "sandbox:\n  runtime_isolation:\n    base: gvisor\n    \"busybox:1\": container\n",
            &[],
        )
        .expect("valid");
        let by_image = loaded.config.sandbox.isolation_by_image();
        assert_eq!(
            by_image.get("aegis-runtime/base:bookworm"),
            Some(&Isolation::Gvisor)
        );
        assert_eq!(
            by_image.get("aegis-runtime/busybox:1"),
            Some(&Isolation::Container)
        );
        let err = load("sandbox:\n  runtime_isolation:\n    cobol: gvisor\n", &[]).unwrap_err();
        assert!(err.contains("sandbox.runtime_isolation.\"cobol\""), "{err}");
        assert!(err.contains("not an installed runtime"), "{err}");
        let err = load(
            "sandbox:\n  runtime_isolation:\n    shell: gvisor\n    bash: container\n",
            &[],
        )
        .unwrap_err();
        assert!(err.contains("same image"), "{err}");
    }
}
