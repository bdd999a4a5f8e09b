//! A worker's sends (`POST /registry/sockets/send`, `pinned_wire::held::Sends`)
//! checked and handed to the sockets this node holds.
//!
//! Owns what a send may say and how it reaches a socket's outbox; never
//! writes to a connection. The other nodes get a send through the relay's
//! entry ([`super::publish::Relay`]) when placement runs on Redis; this
//! module never talks to them itself.

use base64::Engine as _;
use pinned_wire::held::{Send, Sends, MAX_SENDS_PER_CALL, MAX_SOCKET_ID_LEN};
use tokio_tungstenite::tungstenite::Message;

use super::registry::{HeldSockets, Outgoing};

/// A send that says nothing pinboard can do. Answered 400 with the
/// message as `detail`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// More sends than one call takes.
    #[error("a call carries at most {max} sends, this one {got}")]
    TooMany {
        /// [`MAX_SENDS_PER_CALL`].
        max: usize,
        /// How many it carried.
        got: usize,
    },
    /// A send with none, or more than one, of `text`, `binary`, `close`,
    /// `attachment`.
    #[error(
        "send {index}: exactly one of \"text\", \"binary\", \"close\", \"attachment\" is required"
    )]
    Action {
        /// Its position in the call.
        index: usize,
    },
    /// `binary` that is not base64.
    #[error("send {index}: \"binary\" is not base64 (standard alphabet, padded)")]
    Binary {
        /// Its position in the call.
        index: usize,
    },
    /// A namespace without its leading `/`, or an empty id.
    #[error("send {index}: \"ns\" starts with '/' and \"id\" is not empty")]
    Target {
        /// Its position in the call.
        index: usize,
    },
    /// A socket id longer than pinboard mints.
    #[error("send {index}: \"socket\" is at most {MAX_SOCKET_ID_LEN} bytes")]
    SocketId {
        /// Its position in the call.
        index: usize,
    },
    /// A close code a close frame may not carry.
    #[error("send {index}: close code {code} is not one an endpoint may send (1000, 1001, 1003, 1007-1014, 3000-4999)")]
    CloseCode {
        /// Its position in the call.
        index: usize,
        /// The code.
        code: u16,
    },
}

/// Checks every send of `sends` before any is delivered.
///
/// # Errors
///
/// The first problem found.
pub fn check(sends: &Sends) -> Result<(), SendError> {
    if sends.sends.len() > MAX_SENDS_PER_CALL {
        return Err(SendError::TooMany {
            max: MAX_SENDS_PER_CALL,
            got: sends.sends.len(),
        });
    }
    for (index, send) in sends.sends.iter().enumerate() {
        let actions = [
            send.text.is_some(),
            send.binary.is_some(),
            send.close.is_some(),
            send.attachment.is_some(),
        ];
        if actions.iter().filter(|on| **on).count() != 1 {
            return Err(SendError::Action { index });
        }
        if !send.ns.starts_with('/') || send.ns.len() < 2 || send.id.is_empty() {
            return Err(SendError::Target { index });
        }
        if send
            .socket
            .as_ref()
            .is_some_and(|id| id.len() > MAX_SOCKET_ID_LEN)
        {
            return Err(SendError::SocketId { index });
        }
        if let Some(binary) = &send.binary {
            if base64::engine::general_purpose::STANDARD
                .decode(binary)
                .is_err()
            {
                return Err(SendError::Binary { index });
            }
        }
        if let Some(close) = &send.close {
            let code = close.code;
            let valid = matches!(code, 1000 | 1001 | 1003 | 1007..=1014 | 3000..=4999);
            if !valid {
                return Err(SendError::CloseCode { index, code });
            }
        }
    }
    Ok(())
}

/// Hands `sends` (checked) to the sockets this node holds, in order, and
/// to the other nodes' through the relay when there is one; answers how
/// many socket outboxes of this node took one.
pub fn deliver(sockets: &HeldSockets, sends: &Sends) -> usize {
    let delivered = deliver_here(sockets, sends);
    if let Some(relay) = sockets.relay() {
        relay.publish(&sends.sends);
    }
    delivered
}

/// Hands `sends` (checked) to the sockets this node holds, in order;
/// answers how many socket outboxes took one.
pub fn deliver_here(sockets: &HeldSockets, sends: &Sends) -> usize {
    let mut delivered = 0;
    for send in &sends.sends {
        let key = format!("{}/{}", send.ns, send.id);
        for socket in sockets.select(&key, send.socket.as_deref(), send.tag.as_deref()) {
            let taken = match outgoing(send) {
                Some(outgoing) => socket.push(outgoing),
                None => match &send.attachment {
                    Some(attachment) => {
                        socket.set_attachment(attachment.clone());
                        true
                    }
                    None => false,
                },
            };
            if taken {
                delivered += 1;
            }
        }
    }
    sockets.count_sends(delivered);
    delivered
}

fn outgoing(send: &Send) -> Option<Outgoing> {
    if let Some(text) = &send.text {
        return Some(Outgoing::Message(Message::text(text.clone())));
    }
    if let Some(binary) = &send.binary {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(binary)
            .unwrap_or_default();
        return Some(Outgoing::Message(Message::binary(bytes)));
    }
    send.close
        .as_ref()
        .map(|close| Outgoing::Close(close.code, close.reason.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(json: &str) -> Sends {
        serde_json::from_str(json).expect("sends")
    }

    #[test]
    fn bad_sends_are_named() {
        assert_eq!(
            check(&send(r#"{"sends":[{"ns":"/c","id":"a"}]}"#)),
            Err(SendError::Action { index: 0 })
        );
        assert_eq!(
            check(&send(
                r#"{"sends":[{"ns":"/c","id":"a","text":"x"},{"ns":"c","id":"a","text":"x"}]}"#
            )),
            Err(SendError::Target { index: 1 })
        );
        assert_eq!(
            check(&send(r#"{"sends":[{"ns":"/c","id":"a","binary":"!!"}]}"#)),
            Err(SendError::Binary { index: 0 })
        );
        assert_eq!(
            check(&send(
                r#"{"sends":[{"ns":"/c","id":"a","close":{"code":1005}}]}"#
            )),
            Err(SendError::CloseCode {
                index: 0,
                code: 1005
            })
        );
        assert!(check(&send(
            r#"{"sends":[{"ns":"/c","id":"a","tag":"t","text":"x"}]}"#
        ))
        .is_ok());
    }
}
