//! Group commit: the writes that wait at the same moment share one statement.
//!
//! Both per-call writes of the hot path, the audit chain's rows and the SEAL replay guard's
//! signatures, cost one PostgreSQL round trip each; done one statement per call, their lock or
//! their commit serialises the node. Here:
//!
//! * a call that finds nothing in flight stores its own request at once, on its own task, so a
//!   lone caller pays no hop to another task and back;
//! * calls that arrive while a store is in flight queue; when it ends, a drainer task stores
//!   whatever queued, one batch after another, until nothing waits, then goes idle.
//!
//! A batch that fails as a whole is stored again request by request, so that only a request
//! that fails alone reports the error.
//!
//! A store, once begun, ends even if its caller goes away: a leader whose future is dropped
//! (its client disconnected) hands its unfinished work to a task of its own ([`Finish`]), so its
//! request is not half done and the queue behind it is still drained. The writer's state (a
//! cache, a connection held between batches) travels with whoever stores, so there is never
//! more than one store in flight per [`GroupCommit`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::oneshot;

/// At most this many requests per batch (keeps one statement's arrays modest).
const MAX_BATCH: usize = 256;

/// What a group commit stores with, and how.
pub trait Batch: Default + Send + 'static {
    /// One call's request (shared with the statement storing it while that runs).
    type Request: Send + Sync + 'static;
    /// What storing one request gives back.
    type Stored: Send + 'static;
    /// What is stored, for the log line of a batch that failed.
    const WHAT: &'static str;

    /// Stores all of `batch` in one statement: one result per request, in order, or an error
    /// for the whole batch (whose requests are then stored one by one, so that only a request
    /// that fails alone reports the error).
    fn store<'a>(&'a mut self, batch: &'a [Self::Request]) -> Storing<'a, Self::Stored>;

    /// Nothing waits any more: let go of what was kept for the next batch.
    fn idle(&mut self) {}
}

/// A batch being stored: the results, one per request, or the whole batch's error.
pub type Storing<'a, T> = Pin<Box<dyn Future<Output = Result<Vec<T>, sqlx::Error>> + Send + 'a>>;

/// One request's answer.
pub type Answer<B> = Result<<B as Batch>::Stored, sqlx::Error>;

/// One writer's queue (see the module documentation).
pub struct GroupCommit<B: Batch> {
    queue: Arc<Mutex<Queue<B>>>,
}

impl<B: Batch> Default for GroupCommit<B> {
    fn default() -> Self {
        Self {
            queue: Arc::new(Mutex::new(Queue {
                state: Some(B::default()),
                waiting: Vec::new(),
            })),
        }
    }
}

/// The writer's state while nobody stores (`None` while a store is in flight), and who waits.
struct Queue<B: Batch> {
    state: Option<B>,
    waiting: Vec<(B::Request, oneshot::Sender<Answer<B>>)>,
}

fn lock<B: Batch>(queue: &Mutex<Queue<B>>) -> MutexGuard<'_, Queue<B>> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

enum Turn<B: Batch> {
    Lead(B, B::Request),
    Wait(oneshot::Receiver<Answer<B>>),
}

impl<B: Batch> GroupCommit<B> {
    /// Stores `request` (alone or with others) and answers once its batch was stored. `None`
    /// when the store was lost: its runtime ended before it finished.
    pub async fn submit(&self, request: B::Request) -> Option<Answer<B>> {
        let turn = {
            let mut queue = lock(&self.queue);
            match queue.state.take() {
                Some(state) => Turn::Lead(state, request),
                None => {
                    let (reply, answer) = oneshot::channel();
                    queue.waiting.push((request, reply));
                    Turn::Wait(answer)
                }
            }
        };
        match turn {
            Turn::Lead(state, request) => {
                Finish::new(lead(self.queue.clone(), state, request)).await
            }
            Turn::Wait(answer) => answer.await.ok(),
        }
    }
}

/// The leader's turn: its own request, then the queue goes to a drainer or idle.
async fn lead<B: Batch>(
    queue: Arc<Mutex<Queue<B>>>,
    mut state: B,
    request: B::Request,
) -> Option<Answer<B>> {
    let answer = store(&queue, &mut state, vec![request]).await.pop();
    let Some(state) = park_if_idle(&mut lock(&queue), state) else {
        return answer;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(drain(queue.clone(), state));
        }
        // No runtime left (shutdown): the waiting calls learn it from their dropped senders.
        Err(_) => reset(&queue),
    }
    answer
}

/// Stores what queued, batch after batch, until nothing waits; then the writer goes idle.
async fn drain<B: Batch>(queue: Arc<Mutex<Queue<B>>>, mut state: B) {
    loop {
        let batch: Vec<_> = {
            let mut q = lock(&queue);
            match park_if_idle(&mut q, state) {
                Some(busy) => state = busy,
                None => return,
            }
            let take = q.waiting.len().min(MAX_BATCH);
            q.waiting.drain(..take).collect()
        };
        let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let answers = store(&queue, &mut state, requests).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
}

/// When nothing waits, the writer goes idle with `state` (`None`); otherwise `state` is handed
/// back to store what waits.
fn park_if_idle<B: Batch>(queue: &mut Queue<B>, mut state: B) -> Option<B> {
    if !queue.waiting.is_empty() {
        return Some(state);
    }
    state.idle();
    queue.state = Some(state);
    None
}

/// Stores `requests` in one statement, or, if that fails, each alone: one answer per request.
/// Should this be dropped before it ends (its runtime stopped), the writer is reset rather
/// than left busy forever.
async fn store<B: Batch>(
    queue: &Mutex<Queue<B>>,
    state: &mut B,
    requests: Vec<B::Request>,
) -> Vec<Answer<B>> {
    let mut reset = Reset { queue, armed: true };
    let answers = match state.store(&requests).await {
        Ok(stored) => stored.into_iter().map(Ok).collect(),
        Err(e) if requests.len() == 1 => vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, size = requests.len(), "a batch of {} failed; storing its requests one by one", B::WHAT);
            let mut answers = Vec::with_capacity(requests.len());
            for request in &requests {
                let one = state.store(std::slice::from_ref(request)).await;
                answers.push(one.and_then(|mut stored| {
                    stored.pop().ok_or_else(|| {
                        sqlx::Error::Protocol(format!("{} were stored without an answer", B::WHAT))
                    })
                }));
            }
            answers
        }
    };
    reset.armed = false;
    answers
}

/// Fails what waits and lets the next call lead with a fresh state.
fn reset<B: Batch>(queue: &Mutex<Queue<B>>) {
    let mut q = lock(queue);
    q.waiting.clear();
    q.state = Some(B::default());
}

/// Armed while a store is in flight (see [`store`]).
struct Reset<'a, B: Batch> {
    queue: &'a Mutex<Queue<B>>,
    armed: bool,
}

impl<B: Batch> Drop for Reset<'_, B> {
    fn drop(&mut self) {
        if self.armed {
            reset(self.queue);
        }
    }
}

/// A connection kept from one batch to the next while requests keep arriving: each return to
/// sqlx's pool and each checkout cost a ping (a round trip), as much as a batch's own
/// statement. A [`Batch`] lets go of it when idle (so an idle writer holds nothing and the pool
/// can close) and after any failure (the pool's check on return closes a broken connection).
#[derive(Default)]
pub struct HeldConnection(Option<PoolConnection<Postgres>>);

impl HeldConnection {
    /// The held connection when there is one (and its pool is still open), else one from `pool`.
    pub async fn get(&mut self, pool: &PgPool) -> Result<&mut PgConnection, sqlx::Error> {
        if pool.is_closed() {
            self.0 = None;
            return Err(sqlx::Error::PoolClosed);
        }
        if self.0.is_none() {
            self.0 = Some(pool.acquire().await?);
        }
        match self.0.as_mut() {
            Some(held) => Ok(&mut **held),
            None => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Back to the pool.
    pub fn release(&mut self) {
        self.0 = None;
    }
}

/// What runs after abandoned work ended, given its output.
type Then<T> = Box<dyn FnOnce(T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A future polled in place by its caller that, if the caller drops it before it ended, is
/// spawned to end on its own (and then [`Finish::if_abandoned`]'s follow-up runs with its
/// output). For work that must not stop half way because a client left.
pub struct Finish<T: Send + 'static> {
    work: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    then: Option<Then<T>>,
}

impl<T: Send + 'static> Finish<T> {
    /// `work`, to be awaited.
    pub fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            work: Some(Box::pin(work)),
            then: None,
        }
    }

    /// What to do with the output when the caller dropped this before it ended (and only then).
    pub fn if_abandoned<F, Fut>(mut self, then: F) -> Self
    where
        F: FnOnce(T) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.then = Some(Box::new(move |out| Box::pin(then(out))));
        self
    }
}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(work) = self.work.as_mut() else {
            // Polled again after it ended: a caller's bug, never ready again.
            return Poll::Pending;
        };
        let ready = work.as_mut().poll(cx);
        if ready.is_ready() {
            self.work = None;
        }
        ready
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        let then = self.then.take();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let out = work.await;
                if let Some(then) = then {
                    then(out).await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Stores by sleeping, and remembers every batch it stored.
    #[derive(Default)]
    struct Slow {
        batches: Vec<Vec<u32>>,
    }

    static IDLE: AtomicUsize = AtomicUsize::new(0);

    impl Batch for Slow {
        type Request = (u32, Arc<Mutex<Vec<Vec<u32>>>>);
        type Stored = u32;
        const WHAT: &'static str = "numbers";

        fn store<'a>(&'a mut self, batch: &'a [Self::Request]) -> Storing<'a, u32> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let values: Vec<u32> = batch.iter().map(|(v, _)| *v).collect();
                if let Some((_, log)) = batch.first() {
                    log.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(values.clone());
                }
                self.batches.push(values.clone());
                Ok(values.into_iter().map(|v| v * 10).collect())
            })
        }

        fn idle(&mut self) {
            IDLE.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn calls_that_wait_together_share_a_batch_and_a_leader_that_leaves_still_stores() {
        let writer = Arc::new(GroupCommit::<Slow>::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        // The leader goes away mid-store.
        let leader = {
            let (w, l) = (writer.clone(), log.clone());
            tokio::spawn(async move { w.submit((1, l)).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let followers: Vec<_> = (2..6)
            .map(|v| {
                let (w, l) = (writer.clone(), log.clone());
                tokio::spawn(async move { w.submit((v, l)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5)).await;
        leader.abort();
        for (f, v) in followers.into_iter().zip(2..6) {
            let answer = tokio::time::timeout(Duration::from_secs(5), f)
                .await
                .expect("answered")
                .expect("ran");
            assert_eq!(answer.and_then(Result::ok), Some(v * 10));
        }
        // The leader's own request was stored although its caller left, alone; the four that
        // waited together were stored as one batch.
        let stored = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(stored, vec![vec![1], vec![2, 3, 4, 5]]);
        // Idle again: the next call leads, alone.
        assert_eq!(
            writer.submit((9, log.clone())).await.and_then(Result::ok),
            Some(90)
        );
        assert!(IDLE.load(Ordering::SeqCst) >= 2);
    }
}
