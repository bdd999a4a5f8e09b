//! The receiver's half of messages between objects as data: the
//! `~received` entry of a tray's row, the highest message number admitted
//! from each sender's stream.
//!
//! It owns the entry's shape and its eviction rule only; it never writes a
//! row (the receiving route does, in the admission's own write).
//!
//! A sender delivers its stream one letter at a time, in order, and moves
//! on only once a letter was answered; so a number at or below the mark is
//! a repeat and one above it is new, with no window of ids to keep. Stored
//! as `[[sender, highest], …]`, least recently admitted first; beyond the
//! tray's [`SENDER_WINDOW`](super::Tray::SENDER_WINDOW) senders the least
//! recently admitted one is forgotten.

use super::field::Entry;
use super::TrayError;

/// The reserved row entry of a tray's per-sender marks (Rust-only).
pub(crate) const RECEIVED_KEY: &str = "~received";

/// The marks of one tray, least recently admitted first.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Window {
    marks: Vec<(String, u64)>,
}

impl Window {
    /// Restores the entry as stored (`None`: nothing received yet).
    pub(crate) fn restore(entry: Option<&str>) -> Result<Self, String> {
        let Some(entry) = entry else {
            return Ok(Self::default());
        };
        let marks: Vec<(String, u64)> = serde_json::from_str(entry)
            .map_err(|error| format!("malformed received marks: {error}"))?;
        Ok(Self { marks })
    }

    /// The entry to store.
    pub(crate) fn entry(&self) -> Result<Option<Entry>, TrayError> {
        if self.marks.is_empty() {
            return Ok(None);
        }
        Entry::of(&self.marks)
            .map(Some)
            .map_err(|error| TrayError::Encode(format!("{RECEIVED_KEY}: {error}")))
    }

    /// Whether `sender`'s number `seq` was admitted already.
    pub(crate) fn seen(&self, sender: &str, seq: u64) -> bool {
        self.marks
            .iter()
            .any(|(known, highest)| known == sender && seq <= *highest)
    }

    /// Records `sender`'s number `seq` as admitted (the newest), forgetting
    /// the least recently admitted senders beyond `limit`.
    pub(crate) fn note(&mut self, sender: &str, seq: u64, limit: usize) {
        self.marks.retain(|(known, _)| known != sender);
        self.marks.push((sender.to_owned(), seq));
        let excess = self.marks.len().saturating_sub(limit.max(1));
        self.marks.drain(..excess);
    }

    /// The marks as JSON, for tests and logs.
    #[cfg(test)]
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::to_value(&self.marks).unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on the unexpected
mod tests {
    use super::*;

    #[test]
    fn a_number_at_or_below_the_mark_is_a_repeat() {
        let mut window = Window::default();
        assert!(!window.seen("/a/1#s", 1));
        window.note("/a/1#s", 1, 4);
        window.note("/a/1#s", 2, 4);
        assert!(window.seen("/a/1#s", 1));
        assert!(window.seen("/a/1#s", 2));
        assert!(!window.seen("/a/1#s", 3));
        assert!(
            !window.seen("/a/1#t", 1),
            "another stream is another sender"
        );
        let stored = window.entry().unwrap().unwrap();
        assert_eq!(Window::restore(Some(stored.json())).unwrap(), window);
        assert!(Window::restore(Some("{}")).is_err());
    }

    #[test]
    fn forgets_the_least_recently_admitted_sender_beyond_the_limit() {
        let mut window = Window::default();
        window.note("a", 1, 2);
        window.note("b", 1, 2);
        window.note("a", 2, 2);
        window.note("c", 1, 2);
        assert_eq!(window.json(), serde_json::json!([["a", 2], ["c", 1]]));
    }
}
