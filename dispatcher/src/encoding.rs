//! Command output as the executor carries it in JSON: UTF-8 text as is, anything else as
//! standard base64, and an incomplete character at the very end of output cut at its cap
//! dropped (an artefact of the cut). The node links only the executor's protocol, not its
//! `encoding.rs`, so this is the same rule restated; the node encodes the result of the
//! streaming form of `cmd.run` with it, so that result reads like the executor's one-shot answer.

use base64::Engine;

use crate::protocol::Encoding;

/// Most bytes of each stream a one-shot `cmd.run` keeps, whatever it asks (the executor's
/// `cmd::run::MAX_KEPT_BYTES`); the streaming form keeps to it too.
pub const MAX_COMMAND_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;

/// Encodes `bytes`; `cut` says they were truncated at a limit.
pub fn encode(bytes: Vec<u8>, cut: bool) -> (String, Encoding) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, Encoding::Utf8),
        Err(err) => {
            let utf8 = err.utf8_error();
            let mut bytes = err.into_bytes();
            if cut && utf8.error_len().is_none() {
                bytes.truncate(utf8.valid_up_to());
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
    }

    #[test]
    fn a_sequence_split_by_the_cut_is_dropped() {
        let mut bytes = "aé".as_bytes().to_vec();
        bytes.pop();
        assert_eq!(encode(bytes.clone(), true), ("a".into(), Encoding::Utf8));
        assert_eq!(encode(bytes, false).1, Encoding::Base64);
        assert_eq!(encode(vec![b'a', 0xff, b'b'], true).1, Encoding::Base64);
    }
}
