//! Hosts on loopback for the egress tests: a web host a sandbox may be allowed to reach, and a
//! trap that only counts the connections that reached it (nothing may).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

/// An HTTP host on 127.0.0.2 (loopback /8 is local on Linux) answering `GET /` with `text`.
pub async fn web_host(text: &'static str) -> SocketAddr {
    counted_web_host(SocketAddr::from(([127, 0, 0, 2], 0)), text)
        .await
        .0
}

/// An HTTP host on `bind` answering `GET /` with `text` that counts the connections it
/// accepted; (its address, the count).
pub async fn counted_web_host(
    bind: SocketAddr,
    text: &'static str,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let (listener, addr) = listen(bind).await;
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = Router::new().route("/", get(move || async move { text }));
    let listener = axum::serve::ListenerExt::tap_io(listener, move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

/// A listener on `bind`, and the address it got.
async fn listen<A>(bind: A) -> (TcpListener, SocketAddr)
where
    A: tokio::net::ToSocketAddrs + std::fmt::Display + Copy,
{
    let listener = TcpListener::bind(bind)
        .await
        .unwrap_or_else(|e| panic!("bind {bind}: {e}"));
    let addr = listener.local_addr().expect("addr");
    (listener, addr)
}

/// A listener on 127.0.0.1 that answers nothing and counts the connections it accepted.
pub async fn trap() -> (SocketAddr, Arc<AtomicUsize>) {
    counting_listener("127.0.0.1:0").await
}

/// A listener on `bind` (`0.0.0.0:0`: a service of the Docker host on every interface) that
/// answers nothing and counts the connections it accepted.
pub async fn counting_listener(bind: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let (listener, addr) = listen(bind).await;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (addr, accepted)
}

/// Serves `app` on `listener` in the background, for the rest of the test.
pub fn spawn_server(listener: TcpListener, app: Router) {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
}

/// `app` served on a free port of 127.0.0.1; its address.
pub async fn served_on_loopback(app: Router) -> SocketAddr {
    let (listener, addr) = listen("127.0.0.1:0").await;
    spawn_server(listener, app);
    addr
}
