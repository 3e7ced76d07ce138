//! The dispatcher's side of file transfers (`stream/transfer.rs` moves the blocks): a whole
//! file written from, or read to, a channel of bytes on the executor of a sandbox this
//! instance holds.

use bytes::Bytes;
use sandbox_executor::protocol::{PathParams, ReadStreamResult, WriteResult, WriteStreamParams};
use tokio::sync::mpsc;

use super::{Dispatcher, Location};
use crate::error::Result;
use crate::spec::SandboxId;
use crate::stream::UploadPiece;

impl Dispatcher {
    /// Replaces the file `params.path` with the bytes `source` yields, up to its
    /// [`UploadPiece::End`]; the file becomes the name only then (a source that closes early,
    /// a cancel or a failure leaves the old file and no partial one). The path is resolved and
    /// refused exactly as `fs.write`'s. A sandbox another replica holds is
    /// [`DispatchError::SandboxNotFound`](crate::error::DispatchError::SandboxNotFound) with
    /// `attached_elsewhere` (blocks are not forwarded).
    pub async fn write_stream(
        &self,
        id: SandboxId,
        params: WriteStreamParams,
        source: mpsc::Receiver<UploadPiece>,
    ) -> Result<WriteResult> {
        let sandbox = self.inner.attached(id).await?;
        let _serving = self.inner.serving.enter()?;
        sandbox
            .stream
            .write_stream(params, source, self.inner.config.call_timeout)
            .await
    }

    /// Sends the file at `params.path` to `sink` as it is read (resolved and refused as
    /// `fs.read`'s, as `params.user`; no size ceiling), holding no more than the executor's
    /// window; answers how many bytes went. A sink that closes cancels the read.
    pub async fn read_stream(
        &self,
        id: SandboxId,
        params: PathParams,
        sink: mpsc::Sender<Bytes>,
    ) -> Result<ReadStreamResult> {
        let sandbox = self.inner.attached(id).await?;
        let _serving = self.inner.serving.enter()?;
        sandbox
            .stream
            .read_stream(params, sink, self.inner.config.call_timeout)
            .await
    }

    /// Whether this instance holds sandbox `id` (a transfer's blocks then reach its executor;
    /// through another replica, calls are forwarded, blocks are not).
    pub async fn holds(&self, id: SandboxId) -> Result<bool> {
        Ok(matches!(self.inner.locate(id).await?, Location::Here(_)))
    }
}
