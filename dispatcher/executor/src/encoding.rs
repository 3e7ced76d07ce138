//! Carrying bytes in JSON strings: UTF-8 text as is, anything else as base64.
//!
//! File contents and command output are bytes. When they are valid UTF-8 they travel as text
//! (`"encoding":"utf8"`); otherwise as standard base64 (`"encoding":"base64"`), so binary data is
//! never mangled. When the bytes were cut at a limit, an incomplete UTF-8 sequence at the very end
//! is an artefact of the cut, so it is dropped (at most 3 bytes) rather than forcing base64.
//!
//! [`encode`] is built without the `executor` feature too: the node encodes the result of the
//! streaming form of `cmd.run` with it, so that result reads like the executor's one-shot answer.

use base64::Engine;

#[cfg(feature = "executor")]
use crate::error::{OpError, OpResult};
use crate::protocol::Encoding;

/// Encodes `bytes`; `cut` says they were truncated at a limit.
pub fn encode(mut bytes: Vec<u8>, cut: bool) -> (String, Encoding) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, Encoding::Utf8),
        Err(err) => {
            let utf8 = err.utf8_error();
            bytes = err.into_bytes();
            if cut && utf8.error_len().is_none() {
                bytes.truncate(utf8.valid_up_to());
                // The prefix was just validated, so this cannot fail; fall back to base64 anyway.
                return match String::from_utf8(bytes) {
                    Ok(text) => (text, Encoding::Utf8),
                    Err(err) => (base64_encode(err.as_bytes()), Encoding::Base64),
                };
            }
            (base64_encode(&bytes), Encoding::Base64)
        }
    }
}

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes request content given its declared encoding.
#[cfg(feature = "executor")]
pub fn decode(content: String, encoding: Encoding, what: &str) -> OpResult<Vec<u8>> {
    match encoding {
        Encoding::Utf8 => Ok(content.into_bytes()),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(content.as_bytes())
            .map_err(|e| OpError::invalid(format!("{what} is not valid base64: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stays_text_and_binary_becomes_base64() {
        assert_eq!(
            encode(b"hi\n".to_vec(), false),
            ("hi\n".into(), Encoding::Utf8)
        );
        assert_eq!(
            encode(vec![0xff, 0x00], false),
            ("/wA=".into(), Encoding::Base64)
        );
        assert_eq!(encode(vec![0, 0], false).1, Encoding::Utf8);
    }

    #[test]
    fn a_sequence_split_by_the_cut_is_dropped() {
        let mut bytes = "aé".as_bytes().to_vec();
        bytes.pop();
        assert_eq!(encode(bytes.clone(), true), ("a".into(), Encoding::Utf8));
        assert_eq!(encode(bytes, false).1, Encoding::Base64);
        assert_eq!(encode(vec![b'a', 0xff, b'b'], true).1, Encoding::Base64);
    }

    #[test]
    #[cfg(feature = "executor")]
    fn decode_checks_base64() {
        assert_eq!(
            decode("aGk=".into(), Encoding::Base64, "content").unwrap(),
            b"hi"
        );
        assert!(decode("!!".into(), Encoding::Base64, "content").is_err());
        assert_eq!(decode("x".into(), Encoding::Utf8, "content").unwrap(), b"x");
    }
}
