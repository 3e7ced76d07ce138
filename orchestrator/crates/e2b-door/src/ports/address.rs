//! Which sandbox port a request is for, read from the request alone (no I/O): the `Host`
//! `<port>-<sandbox id>.<domain>` E2B's `get_host` builds, or E2B's headers `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` (the code-interpreter SDK and E2B's stable-host mode). A request that
//! names envd's own port this way is envd's (the door's `/e2b` routes), not a port's.

use axum::http::{header, HeaderMap};
use uuid::Uuid;

/// The port E2B's SDKs give envd; a request naming it is the door's envd, not a relayed port.
pub const ENVD_PORT: u16 = 49983;

/// E2B's header naming the sandbox.
pub const SANDBOX_ID: &str = "e2b-sandbox-id";
/// E2B's header naming the port.
pub const SANDBOX_PORT: &str = "e2b-sandbox-port";
/// E2B's header carrying a private sandbox's traffic access token.
pub const TRAFFIC_TOKEN: &str = "e2b-traffic-access-token";

/// A sandbox port a request is addressed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortAddress {
    /// The E2B sandbox id.
    pub sandbox: Uuid,
    /// The port inside it.
    pub port: u16,
}

/// Why a request that names a sandbox port does not name one correctly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// `E2b-Sandbox-Port` is not a port number.
    #[error("E2b-Sandbox-Port: {0:?} is not a port (1-65535)")]
    BadPort(String),
    /// The sandbox id (header or host) is not an E2B sandbox id.
    #[error("{what}: {value:?} is not a sandbox id")]
    BadSandbox {
        /// Where it was read.
        what: &'static str,
        /// What it said.
        value: String,
    },
}

/// The port `headers` address, if any: `Ok(None)` for a request of the node itself.
///
/// `domain` is the configured `e2b.domain` (a `:port` in it and in `Host` is ignored). The
/// headers win over the host: E2B's SDKs send them to the sandbox URL, whose host is the node's.
pub fn of_request(headers: &HeaderMap, domain: &str) -> Result<Option<PortAddress>, AddressError> {
    if let Some(port) = headers.get(SANDBOX_PORT) {
        let port = port.to_str().unwrap_or_default().trim();
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| AddressError::BadPort(port.to_owned()))?;
        if port == ENVD_PORT {
            return Ok(None);
        }
        // Without the sandbox named, the port header alone addresses nothing here.
        let Some(id) = headers.get(SANDBOX_ID) else {
            return Ok(None);
        };
        let id = id.to_str().unwrap_or_default().trim();
        let sandbox = Uuid::parse_str(id).map_err(|_| AddressError::BadSandbox {
            what: "E2b-Sandbox-Id",
            value: id.to_owned(),
        })?;
        return Ok(Some(PortAddress { sandbox, port }));
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return Ok(None);
    };
    of_host(host, domain)
}

/// The port a `Host` value `<port>-<sandbox id>.<domain>[:<node port>]` addresses.
pub fn of_host(host: &str, domain: &str) -> Result<Option<PortAddress>, AddressError> {
    let host = strip_port(host).to_ascii_lowercase();
    let domain = strip_port(domain).to_ascii_lowercase();
    let Some(label) = host
        .strip_suffix(&domain)
        .and_then(|rest| rest.strip_suffix('.'))
    else {
        return Ok(None);
    };
    // One label before the domain: `8000-<id>`; anything else is not a port's host.
    if label.contains('.') {
        return Ok(None);
    }
    let Some((port, id)) = label.split_once('-') else {
        return Ok(None);
    };
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else {
        return Ok(None);
    };
    let sandbox = Uuid::parse_str(id).map_err(|_| AddressError::BadSandbox {
        what: "Host",
        value: id.to_owned(),
    })?;
    if port == ENVD_PORT {
        return Ok(None);
    }
    Ok(Some(PortAddress { sandbox, port }))
}

fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const ID: &str = "0b1d2c3e-4f50-4a6b-8c7d-9e0f1a2b3c4d";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, HeaderValue::from_str(value).expect("header value"));
        }
        h
    }

    #[test]
    fn the_host_form_names_port_and_sandbox_under_the_domain_only() {
        let id = Uuid::parse_str(ID).expect("uuid");
        let want = Some(PortAddress {
            sandbox: id,
            port: 8000,
        });
        assert_eq!(
            of_host(&format!("8000-{ID}.localhost"), "localhost"),
            Ok(want)
        );
        assert_eq!(
            of_host(
                &format!("8000-{ID}.Sandboxes.Example:8080"),
                "sandboxes.example:8080"
            ),
            Ok(want)
        );
        // The node's own host, another domain, a deeper name, envd's port: not a port's.
        assert_eq!(of_host("localhost:8080", "localhost"), Ok(None));
        assert_eq!(
            of_host(&format!("8000-{ID}.evil.test"), "localhost"),
            Ok(None)
        );
        assert_eq!(
            of_host(&format!("8000-{ID}.x.localhost"), "localhost"),
            Ok(None)
        );
        assert_eq!(
            of_host(&format!("8000-{ID}xlocalhost"), "localhost"),
            Ok(None)
        );
        assert_eq!(
            of_host(&format!("49983-{ID}.localhost"), "localhost"),
            Ok(None)
        );
        assert_eq!(of_host(&format!("0-{ID}.localhost"), "localhost"), Ok(None));
        assert!(matches!(
            of_host("8000-nope.localhost", "localhost"),
            Err(AddressError::BadSandbox { what: "Host", .. })
        ));
    }

    #[test]
    fn e2bs_headers_win_and_envds_port_stays_the_doors() {
        let id = Uuid::parse_str(ID).expect("uuid");
        let h = headers(&[
            ("host", "node:8080"),
            (SANDBOX_ID, ID),
            (SANDBOX_PORT, "3000"),
        ]);
        assert_eq!(
            of_request(&h, "localhost"),
            Ok(Some(PortAddress {
                sandbox: id,
                port: 3000
            }))
        );
        let envd = headers(&[(SANDBOX_ID, ID), (SANDBOX_PORT, "49983")]);
        assert_eq!(of_request(&envd, "localhost"), Ok(None));
        let envd_alone = headers(&[(SANDBOX_ID, ID)]);
        assert_eq!(of_request(&envd_alone, "localhost"), Ok(None));
        let bad = headers(&[(SANDBOX_ID, ID), (SANDBOX_PORT, "http")]);
        assert_eq!(
            of_request(&bad, "localhost"),
            Err(AddressError::BadPort("http".to_owned()))
        );
        let bad_id = headers(&[(SANDBOX_ID, "x"), (SANDBOX_PORT, "80")]);
        assert!(of_request(&bad_id, "localhost").is_err());
    }
}
