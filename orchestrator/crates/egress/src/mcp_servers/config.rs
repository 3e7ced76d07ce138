//! `mcp_servers:` in the node configuration: the external MCP servers an operator declares.
//!
//! Each entry names a server (the `<server>` of `mcp:<server>/<tool>`), its Streamable HTTP URL
//! and where its credentials are: the names of environment variables, never the values, so the
//! file, `check-config` and `aegis.system.config` show nothing secret. The values are read when
//! a connection is made and are sent only to that server.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use aegis_core::caller::Tier;

/// One external MCP server.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Lower-case name (`[a-z][a-z0-9_-]*`, at most 63): manifests offer `mcp:<name>` (every
    /// tool of the server) or `mcp:<name>/<tool>`.
    pub name: String,
    /// The server's Streamable HTTP endpoint, `http(s)://host[:port]/path`, without user
    /// information (credentials come from the environment). Reached under the egress rules.
    pub url: String,
    /// Shown in listings beside the server's tools.
    #[serde(default)]
    pub description: Option<String>,
    /// Environment variable holding a bearer token, sent as `Authorization: Bearer <value>`.
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// Further headers: header name -> environment variable holding its value.
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
    /// Time allowed to connect and initialise, and for each call, seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// The least caller tier that may call this server's tools.
    #[serde(default = "default_tier")]
    pub tier: Tier,
    /// Whether `spec.execution.tool_validation` judges skip this server's tools.
    #[serde(default)]
    pub skip_judge: bool,
    /// Largest result handed back to the caller, bytes of text and structured content; longer
    /// results are cut and flagged `truncated`.
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: u64,
    /// Largest HTTP response accepted from the server, bytes; a larger one fails the call.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// How long a listing of the server's tools is used before it is asked again, seconds.
    #[serde(default = "default_tools_ttl_secs")]
    pub tools_ttl_secs: u64,
}

fn default_timeout_secs() -> u64 {
    30
}
fn default_tier() -> Tier {
    Tier::User
}
fn default_max_result_bytes() -> u64 {
    256 * 1024
}
fn default_max_response_bytes() -> u64 {
    8 * 1024 * 1024
}
fn default_tools_ttl_secs() -> u64 {
    300
}

/// A refused entry: the key under `mcp_servers[i]` and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// `mcp_servers[i]` or `mcp_servers[i].<field>`.
    pub key: String,
    /// What was expected.
    pub message: String,
}

/// Headers the MCP transport sets itself; an operator's header may not replace them.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "connection",
    "transfer-encoding",
];

/// True for a server name: lower-case letter, then letters, digits, `_` or `-`, at most 63.
pub fn is_server_name(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// True for a POSIX-style environment variable name.
fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks every entry; `address_allowed` says whether the node's egress rules let an IP
/// literal be contacted (names are judged when they are resolved, at connection time).
pub fn validate(
    servers: &[McpServerConfig],
    address_allowed: &dyn Fn(IpAddr) -> Result<(), String>,
) -> Result<(), Invalid> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, server) in servers.iter().enumerate() {
        let at = |field: &str| Invalid {
            key: format!("mcp_servers[{i}].{field}"),
            message: String::new(),
        };
        let fail = |field: &str, message: String| Invalid {
            message,
            ..at(field)
        };
        if !is_server_name(&server.name) {
            return Err(fail(
                "name",
                format!(
                    "`{}` is not a server name: a lower-case letter, then lower-case letters, \
                     digits, `_` or `-`, at most 63 characters (no dots: dotted names are \
                     built-in tools)",
                    server.name
                ),
            ));
        }
        if !seen.insert(server.name.as_str()) {
            return Err(fail("name", format!("`{}` is declared twice", server.name)));
        }
        check_url(&server.url, address_allowed).map_err(|m| fail("url", m))?;
        if let Some(var) = &server.bearer_token_env {
            if !is_env_name(var) {
                return Err(fail(
                    "bearer_token_env",
                    format!("`{var}` is not an environment variable name"),
                ));
            }
        }
        for (header, var) in &server.headers_from_env {
            let field = format!("headers_from_env.{header}");
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(fail(
                    &field,
                    format!("`{header}` is not an HTTP header name"),
                ));
            }
            let lower = header.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str())
                || (lower == "authorization" && server.bearer_token_env.is_some())
            {
                return Err(fail(
                    &field,
                    format!("`{header}` is set by the MCP transport (or by bearer_token_env)"),
                ));
            }
            if !is_env_name(var) {
                return Err(fail(
                    &field,
                    format!("`{var}` is not an environment variable name"),
                ));
            }
        }
        if server.timeout_secs == 0 || server.timeout_secs > 600 {
            return Err(fail("timeout_secs", "expected 1 to 600 seconds".to_owned()));
        }
        for (field, value) in [
            ("max_result_bytes", server.max_result_bytes),
            ("max_response_bytes", server.max_response_bytes),
            ("tools_ttl_secs", server.tools_ttl_secs),
        ] {
            if value == 0 {
                return Err(fail(
                    field,
                    "expected a whole number of at least 1".to_owned(),
                ));
            }
        }
        if server.max_result_bytes > server.max_response_bytes {
            return Err(fail(
                "max_result_bytes",
                format!(
                    "{} is larger than max_response_bytes ({}): a result is cut from a response",
                    server.max_result_bytes, server.max_response_bytes
                ),
            ));
        }
    }
    Ok(())
}

/// The URL rules: http or https, a host, no user information, no fragment, and an IP literal
/// only where the egress rules allow it.
fn check_url(
    text: &str,
    address_allowed: &dyn Fn(IpAddr) -> Result<(), String>,
) -> Result<(), String> {
    let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme is `{}`; MCP servers are reached over Streamable HTTP (http or https)",
            url.scheme()
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // The URL is not repeated: it carries what looks like a credential.
        return Err(
            "the URL carries user information; give credentials as environment variable names \
             (bearer_token_env, headers_from_env)"
                .to_owned(),
        );
    }
    if url.fragment().is_some() {
        return Err(format!("`{text}` has a fragment; give the endpoint itself"));
    }
    match url.host() {
        None => Err(format!("`{text}` has no host")),
        Some(url::Host::Ipv4(ip)) => address_allowed(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => address_allowed(IpAddr::V6(ip)),
        Some(url::Host::Domain(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, url: &str) -> McpServerConfig {
        serde_yaml::from_str(&format!("{{name: {name}, url: '{url}'}}")).expect("entry")
    }

    fn loopback_blocked(ip: IpAddr) -> Result<(), String> {
        if ip.is_loopback() {
            Err(format!(
                "address {ip} is not reachable from here (loopback range)"
            ))
        } else {
            Ok(())
        }
    }

    #[test]
    fn entries_are_checked_field_by_field() {
        let ok = [server("gmail", "https://mcp.example.org/mcp")];
        assert_eq!(validate(&ok, &loopback_blocked), Ok(()));
        // Refused for the field at `key`, with a message that says `says`.
        let refused = |servers: &[McpServerConfig], key: &str, says: &str| {
            let err = validate(servers, &loopback_blocked).expect_err(key);
            assert_eq!(err.key, key, "{err:?}");
            assert!(err.message.contains(says), "{err:?}");
        };
        for (name, url, field, says) in [
            ("Gmail", "https://a/mcp", "name", "lower-case"),
            ("a.b", "https://a/mcp", "name", "no dots"),
            ("a", "ftp://a/mcp", "url", "scheme"),
            ("a", "https://u:p@a/mcp", "url", "user information"),
            ("a", "http://127.0.0.1:9/mcp", "url", "loopback"),
            ("a", "not a url", "url", "not a URL"),
        ] {
            refused(
                &[server(name, url)],
                &format!("mcp_servers[0].{field}"),
                says,
            );
        }
        let twice = [server("a", "https://a/mcp"), server("a", "https://b/mcp")];
        refused(&twice, "mcp_servers[1].name", "twice");
        let mut s = server("a", "https://a/mcp");
        s.headers_from_env
            .insert("Mcp-Session-Id".into(), "X".into());
        let err = validate(&[s], &loopback_blocked).expect_err("reserved header");
        assert_eq!(err.key, "mcp_servers[0].headers_from_env.Mcp-Session-Id");
        let mut s = server("a", "https://a/mcp");
        s.bearer_token_env = Some("NOT-A-NAME".into());
        let err = validate(&[s], &loopback_blocked).expect_err("env name");
        assert_eq!(err.key, "mcp_servers[0].bearer_token_env");
        let mut s = server("a", "https://a/mcp");
        s.max_result_bytes = s.max_response_bytes + 1;
        assert!(validate(&[s], &loopback_blocked).is_err());
    }
}
