//! A TCP forwarder that a test can cut and restore, to make a dependency vanish and come back.
//!
//! Cutting closes the listener and resets every forwarded connection, which is what a client
//! sees when the server process stops; restoring listens again on the same port.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// A cuttable forwarder from `addr` to `target`.
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    target: SocketAddr,
    running: Arc<Mutex<Option<CancellationToken>>>,
}

impl TcpProxy {
    /// A forwarder in front of the database at `url`; (the forwarder, the URL that reaches the
    /// database through it).
    pub async fn before_database(url: &str) -> (Self, String) {
        let mut url = url::Url::parse(url).expect("a database URL");
        let host = url.host_str().expect("a database host");
        let target = format!("{host}:{}", url.port().unwrap_or(5432));
        let target = tokio::net::lookup_host(&target)
            .await
            .expect("the database host resolves")
            .next()
            .expect("an address for the database host");
        let proxy = Self::start(target).await;
        url.set_port(Some(proxy.addr.port())).expect("a port");
        url.set_host(Some("127.0.0.1")).expect("a host");
        (proxy, url.into())
    }

    /// Listens on a random loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let proxy = Self {
            addr,
            target,
            running: Arc::new(Mutex::new(None)),
        };
        proxy.serve(listener).await;
        proxy
    }

    async fn serve(&self, listener: TcpListener) {
        let token = CancellationToken::new();
        *self.running.lock().await = Some(token.clone());
        let target = self.target;
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let token = token.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
    }

    /// Closes the listener and every forwarded connection.
    pub async fn cut(&self) {
        if let Some(t) = self.running.lock().await.take() {
            t.cancel();
        }
        // Give the accept loop a moment to drop its listener so the port is closed.
        tokio::task::yield_now().await;
    }

    /// Listens again on the same port.
    pub async fn restore(&self) {
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        };
        self.serve(listener).await;
    }
}
