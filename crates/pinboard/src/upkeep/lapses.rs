//! Noticing that a worker's lease lapsed: the session that left the live
//! worker list after the end of the lease it last held (a worker killed,
//! frozen or cut off), as against one that left before it (deregistered or
//! superseded: the registry says those itself).
//!
//! Owns the last view of live sessions and their lease ends; pure (the
//! caller reads the store and the clock), so a lapse is told from an
//! ending on any clock. Says each lapse once: a session is forgotten as
//! soon as it is reported. Bounded by the live worker list it is shown.
//!
//! The view is read every half lease TTL: a session renewed after one read
//! and removed before the next cannot have outlived the lease end that
//! read saw (a worker renews at least three times a lease), so the two
//! kinds of departure are not confused.

use std::collections::HashMap;

use crate::placement::LiveWorker;

/// A session whose lease lapsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lapse {
    /// The session.
    pub session: String,
    /// Its worker's advertise URL.
    pub advertise_url: String,
    /// Its hostname, if it registered one.
    pub hostname: Option<String>,
    /// The namespaces it hosted.
    pub namespaces: Vec<String>,
    /// How long before this look its lease ended (ms).
    pub lapsed_ms_ago: u64,
}

#[derive(Debug, Clone)]
struct Known {
    advertise_url: String,
    hostname: Option<String>,
    namespaces: Vec<String>,
    /// When its lease ends (wall ms), as of the last look.
    lease_end_ms: u64,
}

/// The live sessions as last seen.
#[derive(Debug, Default)]
pub struct LapseWatch {
    live: HashMap<String, Known>,
}

impl LapseWatch {
    /// Takes the live list read at `now_wall_ms`; answers the sessions
    /// gone since the last look whose lease had ended by now. (The first
    /// look only learns the list.)
    pub fn look(&mut self, live: &[LiveWorker], now_wall_ms: u64) -> Vec<Lapse> {
        let mut current: HashMap<String, Known> = live
            .iter()
            .map(|w| {
                let known = Known {
                    advertise_url: w.record.advertise_url.clone(),
                    hostname: w.record.hostname.clone(),
                    namespaces: w.record.namespaces.clone(),
                    lease_end_ms: now_wall_ms.saturating_add(w.expires_in_ms),
                };
                (w.record.session_id.clone(), known)
            })
            .collect();
        std::mem::swap(&mut self.live, &mut current);
        let mut lapses: Vec<Lapse> = current
            .into_iter()
            .filter(|(session, known)| {
                !self.live.contains_key(session) && known.lease_end_ms <= now_wall_ms
            })
            .map(|(session, known)| Lapse {
                session,
                advertise_url: known.advertise_url,
                hostname: known.hostname,
                namespaces: known.namespaces,
                lapsed_ms_ago: now_wall_ms - known.lease_end_ms,
            })
            .collect();
        lapses.sort_by(|a, b| a.session.cmp(&b.session));
        lapses
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::WorkerRecord;

    fn live(session: &str, expires_in_ms: u64) -> LiveWorker {
        LiveWorker {
            record: WorkerRecord {
                session_id: session.into(),
                advertise_url: format!("http://{session}.test"),
                namespaces: vec!["/counter".into()],
                ..Default::default()
            },
            expires_in_ms,
        }
    }

    #[test]
    fn a_session_gone_after_its_lease_ended_lapsed_once() {
        let mut watch = LapseWatch::default();
        assert!(watch
            .look(&[live("a", 2000), live("b", 2000)], 0)
            .is_empty());
        // b renews; a does not, and is gone once its lease ended.
        assert!(watch
            .look(&[live("a", 1000), live("b", 2000)], 1000)
            .is_empty());
        let lapses = watch.look(&[live("b", 1000)], 2500);
        assert_eq!(lapses.len(), 1, "{lapses:?}");
        assert_eq!(lapses[0].session, "a");
        assert_eq!(lapses[0].advertise_url, "http://a.test");
        assert_eq!(lapses[0].lapsed_ms_ago, 500);
        assert!(watch.look(&[live("b", 1000)], 3000).is_empty(), "once");
    }

    #[test]
    fn a_session_gone_before_its_lease_ended_did_not_lapse() {
        let mut watch = LapseWatch::default();
        watch.look(&[live("a", 2000)], 0);
        // Deregistered (or superseded) with a second of lease left.
        assert!(watch.look(&[], 1000).is_empty());
        assert!(watch.look(&[], 5000).is_empty(), "and not later either");
    }
}
