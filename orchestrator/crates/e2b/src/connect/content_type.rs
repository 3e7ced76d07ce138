//! Which codec a call uses, read from its `Content-Type`: one of four media types, the unary
//! ones for unary methods and the `connect+` ones for streaming methods (server, client or
//! both). Anything else is refused before the body is read.

use super::error::{Code, ConnectError};

/// How messages are written: the proto3 JSON mapping or binary protobuf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    Json,
    Proto,
}

/// Whether a method takes and returns one bare message, or enveloped messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RpcKind {
    Unary,
    Streaming,
}

/// A Connect content type: a codec for a kind of method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentType {
    pub codec: Codec,
    pub kind: RpcKind,
}

/// The four media types, in the order an error lists them.
const KNOWN: [(&str, Codec, RpcKind); 4] = [
    ("application/json", Codec::Json, RpcKind::Unary),
    ("application/proto", Codec::Proto, RpcKind::Unary),
    ("application/connect+json", Codec::Json, RpcKind::Streaming),
    (
        "application/connect+proto",
        Codec::Proto,
        RpcKind::Streaming,
    ),
];

/// Longest content type echoed back in an error.
const ECHO_LIMIT: usize = 64;

/// A `Content-Type` this method cannot be called with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContentTypeError {
    #[error("missing Content-Type; this method takes {}", expected(*.kind))]
    Missing { kind: RpcKind },
    #[error("unsupported Content-Type {got:?}; this method takes {}", expected(*.kind))]
    Unsupported { got: String, kind: RpcKind },
    #[error("Content-Type {got:?} has an unsupported charset; only utf-8 is read")]
    Charset { got: String },
}

fn expected(kind: RpcKind) -> String {
    let names: Vec<&str> = KNOWN
        .iter()
        .filter(|(_, _, k)| *k == kind)
        .map(|(name, _, _)| *name)
        .collect();
    names.join(" or ")
}

impl ContentTypeError {
    /// The HTTP status to answer with (Connect: 415 Unsupported Media Type).
    pub const HTTP_STATUS: u16 = 415;

    /// The error as a Connect error, for a JSON body beside the 415.
    pub fn to_connect_error(&self) -> ConnectError {
        ConnectError::new(Code::InvalidArgument, self.to_string())
    }
}

impl ContentType {
    /// The media type to answer with (the same codec as the request).
    pub fn as_str(self) -> &'static str {
        KNOWN
            .iter()
            .find(|(_, c, k)| *c == self.codec && *k == self.kind)
            .map(|(name, _, _)| *name)
            .unwrap_or("application/json")
    }

    /// The content type of a request to a method of this kind. Case and surrounding spaces do
    /// not matter; a `charset` parameter must be utf-8; other parameters are ignored.
    pub fn negotiate(header: Option<&str>, kind: RpcKind) -> Result<ContentType, ContentTypeError> {
        let Some(value) = header.filter(|v| !v.trim().is_empty()) else {
            return Err(ContentTypeError::Missing { kind });
        };
        let echo = || value.chars().take(ECHO_LIMIT).collect::<String>();
        let mut parts = value.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        for param in parts {
            let Some((name, val)) = param.split_once('=') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("charset") {
                let val = val.trim().trim_matches('"');
                if !val.eq_ignore_ascii_case("utf-8") && !val.eq_ignore_ascii_case("utf8") {
                    return Err(ContentTypeError::Charset { got: echo() });
                }
            }
        }
        KNOWN
            .iter()
            .find(|(name, _, k)| *name == media && *k == kind)
            .map(|(_, codec, kind)| ContentType {
                codec: *codec,
                kind: *kind,
            })
            .ok_or_else(|| ContentTypeError::Unsupported { got: echo(), kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates_the_four_media_types() {
        let ok = [
            ("application/json", RpcKind::Unary, Codec::Json),
            ("application/proto", RpcKind::Unary, Codec::Proto),
            ("application/connect+json", RpcKind::Streaming, Codec::Json),
            (
                "application/connect+proto",
                RpcKind::Streaming,
                Codec::Proto,
            ),
            (
                "Application/JSON; charset=utf-8",
                RpcKind::Unary,
                Codec::Json,
            ),
            (
                " application/connect+json ;charset=\"UTF-8\"",
                RpcKind::Streaming,
                Codec::Json,
            ),
        ];
        for (header, kind, codec) in ok {
            let ct = ContentType::negotiate(Some(header), kind).unwrap();
            assert_eq!((ct.codec, ct.kind), (codec, kind), "{header}");
            assert_eq!(
                ContentType::negotiate(Some(ct.as_str()), kind).unwrap(),
                ct,
                "answer type {} reads back",
                ct.as_str()
            );
        }
    }

    #[test]
    fn refuses_unknown_and_mismatched_types() {
        let err = ContentType::negotiate(Some("text/plain"), RpcKind::Unary).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported Content-Type \"text/plain\"; this method takes application/json or application/proto"
        );
        // A streaming type on a unary method and the other way round.
        assert!(ContentType::negotiate(Some("application/connect+json"), RpcKind::Unary).is_err());
        let err = ContentType::negotiate(Some("application/json"), RpcKind::Streaming).unwrap_err();
        assert!(err
            .to_string()
            .contains("application/connect+json or application/connect+proto"));
        // gRPC and gRPC-Web are other protocols.
        for other in [
            "application/grpc",
            "application/grpc-web+proto",
            "application/connect+xml",
        ] {
            assert!(
                ContentType::negotiate(Some(other), RpcKind::Streaming).is_err(),
                "{other}"
            );
        }
        assert_eq!(
            ContentType::negotiate(None, RpcKind::Unary).unwrap_err(),
            ContentTypeError::Missing {
                kind: RpcKind::Unary
            }
        );
        let err = ContentType::negotiate(Some("application/json; charset=latin1"), RpcKind::Unary)
            .unwrap_err();
        assert!(matches!(err, ContentTypeError::Charset { .. }));
        // A long header is cut in the message.
        let long = format!("application/{}", "x".repeat(500));
        let msg = ContentType::negotiate(Some(&long), RpcKind::Unary)
            .unwrap_err()
            .to_string();
        assert!(msg.len() < 200, "{msg}");
        assert_eq!(ContentTypeError::HTTP_STATUS, 415);
    }
}
