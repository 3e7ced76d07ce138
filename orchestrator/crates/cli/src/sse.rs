//! Server-Sent Events as the follow endpoints send them (`event: events` with a JSON array of
//! log events, `event: end` when the execution is over, `:` keep-alive comments), cut out of a
//! byte stream that may split lines and characters anywhere.

/// One dispatched message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// The `event:` name (`message` when absent, as the specification says).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen.
    pub id: Option<String>,
}

/// Incremental parser: feed it bytes, get whole messages.
#[derive(Debug, Default)]
pub struct Parser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    id: Option<String>,
}

impl Parser {
    /// Adds bytes; returns the messages they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Message> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if let Some(message) = self.line(&line) {
                out.push(message);
            }
        }
        out
    }

    fn line(&mut self, line: &str) -> Option<Message> {
        if line.is_empty() {
            if self.data.is_empty() && self.event.is_none() {
                return None;
            }
            return Some(Message {
                event: self.event.take().unwrap_or_else(|| "message".to_owned()),
                data: std::mem::take(&mut self.data).join("\n"),
                id: self.id.clone(),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "event" => self.event = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            "id" => self.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_any_split_and_comments_are_skipped() {
        let stream = ": keep-alive\n\nevent: events\nid: 3\ndata: [{\"seq\":3,\"x\":\"é\"}]\n\r\nevent: end\ndata: {}\n\n";
        let bytes = stream.as_bytes();
        for split in 0..bytes.len() {
            let mut p = Parser::default();
            let mut got = p.push(&bytes[..split]);
            got.extend(p.push(&bytes[split..]));
            assert_eq!(got.len(), 2, "split at {split}");
            assert_eq!(got[0].event, "events");
            assert_eq!(got[0].id.as_deref(), Some("3"));
            assert_eq!(got[0].data, "[{\"seq\":3,\"x\":\"é\"}]");
            assert_eq!(got[1].event, "end");
        }
    }

    #[test]
    fn multi_line_data_is_joined() {
        let mut p = Parser::default();
        let got = p.push(b"data: a\ndata: b\n\n");
        assert_eq!(got[0].event, "message");
        assert_eq!(got[0].data, "a\nb");
    }
}
