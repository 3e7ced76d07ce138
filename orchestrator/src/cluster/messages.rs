//! What replicas send each other on the peer channel: the signed requests (a forwarded
//! executor call, create, destroy, port or subscription), a holder's refusal, and the frames of
//! a relayed subscription's stream.

use base64::Engine;
use dispatcher::protocol::{Enforcement, ErrorKind, FsEvent, Op, ProcessEnd, StartParams};
use dispatcher::{ProcessEvent, ProcessSelector, Relayed, SandboxSpec, Subscription, WatchEvent};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One forwarded executor request.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedCall {
    /// The sandbox.
    pub sandbox: Uuid,
    /// The caller's deadline for the executor's answer, milliseconds.
    pub deadline_ms: u64,
    /// The executor request.
    pub op: Op,
}

/// A sandbox to create on the receiving replica's own engine (placement chose it).
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedCreate {
    /// The spec, validated by the replica the caller reached (and again by the receiver).
    pub spec: SandboxSpec,
}

/// The answer to a [`ForwardedCreate`]: the new sandbox, held by the receiver.
#[derive(Debug, Serialize, Deserialize)]
pub struct Created {
    /// Its id.
    pub sandbox: Uuid,
}

/// A sandbox to destroy on the receiving replica's own engine.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedDestroy {
    /// The sandbox.
    pub sandbox: Uuid,
}

/// A connection to open to a port of a sandbox the receiver holds (see [`PORT_PATH`]). The
/// replica the client reached admitted and audited it; the receiver only opens it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedPort {
    /// The sandbox.
    pub sandbox: Uuid,
    /// The port in it.
    pub port: u16,
}

/// Why the holder could not run a forwarded call (the body of a non-200 answer).
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardRefusal {
    /// `not_found`, `gone`, `timeout`, `refused`, `unsigned`, `invalid`, `no_room`,
    /// `image_missing` or `error`.
    pub error: String,
    /// What went wrong, for the caller.
    pub message: String,
    /// For `refused`: the executor's error kind (a live process not found, a limit reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

/// One live process or watch a peer opens (the body of `POST /cluster/v1/subscribe`).
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedSubscription {
    /// The sandbox.
    pub sandbox: Uuid,
    /// The caller's deadline for the first answer, milliseconds.
    pub deadline_ms: u64,
    /// What to open.
    pub open: Open,
}

/// What a [`ForwardedSubscription`] opens.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Open {
    /// Start a process.
    Start {
        /// As `proc.start` takes them.
        params: StartParams,
    },
    /// Attach to a live process by pid.
    AttachPid {
        /// Its pid.
        pid: u32,
    },
    /// Attach to a live process by tag.
    AttachTag {
        /// Its tag.
        tag: String,
    },
    /// Watch a directory.
    Watch {
        /// The directory.
        path: String,
        /// Its subdirectories too.
        recursive: bool,
    },
}

impl From<Subscription> for Open {
    fn from(subscription: Subscription) -> Self {
        match subscription {
            Subscription::Start(params) => Open::Start { params },
            Subscription::Attach(ProcessSelector::Pid(pid)) => Open::AttachPid { pid },
            Subscription::Attach(ProcessSelector::Tag(tag)) => Open::AttachTag { tag },
            Subscription::Watch { path, recursive } => Open::Watch { path, recursive },
        }
    }
}

impl From<Open> for Subscription {
    fn from(open: Open) -> Self {
        match open {
            Open::Start { params } => Subscription::Start(params),
            Open::AttachPid { pid } => Subscription::Attach(ProcessSelector::Pid(pid)),
            Open::AttachTag { tag } => Subscription::Attach(ProcessSelector::Tag(tag)),
            Open::Watch { path, recursive } => Subscription::Watch { path, recursive },
        }
    }
}

/// One line of a subscription's answer (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "frame", rename_all = "snake_case")]
pub enum Frame {
    /// First: a process was started or attached to.
    Process {
        /// Its pid.
        pid: u32,
        /// Its tag.
        tag: Option<String>,
        /// What the kernel enforced (a start only).
        landlock: Option<Enforcement>,
    },
    /// First: a watch was opened.
    Watch {
        /// The watched directory, absolute.
        path: String,
    },
    /// Output, base64.
    Stdout {
        /// The bytes, base64.
        data: String,
    },
    /// Output, base64.
    Stderr {
        /// The bytes, base64.
        data: String,
    },
    /// Terminal output, base64.
    Pty {
        /// The bytes, base64.
        data: String,
    },
    /// The holder's handle missed so many events (output bytes among them).
    Dropped {
        /// Events missed.
        events: u64,
        /// Output bytes among them.
        bytes: u64,
    },
    /// The process ended (last).
    End {
        /// How.
        end: ProcessEnd,
    },
    /// A change beneath the watched directory.
    Fs {
        /// What changed.
        event: FsEvent,
    },
    /// The watch ended (last).
    WatchEnd {
        /// Why.
        reason: String,
    },
    /// Nothing to send right now; the holder is alive.
    Beat,
    /// The holder stops serving this stream (last): it is shutting down, or failed.
    Stopped {
        /// Why.
        reason: String,
    },
}

impl Frame {
    /// The frame of one event a holder's handle read.
    pub fn of(event: Relayed) -> Frame {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        match event {
            Relayed::Process(ProcessEvent::Stdout(b)) => Frame::Stdout { data: b64(&b) },
            Relayed::Process(ProcessEvent::Stderr(b)) => Frame::Stderr { data: b64(&b) },
            Relayed::Process(ProcessEvent::Pty(b)) => Frame::Pty { data: b64(&b) },
            Relayed::Process(ProcessEvent::Dropped { events, bytes }) => {
                Frame::Dropped { events, bytes }
            }
            Relayed::Process(ProcessEvent::End(end)) => Frame::End { end },
            Relayed::Watch(WatchEvent::Fs(event)) => Frame::Fs { event },
            Relayed::Watch(WatchEvent::Dropped { events }) => Frame::Dropped { events, bytes: 0 },
            Relayed::Watch(WatchEvent::End { reason }) => Frame::WatchEnd { reason },
        }
    }

    /// The frame as one line of the answer.
    pub fn line(&self) -> Vec<u8> {
        // Plain data: serialising cannot fail.
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}
