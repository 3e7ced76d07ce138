//! envd's plain HTTP `/files`: download one file (`GET`) and upload one or several
//! (`POST`, `multipart/form-data`, one part named `file` per file whose filename is its path,
//! or `application/octet-stream`). Both are streamed, and each file is ONE tool call through
//! the router (`tools::invoke_transfer`): a download is one `fs.read`, an upload one `fs.write`
//! per file, decided and audited once however large the file; its bytes travel beside the call
//! as blocks on the executor's channel (`fs.read_stream` / `fs.write_stream`: no base64, no
//! JSON per chunk), within the executor's credit, so nothing holds more than a few blocks of a
//! file in memory. An upload is parsed as it arrives ([`Multipart`]); a request carries at most
//! [`MAX_UPLOAD_BYTES`] (decompressed, for a `Content-Encoding: gzip` body, inflated as it
//! arrives). A file replaces its name only once its last byte arrived: an upload cut part way
//! (the client gone, a malformed body, a failed write) answers an error, or nothing when the
//! client left, and leaves the old file and no partial one. An upload's `X-Metadata-*` headers
//! are the files' user metadata, kept as their `user.e2b.*` extended attributes (so a file
//! written without any has none).
//!
//! The SDK's signed URLs (`download_url`, `upload_url`) are built with
//! `urljoin(E2B_SANDBOX_URL, "/files")`, which drops the `/e2b` prefix and sends no sandbox
//! headers: the node's root `/files` serves such signed requests too, finding the sandbox
//! whose envd token the signature was made with.

use std::collections::BTreeMap;
use std::io::Write as _;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use flate2::write::GzDecoder;
use futures_util::StreamExt;
use serde_json::json;

use aegis_e2b::api::ApiError;
use aegis_e2b::connect::{Code, ConnectError};
use aegis_e2b::envd::files::{upload_metadata, FilesQuery, WriteInfo, WriteKind};
use aegis_e2b::envd::signature::{self, Operation};

use super::envd::{self, Target};
use super::{api_error, json_response, store};
use aegis_tools::state::AppState;
use aegis_tools::tools::Transfer;
use dispatcher::protocol::RunAs;
use dispatcher::UploadPiece;

/// Largest upload request body (several files together); the sandbox's workspace size is the
/// other bound.
pub const MAX_UPLOAD_BYTES: usize = 1024 * 1024 * 1024;
/// Longest part headers of a multipart upload.
const MAX_PART_HEADERS: usize = 16 * 1024;
/// The largest chunk one tool call moves (a snapshot's restore writes files in chunks).
const MAX_CHUNK: u64 = 4 * 1024 * 1024;

/// Bytes one `fs.write` call of a snapshot's restore moves: [`MAX_CHUNK`], or the node's file
/// size limit when that is lower (the executor refuses more in one call).
pub fn chunk(state: &AppState) -> u64 {
    MAX_CHUNK.min(state.config.sandbox.max_file_bytes).max(1)
}
/// Most files one upload may carry.
const MAX_FILES: usize = 100;
/// Most secure sandboxes a signature is checked against.
const MAX_SIGNED_CANDIDATES: i64 = 10_000;

fn from_connect(e: ConnectError) -> ApiError {
    let status = match e.code {
        Code::NotFound => 404,
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::InvalidArgument => 400,
        Code::ResourceExhausted => 507,
        Code::Unavailable => 503,
        _ => 500,
    };
    ApiError::new(status, e.message)
}

/// The sandbox of a `/files` request (by its headers, or by a signed URL's signature), acting
/// as the user `username` names when it names one: root only where the sandbox allows it.
async fn target_of(
    state: &AppState,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: Operation,
) -> Result<Target, ApiError> {
    let user = query
        .username
        .as_deref()
        .map(envd::named_user)
        .transpose()
        .map_err(from_connect)?;
    let mut target = sandbox_of(state, headers, query, operation).await?;
    if let Some(user) = user {
        if user == RunAs::Root {
            let (allowed, isolation) = envd::root_of(state, target.id)
                .await
                .map_err(from_connect)?;
            if !allowed {
                return Err(from_connect(envd::root_refused(
                    &isolation,
                    target.caller.seal.is_some(),
                )));
            }
        }
        target.user = user;
    }
    Ok(target)
}

/// The sandbox of a `/files` request: by its headers, or by a signed URL's signature.
async fn sandbox_of(
    state: &AppState,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: Operation,
) -> Result<Target, ApiError> {
    if headers.contains_key(aegis_e2b::envd::headers::SANDBOX_ID) {
        // A paused sandbox, or one past its timeout: 502, as E2B's edge answers for it.
        return envd::resolve(state, headers).await.map_err(|e| match e {
            envd::Unserved::NotRunning(e) => ApiError::new(502, e.message),
            envd::Unserved::Refused(e) => from_connect(e),
        });
    }
    let (Some(sig), Some(path)) = (&query.signature, &query.path) else {
        return Err(ApiError::new(
            401,
            "this /files request names no sandbox: send E2b-Sandbox-Id and X-Access-Token, or use a signed URL",
        ));
    };
    let now = chrono::Utc::now().timestamp();
    let candidates = store::secure_sandboxes(&state.pool, MAX_SIGNED_CANDIDATES)
        .await
        .map_err(|_| ApiError::new(503, "the node's database is unavailable"))?;
    let mut expired = false;
    for (id, token) in candidates {
        let checked = signature::verify(
            path,
            operation,
            query.username.as_deref(),
            &token,
            sig,
            query.signature_expiration.as_deref(),
            now,
        );
        match checked {
            Ok(()) => {
                let mut with_token = HeaderMap::new();
                let id = HeaderValue::from_str(&id.to_string())
                    .map_err(|_| ApiError::new(500, "bad sandbox id"))?;
                with_token.insert(aegis_e2b::envd::headers::SANDBOX_ID, id);
                let token =
                    HeaderValue::from_str(&token).map_err(|_| ApiError::new(500, "bad token"))?;
                with_token.insert(aegis_e2b::envd::headers::ACCESS_TOKEN, token);
                return envd::target(state, &with_token).await.map_err(from_connect);
            }
            Err(signature::SignatureError::Expired) => expired = true,
            Err(signature::SignatureError::BadExpiration) => {
                return Err(ApiError::new(
                    401,
                    signature::SignatureError::BadExpiration.to_string(),
                ))
            }
            Err(signature::SignatureError::Invalid) => {}
        }
    }
    Err(ApiError::new(
        401,
        if expired {
            signature::SignatureError::Expired.to_string()
        } else {
            signature::SignatureError::Invalid.to_string()
        },
    ))
}

fn query_of(raw: Option<String>) -> Result<FilesQuery, ApiError> {
    FilesQuery::parse(raw.as_deref().unwrap_or(""))
}

/// Blocks of a download queued between the sandbox and the client.
const DOWNLOAD_QUEUE: usize = 4;
/// Bytes of an upload gathered before they go to the sandbox (one block).
const UPLOAD_PIECE: usize = dispatcher::protocol::MAX_BLOCK;

/// `GET /files?path=`: the file's bytes, streamed as the sandbox sends them (one `fs.read`).
pub async fn download(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = match query_of(raw) {
        Ok(q) => q,
        Err(e) => return api_error(e),
    };
    let (target, path) = match source(&state, &headers, &query).await {
        Ok(found) => found,
        Err(e) => return api_error(e),
    };
    let (sink, mut blocks) = tokio::sync::mpsc::channel::<Bytes>(DOWNLOAD_QUEUE);
    // Its own task: a client that leaves drops the queue, which cancels the read (and the
    // call's audit row says so).
    let call = crate::spawn_labelled(async move {
        envd::call_transfer(
            &state,
            &target,
            "fs.read",
            json!({ "path": path }),
            Transfer::Download(sink),
        )
        .await
    });
    // The first bytes, or the call's end, before the answer starts: a refusal is an HTTP error.
    let Some(first) = blocks.recv().await else {
        return match finished(call).await {
            Ok(()) => (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                )],
                Body::empty(),
            )
                .into_response(),
            Err(e) => api_error(e),
        };
    };
    let rest =
        futures_util::stream::unfold((blocks, Some(call)), |(mut blocks, call)| async move {
            if let Some(bytes) = blocks.recv().await {
                return Some((Ok(bytes), (blocks, call)));
            }
            // The answer has started: a failure cuts the transfer, which the client sees.
            match finished(call?).await {
                Ok(()) => None,
                Err(e) => Some((Err(std::io::Error::other(e.message)), (blocks, None))),
            }
        });
    let body = futures_util::stream::once(async move { Ok(first) }).chain(rest);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        Body::from_stream(body),
    )
        .into_response()
}

/// How a transfer's call ended.
async fn finished(
    call: tokio::task::JoinHandle<Result<serde_json::Value, ConnectError>>,
) -> Result<(), ApiError> {
    match call.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(from_connect(e)),
        Err(e) => Err(ApiError::new(500, format!("the file transfer failed: {e}"))),
    }
}

async fn source(
    state: &AppState,
    headers: &HeaderMap,
    query: &FilesQuery,
) -> Result<(Target, String), ApiError> {
    let target = target_of(state, headers, query, Operation::Read).await?;
    let path = query
        .path
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("path is required"))?;
    let path = envd::absolute(path).map_err(from_connect)?;
    Ok((target, path))
}

/// `POST /files`: writes every `file` part; answers the written files.
pub async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
    body: Body,
) -> Response {
    let query = match query_of(raw) {
        Ok(q) => q,
        Err(e) => return api_error(e),
    };
    match write(&state, &headers, &query, body).await {
        Ok(written) => match serde_json::to_vec(&written) {
            Ok(body) => json_response(StatusCode::OK, body),
            Err(e) => api_error(ApiError::new(500, e.to_string())),
        },
        Err(e) => api_error(e),
    }
}

async fn write(
    state: &AppState,
    headers: &HeaderMap,
    query: &FilesQuery,
    body: Body,
) -> Result<Vec<WriteInfo>, ApiError> {
    let target = target_of(state, headers, query, Operation::Write).await?;
    // Without the sandbox's headers the request was let in by a signed URL, which authorises
    // one file: its path, whatever the parts' filenames say.
    let signed = (!headers.contains_key(aegis_e2b::envd::headers::SANDBOX_ID))
        .then(|| query.path.clone())
        .flatten();
    let metadata = upload_metadata(
        headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
    )?;
    let mut inflate = gzipped(headers)?.then(|| GzDecoder::new(Vec::new()));
    // The media type is matched without case; the boundary is kept as sent (it is
    // case-sensitive: `XyZ` is not `xyz`).
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = content_type.to_ascii_lowercase();
    let mut parser = if media_type.starts_with("multipart/form-data") {
        Some(Multipart::new(&boundary(content_type)?))
    } else if media_type.starts_with("application/octet-stream") {
        None
    } else {
        return Err(ApiError::bad_request(
            "Content-Type must be multipart/form-data or application/octet-stream",
        ));
    };
    let mut writer = Writer {
        state,
        target: &target,
        metadata,
        file: None,
        written: Vec::new(),
        signed,
        held: false,
    };
    if parser.is_none() {
        let path = query
            .path
            .clone()
            .ok_or_else(|| ApiError::bad_request("path is required"))?;
        writer.start(&path)?;
    }
    let too_large = || ApiError::new(413, format!("upload larger than {MAX_UPLOAD_BYTES} bytes"));
    let malformed = |e: std::io::Error| ApiError::bad_request(format!("malformed gzip body: {e}"));
    let mut stream = body.into_data_stream();
    let (mut received, mut inflated) = (0usize, 0usize);
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        received += piece.len();
        if received > MAX_UPLOAD_BYTES {
            return Err(too_large());
        }
        let Some(decoder) = inflate.as_mut() else {
            feed(&mut writer, parser.as_mut(), query, &piece).await?;
            continue;
        };
        // A little at a time: a small compressed piece can inflate a thousandfold.
        for slice in piece.chunks(INFLATE_SLICE) {
            decoder.write_all(slice).map_err(malformed)?;
            let out = std::mem::take(decoder.get_mut());
            inflated += out.len();
            if inflated > MAX_UPLOAD_BYTES {
                return Err(too_large());
            }
            feed(&mut writer, parser.as_mut(), query, &out).await?;
        }
    }
    if let Some(decoder) = inflate {
        let rest = decoder.finish().map_err(malformed)?;
        if inflated + rest.len() > MAX_UPLOAD_BYTES {
            return Err(too_large());
        }
        feed(&mut writer, parser.as_mut(), query, &rest).await?;
    }
    match parser {
        None => writer.finish().await?,
        Some(parser) if !parser.is_done() => {
            return Err(ApiError::bad_request(
                "malformed multipart body: it ends before its closing boundary",
            ))
        }
        // A signed upload's one file, held until the body proved it holds no other.
        Some(_) if writer.held => writer.finish().await?,
        Some(_) => {}
    }
    Ok(writer.written)
}

/// Compressed bytes inflated in one step (at most about a thousand times as many come out).
const INFLATE_SLICE: usize = 4096;

/// Whether an upload's body is gzip (`Content-Encoding: gzip`, what the SDK sends when asked
/// for `gzip`); a coding other than gzip or identity is refused.
fn gzipped(headers: &HeaderMap) -> Result<bool, ApiError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    let coding = value.to_str().unwrap_or("?").trim().to_ascii_lowercase();
    match coding.as_str() {
        "" | "identity" => Ok(false),
        "gzip" | "x-gzip" => Ok(true),
        _ => Err(ApiError::new(
            415,
            format!("Content-Encoding {coding:?} is not accepted: gzip or identity"),
        )),
    }
}

/// Hands bytes of the (decoded) body on: to the one file an octet-stream upload writes, or to
/// the multipart parser and the files it finds.
async fn feed(
    writer: &mut Writer<'_>,
    parser: Option<&mut Multipart>,
    query: &FilesQuery,
    bytes: &[u8],
) -> Result<(), ApiError> {
    let Some(parser) = parser else {
        return writer.data(bytes).await;
    };
    for event in parser.feed(bytes)? {
        match event {
            Event::Start { .. } if writer.signed.is_some() => {
                if writer.file.is_some() || writer.held || !writer.written.is_empty() {
                    return Err(ApiError::new(
                        403,
                        format!(
                            "a signed upload URL authorises one file, {:?}: this body holds a \
                             second part, so nothing more is written (send several files with the \
                             sandbox's access token instead)",
                            writer.signed.as_deref().unwrap_or_default()
                        ),
                    ));
                }
                let path = writer.signed.clone().unwrap_or_default();
                writer.start(&path)?;
            }
            Event::Data(bytes) if writer.held => {
                if !bytes.is_empty() {
                    return Err(ApiError::bad_request(
                        "malformed multipart body: data after its part ended",
                    ));
                }
            }
            // The signed file's last chunk waits for the body's end: a second part refuses
            // the whole request before it is written.
            Event::End if writer.signed.is_some() => writer.held = true,
            Event::Start { filename } => {
                let path = match (&query.path, filename) {
                    (Some(p), _) if writer.written.is_empty() => p.clone(),
                    (_, Some(f)) => f,
                    (_, None) => {
                        return Err(ApiError::bad_request(
                            "a file part has no filename and the query no path",
                        ))
                    }
                };
                if writer.written.len() == MAX_FILES {
                    return Err(ApiError::bad_request(format!(
                        "more than {MAX_FILES} files in one upload"
                    )));
                }
                writer.start(&path)?;
            }
            Event::Data(bytes) => writer.data(&bytes).await?,
            Event::End => writer.finish().await?,
        }
    }
    Ok(())
}

/// The file an upload is writing: its path, the bytes not yet sent, and its call once the
/// first bytes went.
struct Open {
    path: String,
    pending: Vec<u8>,
    sending: Option<Sending>,
}

/// One file's `fs.write` in flight: its bytes go to `source`; dropped before
/// [`UploadPiece::End`], it abandons the write and nothing replaces the name.
struct Sending {
    source: tokio::sync::mpsc::Sender<UploadPiece>,
    call: tokio::task::JoinHandle<Result<serde_json::Value, ConnectError>>,
}

/// Writes the files of an upload, each as one `fs.write` through the router whose bytes
/// follow as a transfer; the upload's metadata (`X-Metadata-*`) replaces each file's old
/// metadata.
struct Writer<'a> {
    state: &'a AppState,
    target: &'a Target,
    metadata: BTreeMap<String, String>,
    file: Option<Open>,
    written: Vec<WriteInfo>,
    /// The one path a signed URL authorises (absent: the sandbox's access token was sent,
    /// which authorises any number of files).
    signed: Option<String>,
    /// A signed upload's file ended; it is completed once the body proved it holds no other.
    held: bool,
}

impl Writer<'_> {
    fn start(&mut self, path: &str) -> Result<(), ApiError> {
        let path = envd::absolute(path).map_err(from_connect)?;
        self.file = Some(Open {
            path,
            pending: Vec::new(),
            sending: None,
        });
        Ok(())
    }

    async fn data(&mut self, mut bytes: &[u8]) -> Result<(), ApiError> {
        while !bytes.is_empty() {
            let Some(file) = self.file.as_mut() else {
                return Ok(());
            };
            let room = UPLOAD_PIECE - file.pending.len();
            let take = room.min(bytes.len());
            file.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if file.pending.len() == UPLOAD_PIECE {
                self.send_pending().await?;
            }
        }
        Ok(())
    }

    /// Starts the current file's call if it has not started.
    fn open(&mut self) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if file.sending.is_some() {
            return;
        }
        let (source, pieces) = tokio::sync::mpsc::channel(2);
        let mut args = json!({"path": file.path, "content": ""});
        if !self.metadata.is_empty() {
            args["metadata"] = json!(self.metadata);
        }
        let (state, target) = (self.state.clone(), self.target.clone());
        // Its own task, so the router's call runs while this one reads the body; if this
        // request ends early the queue's sender is dropped, which abandons the write.
        let call = crate::spawn_labelled(async move {
            envd::call_transfer(&state, &target, "fs.write", args, Transfer::Upload(pieces)).await
        });
        file.sending = Some(Sending { source, call });
    }

    async fn send_pending(&mut self) -> Result<(), ApiError> {
        self.open();
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let bytes = Bytes::from(std::mem::take(&mut file.pending));
        let Some(sending) = file.sending.as_ref() else {
            return Ok(());
        };
        if sending.source.send(UploadPiece::Data(bytes)).await.is_err() {
            // The call ended before the file did: refused (the path), or failed.
            return Err(self.ended_early().await);
        }
        Ok(())
    }

    /// The error of a call that stopped taking bytes.
    async fn ended_early(&mut self) -> ApiError {
        let Some(sending) = self.file.as_mut().and_then(|f| f.sending.take()) else {
            return ApiError::new(500, "the upload's call is gone");
        };
        drop(sending.source);
        match finished(sending.call).await {
            Err(e) => e,
            Ok(()) => ApiError::new(500, "the upload's call ended before the file did"),
        }
    }

    async fn finish(&mut self) -> Result<(), ApiError> {
        if self.file.is_none() {
            return Ok(());
        }
        if self.file.as_ref().is_some_and(|f| !f.pending.is_empty()) {
            self.send_pending().await?;
        }
        self.open();
        let Some(sending) = self.file.as_mut().and_then(|f| f.sending.take()) else {
            return Ok(());
        };
        if sending.source.send(UploadPiece::End).await.is_err() {
            drop(sending.source);
            return finished(sending.call).await;
        }
        drop(sending.source);
        finished(sending.call).await?;
        if let Some(file) = self.file.take() {
            let name = file.path.rsplit('/').next().unwrap_or_default().to_owned();
            self.written.push(WriteInfo {
                path: file.path,
                name,
                kind: WriteKind::File,
                metadata: (!self.metadata.is_empty()).then(|| self.metadata.clone()),
            });
        }
        Ok(())
    }
}

fn boundary(content_type: &str) -> Result<String, ApiError> {
    content_type
        .split(';')
        .skip(1)
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_owned())
        .filter(|b| !b.is_empty() && b.len() <= 200)
        .ok_or_else(|| ApiError::bad_request("multipart/form-data without a boundary"))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// What a multipart body holds, in order.
#[derive(Debug, PartialEq)]
enum Event {
    /// A `file` part begins (its filename, the target path, if given).
    Start { filename: Option<String> },
    /// Bytes of the current `file` part.
    Data(Vec<u8>),
    /// The current `file` part ended.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    /// Before the first boundary.
    Preamble,
    /// After a boundary: its line end or the closing `--`.
    AfterBoundary,
    Headers,
    Body {
        file: bool,
    },
    Done,
}

/// A `multipart/form-data` body parsed as it arrives, holding back only what could be the
/// start of a boundary.
struct Multipart {
    /// `\r\n--<boundary>`.
    delimiter: Vec<u8>,
    buf: Vec<u8>,
    stage: Stage,
}

impl Multipart {
    fn new(boundary: &str) -> Self {
        Multipart {
            delimiter: format!("\r\n--{boundary}").into_bytes(),
            buf: Vec::new(),
            stage: Stage::Preamble,
        }
    }

    fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    fn feed(&mut self, piece: &[u8]) -> Result<Vec<Event>, ApiError> {
        let bad = |what: &str| ApiError::bad_request(format!("malformed multipart body: {what}"));
        self.buf.extend_from_slice(piece);
        let mut events = Vec::new();
        loop {
            match self.stage {
                Stage::Preamble => {
                    // The body opens with the boundary itself (no line end before it).
                    let opening = &self.delimiter[2..];
                    match find(&self.buf, opening) {
                        Some(at) => {
                            self.buf.drain(..at + opening.len());
                            self.stage = Stage::AfterBoundary;
                        }
                        None if self.buf.len() > MAX_PART_HEADERS => {
                            return Err(bad("no boundary at its start"))
                        }
                        None => return Ok(events),
                    }
                }
                Stage::AfterBoundary => {
                    if self.buf.len() < 2 {
                        return Ok(events);
                    }
                    let mark: Vec<u8> = self.buf.drain(..2).collect();
                    self.stage = match mark.as_slice() {
                        b"\r\n" => Stage::Headers,
                        b"--" => Stage::Done,
                        _ => return Err(bad("a boundary is not followed by a line end")),
                    };
                }
                Stage::Headers => match find(&self.buf, b"\r\n\r\n") {
                    Some(end) => {
                        let head = std::str::from_utf8(&self.buf[..end])
                            .map_err(|_| bad("part headers are not UTF-8"))?
                            .to_owned();
                        self.buf.drain(..end + 4);
                        let (name, filename) = disposition(&head);
                        let file = name.as_deref() == Some("file");
                        if file {
                            events.push(Event::Start { filename });
                        }
                        self.stage = Stage::Body { file };
                    }
                    None if self.buf.len() > MAX_PART_HEADERS => {
                        return Err(bad("part headers are too long"))
                    }
                    None => return Ok(events),
                },
                Stage::Body { file } => match find(&self.buf, &self.delimiter) {
                    Some(at) => {
                        let data: Vec<u8> = self.buf.drain(..at).collect();
                        self.buf.drain(..self.delimiter.len());
                        if file {
                            if !data.is_empty() {
                                events.push(Event::Data(data));
                            }
                            events.push(Event::End);
                        }
                        self.stage = Stage::AfterBoundary;
                    }
                    None => {
                        // Keep what could be the start of the delimiter.
                        let keep = self.delimiter.len() - 1;
                        if self.buf.len() > keep {
                            let data: Vec<u8> = self.buf.drain(..self.buf.len() - keep).collect();
                            if file {
                                events.push(Event::Data(data));
                            }
                        }
                        return Ok(events);
                    }
                },
                Stage::Done => {
                    self.buf.clear();
                    return Ok(events);
                }
            }
        }
    }
}

/// The `name` and `filename` of a part's `Content-Disposition`.
fn disposition(head: &str) -> (Option<String>, Option<String>) {
    let line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
        .unwrap_or("");
    let param = |name: &str| -> Option<String> {
        line.split(';').skip(1).find_map(|p| {
            let (k, v) = p.split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"').to_owned())
        })
    };
    (param("name"), param("filename"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(body: &[u8], size: usize) -> Result<(Vec<Event>, bool), ApiError> {
        let mut parser = Multipart::new("XyZ");
        let mut events = Vec::new();
        for piece in body.chunks(size) {
            events.extend(parser.feed(piece)?);
        }
        // Adjacent data events are one file's bytes, however the body was cut.
        let mut merged: Vec<Event> = Vec::new();
        for e in events {
            match (merged.last_mut(), e) {
                (Some(Event::Data(have)), Event::Data(more)) => have.extend(more),
                (_, e) => merged.push(e),
            }
        }
        Ok((merged, parser.is_done()))
    }

    #[test]
    fn multipart_bodies_are_split_however_they_arrive_and_malformed_ones_refused() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
Content-Type: application/octet-stream\r\n\r\nhello\r\n--XyZ\r\n\
Content-Disposition: form-data; name=\"other\"\r\n\r\nignored\r\n--XyZ\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"dir/b.bin\"\r\n\r\n\x00\x01\r\n-\r\n--XyZ--\r\n";
        let want = vec![
            Event::Start {
                filename: Some("a.txt".into()),
            },
            Event::Data(b"hello".to_vec()),
            Event::End,
            Event::Start {
                filename: Some("dir/b.bin".into()),
            },
            Event::Data(b"\x00\x01\r\n-".to_vec()),
            Event::End,
        ];
        for size in [1, 2, 3, 7, 64, body.len()] {
            let (events, done) = parse_in_pieces(body, size).unwrap();
            assert_eq!(events, want, "pieces of {size}");
            assert!(done);
        }
        let (_, done) = parse_in_pieces(&body[..body.len() - 12], 5).unwrap();
        assert!(!done, "a body cut before its closing boundary is not done");
        assert!(parse_in_pieces(b"--XyZ\r\nx: y\r\n\r\nabc\r\n--XyZxx", 4).is_err());
        assert!(parse_in_pieces(&vec![b'a'; MAX_PART_HEADERS + 10], 100).is_err());
        assert_eq!(
            boundary("multipart/form-data; boundary=\"ab c\"").unwrap(),
            "ab c"
        );
        assert!(boundary("multipart/form-data").is_err());
        // The parameter's name is matched without case, its value kept as sent.
        assert_eq!(
            boundary("Multipart/Form-Data; BOUNDARY=XyZ").unwrap(),
            "XyZ"
        );
    }
}
