//! The relay half of the protocol: a TCP connection the executor opens to a port inside the
//! sandbox (`127.0.0.1`), carried over the executor's channel, so the node can reach a server an
//! agent started without the sandbox having a network or a port published on the host.
//!
//! `port.open` answers once the connection is made (`not_found` when nothing listens); the bytes
//! the server sends come back as events of that request's id (`port_data`, then one `port_end`),
//! never more than the credit the node granted (`port.ack`), so a slow client never fills the
//! shared channel. The node sends bytes with `port.write`, half-closes or closes with
//! `port.close`.
//!
//! ```json
//! {"id":5,"op":"port.open","port":8000}
//! {"id":5,"ok":{"window":262144}}
//! {"id":6,"op":"port.write","target":5,"data":"R0VUIC8gSFRUUC8xLjENCg0K"}
//! {"event":5,"kind":"port_data","data":"SFRUUC8xLjAgMjAwIE9LDQo="}
//! {"id":7,"op":"port.ack","target":5,"bytes":19}
//! {"event":5,"kind":"port_end"}
//! ```

use serde::{Deserialize, Serialize};

/// Parameters of `port.open`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortOpenParams {
    /// The TCP port on the sandbox's loopback address, 1..=65535.
    pub port: u16,
}

/// Result of `port.open`: the connection is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortOpenResult {
    /// Bytes the executor sends before it waits for a `port.ack` (the initial credit).
    pub window: u64,
}

/// Parameters of `port.write`: bytes for the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortWriteParams {
    /// The id of the `port.open` request.
    pub target: u64,
    /// The bytes, standard base64 (at most 1 MiB decoded).
    pub data: String,
}

/// Parameters of `port.ack`: the node has passed on `bytes` more of the server's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortAckParams {
    /// The id of the `port.open` request.
    pub target: u64,
    /// Bytes of `port_data` events handed on since the last ack.
    pub bytes: u64,
}

/// What `port.close` closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortShutdown {
    /// Only the node's direction (the client finished its request); the server's bytes still
    /// come until it closes.
    Write,
    /// Both directions: the connection ends now (its `port_end` follows).
    #[default]
    Both,
}

/// Parameters of `port.close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortCloseParams {
    /// The id of the `port.open` request.
    pub target: u64,
    /// Which direction; default both.
    #[serde(default)]
    pub how: PortShutdown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Event, EventBody, Op, Request, EVENT_PREFIX};
    use serde_json::json;

    #[test]
    fn port_requests_and_events_have_their_documented_shape() {
        let open: Request = serde_json::from_value(json!({"id":5,"op":"port.open","port":8000}))
            .expect("port.open parses");
        assert_eq!(open.op, Op::PortOpen(PortOpenParams { port: 8000 }));
        let close: Request =
            serde_json::from_value(json!({"id":6,"op":"port.close","target":5})).expect("close");
        assert_eq!(
            close.op,
            Op::PortClose(PortCloseParams {
                target: 5,
                how: PortShutdown::Both
            })
        );
        assert!(
            serde_json::from_value::<Request>(json!({"id":7,"op":"port.open","port":70000}))
                .is_err()
        );
        assert!(serde_json::from_value::<Request>(
            json!({"id":7,"op":"port.open","port":80,"host":"10.0.0.1"})
        )
        .is_err());
        let data = Event {
            event: 5,
            body: EventBody::PortData {
                data: "aGk=".into(),
            },
        };
        let line = serde_json::to_vec(&data).expect("serializes");
        assert!(line.starts_with(EVENT_PREFIX));
        assert_eq!(
            serde_json::to_value(&data).expect("value"),
            json!({"event":5,"kind":"port_data","data":"aGk="})
        );
        let end = Event {
            event: 5,
            body: EventBody::PortEnd { error: None },
        };
        assert_eq!(
            serde_json::to_value(&end).expect("value"),
            json!({"event":5,"kind":"port_end"})
        );
    }
}
