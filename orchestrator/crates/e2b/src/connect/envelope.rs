//! Enveloped streams: each message behind a 5-byte prefix (a flags byte, then the payload's
//! length as a big-endian u32). A server stream ends with one end-stream envelope (flag
//! [`FLAG_END_STREAM`]) whose payload is always JSON: `{}` on success, `{"error": {...}}` on
//! failure, with optional `metadata` (trailers).
//!
//! [`EnvelopeDecoder`] reads envelopes from a body as its chunks arrive, holding at most one
//! prefix and one payload, and refuses a declared length above its limit before buffering it.
//! [`RequestStreamDecoder`] reads a client stream (StreamInput); [`ResponseStreamDecoder`] reads
//! a server stream, as a client or a test does.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use super::content_type::Codec;
use super::error::{Code, ConnectError};
use super::message::{decode_payload, encode_unary, EncodeError, Message};

/// Bytes before each payload: flags and a big-endian u32 length.
pub const PREFIX_LEN: usize = 5;
/// The payload is compressed with the negotiated encoding (never negotiated here).
pub const FLAG_COMPRESSED: u8 = 0b01;
/// The last envelope of a server stream; its payload is the JSON end message.
pub const FLAG_END_STREAM: u8 = 0b10;

/// One envelope's prefix and payload.
pub fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    // A payload cannot exceed u32::MAX here: messages are bounded far below it, and the
    // encoders below never produce one that large from bounded input.
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(PREFIX_LEN + payload.len());
    out.push(flags);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// One message of a stream, enveloped.
pub fn message_frame<M: Message>(codec: Codec, message: &M) -> Result<Vec<u8>, EncodeError> {
    let payload = encode_unary(codec, message)?;
    if u32::try_from(payload.len()).is_err() {
        return Err(EncodeError {
            message_type: M::full_name(),
            detail: format!("{} bytes do not fit an envelope", payload.len()),
        });
    }
    Ok(envelope(0, &payload))
}

/// How a server stream ended: the error, if it failed, and trailers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndStream {
    pub error: Option<ConnectError>,
    pub metadata: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct EndWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, Vec<String>>,
}

impl EndStream {
    /// A stream that ended well.
    pub fn ok() -> Self {
        EndStream::default()
    }

    /// A stream that failed with `error`.
    pub fn failed(error: ConnectError) -> Self {
        EndStream {
            error: Some(error),
            metadata: BTreeMap::new(),
        }
    }

    /// The end message's JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let wire = EndWire {
            error: self.error.as_ref().map(ConnectError::to_json_value),
            metadata: self.metadata.clone(),
        };
        serde_json::to_vec(&wire).unwrap_or_else(|_| b"{}".to_vec())
    }

    /// Reads an end message.
    pub fn from_json(payload: &[u8]) -> Result<Self, EnvelopeError> {
        let bad = |e: serde_json::Error| EnvelopeError::BadEndMessage {
            detail: e.to_string(),
        };
        let wire: EndWire = serde_json::from_slice(payload).map_err(bad)?;
        let error = match wire.error {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => Some(ConnectError::from_json_value(value).map_err(bad)?),
        };
        Ok(EndStream {
            error,
            metadata: wire.metadata,
        })
    }
}

/// The end-stream envelope of a server stream.
pub fn end_stream_frame(end: &EndStream) -> Vec<u8> {
    envelope(FLAG_END_STREAM, &end.to_json())
}

/// An envelope read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The end-stream envelope.
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }

    /// A compressed payload.
    pub fn is_compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }
}

/// A stream body that is not a sequence of well-formed envelopes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("envelope {index}: declared length {declared} bytes is larger than the limit of {max} bytes")]
    TooLarge {
        index: u64,
        declared: u64,
        max: usize,
    },
    #[error("envelope {index}: unknown flags 0x{flags:02x} (only 0x01 compressed and 0x02 end-stream exist)")]
    UnknownFlags { index: u64, flags: u8 },
    #[error("stream ended inside envelope {index}: {received} of {expected} bytes")]
    Truncated {
        index: u64,
        received: usize,
        expected: usize,
    },
    #[error("envelope {index}: compressed, but no compression was negotiated")]
    Compressed { index: u64 },
    #[error(
        "envelope {index}: end-stream flag in a client stream (a client stream ends with its body)"
    )]
    EndInRequest { index: u64 },
    #[error("data after the end-stream envelope")]
    AfterEnd,
    #[error("server stream ended without an end-stream envelope")]
    MissingEnd,
    #[error("end-stream message is not valid: {detail}")]
    BadEndMessage { detail: String },
}

impl EnvelopeError {
    /// As a Connect error: `resource_exhausted` for size, `invalid_argument` otherwise.
    pub fn to_connect_error(&self) -> ConnectError {
        let code = match self {
            EnvelopeError::TooLarge { .. } => Code::ResourceExhausted,
            _ => Code::InvalidArgument,
        };
        ConnectError::new(code, self.to_string())
    }
}

impl From<EnvelopeError> for ConnectError {
    fn from(e: EnvelopeError) -> Self {
        e.to_connect_error()
    }
}

/// Reads envelopes incrementally; see the module doc.
#[derive(Debug)]
pub struct EnvelopeDecoder {
    max_message: usize,
    prefix: [u8; PREFIX_LEN],
    prefix_len: usize,
    /// Set once the prefix is complete: the frame's flags and payload length.
    current: Option<(u8, usize)>,
    payload: Vec<u8>,
    /// Envelopes completed so far; names the envelope an error is about.
    index: u64,
}

impl EnvelopeDecoder {
    /// A decoder refusing any payload above `max_message` bytes.
    pub fn new(max_message: usize) -> Self {
        EnvelopeDecoder {
            max_message,
            prefix: [0; PREFIX_LEN],
            prefix_len: 0,
            current: None,
            payload: Vec::new(),
            index: 0,
        }
    }

    /// Reads a chunk of the body; returns the envelopes it completed, in order. After an
    /// error the decoder is not to be used again.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<Vec<Frame>, EnvelopeError> {
        let mut frames = Vec::new();
        while !chunk.is_empty() {
            match self.current {
                None => {
                    let take = (PREFIX_LEN - self.prefix_len).min(chunk.len());
                    self.prefix[self.prefix_len..self.prefix_len + take]
                        .copy_from_slice(&chunk[..take]);
                    self.prefix_len += take;
                    chunk = &chunk[take..];
                    if self.prefix_len == PREFIX_LEN {
                        self.start_payload()?;
                        self.complete_if_full(&mut frames);
                    }
                }
                Some((_, len)) => {
                    let take = (len - self.payload.len()).min(chunk.len());
                    self.payload.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    self.complete_if_full(&mut frames);
                }
            }
        }
        Ok(frames)
    }

    fn start_payload(&mut self) -> Result<(), EnvelopeError> {
        let flags = self.prefix[0];
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(EnvelopeError::UnknownFlags {
                index: self.index,
                flags,
            });
        }
        let declared = u32::from_be_bytes([
            self.prefix[1],
            self.prefix[2],
            self.prefix[3],
            self.prefix[4],
        ]);
        let len = usize::try_from(declared).unwrap_or(usize::MAX);
        if len > self.max_message {
            return Err(EnvelopeError::TooLarge {
                index: self.index,
                declared: u64::from(declared),
                max: self.max_message,
            });
        }
        self.payload = Vec::with_capacity(len);
        self.current = Some((flags, len));
        Ok(())
    }

    fn complete_if_full(&mut self, frames: &mut Vec<Frame>) {
        if let Some((flags, len)) = self.current {
            if self.payload.len() == len {
                frames.push(Frame {
                    flags,
                    payload: std::mem::take(&mut self.payload),
                });
                self.current = None;
                self.prefix_len = 0;
                self.index += 1;
            }
        }
    }

    /// Whether the body may end here (between envelopes).
    pub fn is_between_envelopes(&self) -> bool {
        self.prefix_len == 0 && self.current.is_none()
    }

    /// The body ended: refuses an envelope left incomplete.
    pub fn finish(&self) -> Result<(), EnvelopeError> {
        match self.current {
            Some((_, len)) => Err(EnvelopeError::Truncated {
                index: self.index,
                received: PREFIX_LEN + self.payload.len(),
                expected: PREFIX_LEN + len,
            }),
            None if self.prefix_len > 0 => Err(EnvelopeError::Truncated {
                index: self.index,
                received: self.prefix_len,
                expected: PREFIX_LEN,
            }),
            None => Ok(()),
        }
    }
}

/// Reads a client stream's messages (StreamInput): no compression, no end-stream envelope.
#[derive(Debug)]
pub struct RequestStreamDecoder<M> {
    codec: Codec,
    envelopes: EnvelopeDecoder,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message> RequestStreamDecoder<M> {
    /// A decoder of `codec` messages of at most `max_message` bytes each.
    pub fn new(codec: Codec, max_message: usize) -> Self {
        RequestStreamDecoder {
            codec,
            envelopes: EnvelopeDecoder::new(max_message),
            _message: PhantomData,
        }
    }

    /// Reads a chunk of the request body; returns the messages it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<M>, ConnectError> {
        let mut messages = Vec::new();
        let first = self.envelopes.index;
        for (i, frame) in self.envelopes.feed(chunk)?.into_iter().enumerate() {
            let index = first + i as u64;
            if frame.is_end_stream() {
                return Err(EnvelopeError::EndInRequest { index }.into());
            }
            if frame.is_compressed() {
                return Err(EnvelopeError::Compressed { index }.into());
            }
            messages.push(decode_payload(self.codec, &frame.payload)?);
        }
        Ok(messages)
    }

    /// The request body ended: refuses an envelope left incomplete.
    pub fn finish(&self) -> Result<(), ConnectError> {
        Ok(self.envelopes.finish()?)
    }
}

/// An item of a server stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem<M> {
    Message(M),
    End(EndStream),
}

/// Reads a server stream: messages, then exactly one end-stream envelope, then nothing.
#[derive(Debug)]
pub struct ResponseStreamDecoder<M> {
    codec: Codec,
    envelopes: EnvelopeDecoder,
    ended: bool,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message> ResponseStreamDecoder<M> {
    /// A decoder of `codec` messages of at most `max_message` bytes each.
    pub fn new(codec: Codec, max_message: usize) -> Self {
        ResponseStreamDecoder {
            codec,
            envelopes: EnvelopeDecoder::new(max_message),
            ended: false,
            _message: PhantomData,
        }
    }

    /// Reads a chunk of the response body; returns what it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<StreamItem<M>>, ConnectError> {
        if self.ended && !chunk.is_empty() {
            return Err(EnvelopeError::AfterEnd.into());
        }
        let mut items = Vec::new();
        let first = self.envelopes.index;
        for (i, frame) in self.envelopes.feed(chunk)?.into_iter().enumerate() {
            if self.ended {
                return Err(EnvelopeError::AfterEnd.into());
            }
            if frame.is_compressed() {
                return Err(EnvelopeError::Compressed {
                    index: first + i as u64,
                }
                .into());
            }
            if frame.is_end_stream() {
                self.ended = true;
                items.push(StreamItem::End(EndStream::from_json(&frame.payload)?));
            } else {
                items.push(StreamItem::Message(decode_payload(
                    self.codec,
                    &frame.payload,
                )?));
            }
        }
        if self.ended && !self.envelopes.is_between_envelopes() {
            return Err(EnvelopeError::AfterEnd.into());
        }
        Ok(items)
    }

    /// The response body ended: refuses a stream without its end-stream envelope.
    pub fn finish(&self) -> Result<(), ConnectError> {
        self.envelopes.finish()?;
        if !self.ended {
            return Err(EnvelopeError::MissingEnd.into());
        }
        Ok(())
    }
}
