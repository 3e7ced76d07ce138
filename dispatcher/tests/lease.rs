//! The lease on held sandboxes and its epoch fence, against a real Docker engine, PostgreSQL
//! and executor, in one process (the suite's `takeover::` drives replicas as processes with
//! kill -9 and SIGSTOP). A peer's actions are written as the peer would write them.
//!
//! Needs what `lifecycle.rs` needs (see `common`).

mod common;

use std::time::Duration;

use common::{adoptable, called, eventually, finish, read, within, write, TestEnv, IMAGE};
use dispatcher::protocol::ReadResult;
use dispatcher::{DispatchError, Owner, OwnerKind, SandboxId, SandboxSpec};
use uuid::Uuid;

async fn holder(env: &TestEnv, id: SandboxId) -> (Uuid, i64, String) {
    sqlx::query_as("SELECT instance_id, epoch, state FROM sandboxes WHERE id = $1")
        .bind(id.0)
        .fetch_one(&env.pg)
        .await
        .expect("sandbox row")
}

async fn fence(env: &TestEnv, instance: Uuid) {
    let sql = "UPDATE node_instances SET fenced_at = now() WHERE id = $1";
    env.on_instance(sql, instance).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_holder_lets_go_of_what_was_claimed_and_takes_back_the_rest() {
    let env = TestEnv::new().await;
    let (me, d, _) = env
        .started_with(|c| {
            adoptable(c);
            c.lease = Some(Duration::from_millis(800));
        })
        .await;
    let spec = |owner: &str| SandboxSpec::new(IMAGE, Owner::new(OwnerKind::Operator, owner));
    let kept = within(60, "create", d.create(spec("lease-kept")))
        .await
        .expect("create");
    let taken = within(60, "create", d.create(spec("lease-taken")))
        .await
        .expect("create");
    for id in [kept, taken] {
        assert_eq!(holder(&env, id).await, (me, 1, "running".to_owned()));
        within(10, "write", d.call(id, write("f.txt", "before")))
            .await
            .expect("write");
    }

    // A peer fenced this instance off and claimed one sandbox (the epoch moves on).
    let peer = env.new_instance().await;
    fence(&env, me).await;
    sqlx::query("UPDATE sandboxes SET instance_id = $2, epoch = epoch + 1 WHERE id = $1")
        .bind(taken.0)
        .bind(peer)
        .execute(&env.pg)
        .await
        .unwrap();

    // The next renewal finds the fence: the instance rejoins, takes back what nobody claimed
    // (one epoch later, the same executor and files) and lets go of the other.
    eventually(20, "the unclaimed sandbox taken back", || async {
        holder(&env, kept).await == (me, 2, "running".to_owned())
    })
    .await;
    let fenced: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT fenced_at FROM node_instances WHERE id = $1")
            .bind(me)
            .fetch_one(&env.pg)
            .await
            .unwrap();
    assert!(fenced.is_none(), "rejoined");
    eventually(20, "taken back and serving", || async {
        d.call(kept, read("f.txt")).await.is_ok()
    })
    .await;
    let back: ReadResult = called(&d, kept, 10, "read", read("f.txt")).await;
    assert_eq!(back.content, "before");
    match within(10, "call the claimed one", d.call(taken, read("f.txt"))).await {
        Err(DispatchError::SandboxNotFound {
            attached_elsewhere: true,
            ..
        }) => {}
        other => panic!("the claimed sandbox is the peer's now: {other:?}"),
    }
    // Nothing this instance did changed the claimed row; its stream's end recorded nothing.
    assert_eq!(holder(&env, taken).await, (peer, 2, "running".to_owned()));

    common::destroyed(&d, kept).await;
    finish(&d, &[taken]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_replica_takes_over_a_fenced_holders_sandbox_and_marks_a_vanished_one_lost() {
    let env = TestEnv::new().await;
    let (first, d1, mut config) = env.started_with(adoptable).await;
    let spec = |owner: &str, kind| SandboxSpec::new(IMAGE, Owner::new(kind, owner));
    let session = within(60, "create", d1.create(spec("s-1", OwnerKind::Session)))
        .await
        .expect("create");
    let gone = within(60, "create", d1.create(spec("s-2", OwnerKind::Session)))
        .await
        .expect("create");
    let execution = within(60, "create", d1.create(spec("e-1", OwnerKind::Execution)))
        .await
        .expect("create");
    within(10, "write", d1.call(session, write("f.txt", "kept")))
        .await
        .expect("write");
    // The holder dies without a word (its streams just end), and one container vanishes.
    drop(d1);
    let row = holder(&env, gone).await;
    assert_eq!(row.0, first);
    let name = format!("aegis-sbx-{gone}");
    within(
        30,
        "remove",
        env.docker.remove_container(
            &name,
            Some(
                bollard::query_parameters::RemoveContainerOptionsBuilder::new()
                    .force(true)
                    .build(),
            ),
        ),
    )
    .await
    .expect("remove container");
    env.silence(first).await;

    let second = env.new_instance().await;
    config.dead_after = Duration::from_secs(3);
    config.lease = Some(Duration::from_secs(2));
    let d2 = env.start(second, config).await;
    // Fenced and taken over at start (its first lease tick), before its first reap.
    assert_eq!(
        holder(&env, session).await,
        (second, 2, "running".to_owned())
    );
    let back: ReadResult = called(&d2, session, 10, "read", read("f.txt")).await;
    assert_eq!(back.content, "kept");
    let (_, _, state) = holder(&env, gone).await;
    assert_eq!(state, "destroyed");
    let reason: Option<String> = sqlx::query_scalar("SELECT reason FROM sandboxes WHERE id = $1")
        .bind(gone.0)
        .fetch_one(&env.pg)
        .await
        .unwrap();
    assert!(reason.unwrap_or_default().starts_with("lost:"));
    match within(10, "call the lost one", d2.call(gone, read("f.txt"))).await {
        Err(DispatchError::SandboxGone { reason, .. }) => assert!(reason.starts_with("lost:")),
        other => panic!("expected SandboxGone(lost), got {other:?}"),
    }
    // An execution's sandbox is not adopted: its work died with the holder; the reaper took it.
    let (exec_holder, _, exec_state) = holder(&env, execution).await;
    assert_eq!(exec_holder, first);
    assert_eq!(exec_state, "destroyed");

    within(30, "destroy", d2.destroy(session))
        .await
        .expect("destroy");
    d2.shutdown().await;
}
