//! A port connection as a byte stream: the executor's relay (`dispatcher::PortConnection`) on
//! one side, a `tokio::io::duplex` on the other, which hyper's client speaks HTTP over (and a
//! WebSocket's bytes pass through after an upgrade). Bytes are bounded per connection in each
//! direction; past a bound the connection is closed.

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use dispatcher::{OpenedPort, PortConnection, PortEvent, PortStream, PortWriter};

/// Buffer between the two pumps and the client side, each way.
const DUPLEX_BYTES: usize = 64 * 1024;

/// Bytes one connection may carry, each way.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// From the client to the server in the sandbox.
    pub to_server: u64,
    /// From the server in the sandbox to the client.
    pub to_client: u64,
}

/// The client's end of `opened`, wherever its sandbox is held; the relay runs until either
/// side ends, then closes the connection.
pub fn open_anywhere(opened: OpenedPort, bounds: Bounds) -> DuplexStream {
    match opened {
        OpenedPort::Here(connection) => open(connection, bounds),
        OpenedPort::Relayed(stream) => open_relayed(stream, bounds),
    }
}

/// The client's end of `connection`; the relay runs until either side ends, then closes the
/// connection.
pub fn open(connection: PortConnection, bounds: Bounds) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(DUPLEX_BYTES);
    tokio::spawn(relay(connection, theirs, bounds));
    ours
}

/// Joins `connection` (opened here for a peer replica) to the connection `request` becomes once
/// its `101 Switching Protocols` is sent: the peer's client then reads and writes the server's
/// bytes, under this node's bounds. Used by the orchestrator's peer route for ports.
pub fn join_upgrade(
    request: &mut axum::extract::Request,
    connection: PortConnection,
    bounds: Bounds,
) {
    let on_upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(error = %e, "a peer's port connection did not upgrade");
                return;
            }
        };
        let mut peer = hyper_util::rt::TokioIo::new(upgraded);
        let mut server = open(connection, bounds);
        if let Err(e) = tokio::io::copy_bidirectional(&mut peer, &mut server).await {
            tracing::debug!(error = %e, "a peer's port connection ended");
        }
    });
}

/// The client's end of a connection another replica relays (its holder bounds it as well, by
/// its own settings): the same bounds here, so a client is held to this node's.
fn open_relayed(stream: PortStream, bounds: Bounds) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(DUPLEX_BYTES);
    tokio::spawn(async move {
        let (mut from_peer, mut to_peer) = tokio::io::split(stream);
        let (mut from_client, mut to_client) = tokio::io::split(theirs);
        let inbound = copy_bounded(&mut from_client, &mut to_peer, bounds.to_server);
        let outbound = copy_bounded(&mut from_peer, &mut to_client, bounds.to_client);
        tokio::pin!(inbound, outbound);
        tokio::select! {
            ended = &mut outbound => if let Err(why) = ended {
                tracing::debug!(%why, "a relayed sandbox port's stream to its client ended");
            },
            sent = &mut inbound => match sent {
                Ok(()) => if let Err(why) = outbound.await {
                    tracing::debug!(%why, "a relayed sandbox port's stream to its client ended");
                },
                Err(why) => tracing::debug!(%why, "a relayed sandbox port's stream from its client ended"),
            },
        }
    });
    ours
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

async fn relay(mut connection: PortConnection, side: DuplexStream, bounds: Bounds) {
    let port = connection.port();
    let (from_client, to_client) = tokio::io::split(side);
    let inbound = to_server(connection.writer(), from_client, bounds.to_server);
    let outbound = from_server(&mut connection, to_client, bounds.to_client);
    tokio::pin!(inbound, outbound);
    tokio::select! {
        ended = &mut outbound => {
            if let Err(why) = ended {
                tracing::debug!(port, %why, "a sandbox port's relay to its client ended");
            }
        }
        sent = &mut inbound => match sent {
            // The client finished sending (half-close): its answer still comes.
            Ok(()) => {
                if let Err(why) = outbound.await {
                    tracing::debug!(port, %why, "a sandbox port's relay to its client ended");
                }
            }
            Err(why) => tracing::debug!(port, %why, "a sandbox port's relay from its client ended"),
        },
    }
    // Dropping the connection closes it in the sandbox.
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
