//! The replay guard, written in batches.
//!
//! Every signed call records its envelope's signature before it runs ([`sessions::admit`]). Done
//! one statement per call, that was the largest PostgreSQL cost of a SEAL call: a transaction,
//! a commit and a round trip each. Here the calls that wait at the same moment share one
//! statement (group commit):
//!
//! * a call that finds no statement in flight runs its own at once, from its own task, so a lone
//!   caller waits no longer than before (no hop to another task and back);
//! * calls that arrive while a statement is in flight queue; when it ends, a drainer task stores
//!   whatever queued with one statement per batch, until the queue is empty.
//!
//! The leader's future may be dropped mid-statement (its client went away): the queue is then
//! handed to a drainer all the same, so no queued call waits forever.
//!
//! Nothing about the guard's promise changes: each signature is inserted under the table's
//! primary key (atomic across replicas), and a call learns that it was admitted only after the
//! statement that recorded it committed. A batch that fails is retried request by request, so
//! only a request that fails alone reports the error.

use std::sync::{Arc, Mutex, MutexGuard};

use sqlx::PgPool;
use tokio::sync::oneshot;

use super::sessions::{self, Admission, AdmitRequest};

/// At most this many admissions per statement.
const MAX_BATCH: usize = 256;

/// One admission waiting for its batch.
struct Pending {
    request: AdmitRequest,
    reply: oneshot::Sender<Result<Option<Admission>, sqlx::Error>>,
}

/// Who is storing, and who waits.
#[derive(Default)]
struct Queue {
    /// A statement is in flight (a leader's or the drainer's): new calls queue.
    busy: bool,
    waiting: Vec<Pending>,
}

/// The gateway's admissions (see the module documentation). Every call passes the gateway's
/// one pool; a drainer stores with the pool of the leader that handed it the queue.
#[derive(Default)]
pub struct Admissions {
    queue: Arc<Mutex<Queue>>,
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a call does: store its own statement, or wait for a batch.
enum Turn {
    Lead(AdmitRequest),
    Wait(oneshot::Receiver<Result<Option<Admission>, sqlx::Error>>),
}

impl Admissions {
    /// Records `request`'s signature and reads its session's current facts (see
    /// [`sessions::admit`]); returns once the statement holding it committed.
    pub async fn admit(
        &self,
        pool: &PgPool,
        request: AdmitRequest,
    ) -> Result<Option<Admission>, sqlx::Error> {
        let turn = {
            let mut queue = lock(&self.queue);
            if queue.busy {
                let (reply, answer) = oneshot::channel();
                queue.waiting.push(Pending { request, reply });
                Turn::Wait(answer)
            } else {
                queue.busy = true;
                Turn::Lead(request)
            }
        };
        match turn {
            Turn::Lead(request) => {
                // Whatever queues meanwhile is handed on when this ends, however it ends.
                let _handoff = Handoff {
                    queue: &self.queue,
                    pool,
                };
                admit_one(pool, &request).await
            }
            Turn::Wait(answer) => answer.await.unwrap_or_else(|_| {
                Err(sqlx::Error::Protocol(
                    "the replay guard's writer stopped before recording the envelope".into(),
                ))
            }),
        }
    }
}

/// [`sessions::admit`] for one request.
async fn admit_one(
    pool: &PgPool,
    request: &AdmitRequest,
) -> Result<Option<Admission>, sqlx::Error> {
    sessions::admit(pool, std::slice::from_ref(request))
        .await
        .map(|mut answers| answers.pop().flatten())
}

/// Ends a leader's turn: queued calls go to a drainer task, or the queue goes idle.
struct Handoff<'a> {
    queue: &'a Arc<Mutex<Queue>>,
    pool: &'a PgPool,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let mut queue = lock(self.queue);
        if queue.waiting.is_empty() {
            queue.busy = false;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(queue);
                runtime.spawn(drain(Arc::clone(self.queue), self.pool.clone()));
            }
            // No runtime left (shutdown): the waiting calls learn it from their dropped senders.
            Err(_) => abandon(&mut queue),
        }
    }
}

/// Stores what queued, batch after batch, until nothing waits; then the queue goes idle.
async fn drain(queue: Arc<Mutex<Queue>>, pool: PgPool) {
    loop {
        let batch: Vec<Pending> = {
            let mut q = lock(&queue);
            if q.waiting.is_empty() {
                q.busy = false;
                return;
            }
            let take = q.waiting.len().min(MAX_BATCH);
            q.waiting.drain(..take).collect()
        };
        // Dropped mid-batch only when its runtime ends: the queue must not stay busy forever.
        let mut stop = Abandon {
            queue: &queue,
            armed: true,
        };
        store(&pool, batch).await;
        stop.armed = false;
    }
}

/// Fails what waits and lets the next call lead.
fn abandon(queue: &mut Queue) {
    queue.waiting.clear();
    queue.busy = false;
}

struct Abandon<'a> {
    queue: &'a Mutex<Queue>,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            abandon(&mut lock(self.queue));
        }
    }
}

/// Stores one batch and answers every request in it.
async fn store(pool: &PgPool, batch: Vec<Pending>) {
    let (requests, replies): (Vec<AdmitRequest>, Vec<_>) =
        batch.into_iter().map(|p| (p.request, p.reply)).unzip();
    match sessions::admit(pool, &requests).await {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(e) if requests.len() == 1 => {
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(Err(e));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, size = requests.len(), "a replay-guard batch failed; retrying its requests one by one");
            for (request, reply) in requests.iter().zip(replies) {
                let _ = reply.send(admit_one(pool, request).await);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::postgres::PgPoolOptions;
    use uuid::Uuid;

    use super::*;

    fn request() -> AdmitRequest {
        AdmitRequest {
            tenant: "default".into(),
            session: Uuid::new_v4(),
            signature: format!("sig-{}", Uuid::new_v4()),
            context_name: "ctx".into(),
        }
    }

    /// A database that accepts connections and never answers: every statement stays in flight
    /// until the pool gives up.
    async fn silent_database() -> PgPool {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback listener");
        let port = listener.local_addr().expect("its address").port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(300))
            .connect_lazy(&format!("postgres://u@127.0.0.1:{port}/db"))
            .expect("a lazy pool")
    }

    #[tokio::test]
    async fn a_leader_that_goes_away_hands_the_queue_on() {
        let admissions = Arc::new(Admissions::default());
        let pool = silent_database().await;
        let leader = {
            let (a, p) = (admissions.clone(), pool.clone());
            tokio::spawn(async move { a.admit(&p, request()).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            lock(&admissions.queue).busy,
            "the leader's statement is in flight"
        );
        let follower = {
            let (a, p) = (admissions.clone(), pool.clone());
            tokio::spawn(async move { a.admit(&p, request()).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(lock(&admissions.queue).waiting.len(), 1);
        // The leader's client goes away mid-statement.
        leader.abort();
        // The queued call is still answered (here with the pool's error), not left waiting.
        let answered = tokio::time::timeout(Duration::from_secs(5), follower)
            .await
            .expect("the queued call was answered")
            .expect("its task ran");
        assert!(answered.is_err());
        // And the queue is idle again: the next call leads.
        let next = tokio::time::timeout(Duration::from_secs(5), admissions.admit(&pool, request()))
            .await
            .expect("the next call was answered");
        assert!(next.is_err());
        assert!(!lock(&admissions.queue).busy);
    }
}
