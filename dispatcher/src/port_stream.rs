//! A port connection as a byte stream, wherever its sandbox is held: the executor's relay
//! ([`PortConnection`]) or a peer's relayed stream ([`PortStream`]) on one side, a
//! `tokio::io::duplex` on the other. Every reader of a sandbox port (E2B's port route, which
//! hyper speaks HTTP and WebSockets over; the code interpreter's client) takes this one pump,
//! so a port behaves the same on every replica. Bytes are bounded per connection in each
//! direction; past a bound the connection is closed.

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use crate::forward::PortStream;
use crate::port::{OpenedPort, PortConnection, PortEvent, PortWriter};

/// Buffer between the two pumps and the client side, each way.
const DUPLEX_BYTES: usize = 64 * 1024;

/// Bytes one connection may carry, each way.
#[derive(Debug, Clone, Copy)]
pub struct PortBounds {
    /// From the client to the server in the sandbox.
    pub to_server: u64,
    /// From the server in the sandbox to the client.
    pub to_client: u64,
}

impl OpenedPort {
    /// The client's end of this connection, wherever its sandbox is held; the pump runs until
    /// either side ends, then closes the connection. A relayed connection is bounded here as
    /// well as by its holder, so a client is held to this node's bounds.
    pub fn into_stream(self, bounds: PortBounds) -> DuplexStream {
        match self {
            OpenedPort::Here(connection) => connection.into_stream(bounds),
            OpenedPort::Relayed(stream) => relayed(stream, bounds),
        }
    }
}

impl PortConnection {
    /// The client's end of this connection; the pump runs until either side ends, then closes
    /// the connection in the sandbox.
    pub fn into_stream(self, bounds: PortBounds) -> DuplexStream {
        let (ours, theirs) = tokio::io::duplex(DUPLEX_BYTES);
        tokio::spawn(relay(self, theirs, bounds));
        ours
    }
}

fn relayed(stream: PortStream, bounds: PortBounds) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(DUPLEX_BYTES);
    tokio::spawn(async move {
        let (mut from_peer, mut to_peer) = tokio::io::split(stream);
        let (mut from_client, mut to_client) = tokio::io::split(theirs);
        let inbound = copy_bounded(&mut from_client, &mut to_peer, bounds.to_server);
        let outbound = copy_bounded(&mut from_peer, &mut to_client, bounds.to_client);
        both_ways("relayed", inbound, outbound).await;
    });
    ours
}

async fn relay(mut connection: PortConnection, side: DuplexStream, bounds: PortBounds) {
    let (from_client, to_client) = tokio::io::split(side);
    let writer = connection.writer();
    let inbound = to_server(writer, from_client, bounds.to_server);
    let outbound = from_server(&mut connection, to_client, bounds.to_client);
    both_ways("local", inbound, outbound).await;
    // Dropping the connection closes it in the sandbox.
}

/// Runs both directions until the server's side ends; a client that only finished sending
/// (a half-close) still gets its answer.
async fn both_ways(
    how: &'static str,
    inbound: impl std::future::Future<Output = Result<(), String>>,
    outbound: impl std::future::Future<Output = Result<(), String>>,
) {
    tokio::pin!(inbound, outbound);
    tokio::select! {
        ended = &mut outbound => if let Err(why) = ended {
            tracing::debug!(how, %why, "a sandbox port's stream to its client ended");
        },
        sent = &mut inbound => match sent {
            Ok(()) => if let Err(why) = outbound.await {
                tracing::debug!(how, %why, "a sandbox port's stream to its client ended");
            },
            Err(why) => tracing::debug!(how, %why, "a sandbox port's stream from its client ended"),
        },
    }
}

/// Copies `from` to `to` until `from` ends (then shuts `to` for writing), or past `bound`
/// bytes (an error).
async fn copy_bounded<R, W>(from: &mut R, to: &mut W, bound: u64) -> Result<(), String>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; DUPLEX_BYTES];
    let mut moved = 0u64;
    loop {
        let n = from.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return to.shutdown().await.map_err(|e| e.to_string());
        }
        moved += n as u64;
        if moved > bound {
            return Err(format!("more than {bound} bytes on one connection"));
        }
        to.write_all(&buf[..n]).await.map_err(|e| e.to_string())?;
    }
}

async fn to_server(
    writer: PortWriter,
    mut from_client: tokio::io::ReadHalf<DuplexStream>,
    bound: u64,
) -> Result<(), String> {
    let mut buf = vec![0u8; DUPLEX_BYTES];
    let mut sent = 0u64;
    loop {
        let n = from_client
            .read(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return writer.shutdown_write().await.map_err(|e| e.to_string());
        }
        sent += n as u64;
        if sent > bound {
            return Err(format!(
                "the client sent more than {bound} bytes on one connection"
            ));
        }
        writer.write(&buf[..n]).await.map_err(|e| e.to_string())?;
    }
}

async fn from_server(
    connection: &mut PortConnection,
    mut to_client: tokio::io::WriteHalf<DuplexStream>,
    bound: u64,
) -> Result<(), String> {
    let mut received = 0u64;
    while let Some(event) = connection.next().await {
        match event {
            PortEvent::Data(bytes) => {
                received += bytes.len() as u64;
                if received > bound {
                    return Err(format!(
                        "the server sent more than {bound} bytes on one connection"
                    ));
                }
                to_client
                    .write_all(&bytes)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            PortEvent::End(None) => break,
            PortEvent::End(Some(why)) => return Err(why),
        }
    }
    to_client.shutdown().await.map_err(|e| e.to_string())
}
