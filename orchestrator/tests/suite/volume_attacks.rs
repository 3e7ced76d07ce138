//! Persistent volumes attacked from inside the sandbox (issue 20 item 5), through the running
//! service with real PostgreSQL and Docker and the scripted model (tests/suite/common/fake_llm.rs):
//! a volume replaced by a symbolic link into the image must not carry the image's files into
//! the next execution, and a restore that fails must not overwrite the saved volume. Effects are
//! checked from inside the next execution's sandbox (`find`/`stat` through `cmd.run`) and in
//! `agent_volumes`.

use crate::common;

use std::time::Duration;

use common::agent::AgentManifest;
use common::fake_llm::{answer, tool_calls, Step};
use common::harness::{Harness, AGENTS};
use serde_json::{json, Value};

async fn harness(script: Vec<Step>) -> Harness {
    Harness::start(script).await
}

impl Harness {
    /// Runs `agent` with an empty request and waits (90 s) for the end; (id, execution).
    async fn run_empty(&self, agent: &str) -> (String, Value) {
        let id = self.started(agent, json!({})).await;
        let e = self.wait_end(&id, Duration::from_secs(90)).await;
        (id, e)
    }

    /// Runs agent `agent` to its end, which must be a completion with `commands` commands run;
    /// the stdout of each (see [`Harness::outputs`]).
    async fn outputs_of_a_run(&self, agent: &str, commands: usize) -> Vec<String> {
        let (id, e) = self.run_empty(agent).await;
        assert_eq!(e["status"], "completed", "{e}");
        let out = self.outputs(&id).await;
        assert_eq!(out.len(), commands, "{out:?}");
        out
    }

    /// The stdout of each `cmd.run` of execution `id`, in order; every tool call must have been
    /// allowed and every command must have exited 0 (a refused or failed check proves nothing).
    async fn outputs(&self, id: &str) -> Vec<String> {
        let events = self.events(id).await;
        for call in events.iter().filter(|e| e["event_type"] == "tool_call") {
            assert_eq!(call["payload"]["decision"], "allowed", "{call}");
            assert!(call["payload"]["error"].is_null(), "{call}");
        }
        events
            .iter()
            .filter(|e| e["event_type"] == "console_output")
            .map(|e| {
                assert_eq!(e["payload"]["exit_code"], 0, "{e}");
                e["payload"]["stdout"].as_str().unwrap().to_owned()
            })
            .collect()
    }
}

/// An agent on the Debian runtime (whose `/usr/sbin` holds 117 root-owned files, one of them
/// setgid) with two persistent volumes, one directly beneath the workspace and one nested.
fn keeper(name: &str, version: &str, disk: &str) -> String {
    AgentManifest::new(name)
        .version(version)
        .runtime("shell", "bookworm")
        .instruction("Keep files.")
        .spec(
            "  tools: [cmd.run, fs.write, fs.read]
  builtin_dispatchers:
    - name: cmd
      capabilities:
        - name: cmd.run
          subcommand_allowlist: [rmdir, ln, find, stat, ls, truncate, cat]
  security:
    resources:
",
        )
        .spec(&format!("      disk: {disk}\n"))
        .spec(
            "  volumes:
    - name: data
      storage_class: persistent
      mount_path: /workspace/data
      access_mode: read-write
      size_limit: 8Mi
    - name: nested
      storage_class: persistent
      mount_path: /workspace/deep/sbin
      access_mode: read-write
      size_limit: 8Mi
",
        )
        .yaml()
}

fn run_cmd(command: &str) -> (&'static str, Value) {
    ("cmd__run", json!({ "command": command }))
}

/// What the next execution checks from inside its sandbox, in this order.
fn inspection() -> Step {
    tool_calls(&[
        run_cmd("find /workspace -perm /6000"),
        run_cmd("find /workspace -not -user 65534"),
        run_cmd("find /workspace -not -group 65534"),
        run_cmd("find /workspace -mindepth 1 -not -type d"),
        run_cmd("stat -c %F:%u:%g /workspace/data /workspace/deep /workspace/deep/sbin"),
    ])
}

#[tokio::test]
async fn a_volume_replaced_by_a_link_into_the_image_saves_nothing_of_the_image() {
    let h = harness(vec![
        // The attack: both volumes (and the nested one's parent) become links into the image.
        tool_calls(&[
            run_cmd("rmdir /workspace/data"),
            run_cmd("ln -s /usr/sbin /workspace/data"),
            run_cmd("rmdir /workspace/deep/sbin /workspace/deep"),
            run_cmd("ln -s /usr /workspace/deep"),
            run_cmd("ls /workspace/data/unix_chkpwd /workspace/deep/sbin/unix_chkpwd"),
        ]),
        answer("linked"),
        inspection(),
        answer("inspected"),
    ])
    .await;
    h.deployed(AGENTS, &keeper("keeper", "1.0.0", "64Mi")).await;

    let (first, e) = h.run_empty("keeper").await;
    // The links were made (the attack ran as written)...
    let out = h.outputs(&first).await;
    assert!(out[4].contains("/workspace/data/unix_chkpwd"), "{out:?}");
    let first_end = e;
    let saved: Vec<(String, i64)> =
        sqlx::query_as("SELECT name, content_bytes FROM agent_volumes ORDER BY name")
            .fetch_all(&h.app.state.pool)
            .await
            .unwrap();

    let out = h.outputs_of_a_run("keeper", 5).await;
    assert_eq!(
        out[0], "",
        "setuid/setgid files in the workspace: {}",
        out[0]
    );
    assert_eq!(
        out[1], "",
        "files not owned by the sandbox user: {}",
        out[1]
    );
    assert_eq!(out[2], "", "files not of the sandbox group: {}", out[2]);
    assert_eq!(
        out[3], "",
        "files from the image in the workspace: {}",
        out[3]
    );
    assert_eq!(
        out[4], "directory:65534:65534\ndirectory:65534:65534\ndirectory:65534:65534\n",
        "the volumes are the sandbox user's directories again"
    );

    // The first execution saved nothing (what the second saved is its empty directories) and
    // failed, naming the link.
    assert!(saved.is_empty(), "saved by the first execution: {saved:?}");
    assert_eq!(first_end["status"], "failed", "{first_end}");
    let reason = first_end["last_error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("/workspace/data is a symbolic link")
            || reason.contains("/workspace/deep is a symbolic link"),
        "{first_end}"
    );
}

#[tokio::test]
async fn a_restore_that_fails_never_overwrites_the_saved_volume() {
    let h = harness(vec![
        // First execution: 3 MiB of data and a note in the volume, saved when it ends.
        tool_calls(&[
            (
                "fs__write",
                json!({"path": "/workspace/data/note.txt", "content": "saved first"}),
            ),
            run_cmd("truncate -s 3M /workspace/data/big"),
        ]),
        answer("written"),
        // Third execution (the second never reaches the model): the volume as first saved.
        tool_calls(&[
            run_cmd("cat /workspace/data/note.txt"),
            run_cmd("stat -c %s /workspace/data/big"),
        ]),
        answer("read"),
    ])
    .await;
    h.deployed(AGENTS, &keeper("hoarder", "1.0.0", "64Mi"))
        .await;
    let (first, e) = h.run_empty("hoarder").await;
    assert_eq!(e["status"], "completed", "{e}");
    let pool = &h.app.state.pool;
    let row = || async {
        sqlx::query_as::<_, (Vec<u8>, uuid::Uuid)>(
            "SELECT content, last_execution_id FROM agent_volumes WHERE name = 'data'",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let (content, by) = row().await;
    assert_eq!(by.to_string(), first);
    assert!(content.len() > 3 << 20, "{}", content.len());

    // A new version whose workspace is smaller than the volume: the restore runs out of space
    // and fails, after part of the archive was unpacked.
    h.deployed(AGENTS, &keeper("hoarder", "1.1.0", "1Mi")).await;
    let (second, e) = h.run_empty("hoarder").await;
    assert_eq!(e["status"], "failed", "{e}");
    let reason = e["last_error"].as_str().unwrap_or_default();
    assert!(reason.contains("could not mount spec.volumes"), "{e}");
    let (after, by) = row().await;
    assert_eq!(
        by.to_string(),
        first,
        "the failed execution wrote the volume"
    );
    assert!(after == content, "the saved volume changed");
    let events = h.events(&second).await;
    let failed: Vec<&Value> = events
        .iter()
        .filter(|e| e["event_type"] == "volumes_failed")
        .collect();
    assert!(
        failed.iter().any(|e| e["payload"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not restored")),
        "the skipped save is in the execution's events: {events:?}"
    );
    assert!(!events.iter().any(|e| e["event_type"] == "volumes_saved"));

    // Room again: the next execution gets the volume as the first one saved it.
    h.deployed(AGENTS, &keeper("hoarder", "1.2.0", "64Mi"))
        .await;
    let (third, e) = h.run_empty("hoarder").await;
    assert_eq!(e["status"], "completed", "{e}");
    let out = h.outputs(&third).await;
    assert_eq!(out, ["saved first", "3145728\n"]);
}

/// One ustar entry as any tar writer makes it: owner, mode and type as given.
fn tar_entry(name: &str, kind: u8, mode: u32, uid: u32, data: &[u8], link: &str) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |field: &mut [u8], value: u64| {
        let digits = field.len() - 1;
        field[..digits].copy_from_slice(format!("{value:0digits$o}").as_bytes());
    };
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], u64::from(uid));
    octal(&mut h[116..124], u64::from(uid));
    octal(&mut h[124..136], data.len() as u64);
    octal(&mut h[136..148], 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if kind == b'3' {
        octal(&mut h[329..337], 1);
        octal(&mut h[337..345], 3);
    }
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut entry = h.to_vec();
    entry.extend_from_slice(data);
    entry.resize(entry.len().div_ceil(512) * 512, 0);
    entry
}

#[tokio::test]
async fn a_saved_volume_from_before_is_restored_as_the_sandbox_users_plain_data() {
    let h = harness(vec![
        answer("nothing yet"),
        tool_calls(&[
            run_cmd("find /workspace -perm /7000"),
            run_cmd("find /workspace -not -user 65534"),
            run_cmd("find /workspace -not -group 65534"),
            run_cmd("find /workspace -type c -o -type b -o -type p"),
            run_cmd("find /workspace/data -type l"),
            run_cmd("cat /workspace/data/notes.txt"),
            run_cmd("stat -c %a /workspace/data/su /workspace/data/shared"),
        ]),
        answer("inspected"),
    ])
    .await;
    h.deployed(AGENTS, &keeper("heir", "1.0.0", "64Mi")).await;
    let agent_id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM definitions WHERE name = 'heir'")
        .fetch_one(&h.app.state.pool)
        .await
        .unwrap();
    // The owner is the principal of the admin key that runs it: a first, empty run says which.
    let (_, e) = h.run_empty("heir").await;
    assert_eq!(e["status"], "completed", "{e}");
    let owner = e["principal"].as_str().unwrap().to_owned();
    // A row as an older node saved it (the volume replaced by a copy of the image's files):
    // root-owned setuid and setgid files, a sticky directory, a device, a FIFO, links out.
    let archive = [
        tar_entry("./", b'5', 0o755, 0, b"", ""),
        tar_entry("./su", b'0', 0o4755, 0, b"ELF", ""),
        tar_entry("./shared/", b'5', 0o3777, 0, b"", ""),
        tar_entry("./shared/chkpwd", b'0', 0o2755, 0, b"ELF", ""),
        tar_entry("./null", b'3', 0o666, 0, b"", ""),
        tar_entry("./pipe", b'6', 0o644, 0, b"", ""),
        tar_entry("./etc", b'2', 0o777, 0, b"", "/etc"),
        tar_entry("./up", b'2', 0o777, 0, b"", "../../usr/sbin"),
        tar_entry("./notes.txt", b'0', 0o644, 1000, b"kept notes", ""),
        tar_entry("./latest", b'2', 0o777, 0, b"", "notes.txt"),
        vec![0u8; 1024],
    ]
    .concat();
    sqlx::query(
        "INSERT INTO agent_volumes (id, tenant_id, agent_id, owner, name, size_limit_bytes, \
         content, content_bytes, expires_at) \
         VALUES ($1, 'default', $2, $3, 'data', $4, $5, $6, now() + interval '1 hour') \
         ON CONFLICT (tenant_id, agent_id, owner, name) DO UPDATE SET content = EXCLUDED.content, \
         content_bytes = EXCLUDED.content_bytes",
    )
    .bind(uuid::Uuid::new_v4())
    .bind(agent_id)
    .bind(&owner)
    .bind(8i64 << 20)
    .bind(&archive)
    .bind(archive.len() as i64)
    .execute(&h.app.state.pool)
    .await
    .unwrap();

    let out = h.outputs_of_a_run("heir", 7).await;
    assert_eq!(out[0], "", "setuid, setgid or sticky: {}", out[0]);
    assert_eq!(out[1], "", "not owned by the sandbox user: {}", out[1]);
    assert_eq!(out[2], "", "not of the sandbox group: {}", out[2]);
    assert_eq!(out[3], "", "devices or FIFOs: {}", out[3]);
    assert_eq!(
        out[4], "/workspace/data/latest\n",
        "only the link inside is kept"
    );
    assert_eq!(out[5], "kept notes");
    assert_eq!(out[6], "755\n777\n");
}
