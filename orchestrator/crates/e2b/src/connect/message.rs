//! One message in either codec: the body of a unary call, or the payload of one envelope.
//! Decoding names the message type and, for JSON, the field that was wrong.

use serde::{de::DeserializeOwned, Serialize};

use super::content_type::Codec;
use super::error::{Code, ConnectError};

/// A generated envd message: both codecs and its protobuf name.
pub trait Message: prost::Message + prost::Name + Default + Serialize + DeserializeOwned {}

impl<T> Message for T where T: prost::Message + prost::Name + Default + Serialize + DeserializeOwned {}

/// Longest part of a parser's message repeated in an error.
const DETAIL_LIMIT: usize = 200;

/// A message that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{message_type}: message of {len} bytes is larger than the limit of {max} bytes")]
    TooLarge {
        message_type: String,
        len: usize,
        max: usize,
    },
    #[error("{message_type}: empty JSON body; send {{}} for an empty message")]
    EmptyJson { message_type: String },
    #[error("{message_type}: invalid JSON{}: {detail}", at(path))]
    Json {
        message_type: String,
        path: String,
        detail: String,
    },
    #[error("{message_type}: invalid protobuf: {detail}")]
    Proto {
        message_type: String,
        detail: String,
    },
}

/// Where in the JSON, unless the error is about the whole body (serde's path `.`).
fn at(path: &str) -> String {
    if path.is_empty() || path == "." {
        String::new()
    } else {
        format!(" at `{path}`")
    }
}

impl DecodeError {
    /// As a Connect error: `resource_exhausted` for size, `invalid_argument` otherwise.
    pub fn to_connect_error(&self) -> ConnectError {
        let code = match self {
            DecodeError::TooLarge { .. } => Code::ResourceExhausted,
            _ => Code::InvalidArgument,
        };
        ConnectError::new(code, self.to_string())
    }
}

impl From<DecodeError> for ConnectError {
    fn from(e: DecodeError) -> Self {
        e.to_connect_error()
    }
}

/// A message that could not be written (a value outside what its JSON form can express, such
/// as a timestamp beyond year 9999).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message_type}: cannot encode: {detail}")]
pub struct EncodeError {
    pub message_type: String,
    pub detail: String,
}

impl From<EncodeError> for ConnectError {
    fn from(e: EncodeError) -> Self {
        ConnectError::new(Code::Internal, e.to_string())
    }
}

fn cut(text: String) -> String {
    if text.len() <= DETAIL_LIMIT {
        return text;
    }
    let mut end = DETAIL_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Reads one message of type `M` in `codec`, refusing more than `max` bytes.
pub fn decode_unary<M: Message>(codec: Codec, body: &[u8], max: usize) -> Result<M, DecodeError> {
    if body.len() > max {
        return Err(DecodeError::TooLarge {
            message_type: M::full_name(),
            len: body.len(),
            max,
        });
    }
    decode_payload(codec, body)
}

/// Reads one message of type `M` in `codec` (no size check: envelopes are checked as read).
pub(crate) fn decode_payload<M: Message>(codec: Codec, body: &[u8]) -> Result<M, DecodeError> {
    match codec {
        Codec::Proto => M::decode(body).map_err(|e| DecodeError::Proto {
            message_type: M::full_name(),
            detail: cut(e.to_string()),
        }),
        Codec::Json => {
            if body.iter().all(u8::is_ascii_whitespace) {
                return Err(DecodeError::EmptyJson {
                    message_type: M::full_name(),
                });
            }
            let mut de = serde_json::Deserializer::from_slice(body);
            let json_error = |path: String, e: serde_json::Error| DecodeError::Json {
                message_type: M::full_name(),
                path,
                detail: cut(strip_position(e)),
            };
            let message: M = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let path = e.path().to_string();
                json_error(path, e.into_inner())
            })?;
            de.end().map_err(|e| json_error(".".to_owned(), e))?;
            Ok(message)
        }
    }
}

/// serde_json's message without its "at line 1 column 9" tail (the path says where).
fn strip_position(e: serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// Writes one message in `codec`.
pub fn encode_unary<M: Message>(codec: Codec, message: &M) -> Result<Vec<u8>, EncodeError> {
    match codec {
        Codec::Proto => Ok(message.encode_to_vec()),
        Codec::Json => serde_json::to_vec(message).map_err(|e| EncodeError {
            message_type: M::full_name(),
            detail: cut(e.to_string()),
        }),
    }
}
