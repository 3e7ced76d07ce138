//! `port.*`: TCP connections to ports inside the sandbox, relayed over the executor's channel.
//!
//! The node reaches a server an agent started (`python3 -m http.server 8000`) without the
//! sandbox having a network interface beyond loopback and without a port published on the
//! host: the executor, which runs in the sandbox's network namespace, connects to
//! `127.0.0.1:<port>` and carries the bytes. Only loopback is ever dialled (the request names a
//! port, not an address), by the executor itself: commands stay under their Landlock domain,
//! which refuses them TCP connections without egress.
//!
//! Each connection has a reader thread that forwards what the server sends as `port_data`
//! events, never more than the credit the node granted (`port.ack`), so one slow client cannot
//! fill the channel that tool calls share; then one `port_end`. Writes go on the request's own
//! thread, bounded in size and time like `proc.input`. At most [`MAX_CONNECTIONS`] at once.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::context::Context;
use crate::encoding::{self, base64_encode};
use crate::error::{OpError, OpResult};
use crate::protocol::{
    Empty, Encoding, ErrorKind, Event, EventBody, PortAckParams, PortCloseParams, PortOpenParams,
    PortOpenResult, PortShutdown, PortWriteParams,
};
use crate::running::{Connection, Credit};

/// Open port connections per sandbox: each holds a thread, which counts against the sandbox's
/// pids limit (256 by default), so a flood of connections cannot take all of them.
pub const MAX_CONNECTIONS: usize = 64;
/// Bytes sent before the node's first ack (and the most credit a connection holds).
pub const WINDOW: u64 = 256 * 1024;
/// Most bytes of one `port_data` event.
const CHUNK: usize = 64 * 1024;
/// Most bytes of one `port.write`.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;
/// How long a connect may take (loopback: refused or accepted at once unless the backlog is full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a write may wait for a server that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// `port.open`: connects to the port on loopback and starts forwarding its bytes as events of
/// `id`.
pub fn open(ctx: &Arc<Context>, id: u64, params: PortOpenParams) -> OpResult<PortOpenResult> {
    let port = params.port;
    if port == 0 {
        return Err(OpError::invalid("port: 0 is not a port (1..=65535)"));
    }
    if ctx.ports.lock().len() >= MAX_CONNECTIONS {
        return Err(OpError::new(
            ErrorKind::LimitReached,
            format!("{MAX_CONNECTIONS} port connections are open in this sandbox (its limit)"),
        ));
    }
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let stream =
        TcpStream::connect_timeout(&address, CONNECT_TIMEOUT).map_err(|e| match e.kind() {
            IoKind::ConnectionRefused => OpError::new(
                ErrorKind::NotFound,
                format!("nothing listens on port {port} in the sandbox"),
            ),
            IoKind::TimedOut | IoKind::WouldBlock => OpError::new(
                ErrorKind::Busy,
                format!("port {port} did not accept within {CONNECT_TIMEOUT:?}"),
            ),
            _ => OpError::new(ErrorKind::Io, format!("connecting to port {port}: {e}")),
        })?;
    let setup = |e: std::io::Error| OpError::new(ErrorKind::Io, format!("port {port}: {e}"));
    stream.set_nodelay(true).map_err(setup)?;
    stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(setup)?;
    let reading = stream.try_clone().map_err(setup)?;
    let connection = Arc::new(Connection {
        port,
        stream,
        credit: Mutex::new(Credit {
            available: WINDOW,
            closed: false,
        }),
        granted: Condvar::new(),
        writing: Mutex::new(()),
    });
    ctx.ports.lock().insert(id, Arc::clone(&connection));
    let thread_ctx = Arc::clone(ctx);
    let spawned = std::thread::Builder::new()
        .name(format!("port-{port}"))
        .spawn(move || forward(&thread_ctx, id, &connection, reading));
    if let Err(e) = spawned {
        if let Some(connection) = ctx.ports.lock().remove(&id) {
            let _ = connection.stream.shutdown(Shutdown::Both);
        }
        return Err(OpError::new(
            ErrorKind::Busy,
            format!("cannot start the thread of a port connection: {e}"),
        ));
    }
    Ok(PortOpenResult { window: WINDOW })
}

/// The reader thread: the server's bytes as events within the credit, then the end.
fn forward(ctx: &Context, id: u64, connection: &Connection, mut reading: TcpStream) {
    let mut buf = vec![0u8; CHUNK];
    let error = loop {
        let Some(room) = connection.wait_credit(CHUNK) else {
            break None;
        };
        match reading.read(&mut buf[..room]) {
            Ok(0) => break None,
            Ok(n) => {
                {
                    let mut credit = connection.credit();
                    credit.available = credit.available.saturating_sub(n as u64);
                }
                ctx.events.event(&Event {
                    event: id,
                    body: EventBody::PortData {
                        data: base64_encode(&buf[..n]),
                    },
                });
            }
            Err(e) if e.kind() == IoKind::Interrupted => {}
            // A close by the node shows here as a reset or a read of nothing: not a failure.
            Err(_) if connection.credit().closed => break None,
            Err(e) => break Some(format!("reading port {}: {e}", connection.port)),
        }
    };
    ctx.ports.lock().remove(&id);
    let _ = connection.stream.shutdown(Shutdown::Both);
    ctx.events.event(&Event {
        event: id,
        body: EventBody::PortEnd { error },
    });
}

/// `port.write`: all the bytes go to the server, or an error says why not.
pub fn write(ctx: &Context, params: PortWriteParams) -> OpResult<Empty> {
    let bytes = encoding::decode(params.data, Encoding::Base64, "data")?;
    if bytes.len() > MAX_WRITE_BYTES {
        return Err(OpError::new(
            ErrorKind::TooLarge,
            format!(
                "{} bytes are over the {MAX_WRITE_BYTES}-byte limit of one port.write",
                bytes.len()
            ),
        ));
    }
    let connection = ctx.ports.get(params.target)?;
    let _writing = connection
        .writing
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    (&connection.stream).write_all(&bytes).map_err(|e| {
        let kind = if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) {
            ErrorKind::Busy
        } else {
            ErrorKind::Io
        };
        OpError::new(kind, format!("writing to port {}: {e}", connection.port))
    })?;
    Ok(Empty {})
}

/// `port.ack`: the node handed on `bytes` more; the reader may send as many again.
pub fn ack(ctx: &Context, params: PortAckParams) -> OpResult<Empty> {
    let connection = ctx.ports.get(params.target)?;
    let mut credit = connection.credit();
    credit.available = credit.available.saturating_add(params.bytes).min(WINDOW);
    connection.granted.notify_all();
    Ok(Empty {})
}

/// `port.close`: the node's direction only, or the whole connection (its `port_end` follows).
pub fn close(ctx: &Context, params: PortCloseParams) -> OpResult<Empty> {
    let connection = ctx.ports.get(params.target)?;
    match params.how {
        PortShutdown::Write => {
            let _ = connection.stream.shutdown(Shutdown::Write);
        }
        PortShutdown::Both => {
            connection.credit().closed = true;
            connection.granted.notify_all();
            let _ = connection.stream.shutdown(Shutdown::Both);
        }
    }
    Ok(Empty {})
}
