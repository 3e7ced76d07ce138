//! The dispatcher's side of port connections (`crate::port` holds the handle): opening one on
//! the executor of a sandbox this instance holds.

use std::sync::{Arc, Weak};

use sandbox_executor::protocol::{Op, PortOpenParams, PortOpenResult};

use super::{run_detached, Dispatcher, Location};
use crate::error::{DispatchError, Result};
use crate::feed::Feed;
use crate::live::{answer, WatchedSandbox};
use crate::port::{PortConnection, PortWriter};
use crate::spec::SandboxId;

/// The feed of one connection holds this much; the executor's window (256 KiB) is below it.
const PORT_FEED_BYTES: usize = 1024 * 1024;

impl Dispatcher {
    /// Opens a TCP connection to `port` on the sandbox's loopback address, made by its executor
    /// (no network, nothing published on the host). Nothing listening there is
    /// [`DispatchError::Refused`] with kind `not_found`, at once. A sandbox another replica
    /// holds is [`DispatchError::SandboxNotFound`] with `attached_elsewhere` (not relayed).
    pub async fn open_port(&self, id: SandboxId, port: u16) -> Result<PortConnection> {
        let sandbox = match self.inner.locate(id).await? {
            Location::Here(sandbox) => sandbox,
            Location::Elsewhere(_) => {
                return Err(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: true,
                })
            }
        };
        let feed = Feed::of_port(PORT_FEED_BYTES);
        let deadline = self.inner.config.call_timeout;
        // Detached: a caller that leaves after the open was sent still gets the connection
        // closed (the handle is made, then dropped, in the task).
        run_detached(async move {
            let (target, response) = sandbox
                .stream
                .call_feeding_with_id(
                    Op::PortOpen(PortOpenParams { port }),
                    deadline,
                    Some(Arc::clone(&feed)),
                )
                .await;
            let _opened: PortOpenResult = answer(id, "port.open", response?)?;
            Ok(PortConnection {
                writer: PortWriter {
                    sandbox_id: id,
                    port,
                    target,
                    sandbox: Arc::downgrade(&sandbox) as Weak<dyn WatchedSandbox>,
                    deadline,
                },
                reader: feed.reader_from_start(),
                unacked: 0,
            })
        })
        .await
    }
}
