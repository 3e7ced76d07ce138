//! The chat-completions client: alias resolution, one HTTP attempt, retries with backoff.
//!
//! Every attempt is bounded by its provider's `timeout_secs` as a whole (connect, answer and
//! body), so a provider that accepts and never answers costs at most
//! `(1 + max_retries) × timeout` plus the backoff, never a hung execution. Only failures another
//! attempt can fix are retried (408, 429, 5xx, timeouts, broken connections); a 400 or 401 is
//! returned at once. The API key is read once from its environment variable at construction,
//! sent only as a sensitive `Authorization` header, and scrubbed from every error text.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, CONTENT_TYPE, RETRY_AFTER};

use super::config::{list, LlmConfig, ModelRef};
use super::error::LlmError;
use super::types::{ChatRequest, ChatResponse};
use super::wire::{self, Decoded, ToolNames};

/// The longest backoff between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The longest `Retry-After` honoured; a provider asking for more gets this much.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The longest error body quoted in [`LlmError::Http`], characters.
const EXCERPT_CHARS: usize = 500;
/// What replaces the API key wherever a provider echoes it.
const REDACTED: &str = "[redacted]";

/// A client for every configured provider. Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct LlmClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    providers: HashMap<String, Provider>,
    models: BTreeMap<String, ModelRef>,
    default_model: Option<String>,
}

#[derive(Debug)]
struct Provider {
    name: String,
    url: String,
    key: Option<ApiKey>,
    timeout: Duration,
    max_retries: u32,
    initial_backoff: Duration,
}

/// An API key; its `Debug` never shows it.
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// One failed attempt, with the wait the provider asked for.
struct Failure {
    error: LlmError,
    retry_after: Option<Duration>,
}

impl LlmClient {
    /// Checks the configuration and reads each provider's API key from its environment
    /// variable. A variable that is named but unset is an error now, naming the variable, so
    /// a misconfigured node says so at start rather than at its first execution. A config
    /// without providers is accepted; its calls fail with [`LlmError::NoProviders`].
    pub fn new(config: &LlmConfig) -> Result<Self, LlmError> {
        config.validate().map_err(LlmError::Config)?;
        let mut providers = HashMap::new();
        for (i, p) in config.providers.iter().enumerate() {
            let key = match &p.api_key_env {
                None => None,
                Some(var) => Some(read_key(var).map_err(|why| {
                    LlmError::Config(format!(
                        "llm.providers[{i}].api_key_env: environment variable `{var}` {why}"
                    ))
                })?),
            };
            providers.insert(
                p.name.clone(),
                Provider {
                    name: p.name.clone(),
                    url: format!("{}/chat/completions", p.base_url.trim_end_matches('/')),
                    key,
                    timeout: Duration::from_secs(p.timeout_secs),
                    max_retries: p.max_retries,
                    initial_backoff: Duration::from_millis(p.initial_backoff_ms),
                },
            );
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("orchestrator/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                providers,
                models: config.models.clone(),
                default_model: config.default_model.clone(),
            }),
        })
    }

    /// The configured model aliases, sorted.
    pub fn aliases(&self) -> Vec<String> {
        self.inner.models.keys().cloned().collect()
    }

    /// One chat completion with the model behind `alias` (a key of `llm.models`, or `None` for
    /// `llm.default_model`), retried as the provider's config says.
    pub async fn chat(
        &self,
        alias: Option<&str>,
        request: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        let (model, provider) = self.resolve(alias)?;
        let names = ToolNames::for_request(request);
        let body = serde_json::to_vec(&wire::encode(model, request, &names)).map_err(|e| {
            LlmError::BadResponse {
                provider: provider.name.clone(),
                message: format!("cannot encode the request: {e}"),
            }
        })?;
        let attempts = provider.max_retries.saturating_add(1);
        let mut attempt = 1;
        loop {
            let started = Instant::now();
            let outcome = match tokio::time::timeout(
                provider.timeout,
                self.attempt(provider, body.clone(), &names),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(Failure {
                    error: LlmError::Timeout {
                        provider: provider.name.clone(),
                        after: provider.timeout,
                    },
                    retry_after: None,
                }),
            };
            let latency_ms = started.elapsed().as_millis() as u64;
            let failure = match outcome {
                Ok(d) => {
                    tracing::debug!(
                        provider = %provider.name,
                        model = %model.model,
                        attempt,
                        status = 200,
                        latency_ms,
                        prompt_tokens = d.usage.prompt_tokens,
                        completion_tokens = d.usage.completion_tokens,
                        tool_calls = d.message.tool_calls.len(),
                        "llm call"
                    );
                    return Ok(ChatResponse {
                        message: d.message,
                        finish_reason: d.finish_reason,
                        usage: d.usage,
                        model: d.model.unwrap_or_else(|| model.model.clone()),
                        provider: provider.name.clone(),
                        attempts: attempt,
                    });
                }
                Err(f) => f,
            };
            tracing::debug!(
                provider = %provider.name,
                model = %model.model,
                attempt,
                status = status_of(&failure.error),
                latency_ms,
                error = %failure.error,
                "llm call failed"
            );
            if !failure.error.is_retryable() {
                return Err(failure.error);
            }
            if attempt >= attempts {
                return Err(if attempts == 1 {
                    failure.error
                } else {
                    LlmError::RetriesExhausted {
                        provider: provider.name.clone(),
                        attempts,
                        last: Box::new(failure.error),
                    }
                });
            }
            let delay = failure
                .retry_after
                .map(|d| d.min(MAX_RETRY_AFTER))
                .unwrap_or_else(|| backoff(provider.initial_backoff, attempt - 1));
            tracing::warn!(
                provider = %provider.name,
                model = %model.model,
                attempt,
                status = status_of(&failure.error),
                delay_ms = delay.as_millis() as u64,
                "llm call failed, retrying"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    fn resolve(&self, alias: Option<&str>) -> Result<(&ModelRef, &Provider), LlmError> {
        let inner = &*self.inner;
        if inner.providers.is_empty() {
            return Err(LlmError::NoProviders);
        }
        let alias = match alias.or(inner.default_model.as_deref()) {
            Some(a) => a,
            None => {
                return Err(LlmError::Config(format!(
                    "no model alias given and llm.default_model is not set (aliases: {})",
                    list(inner.models.keys().map(String::as_str))
                )))
            }
        };
        let model = inner
            .models
            .get(alias)
            .ok_or_else(|| LlmError::UnknownAlias {
                alias: alias.to_owned(),
                known: self.aliases(),
            })?;
        let provider = inner.providers.get(&model.provider).ok_or_else(|| {
            LlmError::Config(format!(
                "llm.models.{alias}.provider: unknown provider `{}`",
                model.provider
            ))
        })?;
        Ok((model, provider))
    }

    /// One HTTP exchange, without timeout (the caller bounds it).
    async fn attempt(
        &self,
        p: &Provider,
        body: Vec<u8>,
        names: &ToolNames,
    ) -> Result<Decoded, Failure> {
        let transport = |e: reqwest::Error| Failure {
            error: LlmError::Transport {
                provider: p.name.clone(),
                message: p.redact(&error_chain(&e)),
            },
            retry_after: None,
        };
        let mut req = self
            .inner
            .http
            .post(&p.url)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &p.key {
            req = req.bearer_auth(&key.0);
        }
        let response = req.send().await.map_err(transport)?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let bytes = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let text = p.redact(&String::from_utf8_lossy(&bytes));
            return Err(Failure {
                error: LlmError::Http {
                    provider: p.name.clone(),
                    status: status.as_u16(),
                    body_excerpt: text.trim().chars().take(EXCERPT_CHARS).collect(),
                },
                retry_after,
            });
        }
        wire::decode(&bytes, names).map_err(|m| Failure {
            error: LlmError::BadResponse {
                provider: p.name.clone(),
                message: p.redact(&m),
            },
            retry_after: None,
        })
    }
}

impl Provider {
    /// `text` with every occurrence of the API key replaced, also as a JSON body quotes it
    /// (`"` and `\` escaped, `/` as `\/`), where the bare key would not match.
    fn redact(&self, text: &str) -> String {
        let Some(key) = self
            .key
            .as_ref()
            .map(|k| k.0.as_str())
            .filter(|k| !k.is_empty())
        else {
            return text.to_owned();
        };
        let escaped = serde_json::to_string(key).unwrap_or_default();
        let escaped = escaped
            .strip_prefix('"')
            .and_then(|e| e.strip_suffix('"'))
            .unwrap_or(key);
        let mut out = text.to_owned();
        for form in [
            escaped.replace('/', "\\/"),
            escaped.to_owned(),
            key.to_owned(),
        ] {
            if out.contains(&form) {
                out = out.replace(&form, REDACTED);
            }
        }
        out
    }
}

/// The key in `var`, or why there is none (never the value).
fn read_key(var: &str) -> Result<ApiKey, &'static str> {
    match std::env::var(var) {
        Ok(v) if v.trim().is_empty() => Err("is empty"),
        Ok(v) => Ok(ApiKey(v.trim().to_owned())),
        Err(std::env::VarError::NotPresent) => Err("is not set"),
        Err(std::env::VarError::NotUnicode(_)) => Err("is not valid UTF-8"),
    }
}

/// `initial × 2^retry`, at most [`MAX_BACKOFF`].
fn backoff(initial: Duration, retry: u32) -> Duration {
    let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(MAX_BACKOFF)
}

/// `Retry-After` in seconds; the HTTP-date form is ignored (the backoff applies then).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

/// reqwest's message with its causes (`error sending request: ...: connection refused`).
fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn status_of(e: &LlmError) -> u16 {
    match e {
        LlmError::Http { status, .. } => *status,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let i = Duration::from_millis(500);
        assert_eq!(backoff(i, 0), Duration::from_millis(500));
        assert_eq!(backoff(i, 1), Duration::from_secs(1));
        assert_eq!(backoff(i, 3), Duration::from_secs(4));
        assert_eq!(backoff(i, 5), MAX_BACKOFF);
        assert_eq!(backoff(i, 40), MAX_BACKOFF);
    }

    #[test]
    fn the_key_never_shows_in_debug() {
        let p = Provider {
            name: "p".into(),
            url: "http://x/v1/chat/completions".into(),
            key: Some(ApiKey("sk-secret".into())),
            timeout: Duration::from_secs(1),
            max_retries: 0,
            initial_backoff: Duration::ZERO,
        };
        assert!(!format!("{p:?}").contains("sk-secret"));
        assert_eq!(p.redact("bad key sk-secret!"), "bad key [redacted]!");
        let p = Provider {
            key: Some(ApiKey("k/ey+\"x".into())),
            ..p
        };
        assert_eq!(
            p.redact(r#"{"error": "bad key k\/ey+\"x", "k": "k/ey+\"x"}"#),
            r#"{"error": "bad key [redacted]", "k": "[redacted]"}"#
        );
    }
}
