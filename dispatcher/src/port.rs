//! Connections to ports inside a sandbox: the public handle over the executor's `port.*`
//! operations and the events they stream (`Dispatcher::open_port` makes one).
//!
//! A [`PortConnection`] is one TCP connection the sandbox's executor opened to
//! `127.0.0.1:<port>` in the sandbox: what the server sends arrives through the connection's
//! feed (filled by the stream's reader, `stream.rs`), what the caller writes goes as
//! `port.write` calls. The executor sends no more than the credit this handle granted
//! ([`PortConnection::next`] grants it back as bytes are handed on), so the feed never drops a
//! byte and a slow client holds back only its own server, never the channel tool calls share.
//! Dropping the handle closes the connection.

use std::sync::Weak;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use sandbox_executor::protocol::{
    Empty, Op, PortAckParams, PortCloseParams, PortShutdown, PortWriteParams,
};

use crate::error::Result;
use crate::feed::{Item, Read, Reader};
use crate::live::{answer, WatchedSandbox};
use crate::spec::SandboxId;

/// Bytes handed on before they are acknowledged to the executor (well below its window, so it
/// never waits on an ack this handle holds back).
const ACK_EVERY: u64 = 64 * 1024;
/// Most bytes of one `port.write` (the executor's bound).
const WRITE_CHUNK: usize = 1024 * 1024;

/// What a server in the sandbox did on a port connection, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortEvent {
    /// Bytes it sent.
    Data(Bytes),
    /// The connection ended (the last event); `Some` says why when it was not a clean close.
    End(Option<String>),
}

/// A connection to a port in a sandbox, by where the sandbox is held
/// ([`Dispatcher::open_port_anywhere`](crate::Dispatcher::open_port_anywhere)).
pub enum OpenedPort {
    /// On this instance's executor channel.
    Here(PortConnection),
    /// Through the instance that holds the sandbox, as a byte stream.
    Relayed(crate::forward::PortStream),
}

impl std::fmt::Debug for OpenedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenedPort::Here(connection) => f.debug_tuple("Here").field(connection).finish(),
            OpenedPort::Relayed(_) => f.write_str("Relayed"),
        }
    }
}

/// One TCP connection to a port inside a sandbox. Dropping it closes the connection.
pub struct PortConnection {
    pub(crate) writer: PortWriter,
    pub(crate) reader: Reader,
    pub(crate) unacked: u64,
}

/// The sending half of a [`PortConnection`], to write while its owner reads; it does not keep
/// the connection open.
#[derive(Clone)]
pub struct PortWriter {
    pub(crate) sandbox_id: SandboxId,
    pub(crate) port: u16,
    /// The id of the `port.open` request, which its events and every later call name.
    pub(crate) target: u64,
    pub(crate) sandbox: Weak<dyn WatchedSandbox>,
    pub(crate) deadline: Duration,
}

impl std::fmt::Debug for PortConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortConnection")
            .field("sandbox", &self.writer.sandbox_id)
            .field("port", &self.writer.port)
            .finish_non_exhaustive()
    }
}

impl PortConnection {
    /// The port in the sandbox.
    pub fn port(&self) -> u16 {
        self.writer.port
    }

    /// A handle that writes to the server (and half-closes) while this one reads.
    pub fn writer(&self) -> PortWriter {
        self.writer.clone()
    }

    /// The next thing the server did; `None` once [`PortEvent::End`] was returned. Bytes
    /// returned count as handed on: the executor may send as many again.
    pub async fn next(&mut self) -> Option<PortEvent> {
        let event = match self.reader.next().await? {
            Read::Item(Item::PortData(bytes)) => {
                self.unacked += bytes.len() as u64;
                if self.unacked >= ACK_EVERY {
                    self.ack();
                }
                PortEvent::Data(bytes)
            }
            Read::Item(Item::PortEnd(error)) => PortEvent::End(error),
            // The feed is bounded above the executor's window, so this is a broken promise:
            // end rather than pass on a stream with a hole in it.
            Read::Dropped { events, bytes } | Read::Item(Item::Gap { events, bytes }) => {
                PortEvent::End(Some(format!(
                    "the relay lost {bytes} bytes in {events} events of port {}",
                    self.writer.port
                )))
            }
            Read::Item(other) => PortEvent::End(Some(format!(
                "the relay of port {} carried an event of another kind: {other:?}",
                self.writer.port
            ))),
        };
        Some(event)
    }

    fn ack(&mut self) {
        if let Some(sandbox) = self.writer.sandbox.upgrade() {
            sandbox.send_detached(Op::PortAck(PortAckParams {
                target: self.writer.target,
                bytes: self.unacked,
            }));
        }
        self.unacked = 0;
    }
}

impl PortWriter {
    /// Sends `bytes` to the server; returns once the executor wrote them all.
    pub async fn write(&self, bytes: &[u8]) -> Result<()> {
        for chunk in bytes.chunks(WRITE_CHUNK) {
            let op = Op::PortWrite(PortWriteParams {
                target: self.target,
                data: base64::engine::general_purpose::STANDARD.encode(chunk),
            });
            self.call(op, "port.write").await?;
        }
        Ok(())
    }

    /// Closes the direction toward the server (the client finished sending); the server's
    /// bytes still come until it closes.
    pub async fn shutdown_write(&self) -> Result<()> {
        let op = Op::PortClose(PortCloseParams {
            target: self.target,
            how: PortShutdown::Write,
        });
        self.call(op, "port.close").await
    }

    async fn call(&self, op: Op, name: &'static str) -> Result<()> {
        let sandbox =
            self.sandbox
                .upgrade()
                .ok_or(crate::error::DispatchError::SandboxNotFound {
                    id: self.sandbox_id,
                    attached_elsewhere: false,
                })?;
        let response = sandbox.call(op, self.deadline).await?;
        answer::<Empty>(self.sandbox_id, name, response).map(|_| ())
    }
}

impl Drop for PortConnection {
    fn drop(&mut self) {
        if let Some(sandbox) = self.writer.sandbox.upgrade() {
            sandbox.send_detached(Op::PortClose(PortCloseParams {
                target: self.writer.target,
                how: PortShutdown::Both,
            }));
        }
    }
}
