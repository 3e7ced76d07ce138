//! The events of one live process or watch, as the dispatcher keeps them: a [`Feed`].
//!
//! The stream's reader task (`stream.rs`) decodes each event line into an [`Item`] and pushes it
//! to its feed; the handles (`live.rs`) read it through a [`Reader`] each. A feed is a ring
//! bounded in output bytes and in events: the reader task never waits for a handle, the oldest
//! events go first, and a handle that falls behind is told how many events and bytes it missed
//! ([`Read::Dropped`]), never silently. The newest event is always kept, so the last one (a
//! process's end, a watch's end) is never dropped. Handles wait on a `watch` channel of the
//! feed's sequence number, so a push is never missed between a look and a wait.
//!
//! A process or watch of a sandbox another instance holds has a feed here too, filled from the
//! holder's stream instead of the executor's (`relay.rs`); what the holder's handle missed
//! arrives as an [`Item::Gap`], read as a drop report like the feed's own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use base64::Engine;
use bytes::Bytes;
use sandbox_executor::protocol::{EventBody, FsEvent, LiveProcess, OutputStream, ProcessEnd};
use tokio::sync::watch;

/// Most events a process's feed keeps (besides its byte bound).
pub(crate) const MAX_PROCESS_EVENTS: usize = 16 * 1024;

/// One event as a feed keeps it (decoded from the wire by the stream's reader).
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Data(OutputStream, Bytes),
    End(ProcessEnd),
    Fs(FsEvent),
    WatchEnd(String),
    /// Events (with output bytes among them) the holder's handle missed before the next one:
    /// a relayed drop report (`relay.rs`).
    Gap {
        events: u64,
        bytes: u64,
    },
    /// Bytes a server in the sandbox sent on a port connection (`port.rs`).
    PortData(Bytes),
    /// A port connection ended; with the reason when it was not clean.
    PortEnd(Option<String>),
}

impl Item {
    /// The wire event as an item; `data` is base64.
    pub(crate) fn from_wire(body: EventBody) -> std::result::Result<Item, String> {
        Ok(match body {
            EventBody::Data { stream, data } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| format!("data is not base64: {e}"))?;
                Item::Data(stream, Bytes::from(bytes))
            }
            EventBody::End(end) => Item::End(end),
            EventBody::Fs(event) => Item::Fs(event),
            EventBody::WatchEnd { reason } => Item::WatchEnd(reason),
            EventBody::PortData { data } => Item::PortData(Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| format!("port data is not base64: {e}"))?,
            )),
            EventBody::PortEnd { error } => Item::PortEnd(error),
            // Routed to its transfer by the stream, never to a feed.
            EventBody::Credit { .. } => return Err("credit belongs to a transfer".to_owned()),
        })
    }

    /// The last event of its feed.
    pub(crate) fn is_last(&self) -> bool {
        matches!(self, Item::End(_) | Item::WatchEnd(_) | Item::PortEnd(_))
    }

    fn bytes(&self) -> u64 {
        match self {
            Item::Data(_, bytes) | Item::PortData(bytes) => bytes.len() as u64,
            _ => 0,
        }
    }
}

struct Entry {
    seq: u64,
    /// Output bytes of every earlier event.
    bytes_before: u64,
    item: Item,
}

#[derive(Default)]
struct Ring {
    entries: VecDeque<Entry>,
    next_seq: u64,
    /// Output bytes of every event pushed.
    bytes_total: u64,
    /// Output bytes of the entries kept.
    bytes_kept: u64,
    ended: bool,
}

/// The events of one process or watch, bounded, shared by its handles (see the module doc).
pub(crate) struct Feed {
    ring: Mutex<Ring>,
    changed: watch::Sender<u64>,
    max_bytes: u64,
    max_events: usize,
    /// Set when it is a process: its pid and tag, once started.
    pub(crate) process: OnceLock<(u32, Option<String>)>,
    watch: bool,
    /// A port connection's feed (its end is a [`Item::PortEnd`]).
    port: bool,
}

impl Feed {
    pub(crate) fn new(max_bytes: usize, max_events: usize, watch: bool) -> Arc<Feed> {
        Arc::new(Feed {
            ring: Mutex::new(Ring::default()),
            changed: watch::Sender::new(0),
            max_bytes: max_bytes as u64,
            max_events: max_events.max(1),
            process: OnceLock::new(),
            watch,
            port: false,
        })
    }

    /// The feed of a port connection: `max_bytes` above the executor's window, so that nothing
    /// is ever dropped (the executor sends no more than the credit granted).
    pub(crate) fn of_port(max_bytes: usize) -> Arc<Feed> {
        Arc::new(Feed {
            ring: Mutex::new(Ring::default()),
            changed: watch::Sender::new(0),
            max_bytes: max_bytes as u64,
            max_events: MAX_PROCESS_EVENTS,
            process: OnceLock::new(),
            watch: false,
            port: true,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an event, dropping the oldest ones over the bounds (never the newest).
    pub(crate) fn push(&self, item: Item) {
        let mut ring = self.lock();
        if ring.ended {
            return;
        }
        let bytes = item.bytes();
        ring.ended = item.is_last();
        let entry = Entry {
            seq: ring.next_seq,
            bytes_before: ring.bytes_total,
            item,
        };
        ring.entries.push_back(entry);
        ring.next_seq += 1;
        ring.bytes_total += bytes;
        ring.bytes_kept += bytes;
        while ring.entries.len() > 1
            && (ring.bytes_kept > self.max_bytes || ring.entries.len() > self.max_events)
        {
            if let Some(old) = ring.entries.pop_front() {
                ring.bytes_kept -= old.item.bytes();
            }
        }
        let seq = ring.next_seq;
        drop(ring);
        self.changed.send_replace(seq);
    }

    /// Ends the feed because its events can no longer come (the stream closed).
    pub(crate) fn end_with(&self, reason: &str) {
        self.end_unobserved(format!("the sandbox is gone: {reason}"));
    }

    /// Ends the feed with `error` as the reason its real end was not observed (an end event
    /// whose `error` says so, or a watch's end).
    pub(crate) fn end_unobserved(&self, error: String) {
        let item = if self.port {
            Item::PortEnd(Some(error))
        } else if self.watch {
            Item::WatchEnd(error)
        } else {
            Item::End(ProcessEnd {
                error: Some(error),
                ..ProcessEnd::default()
            })
        };
        self.push(item);
    }

    /// Whether its last event was pushed.
    pub(crate) fn ended(&self) -> bool {
        self.lock().ended
    }

    /// The feed of a process whose pid and tag are known.
    pub(crate) fn of_process(max_bytes: usize, pid: u32, tag: Option<String>) -> Arc<Feed> {
        let feed = Feed::new(max_bytes, MAX_PROCESS_EVENTS, false);
        let _ = feed.process.set((pid, tag));
        feed
    }

    /// The pid and tag of the process it follows (none for a watch, or before the start's
    /// answer).
    pub(crate) fn process(&self) -> Option<(u32, Option<&str>)> {
        self.process.get().map(|(pid, tag)| (*pid, tag.as_deref()))
    }

    /// A reader from the very first event: the handle of the start, which is told of anything
    /// dropped before it was made (the output may outrun the start's answer).
    pub(crate) fn reader_from_start(self: &Arc<Self>) -> Reader {
        Reader {
            feed: Arc::clone(self),
            next_seq: 0,
            bytes_read: 0,
            changed: self.changed.subscribe(),
        }
    }

    /// A reader from the oldest event kept (an attached handle).
    pub(crate) fn reader(self: &Arc<Self>) -> Reader {
        let ring = self.lock();
        let (next_seq, bytes_read) = match ring.entries.front() {
            Some(front) => (front.seq, front.bytes_before),
            None => (ring.next_seq, ring.bytes_total),
        };
        drop(ring);
        Reader {
            feed: Arc::clone(self),
            next_seq,
            bytes_read,
            changed: self.changed.subscribe(),
        }
    }
}

/// Makes the feed of a live process found by `ExecutorStream::follow_live_processes`.
pub(crate) type MakeFeed = Box<dyn Fn(&LiveProcess) -> Arc<Feed> + Send>;

/// How an adopted sandbox's live processes get their feeds (`stream.rs`,
/// `follow_live_processes`).
pub(crate) fn adopted_feeds(max_bytes: usize) -> MakeFeed {
    Box::new(move |process: &LiveProcess| {
        Feed::of_process(max_bytes, process.pid, process.tag.clone())
    })
}

/// What a reader gets next.
pub(crate) enum Read {
    /// The next event.
    Item(Item),
    /// Events (with output bytes among them) dropped before the next one.
    Dropped { events: u64, bytes: u64 },
}

/// One handle's position in a feed.
pub(crate) struct Reader {
    feed: Arc<Feed>,
    next_seq: u64,
    bytes_read: u64,
    changed: watch::Receiver<u64>,
}

/// What a reader finds without waiting.
enum Poll {
    Ready(Read),
    Ended,
    Empty,
}

impl Reader {
    /// The next event if one is there.
    fn poll(&mut self) -> Poll {
        let ring = self.feed.lock();
        let (front_seq, front_bytes) = match ring.entries.front() {
            Some(front) => (front.seq, front.bytes_before),
            None => (ring.next_seq, ring.bytes_total),
        };
        if self.next_seq < front_seq {
            let missed = Read::Dropped {
                events: front_seq - self.next_seq,
                bytes: front_bytes.saturating_sub(self.bytes_read),
            };
            self.next_seq = front_seq;
            self.bytes_read = front_bytes;
            return Poll::Ready(missed);
        }
        let index = usize::try_from(self.next_seq - front_seq).unwrap_or(usize::MAX);
        if let Some(entry) = ring.entries.get(index) {
            self.next_seq += 1;
            self.bytes_read = entry.bytes_before + entry.item.bytes();
            return Poll::Ready(Read::Item(entry.item.clone()));
        }
        if ring.ended {
            Poll::Ended
        } else {
            Poll::Empty
        }
    }

    /// The next event; `None` after the last one.
    pub(crate) async fn next(&mut self) -> Option<Read> {
        loop {
            self.changed.borrow_and_update();
            match self.poll() {
                Poll::Ready(read) => return Some(read),
                Poll::Ended => return None,
                Poll::Empty => {}
            }
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Waits for the feed's last event, skipping everything before it; `None` if the feed is
    /// gone without one.
    pub(crate) async fn last(&mut self) -> Option<Item> {
        loop {
            self.changed.borrow_and_update();
            {
                let ring = self.feed.lock();
                if ring.ended {
                    let last = ring.entries.back()?;
                    self.next_seq = last.seq + 1;
                    self.bytes_read = ring.bytes_total;
                    return Some(last.item.clone());
                }
            }
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }

    /// The next event if one is there, without waiting; `None` if none is (yet).
    pub(crate) fn try_next(&mut self) -> Option<Read> {
        match self.poll() {
            Poll::Ready(read) => Some(read),
            Poll::Ended | Poll::Empty => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn data(n: usize) -> Item {
        Item::Data(OutputStream::Stdout, Bytes::from(vec![b'x'; n]))
    }

    fn end() -> Item {
        Item::End(ProcessEnd {
            exit_code: Some(0),
            ..ProcessEnd::default()
        })
    }

    async fn read(reader: &mut Reader) -> Option<Read> {
        tokio::time::timeout(Duration::from_secs(5), reader.next())
            .await
            .expect("a read that has something to return does not wait")
    }

    #[tokio::test]
    async fn a_reader_behind_the_bound_is_told_what_it_missed_and_the_end_is_kept() {
        let feed = Feed::new(100, 1000, false);
        let mut early = feed.reader();
        for _ in 0..5 {
            feed.push(data(40));
        }
        feed.push(end());
        // 200 bytes went by, at most 100 are kept: the first three chunks are gone.
        match read(&mut early).await {
            Some(Read::Dropped { events, bytes }) => assert_eq!((events, bytes), (3, 120)),
            _ => panic!("expected a drop report first"),
        }
        for _ in 0..2 {
            assert!(
                matches!(read(&mut early).await, Some(Read::Item(Item::Data(_, b))) if b.len() == 40)
            );
        }
        assert!(matches!(
            read(&mut early).await,
            Some(Read::Item(Item::End(_)))
        ));
        assert!(read(&mut early).await.is_none());
        // A reader made now starts at the oldest kept event, missing nothing it could have had.
        let mut late = feed.reader();
        assert!(matches!(
            read(&mut late).await,
            Some(Read::Item(Item::Data(..)))
        ));
        // Nothing after the end, not even a second end.
        feed.end_with("gone");
        assert!(matches!(
            read(&mut late).await,
            Some(Read::Item(Item::Data(..)))
        ));
        assert!(
            matches!(read(&mut late).await, Some(Read::Item(Item::End(e))) if e.error.is_none())
        );
        assert!(read(&mut late).await.is_none());
    }

    #[tokio::test]
    async fn the_newest_event_is_kept_whatever_its_size_and_counts_bound_watches() {
        let feed = Feed::new(10, 1000, false);
        feed.push(data(50));
        let mut reader = feed.reader();
        assert!(
            matches!(read(&mut reader).await, Some(Read::Item(Item::Data(_, b))) if b.len() == 50)
        );
        let watch = Feed::new(usize::MAX, 2, true);
        let mut reader = watch.reader();
        for i in 0..4 {
            watch.push(Item::Fs(FsEvent {
                op: sandbox_executor::protocol::FsOp::Create,
                path: format!("/workspace/{i}"),
                is_dir: false,
            }));
        }
        watch.end_with("the stream broke");
        match read(&mut reader).await {
            Some(Read::Dropped { events, bytes }) => assert_eq!((events, bytes), (3, 0)),
            _ => panic!("expected a drop report"),
        }
        assert!(
            matches!(read(&mut reader).await, Some(Read::Item(Item::Fs(e))) if e.path == "/workspace/3")
        );
        assert!(
            matches!(read(&mut reader).await, Some(Read::Item(Item::WatchEnd(r))) if r.contains("stream broke"))
        );
        assert!(read(&mut reader).await.is_none());
    }

    #[tokio::test]
    async fn wait_end_skips_to_the_end() {
        let feed = Feed::new(1000, 1000, false);
        let mut reader = feed.reader();
        let pushing = Arc::clone(&feed);
        let waiter = tokio::spawn(async move {
            let last = reader.last().await;
            (last, reader.try_next().is_none())
        });
        for _ in 0..10 {
            pushing.push(data(10));
        }
        pushing.push(end());
        let (last, then_nothing) = waiter.await.expect("the waiting task");
        assert!(matches!(last, Some(Item::End(e)) if e.exit_code == Some(0)));
        assert!(then_nothing, "nothing is read after the end");
    }

    #[tokio::test]
    async fn the_starting_handle_is_told_of_what_went_before_it_existed() {
        let feed = Feed::new(100, 1000, false);
        for _ in 0..5 {
            feed.push(data(40));
        }
        let mut first = feed.reader_from_start();
        match read(&mut first).await {
            Some(Read::Dropped { events, bytes }) => assert_eq!((events, bytes), (3, 120)),
            _ => panic!("expected a drop report first"),
        }
        // An attached handle starts at what is kept, with nothing to report.
        let mut attached = feed.reader();
        assert!(matches!(
            read(&mut attached).await,
            Some(Read::Item(Item::Data(..)))
        ));
    }

    #[test]
    fn try_next_returns_at_once() {
        let feed = Feed::new(1000, 1000, false);
        let mut reader = feed.reader();
        assert!(reader.try_next().is_none(), "nothing yet");
        feed.push(data(3));
        assert!(matches!(reader.try_next(), Some(Read::Item(Item::Data(_, b))) if b.len() == 3));
        assert!(reader.try_next().is_none());
        feed.push(end());
        assert!(matches!(reader.try_next(), Some(Read::Item(Item::End(_)))));
        assert!(reader.try_next().is_none(), "nothing after the end");
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_for_the_next_event() {
        let feed = Feed::new(1000, 1000, false);
        let mut reader = feed.reader();
        let pushing = Arc::clone(&feed);
        let waiter = tokio::spawn(async move { read(&mut reader).await.is_some() });
        tokio::task::yield_now().await;
        pushing.push(data(1));
        assert!(waiter.await.expect("the reader task"));
    }
}
