//! File transfers on the executor stream (`fs.write_stream`, `fs.read_stream`): the file's
//! bytes move as blocks (binary frames, `protocol::transfer`) instead of base64 in JSON lines.
//!
//! Both directions run on credit. An upload sends no block before the executor's first
//! `credit` event (so a refused path costs no bytes) and never more than it was granted; a
//! download acknowledges blocks as its sink takes them (`fs.stream_ack`), so the executor never
//! sends more than [`WINDOW`] ahead of the consumer. Either way the node holds at most a window
//! per transfer, and the lines of other calls pass between the blocks.
//!
//! A transfer whose caller goes away (its future dropped, an upload's source closed without
//! [`UploadPiece::End`], a download's sink closed) is cancelled on the executor, which removes
//! a half-written file.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sandbox_executor::protocol::{
    block_header, Op, PathParams, ReadStreamResult, StreamAckParams, WriteResult,
    WriteStreamParams, BLOCK_HEADER, IDLE_LIMIT, MAX_BLOCK, WINDOW,
};
use tokio::sync::{mpsc, oneshot};

use super::{ExecutorStream, Reply, Shared};
use crate::error::{DispatchError, Result};
use crate::live::answer;

/// What the reader hands a transfer.
#[derive(Debug)]
pub(crate) enum Moved {
    /// A block's payload (downloads).
    Block(Bytes),
    /// Credit granted (uploads).
    Credit(u64),
}

/// One piece of an upload's source.
#[derive(Debug)]
pub enum UploadPiece {
    /// The next bytes of the file.
    Data(Bytes),
    /// The file is complete: it may replace the name. A source that closes without this
    /// abandons the upload, and nothing is written.
    End,
}

/// Payload bytes of a download handed on before they are acknowledged.
const ACK_EVERY: u64 = WINDOW / 4;

/// Hands a block's payload to its transfer (dropped when none waits: it was cancelled).
pub(super) fn route_block(shared: &Shared, id: u64, payload: Bytes) {
    if let Some(to) = shared.lock().transfers.get(&id) {
        let _ = to.send(Moved::Block(payload));
    }
}

/// Hands a `credit` event to its upload.
pub(super) fn route_credit(shared: &Shared, id: u64, bytes: u64) {
    if let Some(to) = shared.lock().transfers.get(&id) {
        let _ = to.send(Moved::Credit(bytes));
    }
}

/// A transfer's registration: its answer and its blocks or credit, forgotten when dropped; if
/// it is dropped before the answer came, the executor is told to cancel it.
struct Registered<'a> {
    stream: &'a ExecutorStream,
    id: u64,
    answer: oneshot::Receiver<Reply>,
    moved: mpsc::UnboundedReceiver<Moved>,
    answered: bool,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        {
            let mut state = self.stream.shared.lock();
            state.pending.remove(&self.id);
            state.transfers.remove(&self.id);
        }
        if !self.answered {
            self.stream.send_cancel(self.id);
        }
    }
}

impl ExecutorStream {
    /// Registers a transfer and writes its request.
    async fn begin_transfer(&self, op: Op, deadline: Duration) -> Result<Registered<'_>> {
        let sandbox = self.shared.sandbox;
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (answer_tx, answer) = oneshot::channel();
        let (moved_tx, moved) = mpsc::unbounded_channel();
        self.shared
            .register(id, answer_tx)?
            .transfers
            .insert(id, moved_tx);
        let registered = Registered {
            stream: self,
            id,
            answer,
            moved,
            answered: false,
        };
        let line = super::request_line(sandbox, id, op)?;
        let sent = tokio::time::timeout(deadline, self.writer.send(Bytes::from(line))).await;
        if !matches!(sent, Ok(Ok(()))) {
            return Err(self.gone());
        }
        Ok(registered)
    }

    fn gone(&self) -> DispatchError {
        DispatchError::SandboxGone {
            id: self.shared.sandbox,
            reason: self
                .shared
                .closed_reason()
                .unwrap_or_else(|| "the executor stream is closed".to_owned()),
        }
    }

    /// Writes one block (header and payload in one write, so no other line comes between).
    async fn send_block(&self, id: u64, payload: &[u8]) -> Result<()> {
        let mut block = BytesMut::with_capacity(payload.len() + BLOCK_HEADER);
        block.extend_from_slice(&block_header(id, payload.len()));
        block.extend_from_slice(payload);
        self.writer
            .send(block.freeze())
            .await
            .map_err(|_| self.gone())
    }

    /// A slot of the executor's requests in flight (a transfer holds one for its duration).
    async fn transfer_slot(&self, deadline: Duration) -> Result<tokio::sync::OwnedSemaphorePermit> {
        match tokio::time::timeout(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(self.gone()),
            Err(_) => Err(DispatchError::Timeout {
                id: self.shared.sandbox,
                op: "transfer",
                after: deadline,
            }),
        }
    }

    /// `fs.write_stream`: the file's bytes from `source`, within the executor's credit; the
    /// executor's answer once it renamed the complete file over the name.
    pub(crate) async fn write_stream(
        &self,
        params: WriteStreamParams,
        mut source: mpsc::Receiver<UploadPiece>,
        deadline: Duration,
    ) -> Result<WriteResult> {
        const OP: &str = "fs.write_stream";
        let sandbox = self.shared.sandbox;
        let _slot = self.transfer_slot(deadline).await?;
        let mut transfer = self
            .begin_transfer(Op::FsWriteStream(params), deadline)
            .await?;
        let id = transfer.id;
        let mut credit = 0u64;
        let mut held = Bytes::new();
        // The first credit says the executor registered the transfer: before it, even the end
        // block would be dropped as a block of no transfer.
        let mut opened = false;
        let mut complete = false;
        let stalled = || DispatchError::Timeout {
            id: sandbox,
            op: OP,
            after: IDLE_LIMIT,
        };
        loop {
            if complete && opened && held.is_empty() {
                break;
            }
            if !held.is_empty() && credit > 0 {
                let n = held
                    .len()
                    .min(MAX_BLOCK)
                    .min(usize::try_from(credit).unwrap_or(MAX_BLOCK));
                let part = held.split_to(n);
                self.send_block(id, &part).await?;
                credit -= n as u64;
                continue;
            }
            tokio::select! {
                biased;
                // Early: a refusal (the path), or a failure part way (the disk full).
                answered = &mut transfer.answer => {
                    transfer.answered = true;
                    let response = answered.map_err(|_| self.gone())?.map_err(|reason| {
                        DispatchError::SandboxGone { id: sandbox, reason }
                    })?;
                    return answer(sandbox, OP, response);
                }
                moved = transfer.moved.recv() => match moved {
                    Some(Moved::Credit(bytes)) => {
                        opened = true;
                        credit = credit.saturating_add(bytes);
                    }
                    Some(Moved::Block(_)) => {}
                    None => return Err(self.gone()),
                },
                piece = source.recv(), if held.is_empty() && !complete => match piece {
                    Some(UploadPiece::Data(bytes)) => held = bytes,
                    Some(UploadPiece::End) => complete = true,
                    None => {
                        return Err(DispatchError::Abandoned {
                            id: sandbox,
                            op: OP,
                            reason: "its source ended before the file's last byte; the \
                                     partial file is removed"
                                .to_owned(),
                        })
                    }
                },
                () = tokio::time::sleep(IDLE_LIMIT) => return Err(stalled()),
            }
        }
        self.send_block(id, &[]).await?;
        let answered = tokio::time::timeout(deadline, &mut transfer.answer).await;
        transfer.answered = true;
        let response = match answered {
            Ok(Ok(Ok(response))) => response,
            Ok(Ok(Err(reason))) => {
                return Err(DispatchError::SandboxGone {
                    id: sandbox,
                    reason,
                })
            }
            Ok(Err(_)) => return Err(self.gone()),
            Err(_) => {
                transfer.answered = false;
                return Err(DispatchError::Timeout {
                    id: sandbox,
                    op: OP,
                    after: deadline,
                });
            }
        };
        answer(sandbox, OP, response)
    }

    /// `fs.read_stream`: the file's bytes to `sink` as they come (acknowledged as the sink takes
    /// them); the executor's answer after the last block.
    pub(crate) async fn read_stream(
        &self,
        params: PathParams,
        sink: mpsc::Sender<Bytes>,
        deadline: Duration,
    ) -> Result<ReadStreamResult> {
        const OP: &str = "fs.read_stream";
        let sandbox = self.shared.sandbox;
        let _slot = self.transfer_slot(deadline).await?;
        let mut transfer = self
            .begin_transfer(Op::FsReadStream(params), deadline)
            .await?;
        let id = transfer.id;
        let mut unacked = 0u64;
        let response = loop {
            tokio::select! {
                moved = transfer.moved.recv() => match moved {
                    Some(Moved::Block(bytes)) => {
                        let len = bytes.len() as u64;
                        if sink.send(bytes).await.is_err() {
                            return Err(DispatchError::Abandoned {
                                id: sandbox,
                                op: OP,
                                reason: "its reader went away".to_owned(),
                            });
                        }
                        unacked += len;
                        if unacked >= ACK_EVERY {
                            self.send_detached(Op::FsStreamAck(StreamAckParams {
                                target: id,
                                bytes: unacked,
                            }));
                            unacked = 0;
                        }
                    }
                    Some(Moved::Credit(_)) => {}
                    None => return Err(self.gone()),
                },
                answered = &mut transfer.answer => {
                    transfer.answered = true;
                    break answered.map_err(|_| self.gone())?.map_err(|reason| {
                        DispatchError::SandboxGone { id: sandbox, reason }
                    })?;
                }
                () = tokio::time::sleep(IDLE_LIMIT) => {
                    return Err(DispatchError::Timeout { id: sandbox, op: OP, after: IDLE_LIMIT })
                }
            }
        };
        // Every block came before the answer (one channel, in order): hand on what is queued.
        while let Ok(moved) = transfer.moved.try_recv() {
            if let Moved::Block(bytes) = moved {
                if sink.send(bytes).await.is_err() {
                    return Err(DispatchError::Abandoned {
                        id: sandbox,
                        op: OP,
                        reason: "its reader went away".to_owned(),
                    });
                }
            }
        }
        answer(sandbox, OP, response)
    }
}
