//! HTTP/1.1 to the interpreter server over a port connection to `127.0.0.1:49999` inside the
//! sandbox's network namespace (`Dispatcher::open_port_anywhere`: the sandbox's executor opens
//! it, on this replica or on the one holding the sandbox, and `OpenedPort::into_stream` makes it
//! a byte stream):
//! one request per connection (`Connection: close`), the answer's head parsed by `httparse`,
//! its body read by `Content-Length`, chunks or to the close, and every byte of it bounded.
//! `/execute` answers NDJSON in chunks, which [`Exchange::next_line`] hands out line by line.

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Most bytes of one answer's head.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Bytes read from the stream at a time.
const READ_BYTES: usize = 64 * 1024;

/// Why an exchange with the server failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The request could not be sent (the connection closed, the sandbox went).
    #[error("the request could not be sent to the interpreter server: {0}")]
    Send(String),
    /// The connection ended with an error, or before the answer was whole.
    #[error("the interpreter server's connection ended: {0}")]
    Ended(String),
    /// What came back is not HTTP/1.1 as we read it.
    #[error("the interpreter server answered no valid HTTP: {0}")]
    Protocol(String),
    /// The answer is larger than the exchange may read.
    #[error("the interpreter server's answer passed {0} bytes")]
    TooLarge(u64),
}

/// How the answer's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    Close,
}

/// Where chunked decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before a chunk's size line.
    Size,
    /// Inside a chunk: its bytes still to come.
    Data(u64),
    /// After a chunk's bytes: its CRLF.
    End,
    /// After the last chunk (trailers, if any, are ignored).
    Done,
}

/// One request and its answer on one port connection.
pub struct Exchange {
    connection: DuplexStream,
    /// Bytes received and not yet decoded.
    raw: Vec<u8>,
    /// Decoded body bytes not yet handed out as a line.
    body: Vec<u8>,
    /// The answer's status.
    pub status: u16,
    framing: Framing,
    chunk: Chunk,
    /// Body bytes decoded so far (against `Framing::Length`).
    decoded: u64,
    /// Bytes received in all (against the bound).
    received: u64,
    bound: u64,
    eof: bool,
}

/// The request's bytes: `method path`, a JSON body when given, one request per connection.
fn request_bytes(method: &str, path: &str, body: Option<&serde_json::Value>) -> Vec<u8> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Accept: application/json, application/x-ndjson\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

impl Exchange {
    /// Sends the request on `connection` and reads the answer's head; at most `bound` bytes of
    /// answer are read in all.
    pub async fn send(
        mut connection: DuplexStream,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        bound: u64,
    ) -> Result<Exchange, HttpError> {
        connection
            .write_all(&request_bytes(method, path, body))
            .await
            .map_err(|e| HttpError::Send(e.to_string()))?;
        let mut exchange = Exchange {
            connection,
            raw: Vec::new(),
            body: Vec::new(),
            status: 0,
            framing: Framing::Close,
            chunk: Chunk::Size,
            decoded: 0,
            received: 0,
            bound,
            eof: false,
        };
        exchange.read_head().await?;
        Ok(exchange)
    }

    /// Reads the next bytes the server sent into `raw`; false at a clean end.
    async fn fill(&mut self) -> Result<bool, HttpError> {
        if self.eof {
            return Ok(false);
        }
        let mut buf = vec![0u8; READ_BYTES];
        match self.connection.read(&mut buf).await {
            Ok(0) => {
                self.eof = true;
                Ok(false)
            }
            Ok(n) => {
                self.received += n as u64;
                if self.received > self.bound {
                    return Err(HttpError::TooLarge(self.bound));
                }
                self.raw.extend_from_slice(&buf[..n]);
                Ok(true)
            }
            Err(why) => Err(HttpError::Ended(why.to_string())),
        }
    }

    async fn read_head(&mut self) -> Result<(), HttpError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.raw) {
                Ok(httparse::Status::Complete(length)) => {
                    self.status = response.code.unwrap_or(0);
                    self.framing = framing_of(response.headers)?;
                    self.raw.drain(..length);
                    return Ok(());
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Err(HttpError::Protocol(e.to_string())),
            }
            if self.raw.len() > MAX_HEAD_BYTES {
                return Err(HttpError::Protocol(format!(
                    "the answer's head passed {MAX_HEAD_BYTES} bytes"
                )));
            }
            if !self.fill().await? {
                return Err(HttpError::Ended("before the answer's head".to_owned()));
            }
        }
    }

    /// Decodes what `raw` holds into `body`; true once the body is whole.
    fn decode(&mut self) -> Result<bool, HttpError> {
        match self.framing {
            Framing::Close => {
                self.body.append(&mut self.raw);
                Ok(self.eof)
            }
            Framing::Length(total) => {
                let wanted = usize::try_from(total - self.decoded).unwrap_or(usize::MAX);
                let take = wanted.min(self.raw.len());
                self.body.extend(self.raw.drain(..take));
                self.decoded += take as u64;
                Ok(self.decoded == total)
            }
            Framing::Chunked => self.decode_chunks(),
        }
    }

    fn decode_chunks(&mut self) -> Result<bool, HttpError> {
        decode_chunks_into(&mut self.raw, &mut self.body, &mut self.chunk)
    }

    /// The next line of the body (without its newline); `None` once the body is whole and
    /// every line was handed out.
    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        loop {
            if let Some(at) = memchr_newline(&self.body) {
                let mut line: Vec<u8> = self.body.drain(..=at).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.decode()? {
                if let Some(at) = memchr_newline(&self.body) {
                    let mut line: Vec<u8> = self.body.drain(..=at).collect();
                    line.pop();
                    return Ok(Some(line));
                }
                if self.body.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.body)));
            }
            if !self.fill().await? {
                self.decode()?;
                if self.framing != Framing::Close && !self.whole() {
                    return Err(HttpError::Ended(
                        "before the answer's body was whole".to_owned(),
                    ));
                }
                if self.body.is_empty() {
                    return Ok(None);
                }
                let line = std::mem::take(&mut self.body);
                return Ok(Some(line));
            }
        }
    }

    /// The whole body.
    pub async fn body(mut self) -> Result<Vec<u8>, HttpError> {
        loop {
            if self.decode()? {
                return Ok(self.body);
            }
            if !self.fill().await? {
                self.decode()?;
                if self.framing != Framing::Close && !self.whole() {
                    return Err(HttpError::Ended(
                        "before the answer's body was whole".to_owned(),
                    ));
                }
                return Ok(self.body);
            }
        }
    }

    fn whole(&self) -> bool {
        match self.framing {
            Framing::Close => self.eof,
            Framing::Length(total) => self.decoded == total,
            Framing::Chunked => self.chunk == Chunk::Done,
        }
    }
}

fn framing_of(headers: &[httparse::Header<'_>]) -> Result<Framing, HttpError> {
    let value = |name: &str| {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    if value("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
        return Ok(Framing::Chunked);
    }
    match value("content-length") {
        Some(n) => n
            .parse()
            .map(Framing::Length)
            .map_err(|_| HttpError::Protocol(format!("Content-Length reads {n:?}"))),
        None => Ok(Framing::Close),
    }
}

/// Moves the chunk data `raw` holds into `body`, from where `chunk` says decoding is; true
/// after the last chunk.
fn decode_chunks_into(
    raw: &mut Vec<u8>,
    body: &mut Vec<u8>,
    chunk: &mut Chunk,
) -> Result<bool, HttpError> {
    loop {
        match *chunk {
            Chunk::Done => return Ok(true),
            Chunk::Size => {
                let Some(end) = find_crlf(raw) else {
                    return Ok(false);
                };
                let line = String::from_utf8_lossy(&raw[..end]).into_owned();
                let hex = line.split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(hex, 16).map_err(|_| {
                    HttpError::Protocol(format!("a chunk size line reads {line:?}"))
                })?;
                raw.drain(..end + 2);
                *chunk = if size == 0 {
                    Chunk::Done
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(left) => {
                if raw.is_empty() {
                    return Ok(false);
                }
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(raw.len());
                body.extend(raw.drain(..take));
                let left = left - take as u64;
                *chunk = if left == 0 {
                    Chunk::End
                } else {
                    Chunk::Data(left)
                };
            }
            Chunk::End => {
                if raw.len() < 2 {
                    return Ok(false);
                }
                if &raw[..2] != b"\r\n" {
                    return Err(HttpError::Protocol(
                        "a chunk does not end with CRLF".to_owned(),
                    ));
                }
                raw.drain(..2);
                *chunk = Chunk::Size;
            }
        }
    }
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}

fn memchr_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_anywhere_decode_to_the_same_lines() {
        let wire = b"7\r\n{\"a\":1}\r\n3\r\n\n{}\r\n1\r\n\n\r\n0\r\n\r\n";
        for split in 0..wire.len() {
            let mut raw = wire[..split].to_vec();
            let (mut body, mut chunk) = (Vec::new(), Chunk::Size);
            decode_chunks_into(&mut raw, &mut body, &mut chunk).expect("first part");
            raw.extend_from_slice(&wire[split..]);
            let done = decode_chunks_into(&mut raw, &mut body, &mut chunk).expect("second part");
            assert!(done, "split at {split}");
            assert_eq!(body, b"{\"a\":1}\n{}\n", "split at {split}");
        }
    }

    #[test]
    fn a_bad_chunk_size_and_a_missing_crlf_are_protocol_errors() {
        let (mut body, mut chunk) = (Vec::new(), Chunk::Size);
        assert!(decode_chunks_into(&mut b"zz\r\n".to_vec(), &mut body, &mut chunk).is_err());
        let (mut body, mut chunk) = (Vec::new(), Chunk::Size);
        assert!(decode_chunks_into(&mut b"1\r\nabc".to_vec(), &mut body, &mut chunk).is_err());
    }

    #[test]
    fn framing_follows_the_headers() {
        let h = |name: &'static str, value: &'static [u8]| httparse::Header { name, value };
        assert_eq!(
            framing_of(&[h("Transfer-Encoding", b"chunked")]).expect("framing"),
            Framing::Chunked
        );
        assert_eq!(
            framing_of(&[h("content-length", b"12")]).expect("framing"),
            Framing::Length(12)
        );
        assert_eq!(framing_of(&[]).expect("framing"), Framing::Close);
        assert!(framing_of(&[h("Content-Length", b"x")]).is_err());
    }

    #[test]
    fn the_request_names_its_length_and_closes() {
        let bytes = request_bytes("POST", "/execute", Some(&serde_json::json!({"code": "1"})));
        let text = String::from_utf8(bytes).expect("text");
        assert!(text.starts_with("POST /execute HTTP/1.1\r\n"), "{text}");
        assert!(text.contains("Connection: close\r\n"), "{text}");
        assert!(
            text.ends_with("Content-Length: 12\r\n\r\n{\"code\":\"1\"}"),
            "{text}"
        );
    }
}
