//! Live processes and watches of sandboxes another instance holds, followed from here.
//!
//! The holder streams the events of its handle (`forward.rs`, [`Relay`]); a task of this
//! instance pushes them into a [`Feed`] of its own, so the handles given to callers here read
//! exactly like local ones: bounded (the feed's ring; the task never waits for a handle), told of
//! what they missed (the holder's drop reports arrive as [`Item::Gap`], this ring's own as
//! usual), and ended by one last event. When the holder's stream stops early (the holder stopped
//! or went silent, the connection broke) the feed ends at once with an end that says so.
//!
//! The task lives as long as a handle on its feed: each holds an [`Upstream`], and dropping the
//! last one aborts the task, which drops the holder's stream and so closes the subscription on
//! the holder (a watch is removed there). The processes followed so are kept in [`Relays`] by
//! pid and tag, so a second handle on one of them (the end's follower of a background process,
//! a re-attaching client) shares its feed instead of opening another stream to the holder.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use futures_util::StreamExt;
use sandbox_executor::protocol::OutputStream;
use tokio::task::JoinHandle;

use crate::feed::{Feed, Item};
use crate::forward::{Relay, Relayed};
use crate::live::{ProcessEvent, ProcessSelector, WatchEvent};
use crate::spec::SandboxId;

/// The task filling one relayed feed; aborted when the last handle on the feed drops it.
pub(crate) struct Upstream {
    feed: Arc<Feed>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// Starts following `relay` into `feed`.
    pub(crate) fn start(feed: Arc<Feed>, relay: Relay) -> Arc<Upstream> {
        let task = tokio::spawn(pump(Arc::clone(&feed), relay));
        Arc::new(Upstream { feed, task })
    }

    /// The feed it fills.
    pub(crate) fn feed(&self) -> &Arc<Feed> {
        &self.feed
    }
}

/// Pushes the holder's events into `feed` until the last one, or ends it with the reason the
/// events stopped.
async fn pump(feed: Arc<Feed>, mut relay: Relay) {
    while let Some(next) = relay.next().await {
        let item = match next {
            Ok(relayed) => item_of(relayed),
            Err(reason) => return feed.end_unobserved(reason),
        };
        let last = item.is_last();
        feed.push(item);
        if last {
            return;
        }
    }
    feed.end_unobserved(
        "the instance holding the sandbox ended the stream before its last event".to_owned(),
    );
}

fn item_of(relayed: Relayed) -> Item {
    match relayed {
        Relayed::Process(ProcessEvent::Stdout(bytes)) => Item::Data(OutputStream::Stdout, bytes),
        Relayed::Process(ProcessEvent::Stderr(bytes)) => Item::Data(OutputStream::Stderr, bytes),
        Relayed::Process(ProcessEvent::Pty(bytes)) => Item::Data(OutputStream::Pty, bytes),
        Relayed::Process(ProcessEvent::Dropped { events, bytes }) => Item::Gap { events, bytes },
        Relayed::Process(ProcessEvent::End(end)) => Item::End(end),
        Relayed::Watch(WatchEvent::Fs(event)) => Item::Fs(event),
        Relayed::Watch(WatchEvent::Dropped { events }) => Item::Gap { events, bytes: 0 },
        Relayed::Watch(WatchEvent::End { reason }) => Item::WatchEnd(reason),
    }
}

/// One relayed process, as [`Relays`] finds it again.
struct Followed {
    tag: Option<String>,
    upstream: Weak<Upstream>,
}

/// The processes of sandboxes held elsewhere that this instance follows, by sandbox and pid.
#[derive(Default)]
pub(crate) struct Relays {
    processes: Mutex<HashMap<(SandboxId, u32), Followed>>,
}

impl Relays {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SandboxId, u32), Followed>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers the process `pid` of `sandbox` followed through `upstream`.
    pub(crate) fn keep(
        &self,
        sandbox: SandboxId,
        pid: u32,
        tag: Option<String>,
        upstream: &Arc<Upstream>,
    ) {
        let mut processes = self.lock();
        processes.retain(|_, followed| followed.upstream.strong_count() > 0);
        processes.insert(
            (sandbox, pid),
            Followed {
                tag,
                upstream: Arc::downgrade(upstream),
            },
        );
    }

    /// The upstream of a process `select` names in `sandbox` that is followed already and has
    /// not ended (an ended one is unknown to the holder too).
    pub(crate) fn find(
        &self,
        sandbox: SandboxId,
        select: &ProcessSelector,
    ) -> Option<Arc<Upstream>> {
        self.lock()
            .iter()
            .filter(|((s, pid), followed)| {
                *s == sandbox
                    && match select {
                        ProcessSelector::Pid(wanted) => pid == wanted,
                        ProcessSelector::Tag(wanted) => followed.tag.as_ref() == Some(wanted),
                    }
            })
            .find_map(|(_, followed)| followed.upstream.upgrade())
            .filter(|upstream| !upstream.feed.ended())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sandbox_executor::protocol::ProcessEnd;
    use std::time::Duration;

    fn end(code: i32) -> ProcessEvent {
        ProcessEvent::End(ProcessEnd {
            exit_code: Some(code),
            ..ProcessEnd::default()
        })
    }

    async fn last_of(feed: &Arc<Feed>) -> Item {
        tokio::time::timeout(Duration::from_secs(5), feed.reader_from_start().last())
            .await
            .expect("the feed ends without a wait")
            .expect("a last event")
    }

    #[tokio::test]
    async fn the_holders_events_fill_the_feed_and_its_drop_reports_are_kept() {
        let feed = Feed::new(1 << 20, 100, false);
        let relay: Relay = futures_util::stream::iter(vec![
            Ok(Relayed::Process(ProcessEvent::Stdout(Bytes::from_static(
                b"a",
            )))),
            Ok(Relayed::Process(ProcessEvent::Dropped {
                events: 2,
                bytes: 7,
            })),
            Ok(Relayed::Process(end(3))),
            Ok(Relayed::Process(ProcessEvent::Stdout(Bytes::from_static(
                b"after",
            )))),
        ])
        .boxed();
        let _upstream = Upstream::start(Arc::clone(&feed), relay);
        let mut reader = feed.reader_from_start();
        let mut seen = Vec::new();
        while let Some(read) = tokio::time::timeout(Duration::from_secs(5), reader.next())
            .await
            .expect("no wait")
        {
            seen.push(match read {
                crate::feed::Read::Item(item) => format!("{item:?}"),
                crate::feed::Read::Dropped { events, bytes } => format!("local {events} {bytes}"),
            });
        }
        assert_eq!(seen.len(), 3, "nothing after the end: {seen:?}");
        assert!(seen[0].contains("Data(Stdout"), "{seen:?}");
        assert!(seen[1].contains("Gap { events: 2, bytes: 7 }"), "{seen:?}");
        assert!(seen[2].contains("exit_code: Some(3)"), "{seen:?}");
    }

    #[tokio::test]
    async fn a_broken_or_cut_short_stream_ends_the_feed_at_once_with_why() {
        let feed = Feed::new(1 << 20, 100, false);
        let relay: Relay = futures_util::stream::iter(vec![
            Ok(Relayed::Process(ProcessEvent::Stdout(Bytes::from_static(
                b"a",
            )))),
            Err("the holder stopped answering".to_owned()),
        ])
        .boxed();
        let _upstream = Upstream::start(Arc::clone(&feed), relay);
        match last_of(&feed).await {
            Item::End(end) => {
                assert_eq!(end.error.as_deref(), Some("the holder stopped answering"))
            }
            other => panic!("{other:?}"),
        }
        let watch = Feed::new(usize::MAX, 100, true);
        let _upstream = Upstream::start(Arc::clone(&watch), futures_util::stream::empty().boxed());
        match last_of(&watch).await {
            Item::WatchEnd(reason) => assert!(reason.contains("before its last event"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn dropping_the_last_upstream_stops_following_and_it_is_found_only_while_alive() {
        let feed = Feed::new(1 << 20, 100, false);
        let relays = Relays::default();
        let sandbox = SandboxId::new();
        let upstream = Upstream::start(Arc::clone(&feed), futures_util::stream::pending().boxed());
        relays.keep(sandbox, 7, Some("t".to_owned()), &upstream);
        assert!(relays.find(sandbox, &ProcessSelector::Pid(7)).is_some());
        assert!(relays
            .find(sandbox, &ProcessSelector::Tag("t".to_owned()))
            .is_some());
        assert!(relays.find(sandbox, &ProcessSelector::Pid(8)).is_none());
        assert!(relays
            .find(SandboxId::new(), &ProcessSelector::Pid(7))
            .is_none());
        drop(upstream);
        assert!(relays.find(sandbox, &ProcessSelector::Pid(7)).is_none());
    }
}
