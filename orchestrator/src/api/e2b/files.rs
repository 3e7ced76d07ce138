//! envd's plain HTTP `/files`: download one file (`GET`) and upload one or several
//! (`POST`, `multipart/form-data`, one part named `file` per file whose filename is its path).
//! Each file is one `fs.read` or `fs.write` through the router, so both are decided and
//! audited like any other file call; a file is therefore bounded by the executor's file size
//! limit (`sandbox.max_file_bytes`), and a request body by [`MAX_UPLOAD_BYTES`], read
//! incrementally and refused as soon as it passes the bound.
//!
//! The SDK's signed URLs (`download_url`, `upload_url`) are built with
//! `urljoin(E2B_SANDBOX_URL, "/files")`, which drops the `/e2b` prefix and sends no sandbox
//! headers: the node's root `/files` serves only such signed requests, finding the sandbox
//! whose envd token the signature was made with.

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::json;

use aegis_e2b::api::ApiError;
use aegis_e2b::connect::{Code, ConnectError};
use aegis_e2b::envd::files::{FilesQuery, WriteInfo, WriteKind};
use aegis_e2b::envd::signature::{self, Operation};

use super::envd::{self, Target};
use super::{api_error, json_response, store};
use crate::state::AppState;

/// Largest upload request body (several files together).
pub const MAX_UPLOAD_BYTES: usize = 64 * 1024 * 1024;
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

/// The sandbox of a `/files` request: by its headers, or by a signed URL's signature.
async fn target_of(
    state: &AppState,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: Operation,
) -> Result<Target, ApiError> {
    if let Some(user) = &query.username {
        envd::named_user(user).map_err(from_connect)?;
    }
    if headers.contains_key(aegis_e2b::envd::headers::SANDBOX_ID) {
        return envd::target(state, headers).await.map_err(from_connect);
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

/// `GET /files?path=`: the file's bytes.
pub async fn download(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let query = match query_of(raw) {
        Ok(q) => q,
        Err(e) => return api_error(e),
    };
    match read(&state, &headers, &query).await {
        Ok(bytes) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            bytes,
        )
            .into_response(),
        Err(e) => api_error(e),
    }
}

async fn read(
    state: &AppState,
    headers: &HeaderMap,
    query: &FilesQuery,
) -> Result<Vec<u8>, ApiError> {
    let target = target_of(state, headers, query, Operation::Read).await?;
    let path = query
        .path
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("path is required"))?;
    let path = envd::absolute(path).map_err(from_connect)?;
    let out = envd::call(state, &target, "fs.read", json!({"path": path}))
        .await
        .map_err(from_connect)?;
    if out["truncated"] == true {
        return Err(ApiError::new(
            413,
            format!(
                "{path} is {} bytes, larger than this node's file size limit; it is not sent cut short",
                out["size_bytes"]
            ),
        ));
    }
    let content = out["content"].as_str().unwrap_or_default();
    if out["encoding"] == "base64" {
        base64::engine::general_purpose::STANDARD
            .decode(content)
            .map_err(|_| ApiError::new(500, "the sandbox sent malformed base64"))
    } else {
        Ok(content.as_bytes().to_vec())
    }
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
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let body = bounded_body(body).await?;
    let files: Vec<(String, Bytes)> = if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        let boundary = boundary(content_type)?;
        let parts = multipart(&body, &boundary)?;
        let single = parts.len() == 1;
        parts
            .into_iter()
            .map(|(filename, bytes)| {
                let path = match (&query.path, filename) {
                    (Some(p), _) if single => p.clone(),
                    (_, Some(f)) => f,
                    (Some(p), None) => p.clone(),
                    (None, None) => {
                        return Err(ApiError::bad_request(
                            "a file part has no filename and the query no path",
                        ))
                    }
                };
                Ok((path, bytes))
            })
            .collect::<Result<_, _>>()?
    } else if content_type.starts_with("application/octet-stream") {
        let path = query
            .path
            .clone()
            .ok_or_else(|| ApiError::bad_request("path is required"))?;
        vec![(path, body)]
    } else {
        return Err(ApiError::bad_request(
            "Content-Type must be multipart/form-data or application/octet-stream",
        ));
    };
    let limit = state.config.sandbox.max_file_bytes;
    if let Some((path, bytes)) = files.iter().find(|(_, b)| b.len() as u64 > limit) {
        return Err(ApiError::new(
            413,
            format!(
                "{path}: {} bytes is larger than this node's file size limit of {limit} bytes \
                 (sandbox.max_file_bytes); nothing was written",
                bytes.len()
            ),
        ));
    }
    let mut written = Vec::with_capacity(files.len());
    for (path, bytes) in files {
        let path = envd::absolute(&path).map_err(from_connect)?;
        // Text goes as text; anything else as base64, whose size is bounded (4/3), where JSON
        // would escape each control byte into six.
        let text = std::str::from_utf8(&bytes)
            .ok()
            .filter(|t| !t.bytes().any(|b| b < 0x20 && !b"\t\n\r".contains(&b)));
        let (content, encoding) = match text {
            Some(text) => (text.to_owned(), "utf8"),
            None => (
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                "base64",
            ),
        };
        drop(bytes);
        envd::call(
            state,
            &target,
            "fs.write",
            json!({"path": path, "content": content, "encoding": encoding}),
        )
        .await
        .map_err(from_connect)?;
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        written.push(WriteInfo {
            path,
            name,
            kind: WriteKind::File,
            metadata: None,
        });
    }
    Ok(written)
}

/// Reads a request body, refusing it as soon as it passes [`MAX_UPLOAD_BYTES`].
async fn bounded_body(body: Body) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut all = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        if all.len() + chunk.len() > MAX_UPLOAD_BYTES {
            return Err(ApiError::new(
                413,
                format!("upload larger than {MAX_UPLOAD_BYTES} bytes"),
            ));
        }
        all.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(all))
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

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    (from..=haystack.len() - needle.len()).find(|&i| &haystack[i..i + needle.len()] == needle)
}

/// The `file` parts of a multipart body: (filename, content). Other parts are ignored.
fn multipart(body: &Bytes, boundary: &str) -> Result<Vec<(Option<String>, Bytes)>, ApiError> {
    let bad = |what: &str| ApiError::bad_request(format!("malformed multipart body: {what}"));
    let delimiter = format!("--{boundary}").into_bytes();
    let mut at = find(body, &delimiter, 0).ok_or_else(|| bad("no boundary"))? + delimiter.len();
    let mut parts = Vec::new();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(parts);
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err(bad("boundary not followed by a line end"));
        }
        let head_start = at + 2;
        let head_end = find(body, b"\r\n\r\n", head_start).ok_or_else(|| bad("part headers"))?;
        let head = std::str::from_utf8(&body[head_start..head_end])
            .map_err(|_| bad("part headers are not UTF-8"))?;
        let mut closing = b"\r\n".to_vec();
        closing.extend_from_slice(&delimiter);
        let content_start = head_end + 4;
        let content_end =
            find(body, &closing, content_start).ok_or_else(|| bad("unterminated part"))?;
        let disposition = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .unwrap_or("");
        let param = |name: &str| -> Option<String> {
            disposition.split(';').skip(1).find_map(|p| {
                let (k, v) = p.split_once('=')?;
                (k.trim() == name).then(|| v.trim().trim_matches('"').to_owned())
            })
        };
        if param("name").as_deref() == Some("file") {
            if parts.len() == MAX_FILES {
                return Err(ApiError::bad_request(format!(
                    "more than {MAX_FILES} files in one upload"
                )));
            }
            parts.push((param("filename"), body.slice(content_start..content_end)));
        }
        at = content_end + closing.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_bodies_are_split_and_malformed_ones_refused() {
        let body = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
Content-Type: application/octet-stream\r\n\r\nhello\r\n--XyZ\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"dir/b.bin\"\r\n\r\n\x00\x01\r\n\r\n--XyZ--\r\n",
        );
        let parts = multipart(&body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0.as_deref(), Some("a.txt"));
        assert_eq!(&parts[0].1[..], b"hello");
        assert_eq!(parts[1].0.as_deref(), Some("dir/b.bin"));
        assert_eq!(&parts[1].1[..], b"\x00\x01\r\n");
        for bad in [
            &b"nothing"[..],
            b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nabc",
        ] {
            assert!(multipart(&Bytes::from(bad.to_vec()), "XyZ").is_err());
        }
        assert_eq!(
            boundary("multipart/form-data; boundary=\"ab c\"").unwrap(),
            "ab c"
        );
        assert!(boundary("multipart/form-data").is_err());
    }
}
