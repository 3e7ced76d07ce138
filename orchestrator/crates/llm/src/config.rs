//! The `llm:` section of the node configuration: providers, model aliases, the default alias.
//!
//! Manifests and callers name a model by alias (`fast`, `coder`), never by provider and model, so
//! an operator can move an alias from a hosted provider to a local server without touching an
//! agent. A provider holds only where and how to connect; the API key is named by environment
//! variable, so it never sits in a file, a log line or an error.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Node config section `llm:`. The default has no providers: executions then fail with a clear
/// reason instead of the node refusing to start.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// Where the models are served.
    pub providers: Vec<ProviderConfig>,
    /// Alias -> provider and model.
    pub models: BTreeMap<String, ModelRef>,
    /// The alias used when a manifest names none.
    pub default_model: Option<String>,
}

/// One OpenAI-compatible endpoint (OpenAI, Ollama's `/v1`, vLLM, llama.cpp server).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// How aliases refer to it.
    pub name: String,
    /// The API root, `/chat/completions` is appended: `http://127.0.0.1:11434/v1`,
    /// `https://api.openai.com/v1`.
    pub base_url: String,
    /// Name of the environment variable that holds the API key; none means no `Authorization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Longest wait for one attempt (connect, answer and body), seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Extra attempts after a 408, 429, 5xx, transport failure or timeout.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Wait before the first retry, milliseconds; doubles each retry, capped at 10 s.
    #[serde(default = "default_initial_backoff_ms")]
    pub initial_backoff_ms: u64,
}

/// What an alias stands for.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    /// A `providers[].name`.
    pub provider: String,
    /// The model name as the provider knows it (`gpt-4o-mini`, `llama3.1:8b`).
    pub model: String,
    /// Sampling temperature; the provider's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Longest completion, tokens; the provider's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

fn default_timeout_secs() -> u64 {
    60
}

fn default_max_retries() -> u32 {
    3
}

fn default_initial_backoff_ms() -> u64 {
    500
}

/// Retries beyond this are a misconfiguration: with the 10 s backoff cap they would hold an
/// execution for minutes against a provider that is down.
const MAX_RETRIES_CEILING: u32 = 10;

impl LlmConfig {
    /// Checks what types cannot: names resolve, URLs are usable, numbers are sensible.
    /// The message starts with the offending key (`llm.models.fast.provider: ...`).
    pub fn validate(&self) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            let key = format!("llm.providers[{i}]");
            if p.name.trim().is_empty() {
                return Err(format!("{key}.name: expected a non-empty name"));
            }
            if !names.insert(p.name.as_str()) {
                return Err(format!(
                    "{key}.name: provider `{}` is defined twice",
                    p.name
                ));
            }
            check_base_url(&p.base_url).map_err(|m| format!("{key}.base_url: {m}"))?;
            if let Some(var) = &p.api_key_env {
                if !is_env_name(var) {
                    return Err(format!(
                        "{key}.api_key_env: expected the name of an environment variable \
                         (letters, digits, `_`), not the key itself"
                    ));
                }
            }
            if p.timeout_secs == 0 {
                return Err(format!(
                    "{key}.timeout_secs: expected a whole number of at least 1"
                ));
            }
            if p.max_retries > MAX_RETRIES_CEILING {
                return Err(format!(
                    "{key}.max_retries: expected at most {MAX_RETRIES_CEILING}"
                ));
            }
        }
        for (alias, m) in &self.models {
            let key = format!("llm.models.{alias}");
            if alias.trim().is_empty() {
                return Err("llm.models: an alias must not be empty".to_owned());
            }
            if !names.contains(m.provider.as_str()) {
                return Err(format!(
                    "{key}.provider: unknown provider `{}` (known: {})",
                    m.provider,
                    list(names.iter().copied())
                ));
            }
            if m.model.trim().is_empty() {
                return Err(format!("{key}.model: expected a model name"));
            }
            if let Some(t) = m.temperature {
                if !(0.0..=2.0).contains(&t) {
                    return Err(format!("{key}.temperature: expected 0 to 2"));
                }
            }
            if m.max_tokens == Some(0) {
                return Err(format!("{key}.max_tokens: expected at least 1"));
            }
        }
        if let Some(d) = &self.default_model {
            if !self.models.contains_key(d) {
                return Err(format!(
                    "llm.default_model: `{d}` is not an alias of llm.models (known: {})",
                    list(self.models.keys().map(String::as_str))
                ));
            }
        }
        Ok(())
    }
}

/// An absolute `http(s)` URL with a host and no credentials (keys go in `api_key_env`).
fn check_base_url(raw: &str) -> Result<(), String> {
    let url = url::Url::parse(raw)
        .map_err(|e| format!("expected an absolute URL such as http://127.0.0.1:11434/v1: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("expected http or https, not `{}`", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("expected a host".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not carry credentials; name the key's variable in api_key_env".to_owned(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("expected no query or fragment (`/chat/completions` is appended)".to_owned());
    }
    Ok(())
}

fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `a, b, c`, or `none` for an empty list.
pub(crate) fn list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let v: Vec<&str> = items.into_iter().collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> LlmConfig {
        serde_yaml::from_str(yaml).expect("valid yaml")
    }

    const GOOD: &str = "
providers:
  - name: local
    base_url: http://127.0.0.1:11434/v1
models:
  fast: { provider: local, model: llama3.1 }
default_model: fast
";

    #[test]
    fn defaults_apply_and_a_good_config_passes() {
        let c = config(GOOD);
        assert_eq!(c.providers[0].timeout_secs, 60);
        assert_eq!(c.providers[0].max_retries, 3);
        assert_eq!(c.providers[0].initial_backoff_ms, 500);
        c.validate().expect("valid");
        let mut hosted = c.clone();
        hosted.providers[0].base_url = "https://api.openai.com/v1".into();
        hosted.validate().expect("https is valid");
        LlmConfig::default().validate().expect("empty is valid");
    }

    #[test]
    fn the_example_node_config_is_valid() {
        #[derive(Deserialize)]
        struct Node {
            llm: LlmConfig,
        }
        let text = include_str!("../../../../examples/node-config.ollama.yaml");
        let node: Node = serde_yaml::from_str(text).expect("the example parses");
        node.llm.validate().expect("the example is valid");
        assert_eq!(node.llm.default_model.as_deref(), Some("default"));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let r: Result<LlmConfig, _> = serde_yaml::from_str("providers: []\nmodel: x\n");
        assert!(r.is_err());
    }

    #[test]
    fn errors_name_the_key() {
        let mut c = config(GOOD);
        c.models.get_mut("fast").expect("alias").provider = "nope".into();
        let e = c.validate().expect_err("unknown provider");
        assert!(e.starts_with("llm.models.fast.provider:"), "{e}");
        assert!(e.contains("local"), "{e}");

        let mut c = config(GOOD);
        c.default_model = Some("slow".into());
        let e = c.validate().expect_err("bad default");
        assert!(e.starts_with("llm.default_model:"), "{e}");

        for bad in [
            "127.0.0.1:11434",
            "ftp://x/v1",
            "http://user:pw@x/v1",
            "http://x/v1?k=1",
        ] {
            let mut c = config(GOOD);
            c.providers[0].base_url = bad.into();
            let e = c.validate().expect_err(bad);
            assert!(e.starts_with("llm.providers[0].base_url:"), "{bad}: {e}");
            assert!(!e.contains("pw"), "{e}");
        }

        let mut c = config(GOOD);
        c.providers[0].api_key_env = Some("sk-live-123".into());
        let e = c.validate().expect_err("a key, not a name");
        assert!(e.starts_with("llm.providers[0].api_key_env:"), "{e}");
        assert!(!e.contains("sk-live-123"), "{e}");
    }
}
