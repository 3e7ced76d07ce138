//! Web search through the providers an operator configured, with results normalised and
//! filtered by the same domain allowlists as `web.fetch`.
//!
//! Two wire shapes are spoken: SearXNG's JSON API (`GET {url}/search?q=..&format=json`, any
//! SearXNG-compatible endpoint) and the Brave Search API (`GET {url}?q=..&count=..` with the key
//! in `X-Subscription-Token`). Providers are tried in configured order; the first that answers
//! wins. API keys are read from environment variables named in the configuration, never stored
//! in it. Provider endpoints are the operator's choice and are not address-checked (an internal
//! SearXNG is the usual set-up); results are, when a caller goes on to fetch them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::domains::DomainPolicy;

/// `web:` in the node configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebConfig {
    /// Search providers, tried in order; none means `web.search` answers `not_configured`.
    pub search_providers: Vec<SearchProviderConfig>,
}

/// Which wire shape a provider speaks.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// SearXNG's JSON API (and endpoints with the same shape).
    Searxng,
    /// The Brave Search web-search API.
    Brave,
}

/// One configured provider.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SearchProviderConfig {
    /// Wire shape.
    pub kind: ProviderKind,
    /// Base URL (SearXNG: the instance root; Brave: the web-search endpoint).
    pub url: String,
    /// Environment variable holding the API key, if the provider needs one.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Seconds to wait for an answer.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
}

fn default_timeout() -> u64 {
    15
}

/// One normalised result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SearchHit {
    /// Page title.
    pub title: String,
    /// Page URL.
    pub url: String,
    /// Text excerpt.
    pub snippet: String,
}

/// What a search returned after filtering.
#[derive(Debug, Clone, Serialize)]
pub struct SearchResults {
    /// The provider that answered (`kind` and URL host).
    pub provider: String,
    /// Results the allowlists admit, in provider order.
    pub results: Vec<SearchHit>,
    /// How many results were dropped because an allowlist refused their host.
    pub filtered_out: usize,
}

/// Why a search produced nothing.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// No provider is configured.
    #[error("no search provider is configured (web.search_providers in the node configuration)")]
    NotConfigured,
    /// A provider's key variable is unset.
    #[error("search provider {provider}: environment variable {var} is not set")]
    MissingKey {
        /// Provider URL.
        provider: String,
        /// The variable.
        var: String,
    },
    /// Every provider failed; each failure is listed.
    #[error("every search provider failed: {}", .0.join("; "))]
    AllFailed(Vec<String>),
}

impl SearchError {
    /// Stable code for tool results.
    pub fn code(&self) -> &'static str {
        match self {
            SearchError::NotConfigured => "not_configured",
            SearchError::MissingKey { .. } => "not_configured",
            SearchError::AllFailed(_) => "search_failed",
        }
    }
}

/// Runs `query` on the configured providers and keeps what `domains` admits.
pub async fn search(
    config: &WebConfig,
    domains: &DomainPolicy,
    query: &str,
    max_results: usize,
) -> Result<SearchResults, SearchError> {
    if config.search_providers.is_empty() {
        return Err(SearchError::NotConfigured);
    }
    let mut failures = Vec::new();
    for provider in &config.search_providers {
        match ask(provider, query, max_results).await {
            Ok(hits) => {
                let (kept, refused): (Vec<SearchHit>, Vec<SearchHit>) =
                    hits.into_iter().partition(|h| admitted(domains, &h.url));
                return Ok(SearchResults {
                    provider: format!("{:?}", provider.kind).to_ascii_lowercase(),
                    filtered_out: refused.len(),
                    results: kept.into_iter().take(max_results).collect(),
                });
            }
            Err(SearchError::MissingKey { provider, var })
                if config.search_providers.len() == 1 =>
            {
                return Err(SearchError::MissingKey { provider, var })
            }
            Err(e) => failures.push(format!("{}: {e}", provider.url)),
        }
    }
    Err(SearchError::AllFailed(failures))
}

/// True when `url` is http(s) and every rule admits its host.
fn admitted(domains: &DomainPolicy, url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        return false;
    }
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        return false;
    };
    domains.check(host, port).is_ok()
}

async fn ask(
    provider: &SearchProviderConfig,
    query: &str,
    max_results: usize,
) -> Result<Vec<SearchHit>, SearchError> {
    let fail = |m: String| SearchError::AllFailed(vec![m]);
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(provider.timeout_secs.max(1)))
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let key = match &provider.api_key_env {
        None => None,
        Some(var) => Some(std::env::var(var).map_err(|_| SearchError::MissingKey {
            provider: provider.url.clone(),
            var: var.clone(),
        })?),
    };
    let request = match provider.kind {
        ProviderKind::Searxng => {
            let base = provider.url.trim_end_matches('/');
            let mut r = client
                .get(format!("{base}/search"))
                .query(&[("q", query), ("format", "json")]);
            if let Some(key) = &key {
                r = r.bearer_auth(key);
            }
            r
        }
        ProviderKind::Brave => {
            let mut r = client
                .get(&provider.url)
                .query(&[("q", query), ("count", &max_results.min(20).to_string())])
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(key) = &key {
                r = r.header("X-Subscription-Token", key);
            }
            r
        }
    };
    let response = request.send().await.map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(format!("answered HTTP {status}")));
    }
    let body: Value = response
        .json()
        .await
        .map_err(|e| fail(format!("answer is not JSON: {e}")))?;
    let (list, snippet_key) = match provider.kind {
        ProviderKind::Searxng => (body.get("results"), "content"),
        ProviderKind::Brave => (body.pointer("/web/results"), "description"),
    };
    let list = list
        .and_then(Value::as_array)
        .ok_or_else(|| fail("answer has no result list".to_owned()))?;
    Ok(list
        .iter()
        .filter_map(|item| {
            let text = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
            Some(SearchHit {
                url: text("url")?,
                title: text("title").unwrap_or_default(),
                snippet: text(snippet_key).unwrap_or_default(),
            })
        })
        .collect())
}
