//! The exchange of *held* sockets: WebSockets pinboard holds for an opted-in
//! namespace, delivering their events to the id's current owner, so that a
//! move of the id (a drain, a wind-down, a new deployment, a failover)
//! never closes them.
//!
//! This module owns the names, paths and JSON shapes of that exchange; it
//! never reads or writes a connection.
//!
//! 1. **Offer.** pinboard forwards a WebSocket handshake as any request,
//!    with [`SOCKET_OFFER`] naming the socket (unique per pinboard node and
//!    socket). A client's copy of it never reaches a worker (every
//!    `pinboard-*` field a client sends is stripped), and a worker trusts it
//!    only on an attested request.
//! 2. **Hold.** A worker whose namespace opted in answers the offer `200`
//!    with [`SOCKET_HELD`]` : 1` and a [`Hold`] body (the socket's tags,
//!    attachment and the namespace's auto-response) instead of `101`;
//!    pinboard completes the client's handshake itself and holds the
//!    socket. Any other answer (a `101` from a worker that did not opt in,
//!    a Python worker, a refusal) is relayed as before: byte-for-byte.
//! 3. **Events.** Each client message, and its close, is a
//!    `POST /<ns>/<id>`[`EVENT_PATH`] through pinboard's proxy to the id's
//!    owner (placed again if it has none), with [`SOCKET_EVENT`] naming the
//!    socket and an [`Event`] body; one in flight per socket, in order,
//!    retried until answered `2xx` ([`EventAnswer`], which carries what the
//!    event's handler sent) or the wake deadline passes.
//! 4. **Sends.** The owner sends to one socket or to the id's sockets with a
//!    tag by `POST` [`SEND_PATH`] ([`Sends`]) to the pinboard node it is
//!    registered with, bearing its registration token; pinboard delivers
//!    to the sockets it holds (and, on Redis, through every node).

use serde::{Deserialize, Serialize};

/// `pinboard-socket-offer`: on a WebSocket handshake pinboard forwards, the
/// id of the socket pinboard offers to hold.
pub const SOCKET_OFFER: http::HeaderName = http::HeaderName::from_static("pinboard-socket-offer");

/// `pinboard-socket-held`: on a worker's `200` answer to an offer, `1`: the
/// worker asks pinboard to hold the socket.
pub const SOCKET_HELD: http::HeaderName = http::HeaderName::from_static("pinboard-socket-held");

/// `pinboard-socket-event`: on an event pinboard delivers, the socket's id.
pub const SOCKET_EVENT: http::HeaderName = http::HeaderName::from_static("pinboard-socket-event");

/// The path, after `/<ns>/<id>`, events are delivered to.
pub const EVENT_PATH: &str = "/_pinned/sockets/event";

/// pinboard's path a worker sends to held sockets through.
pub const SEND_PATH: &str = "/registry/sockets/send";

/// Sends one [`Sends`] call carries at most.
pub const MAX_SENDS_PER_CALL: usize = 1_000;

/// The longest socket id pinboard mints or accepts, in bytes.
pub const MAX_SOCKET_ID_LEN: usize = 64;

/// A worker's answer to an offer it takes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// The socket's tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The socket's attachment (any JSON), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Box<serde_json::value::RawValue>>,
    /// The namespace's auto-response: `[request, reply]`, a text message
    /// pinboard answers itself without an event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_response: Option<(String, String)>,
}

/// What happened on a held socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// A text message (`data` is the text).
    Text,
    /// A binary message (`data` is its bytes, base64 with padding).
    Binary,
    /// The client closed (`code`, `reason`); the last event of a socket.
    Close,
}

/// One event of a held socket, as its owner receives it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// The socket's id (as offered).
    pub socket: String,
    /// 1 for the socket's first event, one more for each next one. A
    /// redelivered event keeps its number.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    /// The message (text, or base64 for binary); absent for a close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The close code (1005 when the client sent none, 1006 when its
    /// connection dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// The close reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The socket's tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The socket's attachment as pinboard last heard it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Box<serde_json::value::RawValue>>,
}

/// The owner's `2xx` answer to an event.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventAnswer {
    /// The socket's new attachment, when the event's handler set one:
    /// pinboard keeps it for the socket's next events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Box<serde_json::value::RawValue>>,
    /// What the event's handler sent (to this socket or any of the id's),
    /// at most [`MAX_SENDS_PER_CALL`]: pinboard delivers them as it takes
    /// the answer, so an owner that dies before answering loses none (the
    /// event is delivered again, and its sends made again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sends: Vec<Send>,
}

/// A worker's sends to held sockets, in order.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sends {
    /// At most [`MAX_SENDS_PER_CALL`].
    pub sends: Vec<Send>,
}

/// One send: to socket `socket` of `/<ns>/<id>`, or to its sockets with
/// `tag` (every one when both are absent). Exactly one of `text`,
/// `binary`, `close` and `attachment`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Send {
    /// The namespace, with its leading `/`.
    pub ns: String,
    /// The id.
    pub id: String,
    /// One socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// The sockets with this tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// A text message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A binary message, base64 with padding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
    /// Close the socket(s) with this code and reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close: Option<Close>,
    /// The socket's new attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<Box<serde_json::value::RawValue>>,
}

/// A close asked for by the owner.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Close {
    /// The close code.
    pub code: u16,
    /// The reason.
    #[serde(default)]
    pub reason: String,
}

/// pinboard's answer to [`Sends`].
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Delivered {
    /// Sends this node queued to a socket it holds (a send to a tag counts
    /// once per socket).
    pub delivered: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_as_written() {
        let event: Event = serde_json::from_str(
            r#"{"socket":"n1-7","seq":3,"kind":"text","data":"hi","tags":["a"],"attachment":{"name":"ada"}}"#,
        )
        .expect("event");
        assert_eq!(event.kind, EventKind::Text);
        assert_eq!(event.seq, 3);
        assert_eq!(
            event.attachment.expect("attachment").get(),
            r#"{"name":"ada"}"#
        );
        let hold = serde_json::to_string(&Hold {
            tags: vec!["a".into()],
            attachment: None,
            auto_response: Some(("ping".into(), "pong".into())),
        })
        .expect("hold");
        assert_eq!(hold, r#"{"tags":["a"],"autoResponse":["ping","pong"]}"#);
    }
}
