//! The E2B door's `/files` as one audited call per file (issue 47): an upload is one
//! `fs.write`, a download one `fs.read`, however many blocks the file takes on the executor's
//! channel; bytes round-trip exactly at the sizes around a block and the executor's window;
//! a path outside the roots (by name, or through a symlink planted in the workspace) is refused
//! as before and nothing is written; an upload cut part way (the client gone, a body that ends
//! before its closing boundary) leaves the old file, or none, and no temporary file.

use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::common::{docker_lines, e2b_base_sandbox, TestApp, TestDb};

/// A payload block and the executor's window (`protocol::transfer`).
const BLOCK: usize = 256 * 1024;
const WINDOW: usize = 2 * 1024 * 1024;

/// Bytes no two sizes share a pattern of (a shifted copy would not compare equal).
fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 ^ (len as u8))
        .collect()
}

async fn upload(app: &TestApp, id: &str, token: &str, path: &str, body: Vec<u8>) -> (u16, Value) {
    let r = app
        .http
        .post(format!("{}/e2b/files?path={path}", app.http_base))
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", token)
        .header("Content-Type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn download(app: &TestApp, id: &str, token: &str, path: &str) -> (u16, Vec<u8>) {
    let r = app
        .http
        .get(format!("{}/e2b/files?path={path}", app.http_base))
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.bytes().await.unwrap().to_vec())
}

/// Completed audit rows of `action` by the key named `key_name`.
async fn audited(app: &TestApp, key_name: &str, action: &str) -> Vec<(String, Option<String>)> {
    let caller: uuid::Uuid = app
        .one("SELECT id FROM api_keys WHERE name = $1", key_name)
        .await;
    sqlx::query_as(
        "SELECT outcome, reason FROM audit_log WHERE caller_id = $1 AND kind = 'tool' \
         AND action = $2 AND outcome <> 'running' ORDER BY seq",
    )
    .bind(caller.to_string())
    .bind(action)
    .fetch_all(&app.state.pool)
    .await
    .unwrap()
}

/// `ls -a` of a directory in the sandbox's container, read by Docker, not by the node.
fn listing(sandbox: &str, dir: &str) -> Vec<String> {
    docker_lines(&["exec", &format!("aegis-sbx-{sandbox}"), "ls", "-a", dir])
}

#[tokio::test]
async fn each_file_is_one_audited_call_and_its_bytes_round_trip_at_every_boundary() {
    let app = TestApp::spawn().await;
    let key = app.create_key("files-one-call", "operator").await;
    let (id, token, _) = e2b_base_sandbox(&app, &key).await;

    let sizes = [
        0,
        1,
        BLOCK - 1,
        BLOCK,
        BLOCK + 1,
        WINDOW - 1,
        WINDOW,
        WINDOW + 1,
        10 * 1024 * 1024 + 13,
    ];
    for (n, size) in sizes.iter().enumerate() {
        let path = format!("/home/user/sizes/{n}.bin");
        let bytes = payload(*size);
        let (status, body) = upload(&app, &id, &token, &path, bytes.clone()).await;
        assert_eq!(status, 200, "upload of {size} bytes: {body}");
        assert_eq!(body[0]["path"], path, "{body}");
        let (status, got) = download(&app, &id, &token, &path).await;
        assert_eq!(status, 200, "download of {size} bytes");
        assert_eq!(got.len(), *size, "size of {path}");
        assert!(
            got == bytes,
            "the bytes of {path} ({size}) came back changed"
        );
    }
    // A multipart upload of two files, one of them 10 MiB: one call per file.
    let big = payload(10 * 1024 * 1024 + 7);
    let mut body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/mp/a.bin\"\r\n\r\n".to_vec();
    body.extend_from_slice(&big);
    body.extend_from_slice(b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/mp/b.txt\"\r\n\r\nsmall\r\n--XyZ--\r\n");
    let r = app
        .http
        .post(format!("{}/e2b/files", app.http_base))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "multipart/form-data; boundary=XyZ")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, got) = download(&app, &id, &token, "/home/user/mp/a.bin").await;
    assert!(got == big, "the multipart file came back changed");
    let (_, got) = download(&app, &id, &token, "/home/user/mp/b.txt").await;
    assert_eq!(got, b"small");

    // One decision and one completed row per file operation, not per block.
    let writes = audited(&app, "files-one-call", "fs.write").await;
    let reads = audited(&app, "files-one-call", "fs.read").await;
    assert_eq!(writes.len(), sizes.len() + 2, "{writes:?}");
    assert_eq!(reads.len(), sizes.len() + 2, "{reads:?}");
    assert!(writes
        .iter()
        .chain(&reads)
        .all(|(outcome, _)| outcome == "ok"));
    // No temporary file is left beside the names.
    let left: Vec<String> = listing(&app.e2b_sandbox(&id).await, "/home/user/sizes")
        .into_iter()
        .filter(|name| name.starts_with(".sbx-write-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn an_upload_outside_the_roots_is_refused_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let key = app.create_key("files-outside", "operator").await;
    let (id, token, current) = e2b_base_sandbox(&app, &key).await;

    // By name: the policy's path allowlist refuses it before any byte moves.
    let (status, body) = upload(&app, &id, &token, "/etc/planted", payload(3 * BLOCK)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        crate::common::json::text(&body["message"]).contains("/etc/planted"),
        "{body}"
    );
    assert!(!listing(&current, "/etc").contains(&"planted".to_owned()));
    let (status, _) = download(&app, &id, &token, "/etc/planted").await;
    assert_ne!(status, 200);

    // Through a symlink planted in the workspace: allowed by name, refused by the kernel's
    // resolution beneath the root (as `fs.write` refuses it), and nothing lands in /etc.
    let container = format!("aegis-sbx-{current}");
    let owner = docker_lines(&["exec", &container, "stat", "-c", "%u:%g", "/home/user"]);
    docker_lines(&[
        "exec",
        "-u",
        &owner[0],
        &container,
        "ln",
        "-s",
        "/etc",
        "/home/user/out",
    ]);
    assert!(
        docker_lines(&["exec", &container, "readlink", "/home/user/out"]) == ["/etc"],
        "the symlink is planted"
    );
    let (status, body) = upload(&app, &id, &token, "/home/user/out/planted", payload(BLOCK)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        crate::common::json::text(&body["message"]).contains("path"),
        "{body}"
    );
    assert!(!listing(&current, "/etc").contains(&"planted".to_owned()));
    // And read through it: refused the same way.
    let (status, _) = download(&app, &id, &token, "/home/user/out/passwd").await;
    assert_eq!(status, 403);
    let writes = audited(&app, "files-outside", "fs.write").await;
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert!(
        writes.iter().all(|(outcome, _)| outcome != "ok"),
        "{writes:?}"
    );
}

#[tokio::test]
async fn an_upload_cut_part_way_leaves_the_old_file_and_no_half_one() {
    let app = TestApp::spawn().await;
    let key = app.create_key("files-cut", "operator").await;
    let (id, token, current) = e2b_base_sandbox(&app, &key).await;
    let (status, _) = upload(&app, &id, &token, "/home/user/kept.txt", b"old".to_vec()).await;
    assert_eq!(status, 200);

    // A client that sends 3 MiB of a 10 MiB body and disconnects.
    let address = app.http_base.trim_start_matches("http://").to_owned();
    for path in ["/home/user/kept.txt", "/home/user/never.bin"] {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        let head = format!(
            "POST /e2b/files?path={path} HTTP/1.1\r\nHost: {address}\r\nE2b-Sandbox-Id: {id}\r\n\
             X-Access-Token: {token}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\n\r\n",
            10 * 1024 * 1024
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(&payload(3 * 1024 * 1024)).await.unwrap();
        socket.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(socket);
    }
    // The two calls end as errors (the node saw the body cut), never as successes.
    let mut writes = Vec::new();
    for _ in 0..100 {
        writes = audited(&app, "files-cut", "fs.write").await;
        if writes.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(writes.len(), 3, "{writes:?}");
    assert_eq!(writes[0].0, "ok");
    assert!(
        writes[1..].iter().all(|(outcome, _)| outcome != "ok"),
        "{writes:?}"
    );
    let (status, got) = download(&app, &id, &token, "/home/user/kept.txt").await;
    assert_eq!(
        (status, got),
        (200, b"old".to_vec()),
        "the old file is as it was"
    );
    let (status, _) = download(&app, &id, &token, "/home/user/never.bin").await;
    assert_eq!(status, 404, "no half file under the new name");

    // A multipart body that ends before its closing boundary: an error, and no file.
    let mut body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/torn.bin\"\r\n\r\n".to_vec();
    body.extend_from_slice(&payload(WINDOW + BLOCK));
    let r = app
        .http
        .post(format!("{}/e2b/files", app.http_base))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "multipart/form-data; boundary=XyZ")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (status, _) = download(&app, &id, &token, "/home/user/torn.bin").await;
    assert_eq!(status, 404, "a torn multipart file is not written");
    let mut temps = Vec::new();
    for _ in 0..50 {
        temps = listing(&current, "/home/user")
            .into_iter()
            .filter(|name| name.starts_with(".sbx-write-"))
            .collect();
        if temps.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(temps.is_empty(), "temporary files left: {temps:?}");
}

/// Through a replica that does not hold the sandbox, blocks are not forwarded: the same one
/// call per file moves it as forwarded chunks, bytes intact, one audited call each.
#[tokio::test]
async fn a_replica_that_does_not_hold_the_sandbox_moves_the_file_in_one_call_too() {
    use crate::common::replicas::{in_process as replica, SECRET};
    let db = TestDb::create().await;
    let a = TestApp::spawn_with(replica(&db, Some(SECRET))).await;
    let b = TestApp::spawn_with(replica(&db, Some(SECRET))).await;
    let key = a.create_key("files-replica", "operator").await;
    let (id, token, current) = e2b_base_sandbox(&a, &key).await;
    let holder: uuid::Uuid = sqlx::query_scalar("SELECT instance_id FROM sandboxes WHERE id = $1")
        .bind(uuid::Uuid::parse_str(&current).unwrap())
        .fetch_one(&a.state.pool)
        .await
        .unwrap();
    assert_eq!(holder, a.state.instance_id, "A holds the sandbox B serves");

    let bytes = payload(9 * 1024 * 1024 + 5);
    let (status, body) = upload(&b, &id, &token, "/home/user/via-b.bin", bytes.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (status, got) = download(&b, &id, &token, "/home/user/via-b.bin").await;
    assert_eq!(status, 200);
    assert!(got == bytes, "the file came back changed through B");
    let (_, got) = download(&a, &id, &token, "/home/user/via-b.bin").await;
    assert!(got == bytes, "the holder reads what B wrote");
    assert_eq!(audited(&b, "files-replica", "fs.write").await.len(), 1);
    assert_eq!(audited(&b, "files-replica", "fs.read").await.len(), 2);
}
