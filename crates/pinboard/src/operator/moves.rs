//! What moved recently: a bounded ring of re-placements, each with why
//! the id left its owner and what re-placed it.
//!
//! Owns the ring, the short memory of ids whose owner just let go of them
//! (released, deregistered, lost with the store), so that the next claim
//! of such an id can say where it came from, and the memory of ids this
//! node asked to wind down. Fed by this node's [`Routes`] and registry
//! shell; never reads the store and never blocks on anything but its own
//! short locks. Every collection is bounded ([`MOVE_RING_CAPACITY`],
//! [`DEPARTED_CAPACITY`]): a node that sees more churn forgets the oldest.
//!
//! Each move is logged: a failover (owner's lease lapsed, or its process
//! replaced) at warn, any other at debug.
//!
//! A move is what *this node* saw: a claim made by another pinboard node is
//! in that node's ring, and a first placement of a new id is no move. The
//! claim itself says which session the row moved from (the store answers
//! it), so the node that re-places an id records it whichever node saw the
//! owner go; a remembered departure only adds why, when the store cannot
//! tell (a release empties the row's owner, a store loss empties the row).
//!
//! [`Routes`]: crate::routes::Routes

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How a session superseded by a new process at its advertise URL is told
/// (the start of its supersession reason, which every node can read back
/// from the store to say why an id left it).
pub const REPLACED_REASON: &str = "superseded by a new process at its advertise URL";

/// The start of the supersession reason of a session a newer deployment of
/// its hostname took over at once.
pub const TAKEOVER_REASON: &str = "superseded by deployment epoch";

/// The start of the supersession reason of a session a newer deployment
/// took over after winding it down (`takeover: "wind_down"`).
pub const WOUND_DOWN_REASON: &str = "wound down for a newer deployment";

/// Most moves kept (the oldest goes first).
pub const MOVE_RING_CAPACITY: usize = 256;
/// Most ids remembered between their owner letting go and their next claim.
pub const DEPARTED_CAPACITY: usize = 4096;

/// Why an id left its owner. The JSON names (`as_str`) are stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// The owner's lease lapsed (it stopped heartbeating: killed, frozen,
    /// cut off), or it went without a word the store kept.
    LeaseLapsed,
    /// The owner refused the id (wrong epoch, closing, capacity).
    Refusal,
    /// The owner was draining (operator drain, or shutting down) when it
    /// let go of the id.
    Drain,
    /// The owner released the id on its own (idle eviction).
    Released,
    /// The owner released the id after the operator asked it to wind that
    /// id down (`wind_down` push).
    WindDown,
    /// The owner's session ended (deregistered, or ended by its own
    /// process's re-registration).
    SessionEnded,
    /// The owner's process was replaced: a new process registered at its
    /// advertise URL (a crash and restart), superseding its session.
    Replaced,
    /// A newer deployment of the owner's hostname took the slot over: the
    /// owner was superseded, or wound down and then superseded.
    Takeover,
    /// The placement store lost its data while the owner held the id, and
    /// the owner did not reclaim it.
    StoreLoss,
}

impl MoveReason {
    /// Why an id left a session that is gone, from what the store says of
    /// it: its supersession reason, if it was superseded.
    pub fn of_gone_session(superseded: Option<&str>) -> Self {
        match superseded {
            Some(reason) if reason.starts_with(REPLACED_REASON) => Self::Replaced,
            Some(reason)
                if reason.starts_with(TAKEOVER_REASON) || reason.starts_with(WOUND_DOWN_REASON) =>
            {
                Self::Takeover
            }
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
            Self::WindDown => "wind_down",
            Self::SessionEnded => "session_ended",
            Self::Replaced => "replaced",
            Self::Takeover => "takeover",
            Self::StoreLoss => "store_loss",
        }
    }

    /// Whether the owner went (rather than letting go): a failover,
    /// counted in `pinboard_failovers_total`.
    fn is_failover(self) -> bool {
        matches!(self, Self::LeaseLapsed | Self::Replaced)
    }
}

/// What re-placed an id. The JSON names (`as_str`) are stable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MovedBy {
    /// A request through the proxy (a client, or a cluster call).
    #[default]
    Request,
    /// A sweeper call: a `_wake` (an orphan, a marked or unsettled id) or
    /// an `_alarm`, with no client asking.
    Sweeper,
    /// An operator's state control (`pinboard state …`) placing an id
    /// with no live owner so that an owner acts on it.
    Operator,
}

impl MovedBy {
    /// The name as written in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Sweeper => "sweeper",
            Self::Operator => "operator",
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
    /// What re-placed it (absent in answers of older nodes: a request).
    #[serde(default)]
    pub by: MovedBy,
}

/// A claim this node made, as [`MoveLog::claimed`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
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
    /// What made the claim.
    pub by: MovedBy,
}

/// A departure remembered until the id's next claim: the session it
/// left, and why when that was seen (`None`: this node lost sight of the
/// owner, for a reason the store may still tell; see
/// [`MoveLog::lost_sight`]).
pub type Departure = (String, Option<MoveReason>);

/// The ring of recent moves and the ids waiting to be claimed again.
#[derive(Debug)]
pub struct MoveLog {
    ring: Mutex<VecDeque<Move>>,
    departed: quick_cache::sync::Cache<String, Departure>,
    /// Ids the operator asked to wind down through this node, with the
    /// session asked: their release is a wind-down, not an idle release.
    winding: quick_cache::sync::Cache<String, String>,
    /// Counts failovers (`pinboard_failovers_total`).
    failovers: prometheus_client::metrics::counter::Counter,
}

impl Default for MoveLog {
    fn default() -> Self {
        Self {
            ring: Mutex::new(VecDeque::with_capacity(MOVE_RING_CAPACITY)),
            departed: quick_cache::sync::Cache::new(DEPARTED_CAPACITY),
            winding: quick_cache::sync::Cache::new(DEPARTED_CAPACITY),
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
    /// claim on this node is a move. A departure from the same session
    /// remembered already keeps its reason: the first thing that happened
    /// is why the id left (a store loss, then the re-registration that
    /// ended the session the store lost, is a store loss).
    pub fn departed(&self, key: &str, from: &str, reason: MoveReason) {
        if self
            .departed
            .peek(key)
            .is_some_and(|(session, seen)| session == from && seen.is_some())
        {
            return;
        }
        self.departed
            .insert(key.to_owned(), (from.to_owned(), Some(reason)));
    }

    /// This node stopped routing `key` to `from` without learning why:
    /// the owner left the live worker view, or did not answer (a client
    /// retrying through `owner unreachable`). The id's next claim asks the
    /// store why, or takes the cause this node learns first (a store
    /// loss); the owner found holding it again forgets it.
    pub fn lost_sight(&self, key: &str, from: &str) {
        if self
            .departed
            .peek(key)
            .is_some_and(|(session, _)| session == from)
        {
            return;
        }
        self.departed
            .insert(key.to_owned(), (from.to_owned(), None));
    }

    /// The store lost its data: each `(key, owner)` of this node's cached
    /// routes, and each id this node lost sight of the owner of for a
    /// reason not yet known, left it for the loss.
    pub fn store_lost<'a>(&self, cached: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (key, owner) in cached {
            self.departed(key, owner, MoveReason::StoreLoss);
        }
        let unseen: Vec<(String, String)> = self
            .departed
            .iter()
            .filter(|(_, (_, seen))| seen.is_none())
            .map(|(key, (session, _))| (key, session))
            .collect();
        for (key, session) in unseen {
            self.departed(&key, &session, MoveReason::StoreLoss);
        }
    }

    /// The operator asked `session` through this node to wind `key` down:
    /// its release of `key` is a wind-down.
    pub fn winding_down(&self, key: &str, session: &str) {
        self.winding.insert(key.to_owned(), session.to_owned());
    }

    /// `session` refused `key` (a request found it closing): true, and
    /// forgotten, when this node asked `session` to wind `key` down. The
    /// refusal can reach the claim before the release it precedes, and the
    /// move is the wind-down either way.
    pub fn refused_winding(&self, key: &str, session: &str) -> bool {
        self.winding
            .remove_if(key, |asked| asked == session)
            .is_some()
    }

    /// `session` released `key`: a departure for a wind-down asked here,
    /// else for `otherwise` (an idle release, or a drain).
    pub fn released(&self, key: &str, session: &str, otherwise: MoveReason) {
        let reason = match self.winding.remove(key) {
            Some((_, asked)) if asked == session => MoveReason::WindDown,
            _ => otherwise,
        };
        self.departed(key, session, reason);
    }

    /// The store says live session `owner` holds `key`: a departure
    /// remembered from another session is over (the id moved on through
    /// another node, or its process reclaimed it under a new session), and
    /// so is sight lost of `owner` itself (it answers again). A departure
    /// `owner` gave a reason for stays: its release may be on its way.
    pub fn owned(&self, key: &str, owner: &str) {
        self.departed
            .remove_if(key, |(session, seen)| session != owner || seen.is_none());
    }

    /// The departure remembered for `key`, if any, forgotten: a claim
    /// uses it once.
    pub fn take_departure(&self, key: &str) -> Option<Departure> {
        self.departed.remove(key).map(|(_, v)| v)
    }

    /// This node claimed `claim.ns`/`claim.id` for session `claim.to`;
    /// `departure` is the session it came from and why (see
    /// [`Routes`](crate::routes::Routes)'s claims). A claim with none is
    /// a first placement, and one back to the same session a reclaim:
    /// neither is recorded.
    pub fn claimed(&self, claim: Claim<'_>, departure: Option<(&str, MoveReason)>) {
        let Claim {
            ns,
            id,
            to,
            epoch,
            at_ms,
            by,
        } = claim;
        let Some((from, reason)) = departure else {
            return;
        };
        if from == to {
            // The owner came back for it (a re-registration's reclaim).
            return;
        }
        // A failover (the owner died or was replaced) and an id the store
        // lost under its owner are worth a warning; a drain, a refusal, a
        // release or a takeover moving an id is routine.
        if reason.is_failover() {
            self.failovers.inc();
            tracing::warn!(
                target: "pinboard::placement",
                ns, id, from, to, epoch, reason = reason.as_str(), by = by.as_str(),
                "failover: id re-placed after its owner went"
            );
        } else if reason == MoveReason::StoreLoss {
            tracing::warn!(
                target: "pinboard::placement",
                ns, id, from, to, epoch, reason = reason.as_str(), by = by.as_str(),
                "id re-placed: the placement store lost it under its owner"
            );
        } else {
            tracing::debug!(
                target: "pinboard::placement",
                ns, id, from, to, epoch, reason = reason.as_str(), by = by.as_str(),
                "id moved"
            );
        }
        let mut ring = self.ring.lock();
        if ring.len() == MOVE_RING_CAPACITY {
            ring.pop_front();
        }
        ring.push_back(Move {
            at_ms,
            ns: ns.to_owned(),
            id: id.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            epoch: epoch.to_string(),
            reason,
            by,
        });
    }

    /// Up to `limit` moves, newest first.
    pub fn recent(&self, limit: usize) -> Vec<Move> {
        self.ring.lock().iter().rev().take(limit).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(id: &'a str, to: &'a str, epoch: u64) -> Claim<'a> {
        Claim {
            ns: "/c",
            id,
            to,
            epoch,
            at_ms: 1,
            by: MovedBy::Request,
        }
    }

    #[test]
    fn a_claim_with_a_departure_is_a_move_and_the_ring_stays_bounded() {
        let log = MoveLog::default();
        log.claimed(claim("new", "s1", 1), None);
        assert!(log.recent(10).is_empty(), "a first placement is no move");
        log.claimed(claim("a", "s2", 7), Some(("s1", MoveReason::Drain)));
        let moves = log.recent(10);
        assert_eq!(moves.len(), 1);
        assert_eq!(
            (
                moves[0].from.as_str(),
                moves[0].to.as_str(),
                moves[0].reason,
                moves[0].by
            ),
            ("s1", "s2", MoveReason::Drain, MovedBy::Request)
        );
        assert_eq!(moves[0].epoch, "7");
        log.claimed(claim("b", "s1", 9), Some(("s1", MoveReason::Refusal)));
        assert_eq!(log.recent(10).len(), 1, "back to the same owner is no move");
        for i in 0..MOVE_RING_CAPACITY + 10 {
            let id = i.to_string();
            log.claimed(claim(&id, "s2", 1), Some(("s1", MoveReason::LeaseLapsed)));
        }
        let moves = log.recent(usize::MAX);
        assert_eq!(moves.len(), MOVE_RING_CAPACITY);
        assert_eq!(
            moves[0].id,
            (MOVE_RING_CAPACITY + 9).to_string(),
            "newest first"
        );
    }

    #[test]
    fn a_departure_is_used_once_and_its_first_cause_wins() {
        let log = MoveLog::default();
        log.departed("/c/a", "s1", MoveReason::StoreLoss);
        // The re-registration that ended the lost session comes after.
        log.departed("/c/a", "s1", MoveReason::SessionEnded);
        assert_eq!(
            log.take_departure("/c/a"),
            Some(("s1".to_owned(), Some(MoveReason::StoreLoss)))
        );
        assert_eq!(log.take_departure("/c/a"), None, "used once");
        // Another session's departure replaces an older one.
        log.departed("/c/b", "s1", MoveReason::Released);
        log.departed("/c/b", "s2", MoveReason::Drain);
        assert_eq!(
            log.take_departure("/c/b"),
            Some(("s2".to_owned(), Some(MoveReason::Drain)))
        );
        // An owner seen leaving the view takes the first cause learnt.
        log.lost_sight("/c/c", "s1");
        log.lost_sight("/c/d", "s1");
        log.departed("/c/d", "s1", MoveReason::SessionEnded);
        log.store_lost([("/c/e", "s2")]);
        log.departed("/c/c", "s1", MoveReason::SessionEnded);
        for (key, session, reason) in [
            ("/c/c", "s1", MoveReason::StoreLoss),
            ("/c/d", "s1", MoveReason::SessionEnded),
            ("/c/e", "s2", MoveReason::StoreLoss),
        ] {
            assert_eq!(
                log.take_departure(key),
                Some((session.to_owned(), Some(reason))),
                "{key}"
            );
        }
        log.lost_sight("/c/f", "s1");
        assert_eq!(log.take_departure("/c/f"), Some(("s1".to_owned(), None)));
    }

    #[test]
    fn an_id_owned_by_another_session_forgets_its_departure() {
        let log = MoveLog::default();
        log.departed("/c/a", "s1", MoveReason::Released);
        log.owned("/c/a", "s1");
        assert!(
            log.take_departure("/c/a").is_some(),
            "still its owner's (a release racing its note)"
        );
        log.departed("/c/a", "s1", MoveReason::StoreLoss);
        log.owned("/c/a", "s1-again");
        assert_eq!(log.take_departure("/c/a"), None, "reclaimed elsewhere");
        log.lost_sight("/c/a", "s1");
        log.owned("/c/a", "s1");
        assert_eq!(log.take_departure("/c/a"), None, "it answers again");
    }

    #[test]
    fn a_refusal_of_an_id_asked_to_wind_down_here_is_the_wind_down() {
        let log = MoveLog::default();
        log.winding_down("/c/a", "s1");
        assert!(
            !log.refused_winding("/c/a", "s2"),
            "asked of another session"
        );
        assert!(log.refused_winding("/c/a", "s1"));
        assert!(!log.refused_winding("/c/a", "s1"), "used once");
    }

    #[test]
    fn a_release_after_a_wind_down_asked_here_is_a_wind_down() {
        let log = MoveLog::default();
        log.winding_down("/c/a", "s1");
        log.released("/c/a", "s1", MoveReason::Released);
        assert_eq!(
            log.take_departure("/c/a"),
            Some(("s1".to_owned(), Some(MoveReason::WindDown)))
        );
        // Asked of another session, or not at all: its own reason.
        log.winding_down("/c/b", "s2");
        log.released("/c/b", "s1", MoveReason::Drain);
        log.released("/c/c", "s1", MoveReason::Released);
        assert_eq!(
            log.take_departure("/c/b").and_then(|d| d.1),
            Some(MoveReason::Drain)
        );
        assert_eq!(
            log.take_departure("/c/c").and_then(|d| d.1),
            Some(MoveReason::Released)
        );
    }

    #[test]
    fn a_gone_session_says_why_from_its_supersession_reason() {
        let replaced = format!("{REPLACED_REASON} http://x");
        let took = format!("{TAKEOVER_REASON} 3 of hostname \"app\"");
        let wound = format!("{WOUND_DOWN_REASON} of hostname \"app\"");
        for (note, reason) in [
            (None, MoveReason::LeaseLapsed),
            (Some(replaced.as_str()), MoveReason::Replaced),
            (Some(took.as_str()), MoveReason::Takeover),
            (Some(wound.as_str()), MoveReason::Takeover),
            (Some("something else"), MoveReason::SessionEnded),
        ] {
            assert_eq!(MoveReason::of_gone_session(note), reason, "{note:?}");
        }
    }

    #[test]
    fn reasons_and_claimants_keep_their_json_names() {
        for reason in [
            MoveReason::LeaseLapsed,
            MoveReason::Refusal,
            MoveReason::Drain,
            MoveReason::Released,
            MoveReason::WindDown,
            MoveReason::SessionEnded,
            MoveReason::Replaced,
            MoveReason::Takeover,
            MoveReason::StoreLoss,
        ] {
            assert_eq!(
                serde_json::to_value(reason).expect("json"),
                serde_json::Value::String(reason.as_str().to_owned())
            );
        }
        for by in [MovedBy::Request, MovedBy::Sweeper] {
            assert_eq!(
                serde_json::to_value(by).expect("json"),
                serde_json::Value::String(by.as_str().to_owned())
            );
        }
        let old: Move = serde_json::from_str(
            r#"{"atMs":1,"ns":"/c","id":"a","from":"s1","to":"s2","epoch":"2","reason":"drain"}"#,
        )
        .expect("an older node's move");
        assert_eq!(old.by, MovedBy::Request);
    }
}
