//! The Connect protocol (connectrpc.com), as envd serves it and E2B's SDKs call it, without
//! HTTP: an axum handler reads the request's headers and body through these functions and
//! writes what they return.
//!
//! A call is `POST /<package>.<Service>/<Method>`. Unary calls carry one bare message
//! (`application/json` or `application/proto`) and answer one, or an error as JSON with an
//! HTTP status from its code. Streaming calls (`application/connect+json`,
//! `application/connect+proto`) carry enveloped messages: a 5-byte prefix (flags, then the
//! big-endian length) before each; a server stream always answers HTTP 200 and ends with an
//! end-stream envelope (flag `0x02`) whose JSON may hold the error. E2B's Python SDK speaks JSON
//! both ways, uncompressed.

mod content_type;
mod envelope;
mod error;
mod headers;
mod message;

pub use content_type::{Codec, ContentType, ContentTypeError, RpcKind};
pub use envelope::{
    end_stream_frame, envelope, message_frame, EndStream, EnvelopeDecoder, EnvelopeError, Frame,
    RequestStreamDecoder, ResponseStreamDecoder, StreamItem, FLAG_COMPRESSED, FLAG_END_STREAM,
    PREFIX_LEN,
};
pub use error::{Code, ConnectError, ErrorDetail};
pub use headers::{
    check_protocol_version, timeout, PROTOCOL_VERSION, PROTOCOL_VERSION_HEADER, TIMEOUT_HEADER,
};
pub use message::{decode_unary, encode_unary, DecodeError, EncodeError, Message};
