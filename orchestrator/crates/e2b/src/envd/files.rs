//! The pure parts of envd's plain HTTP `/files` route, as the SDK uses it: the query
//! (`path`, `username`, `signature`, `signature_expiration`), the `X-Metadata-*` headers of an
//! upload, and the answer to an upload. File bytes never pass through here.
//!
//! How the SDK uploads: `POST /files` either as `application/octet-stream` (one file, `path`
//! in the query, `Content-Encoding: gzip` when asked) or as `multipart/form-data` with one part
//! named `file` per file whose filename is the target path (the query's `path` is set too when
//! there is one file). A relative path is under the user's home. Errors are
//! `{"code": <status>, "message"}` (the control API's [`crate::api::ApiError`] shape): 400 bad
//! path, 401 bad user or signature, 404 missing, 406 unsupported `Accept-Encoding`, 507 disk
//! full.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::ApiError;
use crate::query::params;

/// The header prefix of an upload's metadata (`X-Metadata-<key>: <value>`).
pub const METADATA_HEADER_PREFIX: &str = "x-metadata-";
/// Longest metadata key: the xattr name limit (255) less the `user.e2b.` namespace.
pub const MAX_METADATA_KEY_BYTES: usize = 246;
/// Most bytes of metadata on one file, keys (with the namespace) and values together.
pub const MAX_METADATA_TOTAL_BYTES: usize = 4096;
/// The xattr namespace envd keeps metadata in; counted in the total.
const METADATA_NAMESPACE: &str = "user.e2b.";

/// The query of `GET` and `POST /files`, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilesQuery {
    /// The file; relative paths are under the user's home. Absent on a multi-file upload.
    pub path: Option<String>,
    /// The user the call acts as (owner of written files); absent: the default user.
    pub username: Option<String>,
    /// A signed URL's signature (see [`super::signature`]).
    pub signature: Option<String>,
    pub signature_expiration: Option<String>,
}

impl FilesQuery {
    /// Reads the raw query string (as it follows `?`). Unknown parameters are ignored; a
    /// parameter given twice is refused.
    pub fn parse(raw_query: &str) -> Result<FilesQuery, ApiError> {
        let mut p = params(raw_query)?;
        Ok(FilesQuery {
            path: p.remove("path"),
            username: p.remove("username"),
            signature: p.remove("signature"),
            signature_expiration: p.remove("signature_expiration"),
        })
    }
}

/// The metadata of an upload from its request headers (name, raw value): every
/// `X-Metadata-<key>` header, the key lowercased; keys and values printable US-ASCII; the
/// first of a repeated key wins; bounded by [`MAX_METADATA_KEY_BYTES`] and
/// [`MAX_METADATA_TOTAL_BYTES`]. No such header: empty (an upload then clears the file's
/// metadata).
pub fn upload_metadata<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut metadata = BTreeMap::new();
    let mut total = 0usize;
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        let Some(key) = lower.strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        let printable = |b: &u8| (0x20..=0x7e).contains(b);
        if key.is_empty() || !key.bytes().all(|b| printable(&b)) {
            return Err(ApiError::bad_request(
                "metadata keys must be non-empty printable US-ASCII",
            ));
        }
        if key.len() > MAX_METADATA_KEY_BYTES {
            return Err(ApiError::bad_request(format!(
                "metadata key {key:?} is longer than {MAX_METADATA_KEY_BYTES} bytes"
            )));
        }
        if !value.iter().all(printable) {
            return Err(ApiError::bad_request(format!(
                "metadata value of {key:?} must be printable US-ASCII"
            )));
        }
        if metadata.contains_key(key) {
            continue;
        }
        total += METADATA_NAMESPACE.len() + key.len() + value.len();
        if total > MAX_METADATA_TOTAL_BYTES {
            return Err(ApiError::bad_request(format!(
                "metadata is larger than {MAX_METADATA_TOTAL_BYTES} bytes in all"
            )));
        }
        // Printable ASCII is UTF-8.
        let value = String::from_utf8_lossy(value).into_owned();
        metadata.insert(key.to_owned(), value);
    }
    Ok(metadata)
}

/// One written file, as an upload answers (a JSON array of these). The SDK requires `name`
/// and `path`; `type` is `file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteInfo {
    pub path: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: WriteKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// What an upload wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteKind {
    File,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_files_query_the_sdk_sends() {
        // files.read("dir/a b.txt", user="user"): httpx encodes the params.
        let q = FilesQuery::parse("path=dir%2Fa+b.txt&username=user").unwrap();
        assert_eq!(q.path.as_deref(), Some("dir/a b.txt"));
        assert_eq!(q.username.as_deref(), Some("user"));
        // download_url: urlencode(quote_via=quote) of path, username, signature, expiration.
        let q = FilesQuery::parse(
            "path=test.txt&username=user&signature=v1_%2F1gx%2BnP&signature_expiration=1700000000",
        )
        .unwrap();
        assert_eq!(q.signature.as_deref(), Some("v1_/1gx+nP"));
        assert_eq!(q.signature_expiration.as_deref(), Some("1700000000"));
        assert_eq!(FilesQuery::parse("").unwrap(), FilesQuery::default());

        for (raw, want) in [
            ("path=a&path=b", "more than once"),
            ("path=%zz", "malformed %-escape"),
            ("path=a%00b", "NUL byte"),
            ("path=%FF", "not UTF-8"),
            ("a=1&b=2&path=%", "malformed %-escape"),
        ] {
            let err = FilesQuery::parse(raw).unwrap_err();
            assert!(err.message.contains(want), "{raw}: {err}");
            assert_eq!(err.code, 400);
        }
    }

    #[test]
    fn upload_metadata_as_envd_reads_it() {
        let headers: [(&str, &[u8]); 4] = [
            ("Content-Type", b"application/octet-stream"),
            ("X-Metadata-Owner", b"team a"),
            ("x-metadata-owner", b"ignored: the first wins"),
            ("X-Metadata-Tag", b"v1"),
        ];
        let md = upload_metadata(headers).unwrap();
        assert_eq!(md.len(), 2);
        assert_eq!(md["owner"], "team a");
        assert_eq!(md["tag"], "v1");
        assert!(upload_metadata([("Accept", &b"*/*"[..])])
            .unwrap()
            .is_empty());

        let bad: [(&str, &[u8]); 3] = [
            ("X-Metadata-", b"v"),
            ("X-Metadata-k", "caf\u{e9}".as_bytes()),
            ("X-Metadata-k", b"tab\there"),
        ];
        for header in bad {
            assert!(upload_metadata([header]).is_err(), "{header:?}");
        }
        let long_key = format!("X-Metadata-{}", "k".repeat(MAX_METADATA_KEY_BYTES + 1));
        assert!(upload_metadata([(long_key.as_str(), &b"v"[..])]).is_err());
        let names: Vec<String> = (0..5).map(|i| format!("X-Metadata-k{i}")).collect();
        let value = vec![b'v'; 1000];
        let err =
            upload_metadata(names.iter().map(|n| (n.as_str(), value.as_slice()))).unwrap_err();
        assert!(err.message.contains("4096"), "{err}");
    }

    #[test]
    fn write_info_as_the_sdk_parses_it() {
        let written = vec![WriteInfo {
            path: "/home/user/hello.txt".into(),
            name: "hello.txt".into(),
            kind: WriteKind::File,
            metadata: None,
        }];
        assert_eq!(
            serde_json::to_value(&written).unwrap(),
            serde_json::json!([{"path": "/home/user/hello.txt", "name": "hello.txt", "type": "file"}])
        );
    }
}
