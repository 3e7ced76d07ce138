//! The replay guard, written in batches.
//!
//! Every signed call records its envelope's signature before it runs ([`sessions::admit`]). Done
//! one statement per call, that was the largest PostgreSQL cost of a SEAL call: a transaction,
//! a commit and a round trip each. Here one task per gateway stores whatever admissions are
//! waiting with a single statement; calls that arrive while a batch is being stored go together
//! in the next one. An idle node sends a lone call at once, so a sequential client waits no
//! longer than before.
//!
//! Nothing about the guard's promise changes: each signature is inserted under the table's
//! primary key (atomic across replicas), and a call learns that it was admitted only after the
//! statement that recorded it committed. A batch that fails is retried request by request, so
//! only a request that fails alone reports the error.

use std::sync::Mutex;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

use super::sessions::{self, Admission, AdmitRequest};

/// At most this many admissions per statement.
const MAX_BATCH: usize = 256;

/// One admission waiting for its batch.
struct Pending {
    pool: PgPool,
    request: AdmitRequest,
    reply: oneshot::Sender<Result<Option<Admission>, sqlx::Error>>,
}

/// The gateway's admission queue; its task starts with the first call (on the caller's runtime)
/// and again whenever that runtime has gone.
#[derive(Default)]
pub struct Admissions {
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

impl Admissions {
    /// Records `request`'s signature and reads its session's current facts (see
    /// [`sessions::admit`]); returns once the batch holding it committed.
    pub async fn admit(
        &self,
        pool: &PgPool,
        request: AdmitRequest,
    ) -> Result<Option<Admission>, sqlx::Error> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            pool: pool.clone(),
            request,
            reply,
        };
        {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            let sender = queue.get_or_insert_with(spawn);
            if let Err(mpsc::error::SendError(back)) = sender.send(pending) {
                // The task's runtime ended (a restart, or an earlier test's runtime).
                let fresh = spawn();
                let _ = fresh.send(back);
                *queue = Some(fresh);
            }
        }
        answer.await.unwrap_or_else(|_| {
            Err(sqlx::Error::Protocol(
                "the replay guard's writer stopped before recording the envelope".into(),
            ))
        })
    }
}

fn spawn() -> mpsc::UnboundedSender<Pending> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(rx));
    tx
}

async fn run(mut rx: mpsc::UnboundedReceiver<Pending>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        store(std::mem::take(&mut batch)).await;
    }
}

/// Stores one batch and answers every request in it.
async fn store(batch: Vec<Pending>) {
    let Some(pool) = batch
        .iter()
        .map(|p| &p.pool)
        .find(|p| !p.is_closed())
        .cloned()
    else {
        for p in batch {
            let _ = p.reply.send(Err(sqlx::Error::PoolClosed));
        }
        return;
    };
    let requests: Vec<AdmitRequest> = batch.iter().map(|p| p.request.clone()).collect();
    match sessions::admit(&pool, &requests).await {
        Ok(answers) => {
            for (p, answer) in batch.into_iter().zip(answers) {
                let _ = p.reply.send(Ok(answer));
            }
        }
        Err(e) if batch.len() == 1 => {
            if let Some(p) = batch.into_iter().next() {
                let _ = p.reply.send(Err(e));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "a replay-guard batch failed; retrying its requests one by one");
            for p in batch {
                let alone = sessions::admit(&pool, std::slice::from_ref(&p.request))
                    .await
                    .map(|mut answers| answers.pop().flatten());
                let _ = p.reply.send(alone);
            }
        }
    }
}
