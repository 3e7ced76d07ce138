//! The node's optional TLS listener (`server.tls`): the operator's certificate (a wildcard
//! `*.<e2b.domain>` for sandbox ports, the node's own name beside it if wanted) and key, PEM
//! files read at start, serving the very router of the HTTP port. E2B's SDKs build
//! `https://<port>-<sandbox id>.<domain>` for `get_host`; with this listener those URLs reach
//! the node without a proxy in front.
//!
//! Handshakes run off the accept loop: each accepted socket gets a task of its own, bounded by
//! [`HANDSHAKE_TIMEOUT`], and only finished handshakes are handed to the server. A client that
//! connects and says nothing holds one task until the timeout, never the listener. Only
//! HTTP/1.1 is offered (ALPN `http/1.1`), the form the port layer relays, WebSocket upgrades
//! included.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Connection;

/// The TLS library the listener is built on (its `ServerConfig` is what [`server_config`]
/// makes and [`tls_listener`] takes).
pub use tokio_rustls::rustls;

/// Longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// Why the TLS listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("server.tls.{what}: {path}: {detail}")]
    Pem {
        /// `cert_file` or `key_file`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// rustls refused the certificate and key (they do not match, or the key is unsupported).
    #[error("server.tls: the certificate and key are not usable together: {0}")]
    Config(#[from] rustls::Error),
}

/// The server side of TLS from the operator's PEM files: the certificate chain (leaf first)
/// and its private key (PKCS#8, PKCS#1 or SEC1).
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem = |what, path: &Path, detail: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        detail,
    };
    let certs = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| pem("cert_file", cert_file, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem("cert_file", cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(pem(
            "cert_file",
            cert_file,
            "no CERTIFICATE block".to_owned(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| pem("key_file", key_file, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The TLS listener: finished handshakes, as the server takes them.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
    acceptor: JoinHandle<()>,
}

/// The TLS listener over `listener` with `config` (see [`server_config`]).
pub fn tls_listener(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> TlsListener {
    let local = listener.local_addr();
    let (tx, ready) = mpsc::channel(READY_QUEUE);
    let acceptor = tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), tx));
    TlsListener {
        ready,
        local,
        acceptor,
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: say so, and let the moment pass.
                tracing::warn!(error = %e, "the TLS listener could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if ready.is_closed() {
            return;
        }
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on a TLS connection");
        }
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    // The server stopped meanwhile: the connection just closes.
                    let _ = ready.send((tls, addr)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(peer = %addr, error = %e, "a TLS handshake failed");
                }
                Err(_) => tracing::debug!(peer = %addr, "a TLS handshake took too long"),
            }
        });
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.local {
            Ok(addr) => Ok(*addr),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        let (tcp, _) = stream.io().get_ref();
        Connection::of(tcp, *stream.remote_addr())
    }
}
