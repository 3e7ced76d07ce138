//! Verified API keys kept in memory, so a REST or MCP call does not spend a PostgreSQL round
//! trip on its key (measured: that lookup was a third of PostgreSQL's work per audited call).
//! Operator keys (REST) and keys bound to a security context (MCP, with the context's version)
//! are kept apart: one key may be used on both doors.
//!
//! A cached key is never trusted longer than the database says it may be:
//!
//! * the cache is used only while this node LISTENs on [`CHANNEL`] and [`CONTEXT_CHANNEL`]; a
//!   trigger on `api_keys` (migration `..._api_key_notify.sql`) notifies every change of a key
//!   row (revocation, role, expiry, binding, deletion), one on `security_contexts` (migration
//!   `..._security_context_notify.sql`) every edit or deletion of a context, from any replica or
//!   from `psql`, in the changing transaction; the listener drops that key, or every key bound to
//!   that context, at once. When the listening connection is lost, every entry is dropped and
//!   nothing is cached until listening again (a notification may have been missed);
//! * an entry lives at most [`MAX_AGE`] even so, and the key's expiry is checked on every use;
//! * `last_used_at` is still refreshed, at most every 30 s per key, in the background.
//!
//! Unknown and refused keys are never cached: each refusal reads the database again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::BoundKey;
use aegis_core::caller::Caller;

/// The NOTIFY channel of key changes; the payload is the key's id.
pub const CHANNEL: &str = "aegis_api_keys";
/// The NOTIFY channel of security context edits; the payload is the context's name.
pub const CONTEXT_CHANNEL: &str = "aegis_security_contexts";
/// The longest an entry is used without reading the key again.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// How often `last_used_at` is refreshed per key (as the uncached lookup does).
const TOUCH_EVERY: Duration = Duration::from_secs(30);
/// Entries beyond this (per kind) are all dropped (they are read again on their next use).
const MAX_ENTRIES: usize = 10_000;

/// One verified key: what its door needs (`T`), and what decides how long that holds.
#[derive(Debug, Clone)]
struct Entry<T> {
    value: T,
    key_id: Uuid,
    /// The security context the answer depends on (bound keys).
    context: Option<String>,
    expires_at: Option<DateTime<Utc>>,
    read_at: Instant,
    touched_at: Instant,
}

/// Key hash → entry, one map per kind of answer.
#[derive(Debug, Default)]
struct Entries {
    operators: HashMap<String, Entry<Caller>>,
    bound: HashMap<String, Entry<BoundKey>>,
}

impl Entries {
    fn clear(&mut self) {
        self.operators.clear();
        self.bound.clear();
    }
}

/// The cache: key hash → verified key, valid only while [`KeyCache::listening`].
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: Mutex<Entries>,
    listening: AtomicBool,
    /// Bumped by every drop: a key read from the database before a drop is not stored after it
    /// (the drop may have been for that very key, announced between the read and the store).
    generation: AtomicU64,
    /// Rate-limit state of the capabilities of keys bound to a security context, for their
    /// REST calls (one window set per key, whichever cached entry carries it).
    limiter: std::sync::Arc<aegis_seal::RateLimiter>,
}

/// What a lookup found.
pub enum Cached<T> {
    /// The key is cached and valid now: its answer; `touch` when `last_used_at` is due.
    Hit { value: T, touch: Option<Uuid> },
    /// Not cached (or caching is off): read the database.
    Miss,
}

/// What a key the database just accepted is remembered with.
pub struct Verified<T> {
    /// The answer for its door.
    pub value: T,
    /// The key's id.
    pub key_id: Uuid,
    /// The security context the answer includes, if any.
    pub context: Option<String>,
    /// The key's expiry.
    pub expires_at: Option<DateTime<Utc>>,
}

/// Picks one kind of entry.
trait Kind: Clone + Sized {
    fn map(entries: &mut Entries) -> &mut HashMap<String, Entry<Self>>;
}

impl Kind for Caller {
    fn map(entries: &mut Entries) -> &mut HashMap<String, Entry<Self>> {
        &mut entries.operators
    }
}

impl Kind for BoundKey {
    fn map(entries: &mut Entries) -> &mut HashMap<String, Entry<Self>> {
        &mut entries.bound
    }
}

impl KeyCache {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rate-limit state bound keys' REST calls count against.
    pub fn limiter(&self) -> std::sync::Arc<aegis_seal::RateLimiter> {
        self.limiter.clone()
    }

    /// True while the listener is subscribed: only then are entries used or stored.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// The cached operator (REST) caller of the key whose hash is `hash`, if usable now.
    pub fn get(&self, hash: &str) -> Cached<Caller> {
        self.lookup(hash)
    }

    /// The cached binding (MCP) of the key whose hash is `hash`, if usable now.
    pub fn get_bound(&self, hash: &str) -> Cached<BoundKey> {
        self.lookup(hash)
    }

    fn lookup<T: Kind>(&self, hash: &str) -> Cached<T> {
        if !self.listening() {
            return Cached::Miss;
        }
        let now = Instant::now();
        let mut entries = self.entries();
        let map = T::map(&mut entries);
        let Some(entry) = map.get_mut(hash) else {
            return Cached::Miss;
        };
        let expired = entry.expires_at.is_some_and(|t| t <= Utc::now());
        if expired || now.duration_since(entry.read_at) >= MAX_AGE {
            map.remove(hash);
            return Cached::Miss;
        }
        let touch = (now.duration_since(entry.touched_at) >= TOUCH_EVERY).then(|| {
            entry.touched_at = now;
            entry.key_id
        });
        Cached::Hit {
            value: entry.value.clone(),
            touch,
        }
    }

    /// Taken before reading a key from the database, given back to [`KeyCache::put`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Remembers an operator key the database accepted after [`KeyCache::generation`] was
    /// `seen`; nothing while not listening or when anything was dropped since.
    pub fn put(&self, seen: u64, hash: String, verified: Verified<Caller>) {
        self.store(seen, hash, verified)
    }

    /// Like [`KeyCache::put`], for a key bound to a security context (with its version).
    pub fn put_bound(&self, seen: u64, hash: String, verified: Verified<BoundKey>) {
        self.store(seen, hash, verified)
    }

    fn store<T: Kind>(&self, seen: u64, hash: String, verified: Verified<T>) {
        let now = Instant::now();
        let mut entries = self.entries();
        if !self.listening() || self.generation() != seen {
            return;
        }
        let map = T::map(&mut entries);
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        map.insert(
            hash,
            Entry {
                value: verified.value,
                key_id: verified.key_id,
                context: verified.context,
                expires_at: verified.expires_at,
                read_at: now,
                touched_at: now,
            },
        );
    }

    /// Whether an entry for key `id` is held (whatever its age or kind): what a test or a
    /// diagnosis needs to tell a cached key from one read every time.
    pub fn holds(&self, id: Uuid) -> bool {
        let entries = self.entries();
        entries.operators.values().any(|e| e.key_id == id)
            || entries.bound.values().any(|e| e.key_id == id)
    }

    /// Drops the key `id` (it changed).
    pub fn forget(&self, id: Uuid) {
        let mut entries = self.entries();
        self.generation.fetch_add(1, Ordering::AcqRel);
        entries.operators.retain(|_, e| e.key_id != id);
        entries.bound.retain(|_, e| e.key_id != id);
    }

    /// Drops every key whose answer includes the security context `name` (it was edited).
    pub fn forget_context(&self, name: &str) {
        let mut entries = self.entries();
        self.generation.fetch_add(1, Ordering::AcqRel);
        entries
            .bound
            .retain(|_, e| e.context.as_deref() != Some(name));
        entries
            .operators
            .retain(|_, e| e.context.as_deref() != Some(name));
    }

    /// Turns caching on or off; either way every entry is dropped.
    fn set_listening(&self, on: bool) {
        let mut entries = self.entries();
        self.generation.fetch_add(1, Ordering::AcqRel);
        entries.clear();
        self.listening.store(on, Ordering::Release);
    }
}

/// Keeps `cache` subscribed to key changes until `shutdown`; reconnects after a lost connection
/// (caching stays off meanwhile).
pub async fn listen(pool: PgPool, cache: Arc<KeyCache>, shutdown: CancellationToken) {
    loop {
        cache.set_listening(false);
        let subscribed = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen_all([CHANNEL, CONTEXT_CHANNEL]).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            _ = shutdown.cancelled() => return,
            l = subscribed => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "API key cache off: cannot LISTEN for key changes");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                    }
                }
            },
        };
        cache.set_listening(true);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => {
                    cache.set_listening(false);
                    return;
                }
                n = listener.try_recv() => n,
            };
            match next {
                Ok(Some(n)) if n.channel() == CONTEXT_CHANNEL => cache.forget_context(n.payload()),
                Ok(Some(n)) => match Uuid::parse_str(n.payload()) {
                    Ok(id) => cache.forget(id),
                    // Not ours to parse: drop everything rather than guess.
                    Err(_) => cache.set_listening(true),
                },
                // The connection was lost: notifications may have been missed.
                Ok(None) | Err(_) => {
                    tracing::warn!("API key cache off: the LISTEN connection was lost");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aegis_core::caller::Role;

    fn operator(id: Uuid, expires_at: Option<DateTime<Utc>>) -> Verified<Caller> {
        Verified {
            value: Caller::operator(id, "k", Role::Operator),
            key_id: id,
            context: None,
            expires_at,
        }
    }

    fn bound(id: Uuid, context: &str) -> Verified<BoundKey> {
        Verified {
            value: BoundKey {
                id,
                name: "k".into(),
                security_context: Some(context.into()),
                context_version: Some("v1".into()),
            },
            key_id: id,
            context: Some(context.into()),
            expires_at: None,
        }
    }

    /// A cache that stores (it is listening for drops), and its generation now.
    fn listening() -> (KeyCache, u64) {
        let cache = KeyCache::default();
        cache.set_listening(true);
        let seen = cache.generation();
        (cache, seen)
    }

    #[test]
    fn nothing_is_cached_or_used_while_not_listening() {
        let cache = KeyCache::default();
        let id = Uuid::new_v4();
        cache.put(cache.generation(), "h".into(), operator(id, None));
        assert!(matches!(cache.get("h"), Cached::Miss));
        cache.set_listening(true);
        assert!(matches!(cache.get("h"), Cached::Miss));
        cache.put(cache.generation(), "h".into(), operator(id, None));
        assert!(matches!(cache.get("h"), Cached::Hit { touch: None, .. }));
        cache.set_listening(false);
        assert!(matches!(cache.get("h"), Cached::Miss));
    }

    #[test]
    fn a_changed_or_expired_key_is_read_again() {
        let (cache, seen) = listening();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        cache.put(seen, "a".into(), operator(a, None));
        let expired = Some(Utc::now() - chrono::Duration::seconds(1));
        cache.put(seen, "b".into(), operator(b, expired));
        cache.forget(a);
        assert!(matches!(cache.get("a"), Cached::Miss));
        assert!(matches!(cache.get("b"), Cached::Miss));
    }

    #[test]
    fn a_key_read_before_a_drop_is_not_stored_after_it() {
        let (cache, seen) = listening();
        let a = Uuid::new_v4();
        cache.forget(a);
        cache.put(seen, "a".into(), operator(a, None));
        assert!(matches!(cache.get("a"), Cached::Miss));
    }

    #[test]
    fn an_edited_context_drops_the_keys_bound_to_it_and_no_others() {
        let (cache, seen) = listening();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        cache.put_bound(seen, "a".into(), bound(a, "ctx-a"));
        cache.put_bound(seen, "b".into(), bound(b, "ctx-b"));
        cache.put(seen, "a".into(), operator(a, None));
        cache.forget_context("ctx-a");
        assert!(matches!(cache.get_bound("a"), Cached::Miss));
        assert!(matches!(cache.get_bound("b"), Cached::Hit { .. }));
        // The same key's REST answer does not depend on the context.
        assert!(matches!(cache.get("a"), Cached::Hit { .. }));
        // A revoked key is dropped from both doors.
        cache.forget(a);
        assert!(matches!(cache.get("a"), Cached::Miss));
        assert!(!cache.holds(a));
        assert!(cache.holds(b));
    }
}
