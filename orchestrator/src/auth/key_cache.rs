//! Verified API keys kept in memory, so a REST call does not spend a PostgreSQL round trip on
//! its key (measured: that lookup was a third of PostgreSQL's work per audited call).
//!
//! A cached key is never trusted longer than the database says it may be:
//!
//! * the cache is used only while this node LISTENs on [`CHANNEL`]; a trigger on `api_keys`
//!   (migration `..._api_key_notify.sql`) notifies every change of a key row (revocation, role,
//!   expiry, deletion), from any replica or from `psql`, in the changing transaction, and the
//!   listener drops that key at once. When the listening connection is lost, every entry is
//!   dropped and nothing is cached until listening again (a notification may have been missed);
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

use crate::caller::Caller;

/// The NOTIFY channel of key changes; the payload is the key's id.
pub const CHANNEL: &str = "aegis_api_keys";
/// The longest an entry is used without reading the key again.
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// How often `last_used_at` is refreshed per key (as the uncached lookup does).
const TOUCH_EVERY: Duration = Duration::from_secs(30);
/// Entries beyond this are all dropped (they are read again on their next use).
const MAX_ENTRIES: usize = 10_000;

/// One verified key.
#[derive(Debug, Clone)]
struct Entry {
    caller: Caller,
    key_id: Uuid,
    expires_at: Option<DateTime<Utc>>,
    read_at: Instant,
    touched_at: Instant,
}

/// The cache: key hash → verified key, valid only while [`KeyCache::listening`].
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: Mutex<HashMap<String, Entry>>,
    listening: AtomicBool,
    /// Bumped by every drop: a key read from the database before a drop is not stored after it
    /// (the drop may have been for that very key, announced between the read and the store).
    generation: AtomicU64,
}

/// What a lookup found.
pub enum Cached {
    /// The key is cached and valid now: its caller; `touch` when `last_used_at` is due.
    Hit { caller: Caller, touch: Option<Uuid> },
    /// Not cached (or caching is off): read the database.
    Miss,
}

impl KeyCache {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while the listener is subscribed: only then are entries used or stored.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// The cached caller of the key whose hash is `hash`, if it may be used now.
    pub fn get(&self, hash: &str) -> Cached {
        if !self.listening() {
            return Cached::Miss;
        }
        let now = Instant::now();
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(hash) else {
            return Cached::Miss;
        };
        let expired = entry.expires_at.is_some_and(|t| t <= Utc::now());
        if expired || now.duration_since(entry.read_at) >= MAX_AGE {
            entries.remove(hash);
            return Cached::Miss;
        }
        let touch = (now.duration_since(entry.touched_at) >= TOUCH_EVERY).then(|| {
            entry.touched_at = now;
            entry.key_id
        });
        Cached::Hit {
            caller: entry.caller.clone(),
            touch,
        }
    }

    /// Taken before reading a key from the database, given back to [`KeyCache::put`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Remembers a key the database accepted after [`KeyCache::generation`] was `seen`; nothing
    /// while not listening or when anything was dropped since.
    pub fn put(
        &self,
        seen: u64,
        hash: String,
        key_id: Uuid,
        caller: Caller,
        expires_at: Option<DateTime<Utc>>,
    ) {
        let now = Instant::now();
        let mut entries = self.entries();
        if !self.listening() || self.generation() != seen {
            return;
        }
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(
            hash,
            Entry {
                caller,
                key_id,
                expires_at,
                read_at: now,
                touched_at: now,
            },
        );
    }

    /// Whether an entry for key `id` is held (whatever its age): what a test or a diagnosis
    /// needs to tell a cached key from one read every time.
    pub fn holds(&self, id: Uuid) -> bool {
        self.entries().values().any(|e| e.key_id == id)
    }

    /// Drops the key `id` (it changed).
    pub fn forget(&self, id: Uuid) {
        let mut entries = self.entries();
        self.generation.fetch_add(1, Ordering::AcqRel);
        entries.retain(|_, e| e.key_id != id);
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
            listener.listen(CHANNEL).await?;
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
                Ok(Some(notification)) => match Uuid::parse_str(notification.payload()) {
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
    use crate::caller::Role;

    fn caller(id: Uuid) -> Caller {
        Caller::operator(id, "k", Role::Operator)
    }

    #[test]
    fn nothing_is_cached_or_used_while_not_listening() {
        let cache = KeyCache::default();
        let id = Uuid::new_v4();
        cache.put(cache.generation(), "h".into(), id, caller(id), None);
        assert!(matches!(cache.get("h"), Cached::Miss));
        cache.set_listening(true);
        assert!(matches!(cache.get("h"), Cached::Miss));
        cache.put(cache.generation(), "h".into(), id, caller(id), None);
        assert!(matches!(cache.get("h"), Cached::Hit { touch: None, .. }));
        cache.set_listening(false);
        assert!(matches!(cache.get("h"), Cached::Miss));
    }

    #[test]
    fn a_changed_or_expired_key_is_read_again() {
        let cache = KeyCache::default();
        cache.set_listening(true);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let seen = cache.generation();
        cache.put(seen, "a".into(), a, caller(a), None);
        let expired = Some(Utc::now() - chrono::Duration::seconds(1));
        cache.put(seen, "b".into(), b, caller(b), expired);
        cache.forget(a);
        assert!(matches!(cache.get("a"), Cached::Miss));
        assert!(matches!(cache.get("b"), Cached::Miss));
    }

    #[test]
    fn a_key_read_before_a_drop_is_not_stored_after_it() {
        let cache = KeyCache::default();
        cache.set_listening(true);
        let a = Uuid::new_v4();
        let seen = cache.generation();
        cache.forget(a);
        cache.put(seen, "a".into(), a, caller(a), None);
        assert!(matches!(cache.get("a"), Cached::Miss));
    }
}
