//! What a node publishes to the others ([`super::relay`]): the
//! publication's shape and bound, and the entry sends are queued through
//! ([`Relay`]).
//!
//! Owns which sends leave this node and how they are cut into
//! publications; never talks to Redis (the relay's publisher task does).

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use pinned_wire::held::Send;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// The largest payload one publication carries (and a subscriber reads):
/// a call's sends are split over as many publications as they need; one
/// send larger than this alone is delivered on the node that took it only
/// (WARN).
pub const MAX_PUBLICATION: usize = 1024 * 1024;
/// Publications waiting for the publisher; one more is dropped (WARN).
pub const PUBLISH_QUEUE: usize = 1_024;

/// One publication: the node that made it and the sends.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Relayed {
    /// The node's part of socket ids.
    pub(crate) from: String,
    /// The sends, checked by the node that took them.
    pub(crate) sends: Vec<Send>,
}

/// A running relay's entry: publications go to its publisher task.
#[derive(Debug)]
pub struct Relay {
    queue: mpsc::Sender<Bytes>,
    node: Box<str>,
    /// Whether the last publication was dropped: one WARN per run of drops.
    dropping: AtomicBool,
}

impl Relay {
    /// An entry for node `node` queueing to `queue`.
    pub(crate) fn new(node: &str, queue: mpsc::Sender<Bytes>) -> Self {
        Self {
            queue,
            node: node.into(),
            dropping: AtomicBool::new(false),
        }
    }
}

impl Relay {
    /// Queues `sends` (checked) for the other nodes: every send but those
    /// addressed to a socket of this node, in publications of at most
    /// [`MAX_PUBLICATION`] bytes.
    pub fn publish(&self, sends: &[Send]) {
        let theirs: Vec<&Send> = sends
            .iter()
            .filter(|send| {
                send.socket
                    .as_deref()
                    .is_none_or(|socket| node_of(socket) != Some(&*self.node))
            })
            .collect();
        for payload in publications(&self.node, &theirs, MAX_PUBLICATION) {
            if self.queue.try_send(payload).is_ok() {
                self.dropping.store(false, Ordering::Relaxed);
            } else if !self.dropping.swap(true, Ordering::Relaxed) {
                tracing::warn!(target: "pinboard::held", "the relay's queue is full or closed: publications to the other nodes are dropped until it takes them again");
            }
        }
    }
}

/// The node part of a socket id (`<node>-<n>`).
pub fn node_of(socket: &str) -> Option<&str> {
    socket.rsplit_once('-').map(|(node, _)| node)
}

/// `sends` as JSON payloads of at most `max` bytes each, in order; a send
/// that alone is larger is left out (WARN).
fn publications(node: &str, sends: &[&Send], max: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut batch: Vec<Send> = Vec::new();
    let mut size = 0usize;
    let envelope = node.len() + 32;
    for send in sends {
        let one = serde_json::to_vec(send).map_or(usize::MAX, |json| json.len() + 1);
        if one.saturating_add(envelope) > max {
            tracing::warn!(target: "pinboard::held", ns = %send.ns, id = %send.id, bytes = one, "a send too large to relay reaches this node's sockets only");
            continue;
        }
        if size + one + envelope > max && !batch.is_empty() {
            out.push(encode(node, std::mem::take(&mut batch)));
            size = 0;
        }
        size += one;
        batch.push((*send).clone());
    }
    if !batch.is_empty() {
        out.push(encode(node, batch));
    }
    out
}

fn encode(node: &str, sends: Vec<Send>) -> Bytes {
    let relayed = Relayed {
        from: node.to_owned(),
        sends,
    };
    Bytes::from(serde_json::to_vec(&relayed).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(socket: Option<&str>, text: &str) -> Send {
        Send {
            ns: "/c".into(),
            id: "a".into(),
            socket: socket.map(str::to_owned),
            text: Some(text.into()),
            ..Send::default()
        }
    }

    #[test]
    fn publications_keep_the_bound_and_the_order() {
        let sends: Vec<Send> = (0..10).map(|i| text(None, &"x".repeat(100 + i))).collect();
        let refs: Vec<&Send> = sends.iter().collect();
        let payloads = publications("n1", &refs, 400);
        assert!(payloads.len() > 1);
        let mut seen = Vec::new();
        for payload in &payloads {
            assert!(payload.len() <= 400, "{} bytes", payload.len());
            let relayed: Relayed = serde_json::from_slice(payload).expect("relayed");
            assert_eq!(relayed.from, "n1");
            seen.extend(relayed.sends.into_iter().map(|s| s.text.expect("text")));
        }
        let want: Vec<String> = sends.into_iter().map(|s| s.text.expect("text")).collect();
        assert_eq!(seen, want);
        let huge = text(None, &"y".repeat(1_000));
        assert!(publications("n1", &[&huge], 400).is_empty());
    }

    #[test]
    fn a_socket_id_names_its_node() {
        assert_eq!(node_of("a1b2c3-17"), Some("a1b2c3"));
        assert_eq!(node_of("plain"), None);
    }

    #[tokio::test]
    async fn sends_to_this_nodes_sockets_are_not_published() {
        let (queue, mut pending) = mpsc::channel(8);
        let relay = Relay::new("me", queue);
        relay.publish(&[
            text(Some("me-1"), "mine"),
            text(Some("you-1"), "yours"),
            text(None, "all"),
        ]);
        let payload = pending.try_recv().expect("one publication");
        let relayed: Relayed = serde_json::from_slice(&payload).expect("relayed");
        let texts: Vec<_> = relayed
            .sends
            .iter()
            .filter_map(|s| s.text.clone())
            .collect();
        assert_eq!(texts, ["yours", "all"]);
        assert!(pending.try_recv().is_err());
    }
}
