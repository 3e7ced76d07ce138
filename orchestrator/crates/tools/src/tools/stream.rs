//! The streaming form of a foreground `cmd.run` (`tools::invoke_streaming`): the command runs
//! as a live process of the executor (the same argv, grant, Landlock domain, sub-reaper,
//! timeout and output cap per stream as the one-shot call), its output goes to the caller's
//! [`OutputSink`] as it is read, and the call answers what the one-shot call answers, built
//! from the same bytes (`sandbox.rs`, `cmd_result`).
//!
//! The call is still one router call: the decision and the intent row come before the process
//! starts, the completion row after its end. If the call is dropped first (the client left),
//! the process's tree is killed through its sub-reaper, as a dropped one-shot call cancels its
//! command, and the router's intent is completed `cancelled` (`client_disconnected`). A streamed
//! command counts against the sandbox's live processes while it runs.

use std::collections::BTreeMap;
use std::time::Instant;

use dispatcher::encoding;
use dispatcher::protocol::{ExecGrant, ProcessEnd, ProcessSignal, StartParams};
use dispatcher::{Dispatcher, ProcessEvent, SandboxId};
use serde_json::{json, Value};

use super::dispatch::{dispatcher_of, refused};
use super::{OutputChunk, OutputSink, ToolContext, ToolError};

/// A foreground command, as `cmd.run` prepared it.
pub(super) struct Foreground {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub timeout_secs: u64,
    pub max_output_bytes: u64,
    pub exec: ExecGrant,
    /// Who it runs as (`root` only where the sandbox allows root).
    pub user: dispatcher::protocol::RunAs,
}

/// Runs `command`, sending its output to `output` as it comes; returns the executor-shaped
/// result of a one-shot `cmd.run` (exit, signal, output, sizes, truncation, duration).
pub(super) async fn run(
    ctx: &ToolContext<'_>,
    command: Foreground,
    output: &OutputSink,
) -> Result<Value, ToolError> {
    let (sandbox, _) = ctx
        .sandbox
        .as_ref()
        .ok_or_else(|| ToolError::new("sandbox_required", "cmd.run runs inside a sandbox"))?;
    let sandbox = *sandbox;
    let dispatcher = dispatcher_of(ctx)?;
    let cap = command
        .max_output_bytes
        .min(encoding::MAX_COMMAND_OUTPUT_BYTES);
    let started = Instant::now();
    let mut handle = dispatcher
        .start_process(
            sandbox,
            StartParams {
                argv: command.argv,
                cwd: command.cwd,
                env: command.env,
                tag: None,
                stdin: false,
                pty: None,
                timeout_ms: Some(command.timeout_secs.saturating_mul(1000)),
                grace_ms: None,
                max_output_bytes: Some(cap),
                exec: command.exec,
                user: command.user,
            },
        )
        .await
        .map_err(refused)?;
    let pid = handle.pid();
    let mut guard = KillOnDrop {
        dispatcher: dispatcher.clone(),
        sandbox,
        pid,
        armed: true,
    };
    // A closed sink (the door gave up) is not an error here: the door drops this call too.
    let _ = output.send(OutputChunk::Started { pid });
    let (mut stdout, mut stderr) = (Captured::default(), Captured::default());
    let mut dropped = 0u64;
    let end = loop {
        match handle.next().await {
            Some(ProcessEvent::Stdout(b)) => stdout.push(&b, output, OutputChunk::Stdout),
            Some(ProcessEvent::Stderr(b)) => stderr.push(&b, output, OutputChunk::Stderr),
            // No terminal was asked for.
            Some(ProcessEvent::Pty(_)) => {}
            Some(ProcessEvent::Dropped { bytes, .. }) => dropped += bytes,
            Some(ProcessEvent::End(end)) => break end,
            None => {
                return Err(ToolError::new(
                    "sandbox_error",
                    "the command's end was read by another handle",
                ))
            }
        }
    };
    guard.armed = false;
    stdout.flush(output, OutputChunk::Stdout);
    stderr.flush(output, OutputChunk::Stderr);
    if let Some(error) = &end.error {
        return Err(ToolError::new(
            "sandbox_error",
            format!("the command's end was not observed: {error}"),
        ));
    }
    Ok(result_of(&end, stdout, stderr, dropped, started))
}

/// The executor's one-shot answer (`RunResult`), made of what the stream carried and its end.
fn result_of(
    end: &ProcessEnd,
    stdout: Captured,
    stderr: Captured,
    dropped: u64,
    started: Instant,
) -> Value {
    let (stdout, stdout_encoding) = encoding::encode(stdout.kept, end.truncated.stdout);
    let (stderr, stderr_encoding) = encoding::encode(stderr.kept, end.truncated.stderr);
    let mut out = json!({
        "exit_code": end.exit_code,
        "signal": end.signal,
        "stdout": stdout,
        "stdout_encoding": stdout_encoding,
        "stderr": stderr,
        "stderr_encoding": stderr_encoding,
        "stdout_bytes": end.stdout_bytes,
        "stderr_bytes": end.stderr_bytes,
        "truncated": end.truncated,
        "duration_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "timed_out": end.timed_out,
    });
    if dropped > 0 {
        out["dropped_bytes"] = json!(dropped);
    }
    out
}

/// One output stream: every byte the executor forwarded (at most the cap, which it enforces),
/// and an incomplete UTF-8 character held back from the last chunk until the next completes it.
#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    held: Vec<u8>,
}

impl Captured {
    fn push(&mut self, bytes: &[u8], output: &OutputSink, wrap: fn(Vec<u8>) -> OutputChunk) {
        self.kept.extend_from_slice(bytes);
        let mut chunk = std::mem::take(&mut self.held);
        chunk.extend_from_slice(bytes);
        let tail = incomplete_tail(&chunk);
        self.held = chunk.split_off(chunk.len() - tail);
        if !chunk.is_empty() {
            let _ = output.send(wrap(chunk));
        }
    }

    /// Sends what was held back (the command ended inside a character, or wrote bytes that are
    /// not text).
    fn flush(&mut self, output: &OutputSink, wrap: fn(Vec<u8>) -> OutputChunk) {
        if !self.held.is_empty() {
            let _ = output.send(wrap(std::mem::take(&mut self.held)));
        }
    }
}

/// How many bytes at the end of `bytes` begin a UTF-8 character they do not finish (0 to 3).
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            // A continuation byte: its lead is further back.
            continue;
        }
        let length = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if length > back { back } else { 0 };
    }
    0
}

/// Kills the command's tree when the call is dropped before the command ended (its client
/// left, its execution ended), as a dropped one-shot call cancels its command.
struct KillOnDrop {
    dispatcher: Dispatcher,
    sandbox: SandboxId,
    pid: u32,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (dispatcher, sandbox, pid) = (self.dispatcher.clone(), self.sandbox, self.pid);
        runtime.spawn(async move {
            if let Err(e) = dispatcher
                .signal_process(sandbox, pid, ProcessSignal::Kill)
                .await
            {
                // It may have ended meanwhile, or its sandbox gone with it.
                tracing::debug!(%pid, sandbox = %sandbox.0, error = %e,
                    "a streamed command whose caller left was not killed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u8>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut captured = Captured::default();
        for c in chunks {
            captured.push(c, &tx, OutputChunk::Stdout);
        }
        captured.flush(&tx, OutputChunk::Stdout);
        let mut out = Vec::new();
        while let Ok(OutputChunk::Stdout(b)) = rx.try_recv() {
            out.push(b);
        }
        (out, captured.kept)
    }

    #[test]
    fn chunks_end_on_character_boundaries_and_keep_every_byte() {
        let text = "aé€😀b".as_bytes();
        // Cut inside é (2 bytes), € (3) and 😀 (4).
        let (chunks, kept) = sent(&[&text[..2], &text[2..5], &text[5..8], &text[8..]]);
        assert_eq!(kept, text);
        assert_eq!(chunks.concat(), text);
        for c in &chunks {
            assert!(std::str::from_utf8(c).is_ok(), "{c:?}");
        }
        // Bytes that are not text are sent as they are, at the latest when the command ends.
        let (chunks, _) = sent(&[b"x\xff", b"\xe2\x82"]);
        assert_eq!(chunks.concat(), b"x\xff\xe2\x82");
        assert_eq!(chunks.last().unwrap(), b"\xe2\x82");
    }

    #[test]
    fn incomplete_tails_are_measured() {
        assert_eq!(incomplete_tail(b""), 0);
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"€".as_bytes()[..2]), 2);
        assert_eq!(incomplete_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_tail(b"\x80\x80\x80"), 0);
    }
}
