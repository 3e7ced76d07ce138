//! What is kept for the client connection that opened a sandbox port: its admission (decided
//! and audited once per client connection, `admit.rs`) and the connection to the port, which
//! its next requests reuse while the server keeps it open (a server that closes after each
//! answer, as HTTP/1.0 ones do, gets a new one, under the same admission). Keyed by the
//! client's address and the port; an entry goes after [`IDLE`] unused, or never comes when
//! [`MAX_ENTRIES`] are kept (the request then is admitted on its own).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::Limited;
use hyper::client::conn::http1::SendRequest;

use super::address::PortAddress;
use super::admit::Admitted;

/// How long a kept connection may wait for its client's next request.
pub const IDLE: Duration = Duration::from_secs(60);
/// Most connections kept at once.
pub const MAX_ENTRIES: usize = 4096;

/// What a kept connection sends requests with.
pub type Sender = SendRequest<Limited<Body>>;

/// What one client connection keeps.
pub struct Kept {
    /// hyper's half that sends requests on the port's connection, while it is open.
    pub sender: Option<Sender>,
    /// Its admission (a request on it must still show the token).
    pub admitted: Admitted,
    used: Instant,
}

/// The kept connections of this node.
#[derive(Default)]
pub struct Pool {
    entries: Mutex<HashMap<(SocketAddr, PortAddress), Kept>>,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SocketAddr, PortAddress), Kept>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what is kept for `client` to `to` (the connection only while it is open).
    pub fn take(&self, client: SocketAddr, to: PortAddress) -> Option<Kept> {
        let mut kept = self.lock().remove(&(client, to))?;
        kept.sender = kept.sender.filter(|s| !s.is_closed());
        Some(kept)
    }

    /// Keeps `admitted` and the connection for `client`'s next request to `to` (dropping what
    /// was idle too long).
    pub fn keep(&self, client: SocketAddr, to: PortAddress, sender: Sender, admitted: Admitted) {
        let mut entries = self.lock();
        entries.retain(|_, kept| kept.used.elapsed() < IDLE);
        if entries.len() < MAX_ENTRIES {
            entries.insert(
                (client, to),
                Kept {
                    sender: Some(sender),
                    admitted,
                    used: Instant::now(),
                },
            );
        }
    }
}

impl Pool {
    /// Drops what was idle too long (closing its connection).
    pub fn sweep(&self) {
        self.lock().retain(|_, kept| kept.used.elapsed() < IDLE);
    }
}
