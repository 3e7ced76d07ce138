//! The replicas' channel to each other: a call for a sandbox another live replica holds is
//! carried to it and answered as if local.
//!
//! Every replica of one database with `cluster.listen` set serves `POST /cluster/v1/call` on a
//! listener of its own (`api/cluster.rs`) and records where its peers reach it in its
//! `node_instances` row (`peer_url`). When the dispatcher finds a sandbox's stream held by
//! another instance, it hands the call to [`Peers`] (its [`Forwarder`]), which looks that
//! instance up and posts the executor request there; the holder runs it with
//! `Dispatcher::call_held` (only into a sandbox it holds; it never forwards again) and returns
//! the executor's response. The decision to make the call (the router's policy check, the audit
//! intent and completion) stays with the replica the caller reached: the holder is a relay to
//! its executor, nothing more.
//!
//! Each request is signed with the cluster secret: HMAC-SHA256 over the Unix time, a random
//! nonce and the body, in [`SIGNATURE_HEADER`] as `t=<secs>,n=<nonce hex>,s=<mac hex>`. The
//! holder refuses a missing or wrong signature, a time more than [`WINDOW_SECS`] away from its
//! clock, and a nonce it has already seen within that window ([`Nonces`]), so a captured request
//! cannot be replayed to run a command twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dispatcher::protocol::{Op, Response};
use dispatcher::{DispatchError, Forwarder, SandboxId};
use futures_util::future::BoxFuture;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

/// The header carrying a forwarded call's signature.
pub const SIGNATURE_HEADER: &str = "x-aegis-cluster";

/// How far a signed time may be from the holder's clock, seconds; nonces are kept this long.
pub const WINDOW_SECS: i64 = 30;

/// Most nonces remembered at once; past it, signed requests are refused until old ones expire
/// (a flood of valid requests needs the secret, so this bounds memory, not an attacker's reach).
const MAX_NONCES: usize = 100_000;

/// The path of the one route peers call.
pub const CALL_PATH: &str = "/cluster/v1/call";

/// Added to a call's own deadline for the trip to the holder and back.
const TRIP_MARGIN: Duration = Duration::from_secs(5);

/// How long a holder's address is reused before its row is read again. A holder that stops
/// within it is still noticed at once: its listener refuses the connection.
const PEER_TTL: Duration = Duration::from_secs(2);

/// The secret all replicas share.
#[derive(Clone)]
pub struct ClusterKey(Arc<[u8]>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(***)")
    }
}

impl ClusterKey {
    /// The key from `cluster.secret` (its length is checked when the config loads).
    pub fn new(secret: &str) -> Self {
        Self(Arc::from(secret.as_bytes()))
    }

    fn mac(&self, time: i64, nonce: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(time.to_string().as_bytes());
        mac.update(b"\n");
        mac.update(nonce.as_bytes());
        mac.update(b"\n");
        mac.update(body);
        mac
    }

    /// The signature header for `body`, sent at `time`.
    pub fn sign(&self, time: i64, body: &[u8]) -> Result<String, String> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| format!("no randomness for a nonce: {e}"))?;
        let nonce = hex(&raw);
        let mac = self.mac(time, &nonce, body).finalize().into_bytes();
        Ok(format!("t={time},n={nonce},s={}", hex(&mac)))
    }

    /// Checks a signature header against `body` at `now`; the nonce is remembered in `seen`.
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: i64,
        seen: &Nonces,
    ) -> Result<(), Unsigned> {
        let header = header.ok_or(Unsigned::Missing)?;
        let mut time = None;
        let mut nonce = None;
        let mut sig = None;
        for part in header.split(',') {
            match part.split_once('=') {
                Some(("t", v)) => time = v.parse::<i64>().ok(),
                Some(("n", v)) => nonce = Some(v),
                Some(("s", v)) => sig = unhex(v),
                _ => return Err(Unsigned::Malformed),
            }
        }
        let (Some(time), Some(nonce), Some(sig)) = (time, nonce, sig) else {
            return Err(Unsigned::Malformed);
        };
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Unsigned::Malformed);
        }
        self.mac(time, nonce, body)
            .verify_slice(&sig)
            .map_err(|_| Unsigned::WrongSignature)?;
        if (now - time).abs() > WINDOW_SECS {
            return Err(Unsigned::Stale);
        }
        seen.admit(nonce, now)
    }
}

/// Why a request on the peer listener was not accepted as a peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsigned {
    /// No signature header.
    #[error("no {SIGNATURE_HEADER} signature")]
    Missing,
    /// The header is not `t=..,n=..,s=..`.
    #[error("malformed {SIGNATURE_HEADER} signature")]
    Malformed,
    /// Signed with another secret, or the body was changed.
    #[error("wrong signature (another cluster secret, or a changed body)")]
    WrongSignature,
    /// Signed too long ago (or in the future).
    #[error("signature time is more than {WINDOW_SECS} s away from this replica's clock")]
    Stale,
    /// The nonce was used already: a replay.
    #[error("nonce already used (a replayed request)")]
    Replayed,
    /// Too many nonces are remembered right now.
    #[error("too many forwarded calls at once; retry")]
    Busy,
}

/// Nonces seen within the signature window.
#[derive(Debug, Default)]
pub struct Nonces(Mutex<HashMap<String, i64>>);

impl Nonces {
    fn admit(&self, nonce: &str, now: i64) -> Result<(), Unsigned> {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= MAX_NONCES / 2 {
            seen.retain(|_, at| now - *at <= 2 * WINDOW_SECS);
        }
        if seen.len() >= MAX_NONCES {
            return Err(Unsigned::Busy);
        }
        if seen.insert(nonce.to_owned(), now).is_some() {
            return Err(Unsigned::Replayed);
        }
        Ok(())
    }
}

/// One forwarded executor request.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedCall {
    /// The sandbox.
    pub sandbox: Uuid,
    /// The caller's deadline for the executor's answer, milliseconds.
    pub deadline_ms: u64,
    /// The executor request.
    pub op: Op,
}

/// Why the holder could not run a forwarded call (the body of a non-200 answer).
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardRefusal {
    /// `not_found`, `gone`, `timeout`, `unsigned`, `invalid` or `error`.
    pub error: String,
    /// What went wrong, for the caller.
    pub message: String,
}

/// The [`Forwarder`] the dispatcher uses: finds the holder's `peer_url` and posts the call.
#[derive(Debug)]
pub struct Peers {
    pool: sqlx::PgPool,
    key: ClusterKey,
    http: reqwest::Client,
    /// Holders' `peer_url`s as last read, with when.
    known: Mutex<HashMap<Uuid, (String, std::time::Instant)>>,
}

impl Peers {
    /// Peers of this database, reached with `key`.
    pub fn new(pool: sqlx::PgPool, key: ClusterKey) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build the peer HTTP client: {e}"))?;
        Ok(Self {
            pool,
            key,
            http,
            known: Mutex::default(),
        })
    }

    /// Where `holder` takes forwarded calls: from the cache while fresh, else its row.
    async fn address_of(&self, holder: Uuid) -> Result<String, String> {
        let cached = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&holder)
            .filter(|(_, at)| at.elapsed() < PEER_TTL)
            .map(|(url, _)| url.clone());
        if let Some(url) = cached {
            return Ok(url);
        }
        let row: Option<(Option<String>,)> = sqlx::query_as(
            "SELECT peer_url FROM node_instances WHERE id = $1 AND stopped_at IS NULL",
        )
        .bind(holder)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| format!("looking the holder up failed: {e}"))?;
        let url = match row {
            None => {
                return Err(
                    "that instance has stopped; its sandboxes are adopted by a replica \
                            on the same engine or reaped"
                        .to_owned(),
                )
            }
            Some((None,)) => {
                return Err(
                    "that instance takes no forwarded calls (it has no cluster.listen)".to_owned(),
                )
            }
            Some((Some(url),)) => url,
        };
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|_, (_, at)| at.elapsed() < PEER_TTL);
        known.insert(holder, (url.clone(), std::time::Instant::now()));
        Ok(url)
    }

    async fn forward_call(
        &self,
        holder: Uuid,
        id: SandboxId,
        op: Op,
        deadline: Duration,
    ) -> Result<Response, DispatchError> {
        let fail = |detail: String| DispatchError::Forward { id, holder, detail };
        let peer = self.address_of(holder).await.map_err(fail)?;
        let op_name = op.name();
        let body = serde_json::to_vec(&ForwardedCall {
            sandbox: id.0,
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            op,
        })
        .map_err(|e| fail(format!("cannot encode the call: {e}")))?;
        let signature = self
            .key
            .sign(chrono::Utc::now().timestamp(), &body)
            .map_err(fail)?;
        let answer = self
            .http
            .post(format!("{}{CALL_PATH}", peer.trim_end_matches('/')))
            .header(SIGNATURE_HEADER, signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(deadline + TRIP_MARGIN)
            .body(body)
            .send()
            .await
            .map_err(|e| fail(format!("{peer} did not answer: {e}")))?;
        let status = answer.status();
        let bytes = answer
            .bytes()
            .await
            .map_err(|e| fail(format!("{peer} broke off its answer: {e}")))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{peer} answered something unreadable: {e}")));
        }
        let refusal: ForwardRefusal = serde_json::from_slice(&bytes).map_err(|_| {
            fail(format!(
                "{peer} answered {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ))
        })?;
        Err(match refusal.error.as_str() {
            "not_found" => DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: false,
            },
            "gone" => DispatchError::SandboxGone {
                id,
                reason: refusal.message,
            },
            "timeout" => DispatchError::Timeout {
                id,
                op: op_name,
                after: deadline,
            },
            _ => fail(format!("{peer} refused: {}", refusal.message)),
        })
    }
}

impl Forwarder for Peers {
    fn forward(
        &self,
        holder: Uuid,
        id: SandboxId,
        op: Op,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<Response, DispatchError>> {
        Box::pin(async move {
            let result = self.forward_call(holder, id, op, deadline).await;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(DispatchError::Forward { .. }) => "error",
                Err(_) => "refused",
            };
            crate::metrics::forwarded_call("sent", outcome);
            result
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_holds_once_within_its_window_for_its_body_and_key() {
        let key = ClusterKey::new(&"k".repeat(32));
        let seen = Nonces::default();
        let header = key.sign(1000, b"body").expect("signed");
        assert_eq!(key.verify(Some(&header), b"body", 1010, &seen), Ok(()));
        assert_eq!(
            key.verify(Some(&header), b"body", 1010, &seen),
            Err(Unsigned::Replayed)
        );
        let header = key.sign(1000, b"body").expect("signed");
        assert_eq!(
            key.verify(Some(&header), b"other", 1000, &seen),
            Err(Unsigned::WrongSignature)
        );
        assert_eq!(
            ClusterKey::new(&"x".repeat(32)).verify(Some(&header), b"body", 1000, &seen),
            Err(Unsigned::WrongSignature)
        );
        assert_eq!(
            key.verify(Some(&header), b"body", 1000 + WINDOW_SECS + 1, &seen),
            Err(Unsigned::Stale)
        );
        assert_eq!(
            key.verify(None, b"body", 1000, &seen),
            Err(Unsigned::Missing)
        );
        assert_eq!(
            key.verify(Some("t=1000,n=zz,s=00"), b"body", 1000, &seen),
            Err(Unsigned::Malformed)
        );
    }
}
