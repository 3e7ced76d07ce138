//! A port connection joined to a peer replica's upgraded HTTP connection. The byte pump itself
//! (bounds each way, half-closes) is the dispatcher's (`OpenedPort::into_stream`), the one every
//! reader of a sandbox port takes; hyper's client speaks HTTP over its stream (and a
//! WebSocket's bytes pass through after an upgrade).

use dispatcher::{PortBounds, PortConnection};

/// Bytes one connection may carry, each way (the dispatcher's pump enforces them).
pub type Bounds = PortBounds;

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
        let mut server = connection.into_stream(bounds);
        if let Err(e) = tokio::io::copy_bidirectional(&mut peer, &mut server).await {
            tracing::debug!(error = %e, "a peer's port connection ended");
        }
    });
}
