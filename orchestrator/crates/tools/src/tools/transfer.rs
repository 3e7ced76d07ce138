//! A file transfer (`invoke_transfer`) through a replica that does not hold the sandbox: calls
//! are forwarded to the holder, blocks are not, so the same one admitted call moves the file as
//! forwarded `fs.write`/`fs.read` chunks (base64 in JSON). Still one decision and one audited
//! call per file. What this path cannot keep: the old file through a cut upload (the first
//! chunk replaces it, the rest append), so an upload cut part way removes what it wrote and
//! answers an error, never a silent partial file.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use dispatcher::protocol::{DeleteParams, Encoding, Op, ReadParams, RunAs, WriteParams};
use dispatcher::{SandboxId, UploadPiece};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::dispatch::{dispatch_error, dispatcher_of, executor_code};
use super::{ToolContext, ToolError};

/// Largest chunk of one forwarded call (the executor refuses more than its `max_file_bytes`).
const MAX_CHUNK: u64 = 4 * 1024 * 1024;

fn chunk_of(ctx: &ToolContext<'_>) -> usize {
    let bytes = MAX_CHUNK
        .min(ctx.state.config.sandbox.max_file_bytes)
        .max(1);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

async fn call(ctx: &ToolContext<'_>, id: SandboxId, op: Op) -> Result<Value, ToolError> {
    dispatcher_of(ctx)?
        .call(id, op)
        .await
        .map_err(dispatch_error)?
        .into_result()
        .map_err(|e| ToolError::new(executor_code(e.kind.as_str()), e.message))
}

/// An upload as forwarded `fs.write` chunks (see the module's documentation).
pub(super) async fn write_forwarded(
    ctx: &ToolContext<'_>,
    id: SandboxId,
    path: String,
    metadata: BTreeMap<String, String>,
    user: RunAs,
    mut source: mpsc::Receiver<UploadPiece>,
) -> Result<Value, ToolError> {
    let chunk = chunk_of(ctx);
    let mut pending: Vec<u8> = Vec::new();
    let mut started = false;
    let mut created = false;
    let mut written = 0u64;
    loop {
        let last = match source.recv().await {
            Some(UploadPiece::Data(bytes)) => {
                pending.extend_from_slice(&bytes);
                false
            }
            Some(UploadPiece::End) => true,
            None => {
                if started {
                    // Best effort: the partial file must not pass for the upload.
                    let _ = call(
                        ctx,
                        id,
                        Op::FsDelete(DeleteParams {
                            path: path.clone(),
                            recursive: false,
                            user,
                        }),
                    )
                    .await;
                }
                return Err(ToolError::new(
                    "abandoned",
                    format!(
                        "the upload of '{path}' ended before its last byte; what it wrote was \
                         removed"
                    ),
                ));
            }
        };
        while pending.len() >= chunk || (last && (!pending.is_empty() || !started)) {
            let rest = pending.split_off(chunk.min(pending.len()));
            let bytes = std::mem::replace(&mut pending, rest);
            let out = call(
                ctx,
                id,
                Op::FsWrite(WriteParams {
                    path: path.clone(),
                    content: base64::engine::general_purpose::STANDARD.encode(&bytes),
                    encoding: Encoding::Base64,
                    create_dirs: true,
                    append: started,
                    metadata: if started {
                        BTreeMap::new()
                    } else {
                        metadata.clone()
                    },
                    user,
                }),
            )
            .await?;
            if !started {
                created = out["created"] == true;
            }
            started = true;
            written += bytes.len() as u64;
        }
        if last {
            return Ok(
                json!({"status": "ok", "path": path, "bytes_written": written,
                             "created": created}),
            );
        }
    }
}

/// A download as forwarded `fs.read` chunks in byte mode.
pub(super) async fn read_forwarded(
    ctx: &ToolContext<'_>,
    id: SandboxId,
    path: String,
    user: RunAs,
    sink: mpsc::Sender<Bytes>,
) -> Result<Value, ToolError> {
    let chunk = chunk_of(ctx) as u64;
    let mut offset = 0u64;
    loop {
        let mut out = call(
            ctx,
            id,
            Op::FsRead(ReadParams {
                path: path.clone(),
                offset: None,
                limit: None,
                max_bytes: Some(chunk),
                byte_offset: Some(offset),
                user,
            }),
        )
        .await?;
        let size_bytes = out["size_bytes"].take();
        let content = out["content"].as_str().unwrap_or_default();
        let bytes = if out["encoding"] == "base64" {
            base64::engine::general_purpose::STANDARD
                .decode(content)
                .map_err(|_| ToolError::new("sandbox_error", "the sandbox sent malformed base64"))?
        } else {
            content.as_bytes().to_vec()
        };
        let more = out["truncated"] == true;
        if more && bytes.is_empty() {
            return Err(ToolError::new(
                "sandbox_error",
                format!("'{path}' stopped growing mid-read"),
            ));
        }
        offset += bytes.len() as u64;
        if !bytes.is_empty() && sink.send(Bytes::from(bytes)).await.is_err() {
            return Err(ToolError::new(
                "abandoned",
                format!("the reader of '{path}' went away"),
            ));
        }
        if !more {
            return Ok(
                json!({"status": "ok", "path": path, "size_bytes": size_bytes,
                             "bytes_read": offset, "truncated": false}),
            );
        }
    }
}
