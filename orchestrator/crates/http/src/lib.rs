//! The HTTP connection a request came on, as handlers see it (`ConnectInfo<Connection>`): the
//! peer's address (the attestation limit per source address), and a way to reset it; over the
//! plain HTTP port or the optional TLS one ([`tls`]), which serve the same routes.
//!
//! Resetting is how the E2B door ends a stream whose sandbox went away under it, as E2B's edge
//! does: E2B's SDK tells a dropped connection (a transport failure, after which it asks the
//! sandbox's health and reports it killed) from an answer that merely ends early, and over
//! HTTP/1.1 only a reset (TCP RST) reads as the former; a closed connection is a protocol error
//! to it. Over HTTP/2 the failing body resets just its stream, and nothing more is needed.
//!
//! The handle is a duplicate of the connection's socket descriptor, so it lives as long as the
//! connection's service and the requests that hold it; the socket closes when the last of them
//! goes (the connection's own task ends first, in practice at once).

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::net::{TcpListener, TcpStream};

pub mod tls;

/// One accepted HTTP connection.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The peer's address.
    pub addr: SocketAddr,
    /// The connection's socket (a duplicate), when it could be had.
    socket: Option<Arc<OwnedFd>>,
}

impl Connection {
    /// Makes the connection end with a reset when it closes, instead of an orderly close: what
    /// an HTTP/1.1 client must see when an answer is cut because what it was about is gone.
    /// Whatever the client has not read yet is dropped with it.
    pub fn reset_on_close(&self) {
        if let Some(socket) = &self.socket {
            if let Err(e) = socket2::SockRef::from(socket.as_ref()).set_linger(Some(Duration::ZERO))
            {
                tracing::debug!(error = %e, "could not make an HTTP connection reset on close");
            }
        }
    }
}

/// The HTTP port's listener: every accepted socket is `TCP_NODELAY` (small request/response
/// exchanges must not wait for Nagle's algorithm to meet the peer's delayed ACK, tens of
/// milliseconds per call), and each connection's [`Connection`] is taken from it.
pub struct HttpListener(TcpListener);

/// The HTTP port's listener over `listener`.
pub fn http_listener(listener: TcpListener) -> HttpListener {
    HttpListener(listener)
}

impl Listener for HttpListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        // Accept errors are logged and retried by the plain listener's own accept.
        let (tcp, addr) = Listener::accept(&mut self.0).await;
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on an HTTP connection");
        }
        (tcp, addr)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

impl Connection {
    /// The connection of an accepted socket from `addr` (a duplicate of its descriptor kept).
    fn of(tcp: &TcpStream, addr: SocketAddr) -> Self {
        let socket = std::os::fd::AsFd::as_fd(tcp)
            .try_clone_to_owned()
            .inspect_err(
                |e| tracing::debug!(error = %e, "no handle on an HTTP connection's socket"),
            )
            .ok()
            .map(Arc::new);
        Connection { addr, socket }
    }
}

impl Connected<IncomingStream<'_, HttpListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, HttpListener>) -> Self {
        Connection::of(stream.io(), *stream.remote_addr())
    }
}
