//! Query strings, decoded strictly: form decoding (`+` a space, `%XX` a byte) into UTF-8 with
//! malformed escapes and NUL bytes refused, bounded in size and count, a parameter given twice
//! refused. Shared by the control API's listings and envd's `/files`.

use std::collections::BTreeMap;

use crate::error_body::ApiError;

/// Longest query string read.
const MAX_QUERY_BYTES: usize = 16 * 1024;
/// Most parameters read from one query string.
const MAX_PARAMS: usize = 64;

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

/// Form decoding (`+` is a space, `%XX` a byte) into UTF-8; `what` names the value in errors.
pub(crate) fn decode(text: &str, what: &str) -> Result<String, ApiError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex
                    .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| bad(format!("{what}: malformed %-escape at byte {i}")))?;
                out.push(byte);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    if out.contains(&0) {
        return Err(bad(format!("{what}: contains a NUL byte")));
    }
    String::from_utf8(out).map_err(|_| bad(format!("{what}: not UTF-8 once decoded")))
}

/// `k=v&k2=v2` into decoded pairs, bounded in size and count.
pub(crate) fn form_pairs(
    text: &str,
    what: &str,
    max_pairs: usize,
) -> Result<Vec<(String, String)>, ApiError> {
    if text.len() > MAX_QUERY_BYTES {
        return Err(bad(format!(
            "{what} is longer than {MAX_QUERY_BYTES} bytes"
        )));
    }
    let mut pairs = Vec::new();
    for part in text.split('&').filter(|p| !p.is_empty()) {
        if pairs.len() == max_pairs {
            return Err(bad(format!("{what} has more than {max_pairs} parameters")));
        }
        let (name, value) = part.split_once('=').unwrap_or((part, ""));
        pairs.push((decode(name, what)?, decode(value, what)?));
    }
    Ok(pairs)
}

/// The query's parameters by name; a parameter given twice is refused.
pub(crate) fn params(raw_query: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut map = BTreeMap::new();
    for (name, value) in form_pairs(raw_query, "query string", MAX_PARAMS)? {
        if map.contains_key(&name) {
            return Err(bad(format!(
                "query parameter {name:?} is given more than once"
            )));
        }
        map.insert(name, value);
    }
    Ok(map)
}
