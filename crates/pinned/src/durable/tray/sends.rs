//! The sender's half of messages between objects as data: the
//! `~outgoing` entry of a tray's row, a stream of numbered letters waiting
//! for their receiver's answer.
//!
//! It owns the entry's shape and bounds only; it never writes a row nor
//! delivers anything (the courier does, over the tray's write path).
//!
//! Stored as `{"stream": "<16 hex>", "next": n, "queue": [letter, …]}`. The
//! stream is drawn once per tray row, at its first send: a receiver keeps
//! one high-water mark per stream, so a tray deleted and created again
//! starts a new stream instead of repeating the numbers an old one used.
//! `next` stays when the queue empties, for the same reason.

use std::collections::VecDeque;

use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::field::Entry;
use super::{TrayError, MAX_OUTGOING, MAX_OUTGOING_BYTES};

/// The reserved row entry of a tray's unanswered sends (Rust-only).
pub(crate) const OUTGOING_KEY: &str = "~outgoing";

/// One message on its way: where to, its number in the stream, the item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Letter {
    pub(crate) seq: u64,
    /// The receiver's namespace, with its leading slash.
    pub(crate) ns: String,
    pub(crate) id: String,
    /// The receiver's tray name and key (`~` for a singleton).
    pub(crate) tray: String,
    pub(crate) key: String,
    pub(crate) message: Json,
}

/// A letter before it is numbered: what a send stages.
#[derive(Clone, Debug)]
pub(crate) struct Draft {
    pub(crate) ns: String,
    pub(crate) id: String,
    pub(crate) tray: &'static str,
    pub(crate) key: String,
    pub(crate) message: Json,
    /// The message's encoded size, checked against
    /// [`MAX_MESSAGE_BYTES`](super::MAX_MESSAGE_BYTES) when drafted.
    pub(crate) bytes: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    stream: String,
    next: u64,
    #[serde(default)]
    queue: VecDeque<Letter>,
}

/// A tray's unanswered sends, restored from and written to `~outgoing`.
#[derive(Debug, Default)]
pub(crate) struct Sends {
    stored: Option<Stored>,
    /// The encoded size of the queued messages.
    bytes: usize,
    /// A courier delivers them now.
    pub(crate) running: bool,
}

fn encoded_len(message: &Json) -> usize {
    serde_json::to_vec(message).map_or(0, |bytes| bytes.len())
}

impl Sends {
    /// Restores the entry as stored (`None`: the tray never sent).
    pub(crate) fn restore(entry: Option<&Json>) -> Result<Self, String> {
        let Some(entry) = entry else {
            return Ok(Self::default());
        };
        let stored: Stored = serde_json::from_value(entry.clone())
            .map_err(|error| format!("malformed outgoing messages: {error}"))?;
        let bytes = stored
            .queue
            .iter()
            .map(|letter| encoded_len(&letter.message))
            .sum();
        Ok(Self {
            stored: Some(stored),
            bytes,
            running: false,
        })
    }

    /// The entry to store: absent until the first send, then kept (its
    /// stream and next number outlive an empty queue).
    pub(crate) fn entry(&self) -> Result<Option<Entry>, TrayError> {
        self.stored
            .as_ref()
            .map(Entry::of)
            .transpose()
            .map_err(|error| TrayError::Encode(format!("{OUTGOING_KEY}: {error}")))
    }

    /// Whether letters wait for an answer.
    pub(crate) fn is_empty(&self) -> bool {
        self.stored
            .as_ref()
            .is_none_or(|stored| stored.queue.is_empty())
    }

    /// How many letters wait.
    pub(crate) fn len(&self) -> usize {
        self.stored.as_ref().map_or(0, |stored| stored.queue.len())
    }

    /// Whether `drafts` fit beside the letters waiting.
    pub(crate) fn check_room(&self, drafts: &[Draft]) -> Result<(), TrayError> {
        let count = self.len().saturating_add(drafts.len());
        let bytes = drafts
            .iter()
            .fold(self.bytes, |sum, draft| sum.saturating_add(draft.bytes));
        if count > MAX_OUTGOING || bytes > MAX_OUTGOING_BYTES {
            return Err(TrayError::OutboxFull {
                letters: count,
                bytes,
            });
        }
        Ok(())
    }

    /// Numbers `draft` and queues it; its sequence number.
    pub(crate) fn push(&mut self, draft: Draft) -> u64 {
        let stored = self.stored.get_or_insert_with(|| {
            let mut bytes = [0u8; 8];
            rand::rng().fill_bytes(&mut bytes);
            Stored {
                stream: bytes.iter().map(|byte| format!("{byte:02x}")).collect(),
                next: 1,
                queue: VecDeque::new(),
            }
        });
        let seq = stored.next;
        stored.next = stored.next.saturating_add(1);
        self.bytes = self.bytes.saturating_add(draft.bytes);
        stored.queue.push_back(Letter {
            seq,
            ns: draft.ns,
            id: draft.id,
            tray: draft.tray.to_owned(),
            key: draft.key,
            message: draft.message,
        });
        seq
    }

    /// The stream and the oldest letter waiting.
    pub(crate) fn front(&self) -> Option<(&str, &Letter)> {
        let stored = self.stored.as_ref()?;
        Some((stored.stream.as_str(), stored.queue.front()?))
    }

    /// Drops the oldest letter if it is number `seq` (answered); true if it
    /// was.
    pub(crate) fn answered(&mut self, seq: u64) -> bool {
        let Some(stored) = self.stored.as_mut() else {
            return false;
        };
        if stored.queue.front().is_none_or(|letter| letter.seq != seq) {
            return false;
        }
        if let Some(letter) = stored.queue.pop_front() {
            self.bytes = self.bytes.saturating_sub(encoded_len(&letter.message));
        }
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use super::*;

    fn draft(n: u64) -> Draft {
        let message = Json::from(n);
        Draft {
            ns: "/ledger".to_owned(),
            id: "a".to_owned(),
            tray: "entries",
            key: "~".to_owned(),
            bytes: encoded_len(&message),
            message,
        }
    }

    #[test]
    fn numbers_letters_in_order_and_keeps_the_next_number_when_empty() {
        let mut sends = Sends::default();
        assert!(sends.entry().unwrap().is_none());
        assert_eq!(sends.push(draft(7)), 1);
        assert_eq!(sends.push(draft(8)), 2);
        assert!(!sends.answered(2), "only the oldest is answered");
        assert!(sends.answered(1));
        assert!(sends.answered(2));
        assert!(sends.is_empty());
        let stored: Json = serde_json::from_str(sends.entry().unwrap().unwrap().json()).unwrap();
        assert_eq!(stored["next"], 3);
        let mut restored = Sends::restore(Some(&stored)).unwrap();
        assert_eq!(restored.push(draft(9)), 3, "numbers never repeat");
        assert_eq!(
            restored.front().unwrap().0,
            stored["stream"].as_str().unwrap()
        );
    }

    #[test]
    fn refuses_sends_beyond_its_bounds() {
        let mut sends = Sends::default();
        for n in 0..MAX_OUTGOING as u64 {
            sends.push(draft(n));
        }
        assert!(matches!(
            sends.check_room(&[draft(0)]),
            Err(TrayError::OutboxFull { .. })
        ));
        let big = Draft {
            bytes: MAX_OUTGOING_BYTES + 1,
            ..draft(0)
        };
        assert!(Sends::default().check_room(&[big]).is_err());
        assert!(Sends::restore(Some(&serde_json::json!({"next": "x"}))).is_err());
    }
}
