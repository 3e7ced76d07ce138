//! The replay guard, written in batches.
//!
//! Every signed call records its envelope's signature before it runs ([`sessions::admit`]). Done
//! one statement per call, that was the largest PostgreSQL cost of a SEAL call: a transaction,
//! a commit and a round trip each. Here the calls that wait at the same moment share one
//! statement, through the same group commit as the audit chain's rows
//! (`aegis_store::group_commit`): a lone caller stores its own at once from its own task, and
//! calls that arrive meanwhile are stored together by a drainer when it ends, on the connection
//! the previous batch used. A leader whose client went away still finishes its statement and
//! hands the queue on.
//!
//! Nothing about the guard's promise changes: each signature is inserted under the table's
//! primary key (atomic across replicas), and a call learns that it was admitted only after the
//! statement that recorded it committed. A batch that fails is retried request by request, so
//! only a request that fails alone reports the error.

use aegis_store::group_commit::{Batch, GroupCommit, HeldConnection, Storing};
use sqlx::PgPool;

use super::sessions::{self, Admission, AdmitRequest};

/// The gateway's admissions (see the module documentation). Every call passes the gateway's
/// one pool; a batch is stored with the pool of its first request.
#[derive(Default)]
pub struct Admissions {
    guard: GroupCommit<ReplayGuard>,
}

impl Admissions {
    /// Records `request`'s signature and reads its session's current facts (see
    /// [`sessions::admit`]); returns once the statement holding it committed.
    pub async fn admit(
        &self,
        pool: &PgPool,
        request: AdmitRequest,
    ) -> Result<Option<Admission>, sqlx::Error> {
        self.guard
            .submit((pool.clone(), request))
            .await
            .unwrap_or_else(|| {
                Err(sqlx::Error::Protocol(
                    "the replay guard's writer stopped before recording the envelope".into(),
                ))
            })
    }
}

/// The replay guard's side of the group commit: its connection, while calls keep arriving.
#[derive(Default)]
struct ReplayGuard {
    held: HeldConnection,
}

impl Batch for ReplayGuard {
    type Request = (PgPool, AdmitRequest);
    type Stored = Option<Admission>;
    const WHAT: &'static str = "replay-guard admissions";

    /// [`sessions::admit`] on the held connection, with the pool of the batch's first request;
    /// after a failure the connection goes back to the pool (which checks it) and the next
    /// statement takes another.
    fn store<'a>(&'a mut self, batch: &'a [Self::Request]) -> Storing<'a, Option<Admission>> {
        Box::pin(async move {
            let Some((pool, _)) = batch.first() else {
                return Ok(Vec::new());
            };
            let requests: Vec<&AdmitRequest> = batch.iter().map(|(_, r)| r).collect();
            let answers = match self.held.get(pool).await {
                Ok(db) => sessions::admit(db, &requests).await,
                Err(e) => Err(e),
            };
            if answers.is_err() {
                self.held.release();
            }
            answers
        })
    }

    fn idle(&mut self) {
        self.held.release();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
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
        // The leader's statement is in flight (the pool waits 300 ms for a connection).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let follower = {
            let (a, p) = (admissions.clone(), pool.clone());
            tokio::spawn(async move { a.admit(&p, request()).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
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
    }
}
