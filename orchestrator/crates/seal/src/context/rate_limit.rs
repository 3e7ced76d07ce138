//! Per-session rate limits of capabilities: a sliding window of the instants of allowed calls,
//! kept per (session, capability index). Exact ("at most N in any window of S seconds"), at the
//! cost of one `Instant` per counted call, which `MAX_RATE_CALLS` bounds.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::RateLimit;

/// Per-session, per-capability sliding windows of allowed calls.
#[derive(Debug, Default)]
pub struct RateLimiter {
    state: Mutex<LimiterState>,
}

#[derive(Debug, Default)]
struct LimiterState {
    sessions: HashMap<String, HashMap<usize, Window>>,
    acquisitions: u64,
}

#[derive(Debug)]
struct Window {
    per: Duration,
    allowed: VecDeque<Instant>,
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while self
            .allowed
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.per)
        {
            self.allowed.pop_front();
        }
    }

    /// Whether one more call fits in a window of `per` holding at most `calls` calls at `now`,
    /// else the seconds until it would (at least 1). Reads only: counting is the caller's.
    fn admits(&self, per: Duration, calls: u32, now: Instant) -> Result<(), u64> {
        let live = self
            .allowed
            .iter()
            .filter(|t| now.saturating_duration_since(**t) < per);
        let oldest = live.clone().next().copied();
        if live.count() < calls.max(1) as usize {
            return Ok(());
        }
        let oldest = oldest.unwrap_or(now);
        let wait = per.saturating_sub(now.saturating_duration_since(oldest));
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Err(secs.max(1))
    }
}

/// How many acquisitions between sweeps of idle windows.
const SWEEP_EVERY: u64 = 4096;

impl RateLimiter {
    /// An empty limiter.
    pub fn new() -> RateLimiter {
        RateLimiter::default()
    }

    /// Whether `limit` admits one more call of capability `capability_index` for `session_key`
    /// at `now`, else the seconds until it would (at least 1). With `count` an admitted call is
    /// counted; without, nothing changes (a preview of the same decision).
    pub fn acquire(
        &self,
        session_key: &str,
        capability_index: usize,
        limit: RateLimit,
        now: Instant,
        count: bool,
    ) -> Result<(), u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let per = Duration::from_secs(u64::from(limit.per_seconds.max(1)));
        if !count {
            return match state
                .sessions
                .get(session_key)
                .and_then(|s| s.get(&capability_index))
            {
                Some(window) => window.admits(per, limit.calls, now),
                None => Ok(()),
            };
        }
        state.acquisitions += 1;
        if state.acquisitions % SWEEP_EVERY == 0 {
            sweep(&mut state.sessions, now);
        }
        let window = state
            .sessions
            .entry(session_key.to_owned())
            .or_default()
            .entry(capability_index)
            .or_insert_with(|| Window {
                per,
                allowed: VecDeque::new(),
            });
        window.per = per;
        window.expire(now);
        window.admits(per, limit.calls, now)?;
        window.allowed.push_back(now);
        Ok(())
    }

    /// Drops every window of a session (on revocation or expiry).
    pub fn forget_session(&self, session_key: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.sessions.remove(session_key);
    }

    /// Drops windows with no call inside them any more.
    pub fn prune(&self, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        sweep(&mut state.sessions, now);
    }

    /// Number of sessions with at least one window (for tests and metrics).
    pub fn session_count(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.sessions.len()
    }
}

fn sweep(sessions: &mut HashMap<String, HashMap<usize, Window>>, now: Instant) {
    sessions.retain(|_, windows| {
        windows.retain(|_, w| {
            w.expire(now);
            !w.allowed.is_empty()
        });
        !windows.is_empty()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_sessions_are_forgotten() {
        let limiter = RateLimiter::new();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let three = RateLimit {
            calls: 3,
            per_seconds: 60,
        };
        for (session, secs) in [("a", 0), ("b", 0)] {
            assert_eq!(limiter.acquire(session, 0, three, at(secs), true), Ok(()));
        }
        // Retry-after rounds up and is never 0.
        let limit = RateLimit {
            calls: 1,
            per_seconds: 1,
        };
        assert_eq!(limiter.acquire("x", 0, limit, t0, true), Ok(()));
        assert_eq!(
            limiter.acquire("x", 0, limit, t0 + Duration::from_millis(999), true),
            Err(1)
        );
        assert_eq!(
            limiter.acquire("x", 0, limit, t0 + Duration::from_millis(1000), true),
            Ok(())
        );

        assert_eq!(limiter.session_count(), 3);
        limiter.forget_session("x");
        assert_eq!(limiter.session_count(), 2);
        limiter.prune(at(1000));
        assert_eq!(limiter.session_count(), 0);
    }
}
