//! What a registration does to the sessions already live: the deployment
//! rules of a hostname slot (see the registry's module doc), supersession
//! of the process that answered at the newcomer's advertise URL before it,
//! and the newcomer's own earlier sessions.
//!
//! Owns the decision alone, as a pure function of the newcomer and the live
//! sessions read from the store ([`plan`]); never touches the store (the
//! registry applies a [`Plan`] with one atomic
//! [`PlacementStore::admit_worker`](crate::placement::PlacementStore::admit_worker),
//! conditional on the deployment version the sessions were read at).
//!
//! # Who is who (inferred where the sources are silent)
//!
//! Each live session other than the newcomer falls in exactly one class,
//! checked in this order:
//!
//! 1. **Its own earlier sessions**: the session named as `prevSessionId`,
//!    and every session of the newcomer's `clientId` at its advertise URL
//!    (one registering worker, one client id: a session whose register ack
//!    was lost is one). They are
//!    the same process: never superseded (that would abort its instances),
//!    never rivals; the registry reclaims the ids they own at their epochs
//!    and then ends those of its own client id (a `prevSessionId` of
//!    another client is reclaimed from, as the reference does, but not
//!    ended: the name alone proves nothing).
//! 2. **The process it replaced**: a session of another client at the same
//!    advertise URL. The newcomer proved it answers at that URL (the
//!    challenge), and the URL addresses one process (the seeds' rule; a
//!    gateway spreading one URL over two processes is not supported), so
//!    that process is gone: a crash and restart. It is superseded at once
//!    (its ids move on their next request, at higher epochs; its old epoch
//!    stays fenced) instead of blocking them until its lease lapses. It is
//!    no rival of the newcomer's deployment either.
//! 3. **Rivals**: sessions of the newcomer's hostname slot (same hostname,
//!    case-insensitive, and same `env`), decided by the deployment epochs
//!    and each older one's `takeover`.
//! 4. Everyone else is left alone.

use pinned_wire::registry::Takeover;

use super::error::RegistryError;
use crate::clock::Now;
use crate::operator::moves::REPLACED_REASON;
use crate::placement::{LiveWorker, WorkerRecord};

/// What the registry does for one registration.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Sessions to supersede now, each with its reason (rivals of an older
    /// deployment, and the process replaced at the advertise URL).
    pub supersede: Vec<(String, String)>,
    /// Older-deployment sessions to wind down, each with the wall time
    /// (ms) it is drained until and superseded at.
    pub wind_down: Vec<(String, u64)>,
    /// Of [`supersede`](Self::supersede), the sessions replaced at their
    /// advertise URL (a restart; for the moves list).
    pub replaced: Vec<String>,
    /// The newcomer's earlier sessions (class 1): the ids they own that it
    /// re-submits are reclaimed at their epochs.
    pub earlier: Vec<String>,
    /// Of [`earlier`](Self::earlier), those of the newcomer's own client
    /// id: ended (quietly, not superseded) once the reclaims are done.
    pub ended: Vec<String>,
}

/// `http(s)://host[:port][/base]` with the scheme and host in lower case,
/// the scheme's default port made explicit and no trailing slash: two
/// advertise URLs reach the same process exactly when these are equal.
fn address(url: &str) -> Option<(String, String, u16, String)> {
    let uri: http::Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    Some((
        scheme,
        uri.host()?.to_ascii_lowercase(),
        port,
        uri.path().trim_end_matches('/').to_owned(),
    ))
}

/// Whether two advertise URLs name the same process.
pub fn same_address(a: &str, b: &str) -> bool {
    match (address(a), address(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// Decide what registering `newcomer` (with `prev` as its
/// `prevSessionId`) does to the `live` sessions, at `now`; a rival wound
/// down is drained for `wind_down_ms`.
///
/// # Errors
///
/// [`RegistryError::HostnameHeld`] when the newcomer's hostname slot is
/// bound to a newer deployment, or held by an older one that denies
/// takeover: then nothing is to change.
pub fn plan(
    newcomer: &WorkerRecord,
    prev: Option<&str>,
    live: &[LiveWorker],
    now: Now,
    wind_down_ms: u64,
) -> Result<Plan, RegistryError> {
    let mut plan = Plan::default();
    let mut rivals: Vec<&WorkerRecord> = Vec::new();
    for record in live.iter().map(|w| &w.record) {
        if record.session_id == newcomer.session_id {
            continue;
        }
        let here = same_address(&record.advertise_url, &newcomer.advertise_url);
        let own = here && record.client_id == newcomer.client_id;
        if own || Some(record.session_id.as_str()) == prev {
            plan.earlier.push(record.session_id.clone());
            if own {
                plan.ended.push(record.session_id.clone());
            }
        } else if here {
            plan.replaced.push(record.session_id.clone());
            plan.supersede.push((
                record.session_id.clone(),
                format!("{REPLACED_REASON} {}", newcomer.advertise_url),
            ));
        } else if in_slot(record, newcomer) {
            rivals.push(record);
        }
    }
    let Some(hostname) = newcomer.hostname.as_deref() else {
        return Ok(plan);
    };
    let epoch = newcomer.epoch;
    let world = match newcomer.env.as_deref() {
        Some(env) => format!("hostname {hostname:?} in env {env:?}"),
        None => format!("hostname {hostname:?}"),
    };
    if let Some(newer) = rivals.iter().map(|r| r.epoch).filter(|e| *e > epoch).max() {
        return Err(RegistryError::HostnameHeld(format!(
            "{world} is bound to deployment epoch {newer} (> {epoch})"
        )));
    }
    let older: Vec<&WorkerRecord> = rivals.into_iter().filter(|r| r.epoch < epoch).collect();
    if older.iter().any(|r| r.takeover == Some(Takeover::Deny)) {
        return Err(RegistryError::HostnameHeld(format!(
            "{world} is held by a session that denies takeover"
        )));
    }
    for rival in older {
        if rival.takeover == Some(Takeover::WindDown) {
            // A later deployment keeps the first deadline.
            if rival.retire_at_wall_ms.is_none() {
                let deadline = now.wall_ms.saturating_add(wind_down_ms);
                plan.wind_down.push((rival.session_id.clone(), deadline));
            }
            continue;
        }
        plan.supersede.push((
            rival.session_id.clone(),
            format!("superseded by deployment epoch {epoch} of {world}"),
        ));
    }
    Ok(plan)
}

/// Whether `record` shares `newcomer`'s deployment slot.
fn in_slot(record: &WorkerRecord, newcomer: &WorkerRecord) -> bool {
    let Some(hostname) = newcomer.hostname.as_deref() else {
        return false;
    };
    record
        .hostname
        .as_deref()
        .is_some_and(|h| h.eq_ignore_ascii_case(hostname))
        && record.env == newcomer.env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(session: &str, client: &str, url: &str) -> LiveWorker {
        LiveWorker {
            record: WorkerRecord {
                session_id: session.into(),
                client_id: client.into(),
                advertise_url: url.into(),
                ..Default::default()
            },
            expires_in_ms: 1000,
        }
    }

    const NOW: Now = Now {
        wall_ms: 1,
        mono_ms: 1,
    };

    #[test]
    fn addresses_compare_as_urls() {
        assert!(same_address("http://H:80", "http://h"));
        assert!(same_address("http://h:9/base/", "HTTP://h:9/base"));
        assert!(!same_address("http://h:9", "http://h:10"));
        assert!(!same_address("http://h:9/a", "http://h:9/A"));
        assert!(!same_address("https://h", "http://h"));
    }

    #[test]
    fn one_address_one_process_and_a_process_never_supersedes_itself() {
        let newcomer = live("new", "c2", "http://127.0.0.1:9").record;
        let sessions = [
            live("ghost", "c1", "http://127.0.0.1:9/"),
            live("lost-ack", "c2", "http://127.0.0.1:9"),
            live("prev", "c3", "http://127.0.0.1:9"),
            live("elsewhere", "c4", "http://127.0.0.1:10"),
            live("same-client-elsewhere", "c2", "http://127.0.0.1:11"),
        ];
        let plan = plan(&newcomer, Some("prev"), &sessions, NOW, 0).expect("plan");
        assert_eq!(plan.replaced, vec!["ghost".to_owned()]);
        assert_eq!(
            plan.supersede
                .iter()
                .map(|(s, _)| s.as_str())
                .collect::<Vec<_>>(),
            ["ghost"]
        );
        assert_eq!(plan.earlier, vec!["lost-ack".to_owned(), "prev".to_owned()]);
        // `prevSessionId` alone proves no identity: a session of another
        // client is reclaimed from, not ended.
        assert_eq!(plan.ended, vec!["lost-ack".to_owned()]);
        assert!(plan.wind_down.is_empty());
    }
}
