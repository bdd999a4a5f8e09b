//! What moved recently: a bounded ring of re-placements, each with why.
//!
//! Owns the ring and the short memory of ids whose owner just let go of them
//! (released, deregistered, lapsed), so that the next claim of such an id can
//! say where it came from. Fed by this node's [`Routes`] and registry
//! shell; never reads the store and never blocks on anything but its own
//! short locks. Both collections are bounded ([`MOVE_RING_CAPACITY`],
//! [`DEPARTED_CAPACITY`]): a node that sees more churn forgets the oldest.
//!
//! Each move is logged: a failover (owner's lease lapsed, or its process
//! replaced) at warn, any other at debug.
//!
//! A move is what *this node* saw: a claim made by another pinboard node is
//! in that node's ring, and a first placement of a new id is no move.
//!
//! [`Routes`]: crate::routes::Routes

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How a session superseded by a new process at its advertise URL is told
/// (the start of its supersession reason, which every node can read back
/// from the store to say why an id left it).
pub const REPLACED_REASON: &str = "superseded by a new process at its advertise URL";

/// Most moves kept (the oldest goes first).
pub const MOVE_RING_CAPACITY: usize = 256;
/// Most ids remembered between their owner letting go and their next claim.
pub const DEPARTED_CAPACITY: usize = 4096;

/// Why an id left its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// The owner's lease lapsed (it stopped heartbeating).
    LeaseLapsed,
    /// The owner refused the id (wrong epoch, closing, capacity).
    Refusal,
    /// The owner was draining when it let go of the id.
    Drain,
    /// The owner released the id (idle eviction, wind-down).
    Released,
    /// The owner's session ended (deregistered or superseded).
    SessionEnded,
    /// The owner's process was replaced: a new process registered at its
    /// advertise URL (a crash and restart), superseding its session.
    Replaced,
}

impl MoveReason {
    /// Why an id left a session that is gone, from what the store says of
    /// it: its supersession reason, if it was superseded.
    pub fn of_gone_session(superseded: Option<&str>) -> Self {
        match superseded {
            Some(reason) if reason.starts_with(REPLACED_REASON) => Self::Replaced,
            Some(_) => Self::SessionEnded,
            None => Self::LeaseLapsed,
        }
    }

    /// The reason as written in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LeaseLapsed => "lease_lapsed",
            Self::Refusal => "refusal",
            Self::Drain => "drain",
            Self::Released => "released",
            Self::SessionEnded => "session_ended",
            Self::Replaced => "replaced",
        }
    }
}

/// One re-placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    /// When the new owner claimed it (Unix ms, this node's clock).
    pub at_ms: u64,
    /// Namespace with its slash.
    pub ns: String,
    /// Instance id.
    pub id: String,
    /// The session that had it.
    pub from: String,
    /// The session that has it now.
    pub to: String,
    /// The new placement epoch (decimal string, as epochs travel).
    pub epoch: String,
    /// Why it left `from`.
    pub reason: MoveReason,
}

/// A claim this node made, as [`MoveLog::claimed`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// Cache key `<ns>/<id>`.
    pub key: &'a str,
    /// Namespace with its slash.
    pub ns: &'a str,
    /// Instance id.
    pub id: &'a str,
    /// The session that got it.
    pub to: &'a str,
    /// The new placement epoch.
    pub epoch: u64,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// The ring of recent moves and the ids waiting to be claimed again.
#[derive(Debug)]
pub struct MoveLog {
    ring: Mutex<VecDeque<Move>>,
    departed: quick_cache::sync::Cache<String, (String, MoveReason)>,
    /// Counts failovers (`pinboard_failovers_total`).
    failovers: prometheus_client::metrics::counter::Counter,
}

impl Default for MoveLog {
    fn default() -> Self {
        Self {
            ring: Mutex::new(VecDeque::with_capacity(MOVE_RING_CAPACITY)),
            departed: quick_cache::sync::Cache::new(DEPARTED_CAPACITY),
            failovers: prometheus_client::metrics::counter::Counter::default(),
        }
    }
}

impl MoveLog {
    /// An empty log counting failovers in `failovers`.
    pub fn counting(failovers: prometheus_client::metrics::counter::Counter) -> Self {
        Self {
            failovers,
            ..Self::default()
        }
    }

    /// `key` (`<ns>/<id>`) left session `from` for `reason`; its next
    /// claim on this node is a move.
    pub fn departed(&self, key: &str, from: &str, reason: MoveReason) {
        self.departed
            .insert(key.to_owned(), (from.to_owned(), reason));
    }

    /// This node claimed `ns`/`id` for session `to` at `epoch`. `known` is
    /// where it came from when the caller knows (a refusal, a lapsed cached
    /// owner, the row's previous owner); else the departure remembered for
    /// `key`, if any. A claim with neither is a first placement and is not
    /// recorded.
    pub fn claimed(&self, claim: Claim<'_>, known: Option<(&str, MoveReason)>) {
        let Claim {
            key,
            ns,
            id,
            to,
            epoch,
            at_ms,
        } = claim;
        let remembered = self.departed.remove(key).map(|(_, v)| v);
        let (from, reason) = match (known, remembered) {
            (Some((from, reason)), _) => (from.to_owned(), reason),
            (None, Some(departure)) => departure,
            (None, None) => return,
        };
        if from == to {
            // The owner came back for it (a re-registration's reclaim).
            return;
        }
        // A failover (the owner died or was replaced) is worth a warning;
        // a drain, a refusal or a release moving an id is routine.
        match reason {
            MoveReason::LeaseLapsed | MoveReason::Replaced => {
                self.failovers.inc();
                tracing::warn!(
                    target: "pinboard::placement",
                    ns, id, from = %from, to, epoch, reason = reason.as_str(),
                    "failover: id re-placed after its owner went"
                );
            }
            _ => tracing::debug!(
                target: "pinboard::placement",
                ns, id, from = %from, to, epoch, reason = reason.as_str(),
                "id moved"
            ),
        }
        let mut ring = self.ring.lock();
        if ring.len() == MOVE_RING_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(Move {
            at_ms,
            ns: ns.to_owned(),
            id: id.to_owned(),
            from,
            to: to.to_owned(),
            epoch: epoch.to_string(),
            reason,
        });
    }

    /// Whether a departure of `key` is remembered (its next claim here
    /// knows where it came from).
    pub fn remembers(&self, key: &str) -> bool {
        self.departed.get(key).is_some()
    }

    /// Up to `limit` moves, newest first.
    pub fn recent(&self, limit: usize) -> Vec<Move> {
        self.ring.lock().iter().rev().take(limit).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(key: &'a str, id: &'a str, to: &'a str, epoch: u64) -> Claim<'a> {
        Claim {
            key,
            ns: "/c",
            id,
            to,
            epoch,
            at_ms: 1,
        }
    }

    #[test]
    fn a_departure_turns_the_next_claim_into_a_move_and_the_ring_stays_bounded() {
        let log = MoveLog::default();
        log.claimed(claim("/c/new", "new", "s1", 1), None);
        assert!(log.recent(10).is_empty(), "a first placement is no move");
        log.departed("/c/a", "s1", MoveReason::Drain);
        log.claimed(claim("/c/a", "a", "s2", 7), None);
        let moves = log.recent(10);
        assert_eq!(moves.len(), 1);
        assert_eq!(
            (
                moves[0].from.as_str(),
                moves[0].to.as_str(),
                moves[0].reason
            ),
            ("s1", "s2", MoveReason::Drain)
        );
        assert_eq!(moves[0].epoch, "7");
        log.claimed(claim("/c/a", "a", "s3", 8), None);
        assert_eq!(log.recent(10).len(), 1, "the departure is used once");
        log.claimed(
            claim("/c/b", "b", "s1", 9),
            Some(("s1", MoveReason::Refusal)),
        );
        assert_eq!(log.recent(10).len(), 1, "back to the same owner is no move");
        for i in 0..MOVE_RING_CAPACITY + 10 {
            let (key, id) = (format!("/c/{i}"), i.to_string());
            log.claimed(
                claim(&key, &id, "s2", 1),
                Some(("s1", MoveReason::LeaseLapsed)),
            );
        }
        let moves = log.recent(usize::MAX);
        assert_eq!(moves.len(), MOVE_RING_CAPACITY);
        assert_eq!(
            moves[0].id,
            (MOVE_RING_CAPACITY + 9).to_string(),
            "newest first"
        );
    }
}
