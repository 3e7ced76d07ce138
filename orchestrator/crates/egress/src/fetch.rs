//! One HTTP(S) GET to the outside world, with the checks of the parent module on every hop.
//!
//! Each hop builds a client that knows only the checked addresses of that hop's host
//! (`resolve_to_addrs`) and refuses any other name, so the connection goes where the check
//! looked, TLS still sees the real host name (SNI, certificate), and nothing resolves twice.
//! Redirects are never followed by the client: we read `Location`, resolve it against the
//! current URL, and start the gates again. The body is read chunk by chunk and cut at the cap.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use super::domains::{DomainPolicy, DomainRefused};
use super::resolve::ResolveError;
use super::{Egress, Refused};

/// Why a fetch did not produce a response.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL does not parse or has no host.
    #[error("invalid URL `{url}`: {message}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// Only http and https are fetched.
    #[error("only http and https URLs are fetched, not `{scheme}` ({url})")]
    Scheme {
        /// The scheme.
        scheme: String,
        /// The URL.
        url: String,
    },
    /// A domain rule refused the host, or an address it resolved to (a denied CIDR).
    #[error("{refused} ({url})")]
    Domain {
        /// The refusal.
        refused: DomainRefused,
        /// The URL of the hop.
        url: String,
    },
    /// The host resolved to nothing usable, or to a blocked address.
    #[error("{error} ({url})")]
    Resolve {
        /// The resolver's refusal.
        error: ResolveError,
        /// The URL of the hop.
        url: String,
    },
    /// More redirects than allowed.
    #[error("more than {limit} redirects (last to {url})")]
    TooManyRedirects {
        /// The hop limit.
        limit: u32,
        /// Where the last redirect pointed.
        url: String,
    },
    /// A redirect without a usable `Location`.
    #[error("redirect {status} from {url} has no usable Location: {message}")]
    BadRedirect {
        /// The status.
        status: u16,
        /// The redirecting URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The whole fetch took longer than allowed.
    #[error("no complete answer within {secs} s ({url})")]
    Timeout {
        /// The limit.
        secs: u64,
        /// The URL being fetched.
        url: String,
    },
    /// Connection, TLS or protocol failure.
    #[error("could not fetch {url}: {message}")]
    Transport {
        /// The URL of the hop.
        url: String,
        /// The failure, with its causes.
        message: String,
    },
}

impl FetchError {
    /// Stable code for tool results.
    pub fn code(&self) -> &'static str {
        match self {
            FetchError::InvalidUrl { .. } => "invalid_url",
            FetchError::Scheme { .. } => "scheme_not_allowed",
            FetchError::Domain { refused, .. } => refused.code(),
            FetchError::Resolve {
                error: ResolveError::Blocked { .. },
                ..
            } => "address_blocked",
            FetchError::Resolve { .. } => "name_not_resolved",
            FetchError::TooManyRedirects { .. } => "too_many_redirects",
            FetchError::BadRedirect { .. } => "bad_redirect",
            FetchError::Timeout { .. } => "timeout",
            FetchError::Transport { .. } => "fetch_failed",
        }
    }
}

/// A response, as far as it was read.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The URL that answered (after redirects).
    pub final_url: String,
    /// Its status.
    pub status: u16,
    /// `Content-Type` as sent, if any.
    pub content_type: Option<String>,
    /// The body, at most the cap.
    pub body: Vec<u8>,
    /// True when the body was longer than the cap and was cut.
    pub truncated: bool,
    /// Each redirect target, in order.
    pub redirects: Vec<String>,
}

/// A hop's target, after the gates: host, port and the addresses to connect to.
struct Checked {
    url: Url,
    host: String,
    addrs: Vec<SocketAddr>,
}

/// Parses `text` and passes it through the scheme, domain and address gates.
pub async fn check_url(
    egress: &Egress,
    domains: &DomainPolicy,
    text: &str,
) -> Result<(Url, String, Vec<SocketAddr>), FetchError> {
    let c = check(egress, domains, text).await?;
    Ok((c.url, c.host, c.addrs))
}

async fn check(egress: &Egress, domains: &DomainPolicy, text: &str) -> Result<Checked, FetchError> {
    let url = Url::parse(text).map_err(|e| FetchError::InvalidUrl {
        url: text.to_owned(),
        message: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FetchError::Scheme {
            scheme: url.scheme().to_owned(),
            url: text.to_owned(),
        });
    }
    // The WHATWG parser has already turned `2130706433`, `0x7f.1` and friends into IPv4.
    let host = match url.host() {
        Some(Host::Domain(d)) => d.trim_end_matches('.').to_ascii_lowercase(),
        Some(Host::Ipv4(ip)) => ip.to_string(),
        Some(Host::Ipv6(ip)) => ip.to_string(),
        None => {
            return Err(FetchError::InvalidUrl {
                url: text.to_owned(),
                message: "no host".to_owned(),
            })
        }
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs = egress
        .admit(domains, &host, port)
        .await
        .map_err(|refused| match refused {
            Refused::Domain(refused) => FetchError::Domain {
                refused,
                url: url.to_string(),
            },
            Refused::Resolve(error) => FetchError::Resolve {
                error,
                url: url.to_string(),
            },
        })?;
    Ok(Checked { url, host, addrs })
}

/// Refuses every name: the client may only use the pinned addresses of its hop (also the
/// resolver of the external MCP servers' clients).
pub struct PinnedOnly;

impl Resolve for PinnedOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let err: Box<dyn std::error::Error + Send + Sync> =
                format!("`{name}` was not checked for this hop").into();
            Err::<Addrs, _>(err)
        })
    }
}

/// Follows `url` to a final response under `domains` and the node's address rules.
pub async fn fetch(
    egress: &Egress,
    domains: &DomainPolicy,
    url: &str,
) -> Result<Fetched, FetchError> {
    let started = Instant::now();
    let deadline = egress.timeout;
    tokio::time::timeout(deadline, follow(egress, domains, url))
        .await
        .unwrap_or_else(|_| {
            Err(FetchError::Timeout {
                secs: deadline.as_secs(),
                url: url.to_owned(),
            })
        })
        .inspect(|f| {
            tracing::debug!(url = %f.final_url, ms = started.elapsed().as_millis() as u64, "fetched")
        })
}

async fn follow(egress: &Egress, domains: &DomainPolicy, url: &str) -> Result<Fetched, FetchError> {
    let mut next = url.to_owned();
    let mut redirects = Vec::new();
    loop {
        let hop = check(egress, domains, &next).await?;
        let transport = |e: reqwest::Error| FetchError::Transport {
            url: hop.url.to_string(),
            message: error_chain(&e),
        };
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(egress.connect_timeout)
            .timeout(egress.timeout)
            .user_agent(concat!("aegis-orchestrator/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(PinnedOnly));
        if matches!(hop.url.host(), Some(Host::Domain(_))) {
            builder = builder.resolve_to_addrs(&hop.host, &hop.addrs);
        }
        let client = builder.build().map_err(transport)?;
        let mut response = client
            .get(hop.url.clone())
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        if status.is_redirection() && status != reqwest::StatusCode::NOT_MODIFIED {
            let bad = |message: String| FetchError::BadRedirect {
                status: status.as_u16(),
                url: hop.url.to_string(),
                message,
            };
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .ok_or_else(|| bad("no Location header".to_owned()))?
                .to_str()
                .map_err(|_| bad("Location is not text".to_owned()))?;
            let target = hop
                .url
                .join(location)
                .map_err(|e| bad(format!("`{location}`: {e}")))?;
            if redirects.len() as u32 >= egress.max_redirects {
                return Err(FetchError::TooManyRedirects {
                    limit: egress.max_redirects,
                    url: target.to_string(),
                });
            }
            redirects.push(target.to_string());
            next = target.to_string();
            continue;
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let cap = usize::try_from(egress.max_body_bytes).unwrap_or(usize::MAX);
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            let room = cap - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        return Ok(Fetched {
            final_url: hop.url.to_string(),
            status: status.as_u16(),
            content_type,
            body,
            truncated,
            redirects,
        });
    }
}

/// An error and its causes on one line (reqwest's top-level message alone says little).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
