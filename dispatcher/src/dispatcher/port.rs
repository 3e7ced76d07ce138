//! The dispatcher's side of port connections (`crate::port` holds the handle): opening one on
//! the executor of a sandbox this instance holds.

use std::sync::{Arc, Weak};

use sandbox_executor::protocol::{Op, PortOpenParams, PortOpenResult};

use super::{run_detached, Dispatcher, Location};
use crate::error::{DispatchError, Result};
use crate::feed::Feed;
use crate::live::{answer, WatchedSandbox};
use crate::port::{OpenedPort, PortConnection, PortWriter};
use crate::spec::SandboxId;

/// The feed of one connection holds this much; the executor's window (256 KiB) is below it.
const PORT_FEED_BYTES: usize = 1024 * 1024;

impl Dispatcher {
    /// Opens a TCP connection to `port` on the sandbox's loopback address, made by its executor
    /// (no network, nothing published on the host). Nothing listening there is
    /// [`DispatchError::Refused`] with kind `not_found`, at once. A sandbox another replica
    /// holds is [`DispatchError::SandboxNotFound`] with `attached_elsewhere` (not relayed: see
    /// [`Dispatcher::open_port_anywhere`]); a holder serves its peers' connections with this.
    pub async fn open_port(&self, id: SandboxId, port: u16) -> Result<PortConnection> {
        let sandbox = self.inner.attached(id).await?;
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

    /// As [`Dispatcher::open_port`], wherever the sandbox is held: a sandbox another live
    /// instance holds is reached through the [`Forwarder`](crate::Forwarder), which asks its
    /// holder to open the port and relays the bytes. The caller decided and audited the
    /// connection; the holder only opens it.
    pub async fn open_port_anywhere(&self, id: SandboxId, port: u16) -> Result<OpenedPort> {
        match self.inner.locate(id).await? {
            Location::Here(_) => self.open_port(id, port).await.map(OpenedPort::Here),
            Location::Elsewhere(holder) => {
                let Some(forwarder) = &self.inner.config.forwarder else {
                    return Err(DispatchError::SandboxNotFound {
                        id,
                        attached_elsewhere: true,
                    });
                };
                forwarder
                    .open_port(holder, id, port, self.inner.config.call_timeout)
                    .await
                    .map(OpenedPort::Relayed)
            }
        }
    }
}
