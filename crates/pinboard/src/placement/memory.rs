//! The in-process placement store: one pinboard node, nothing to install.
//!
//! Owns a single mutex-guarded map of sessions, message queues and
//! placements; every trait call takes the lock once, which is what makes
//! claims atomic. Never awaits while holding the lock. Leases expire by the
//! monotonic clock passed in `now`; nothing survives a restart (hence the
//! cold-start quarantine in `proxy::resolve`: a new process always writes
//! a new generation).
//!
//! Rows are bounded as the trait says: a release drops a row that was
//! never settled at once (raising the dropped mark), and
//! [`PlacementStore::expire_placements`]
//! stamps each vacated row (released, or owner gone) with the time it was
//! first seen vacated and removes it one row grace later, along with
//! lapsed sessions and expired supersession notes. It walks every row once
//! per call (the budget does not apply), which at a million rows holds the
//! lock for some milliseconds every half lease TTL.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;
use pinned_store::InstanceKey;
use pinned_wire::registry::ControlMessage;

use super::{
    next_epoch, Admission, ClaimOutcome, DrainDeadline, Generation, LiveWorker, Placement,
    PlacementEntry, PlacementStore, ReclaimOutcome, StoreError, WorkerRecord, MAX_BOUND_HOSTNAMES,
};
use crate::clock::Now;

#[derive(Debug)]
struct Session {
    record: WorkerRecord,
    expires_at_mono_ms: u64,
    messages: VecDeque<ControlMessage>,
}

#[derive(Debug, Default)]
struct Row {
    /// Empty when released.
    owner: String,
    epoch: u64,
    tag: Option<String>,
    /// When an expiry pass first found the row vacated (monotonic ms).
    vacant_since_mono_ms: Option<u64>,
    /// The `(owner, epoch)` its worker last answered at.
    settled: Option<(String, u64)>,
}

impl Row {
    fn is_settled(&self) -> bool {
        self.settled
            .as_ref()
            .is_some_and(|(s, e)| *s == self.owner && *e == self.epoch)
    }
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Session>,
    superseded: HashMap<String, (String, u64)>,
    rows: HashMap<(String, String), Row>,
    next_msg: u64,
    /// Sweeper lease: holder token and monotonic expiry.
    sweeper: Option<(String, u64)>,
    generation: Option<Generation>,
    /// The dropped mark: the highest epoch of a row dropped at its release
    /// (see `placement`'s invariants); claims mint above it.
    dropped: u64,
    /// Bound hostnames (lowercase) with the wall ms they were last bound.
    hostnames: HashMap<String, u64>,
    /// See [`PlacementStore::deployment_version`].
    deployment_version: u64,
}

impl State {
    fn live(&self, session_id: &str, now: Now) -> Option<&Session> {
        self.sessions
            .get(session_id)
            .filter(|s| s.expires_at_mono_ms > now.mono_ms)
    }

    fn live_mut(&mut self, session_id: &str, now: Now) -> Option<&mut Session> {
        self.sessions
            .get_mut(session_id)
            .filter(|s| s.expires_at_mono_ms > now.mono_ms)
    }
}

/// Placement store kept in this process.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    row_grace_ms: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store; vacated rows are kept one minute (see
    /// [`with_row_grace`](Self::with_row_grace)).
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            row_grace_ms: 60_000,
        }
    }

    /// Keep vacated rows for `ms` before removing them.
    #[must_use]
    pub fn with_row_grace(mut self, ms: u64) -> Self {
        self.row_grace_ms = ms;
        self
    }

    /// Number of placement rows held (owned or in their grace).
    pub fn rows(&self) -> usize {
        self.state.lock().rows.len()
    }

    /// Forget every placement and session (tests: a store that lost its data).
    pub fn wipe(&self) {
        *self.state.lock() = State::default();
    }
}

impl PlacementStore for MemoryStore {
    async fn deployment_version(&self) -> Result<u64, StoreError> {
        Ok(self.state.lock().deployment_version)
    }

    async fn admit_worker(&self, admission: &Admission<'_>, now: Now) -> Result<bool, StoreError> {
        // One lock for the check and every write: nothing interleaves.
        let mut st = self.state.lock();
        if admission
            .expected_version
            .is_some_and(|v| v != st.deployment_version)
        {
            return Ok(false);
        }
        if admission.moves_deployments() {
            st.deployment_version += 1;
        }
        for (session_id, reason) in admission.supersede {
            st.superseded.insert(
                session_id.clone(),
                (reason.clone(), now.mono_ms + admission.superseded_ttl_ms),
            );
            st.sessions.remove(session_id);
        }
        for (session_id, deadline_wall_ms) in admission.wind_down {
            if let Some(s) = st.live_mut(session_id, now) {
                s.record.server_drain = Some(DrainDeadline::At(*deadline_wall_ms));
                s.record.retire_at_wall_ms = Some(*deadline_wall_ms);
            }
        }
        let record = admission.record;
        st.sessions.insert(
            record.session_id.clone(),
            Session {
                record: record.clone(),
                expires_at_mono_ms: now.mono_ms + admission.ttl_ms,
                messages: VecDeque::new(),
            },
        );
        Ok(true)
    }

    async fn put_worker(
        &self,
        record: &WorkerRecord,
        ttl_ms: u64,
        now: Now,
    ) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        st.sessions.insert(
            record.session_id.clone(),
            Session {
                record: record.clone(),
                expires_at_mono_ms: now.mono_ms + ttl_ms,
                messages: VecDeque::new(),
            },
        );
        Ok(())
    }

    async fn renew_worker(
        &self,
        session_id: &str,
        headroom: i64,
        draining: bool,
        ttl_ms: u64,
        now: Now,
    ) -> Result<Option<WorkerRecord>, StoreError> {
        let mut st = self.state.lock();
        Ok(st.live_mut(session_id, now).map(|s| {
            s.record.headroom = headroom;
            s.record.draining = draining;
            s.record.server_drain = s.record.server_drain.map(|d| d.delivered(now.wall_ms));
            s.expires_at_mono_ms = now.mono_ms + ttl_ms;
            s.record.clone()
        }))
    }

    async fn set_server_drain(
        &self,
        session_id: &str,
        drain: Option<DrainDeadline>,
        now: Now,
    ) -> Result<bool, StoreError> {
        let mut st = self.state.lock();
        Ok(st
            .live_mut(session_id, now)
            .map(|s| s.record.server_drain = drain)
            .is_some())
    }

    async fn get_worker(
        &self,
        session_id: &str,
        now: Now,
    ) -> Result<Option<LiveWorker>, StoreError> {
        let st = self.state.lock();
        Ok(st.live(session_id, now).map(|s| LiveWorker {
            record: s.record.clone(),
            expires_in_ms: s.expires_at_mono_ms - now.mono_ms,
        }))
    }

    async fn remove_worker(&self, session_id: &str) -> Result<bool, StoreError> {
        Ok(self.state.lock().sessions.remove(session_id).is_some())
    }

    async fn list_workers(&self, now: Now) -> Result<Vec<LiveWorker>, StoreError> {
        let mut st = self.state.lock();
        st.sessions
            .retain(|_, s| s.expires_at_mono_ms > now.mono_ms);
        let mut out: Vec<LiveWorker> = st
            .sessions
            .values()
            .map(|s| LiveWorker {
                record: s.record.clone(),
                expires_in_ms: s.expires_at_mono_ms - now.mono_ms,
            })
            .collect();
        out.sort_by(|a, b| a.record.session_id.cmp(&b.record.session_id));
        Ok(out)
    }

    async fn bind_hostname(&self, hostname: &str, now: Now) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        st.hostnames
            .insert(hostname.to_ascii_lowercase(), now.wall_ms);
        if st.hostnames.len() > MAX_BOUND_HOSTNAMES {
            let oldest = st
                .hostnames
                .iter()
                .min_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)))
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                st.hostnames.remove(&oldest);
            }
        }
        Ok(())
    }

    async fn bound_hostnames(&self) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self.state.lock().hostnames.keys().cloned().collect();
        names.sort_unstable();
        Ok(names)
    }

    async fn mark_superseded(
        &self,
        session_id: &str,
        error: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<(), StoreError> {
        self.state.lock().superseded.insert(
            session_id.to_owned(),
            (error.to_owned(), now.mono_ms + ttl_ms),
        );
        Ok(())
    }

    async fn superseded(&self, session_id: &str, now: Now) -> Result<Option<String>, StoreError> {
        let st = self.state.lock();
        Ok(st
            .superseded
            .get(session_id)
            .filter(|(_, until)| *until > now.mono_ms)
            .map(|(e, _)| e.clone()))
    }

    async fn push_message(
        &self,
        session_id: &str,
        mut message: ControlMessage,
    ) -> Result<String, StoreError> {
        let mut st = self.state.lock();
        st.next_msg += 1;
        let msg_id = st.next_msg.to_string();
        message.msg_id = Some(msg_id.clone());
        if let Some(s) = st.sessions.get_mut(session_id) {
            s.messages.push_back(message);
        }
        Ok(msg_id)
    }

    async fn pending_messages(
        &self,
        session_id: &str,
        acks: &[String],
    ) -> Result<Vec<ControlMessage>, StoreError> {
        let mut st = self.state.lock();
        let Some(s) = st.sessions.get_mut(session_id) else {
            return Ok(Vec::new());
        };
        if !acks.is_empty() {
            s.messages
                .retain(|m| !m.msg_id.as_ref().is_some_and(|id| acks.contains(id)));
        }
        Ok(s.messages.iter().cloned().collect())
    }

    async fn resolve_or_claim(
        &self,
        instance: InstanceKey<'_>,
        candidate: Option<&str>,
        stale: Option<(&str, u64)>,
        floor: u64,
        generation: &Generation,
        now: Now,
    ) -> Result<ClaimOutcome, StoreError> {
        let InstanceKey { ns, id } = instance;
        let mut st = self.state.lock();
        let key = (ns.to_owned(), id.to_owned());
        let (owner, epoch) = match st.rows.get(&key) {
            Some(r) => (r.owner.clone(), r.epoch),
            None => (String::new(), 0),
        };
        let is_stale = stale.is_some_and(|(s, e)| s == owner && e == epoch);
        if !owner.is_empty() && !is_stale && st.live(&owner, now).is_some() {
            return Ok(ClaimOutcome::Owned(Placement {
                session_id: owner,
                epoch,
            }));
        }
        let Some(candidate) = candidate else {
            return Ok(ClaimOutcome::Vacant);
        };
        if st.generation.as_ref() != Some(generation) {
            return Ok(ClaimOutcome::GenerationLost(st.generation.clone()));
        }
        if st.live(candidate, now).is_none() {
            return Ok(ClaimOutcome::CandidateGone);
        }
        let epoch = next_epoch(epoch.max(st.dropped), floor);
        st.rows.insert(
            key,
            Row {
                owner: candidate.to_owned(),
                epoch,
                tag: None,
                vacant_since_mono_ms: None,
                settled: None,
            },
        );
        let from = (!owner.is_empty() && owner != candidate).then_some(owner);
        Ok(ClaimOutcome::Claimed(
            Placement {
                session_id: candidate.to_owned(),
                epoch,
            },
            from,
        ))
    }

    async fn reclaim(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        prev_sessions: &[&str],
        floor: u64,
        now: Now,
    ) -> Result<ReclaimOutcome, StoreError> {
        let InstanceKey { ns, id } = instance;
        let mut st = self.state.lock();
        let key = (ns.to_owned(), id.to_owned());
        let (owner, epoch) = match st.rows.get(&key) {
            Some(r) => (r.owner.clone(), r.epoch),
            None => (String::new(), 0),
        };
        if owner == session_id {
            return Ok(ReclaimOutcome::Reclaimed(Placement {
                session_id: owner,
                epoch,
            }));
        }
        let from_prev = !owner.is_empty() && prev_sessions.contains(&owner.as_str());
        if !owner.is_empty() && !from_prev && st.live(&owner, now).is_some() {
            return Ok(ReclaimOutcome::Duplicate);
        }
        let epoch = if from_prev {
            epoch
        } else {
            next_epoch(epoch.max(st.dropped), floor)
        };
        let row = st.rows.entry(key).or_default();
        row.owner = session_id.to_owned();
        row.epoch = epoch;
        row.vacant_since_mono_ms = None;
        Ok(ReclaimOutcome::Reclaimed(Placement {
            session_id: session_id.to_owned(),
            epoch,
        }))
    }

    async fn release(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
    ) -> Result<bool, StoreError> {
        let InstanceKey { ns, id } = instance;
        let mut st = self.state.lock();
        let key = (ns.to_owned(), id.to_owned());
        let Some(row) = st.rows.get_mut(&key) else {
            return Ok(false);
        };
        if row.owner != session_id || epoch.is_some_and(|e| e != row.epoch) {
            return Ok(false);
        }
        if row.is_settled() {
            row.owner.clear();
            row.tag = None;
        } else {
            let dropped = row.epoch;
            st.rows.remove(&key);
            st.dropped = st.dropped.max(dropped);
        }
        Ok(true)
    }

    async fn tag(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
        tag: &str,
    ) -> Result<bool, StoreError> {
        let InstanceKey { ns, id } = instance;
        let mut st = self.state.lock();
        let Some(row) = st.rows.get_mut(&(ns.to_owned(), id.to_owned())) else {
            return Ok(false);
        };
        if row.owner != session_id || epoch.is_some_and(|e| e != row.epoch) {
            return Ok(false);
        }
        row.tag = Some(tag.to_owned());
        Ok(true)
    }

    async fn settle(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let InstanceKey { ns, id } = instance;
        let mut st = self.state.lock();
        match st.rows.get_mut(&(ns.to_owned(), id.to_owned())) {
            Some(row) if row.owner == session_id && row.epoch == epoch => {
                row.settled = Some((session_id.to_owned(), epoch));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn placement(
        &self,
        instance: InstanceKey<'_>,
        now: Now,
    ) -> Result<Option<PlacementEntry>, StoreError> {
        let InstanceKey { ns, id } = instance;
        let st = self.state.lock();
        Ok(st
            .rows
            .get(&(ns.to_owned(), id.to_owned()))
            .filter(|r| !r.owner.is_empty())
            .map(|r| PlacementEntry {
                ns: ns.to_owned(),
                id: id.to_owned(),
                placement: Placement {
                    session_id: r.owner.clone(),
                    epoch: r.epoch,
                },
                tag: r.tag.clone(),
                live: st.live(&r.owner, now).is_some(),
                settled: r.is_settled(),
            }))
    }

    async fn wake_candidates(
        &self,
        limit: usize,
        now: Now,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let st = self.state.lock();
        let mut out: Vec<(String, String)> = st
            .rows
            .iter()
            .filter(|(_, r)| {
                !r.owner.is_empty() && (st.live(&r.owner, now).is_none() || !r.is_settled())
            })
            .map(|(key, _)| key.clone())
            .collect();
        out.sort();
        out.truncate(limit);
        Ok(out)
    }

    async fn list_placements(&self, now: Now) -> Result<Vec<PlacementEntry>, StoreError> {
        let st = self.state.lock();
        let mut out: Vec<PlacementEntry> = st
            .rows
            .iter()
            .filter(|(_, r)| !r.owner.is_empty())
            .map(|((ns, id), r)| PlacementEntry {
                ns: ns.clone(),
                id: id.clone(),
                placement: Placement {
                    session_id: r.owner.clone(),
                    epoch: r.epoch,
                },
                tag: r.tag.clone(),
                live: st.live(&r.owner, now).is_some(),
                settled: r.is_settled(),
            })
            .collect();
        out.sort_by(|a, b| (&a.ns, &a.id).cmp(&(&b.ns, &b.id)));
        Ok(out)
    }

    async fn open_generation(&self, proposal: &Generation) -> Result<Generation, StoreError> {
        Ok(self
            .state
            .lock()
            .generation
            .get_or_insert_with(|| proposal.clone())
            .clone())
    }

    async fn generation(&self) -> Result<Option<Generation>, StoreError> {
        Ok(self.state.lock().generation.clone())
    }

    async fn expire_placements(&self, _budget: usize, now: Now) -> Result<usize, StoreError> {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.sessions
            .retain(|_, s| s.expires_at_mono_ms > now.mono_ms);
        st.superseded.retain(|_, (_, until)| *until > now.mono_ms);
        let (sessions, grace) = (&st.sessions, self.row_grace_ms);
        let mut handled = 0;
        st.rows.retain(|_, row| {
            if !row.owner.is_empty() && sessions.contains_key(&row.owner) {
                row.vacant_since_mono_ms = None;
                return true;
            }
            handled += 1;
            let since = *row.vacant_since_mono_ms.get_or_insert(now.mono_ms);
            now.mono_ms.saturating_sub(since) < grace
        });
        Ok(handled)
    }

    async fn acquire_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<bool, StoreError> {
        let mut st = self.state.lock();
        if st
            .sweeper
            .as_ref()
            .is_some_and(|(_, until)| *until > now.mono_ms)
        {
            return Ok(false);
        }
        st.sweeper = Some((token.to_owned(), now.mono_ms + ttl_ms));
        Ok(true)
    }

    async fn renew_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<bool, StoreError> {
        let mut st = self.state.lock();
        match &mut st.sweeper {
            Some((holder, until)) if holder == token && *until > now.mono_ms => {
                *until = now.mono_ms + ttl_ms;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_sweeper_lease(&self, token: &str) -> Result<bool, StoreError> {
        let mut st = self.state.lock();
        if st
            .sweeper
            .as_ref()
            .is_some_and(|(holder, _)| holder == token)
        {
            st.sweeper = None;
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(sid: &str) -> WorkerRecord {
        WorkerRecord {
            session_id: sid.into(),
            client_id: "c".into(),
            secret: "s".into(),
            advertise_url: "http://w".into(),
            namespaces: vec!["/c".into()],
            headroom: 1,
            ..Default::default()
        }
    }

    async fn opened(s: &MemoryStore) -> Generation {
        s.open_generation(&Generation::new("g", 0))
            .await
            .expect("generation")
    }

    fn at(mono_ms: u64) -> Now {
        Now {
            wall_ms: 1000 + mono_ms,
            mono_ms,
        }
    }

    #[tokio::test]
    async fn sweeper_lease_has_one_holder_and_is_taken_over_when_it_lapses() {
        let s = MemoryStore::new();
        assert!(s.acquire_sweeper_lease("a", 100, at(0)).await.expect("a"));
        assert!(!s.acquire_sweeper_lease("b", 100, at(10)).await.expect("b"));
        assert!(!s
            .acquire_sweeper_lease("a", 100, at(10))
            .await
            .expect("a again"));
        assert!(s
            .renew_sweeper_lease("a", 100, at(50))
            .await
            .expect("renew"));
        assert!(!s
            .renew_sweeper_lease("b", 100, at(60))
            .await
            .expect("not b's"));
        // `a` stops renewing (it died): `b` takes over once the lease lapsed.
        assert!(!s.acquire_sweeper_lease("b", 100, at(149)).await.expect("b"));
        assert!(s.acquire_sweeper_lease("b", 100, at(150)).await.expect("b"));
        assert!(!s
            .renew_sweeper_lease("a", 100, at(151))
            .await
            .expect("a lost"));
        assert!(!s.release_sweeper_lease("a").await.expect("release"));
        assert!(s.release_sweeper_lease("b").await.expect("release"));
        assert!(s
            .acquire_sweeper_lease("a", 100, at(152))
            .await
            .expect("free"));
    }

    #[tokio::test]
    async fn first_claim_wins_and_lapse_moves_with_a_larger_epoch() {
        let s = MemoryStore::new();
        let g = opened(&s).await;
        s.put_worker(&rec("a"), 100, at(0)).await.expect("put");
        s.put_worker(&rec("b"), 1000, at(0)).await.expect("put");
        let first = s
            .resolve_or_claim(InstanceKey::new("/c", "x"), Some("a"), None, 5, &g, at(1))
            .await
            .expect("claim");
        let ClaimOutcome::Claimed(p, None) = first else {
            panic!("{first:?}")
        };
        assert_eq!(p.epoch, 5);
        let second = s
            .resolve_or_claim(InstanceKey::new("/c", "x"), Some("b"), None, 5, &g, at(2))
            .await
            .expect("claim");
        assert_eq!(second, ClaimOutcome::Owned(p.clone()));
        // a's lease lapses at 100: b takes over above a's epoch.
        let third = s
            .resolve_or_claim(InstanceKey::new("/c", "x"), Some("b"), None, 5, &g, at(150))
            .await
            .expect("claim");
        assert_eq!(
            third,
            ClaimOutcome::Claimed(
                Placement {
                    session_id: "b".into(),
                    epoch: 6
                },
                Some("a".into())
            )
        );
    }

    #[tokio::test]
    async fn release_keeps_the_epoch_and_wipe_relies_on_the_floor() {
        let s = MemoryStore::new();
        let g = opened(&s).await;
        s.put_worker(&rec("a"), 1000, at(0)).await.expect("put");
        s.resolve_or_claim(InstanceKey::new("/c", "x"), Some("a"), None, 10, &g, at(0))
            .await
            .expect("claim");
        assert!(!s
            .release(InstanceKey::new("/c", "x"), "a", Some(9))
            .await
            .expect("release"));
        assert!(s
            .release(InstanceKey::new("/c", "x"), "a", Some(10))
            .await
            .expect("release"));
        let again = s
            .resolve_or_claim(InstanceKey::new("/c", "x"), Some("a"), None, 3, &g, at(1))
            .await
            .expect("claim");
        assert!(matches!(
            again,
            ClaimOutcome::Claimed(Placement { epoch: 11, .. }, None)
        ));
    }

    #[tokio::test]
    async fn reclaim_keeps_own_ids_and_reports_duplicates() {
        let s = MemoryStore::new();
        let g = opened(&s).await;
        s.put_worker(&rec("old"), 1000, at(0)).await.expect("put");
        s.put_worker(&rec("other"), 1000, at(0)).await.expect("put");
        s.resolve_or_claim(
            InstanceKey::new("/c", "mine"),
            Some("old"),
            None,
            7,
            &g,
            at(0),
        )
        .await
        .expect("claim");
        s.resolve_or_claim(
            InstanceKey::new("/c", "theirs"),
            Some("other"),
            None,
            7,
            &g,
            at(0),
        )
        .await
        .expect("claim");
        s.put_worker(&rec("new"), 1000, at(1)).await.expect("put");
        let mine = s
            .reclaim(InstanceKey::new("/c", "mine"), "new", &["old"], 9, at(1))
            .await
            .expect("reclaim");
        assert_eq!(
            mine,
            ReclaimOutcome::Reclaimed(Placement {
                session_id: "new".into(),
                epoch: 7
            })
        );
        let theirs = s
            .reclaim(InstanceKey::new("/c", "theirs"), "new", &["old"], 9, at(1))
            .await
            .expect("reclaim");
        assert_eq!(theirs, ReclaimOutcome::Duplicate);
    }

    #[tokio::test]
    async fn messages_are_redelivered_until_acked() {
        let s = MemoryStore::new();
        s.put_worker(&rec("a"), 1000, at(0)).await.expect("put");
        let msg = |id: &str| ControlMessage {
            kind: "wind_down".into(),
            id: id.into(),
            ns: Some("/c".into()),
            deadline: None,
            msg_id: None,
        };
        let m1 = s.push_message("a", msg("x")).await.expect("push");
        s.push_message("a", msg("y")).await.expect("push");
        assert_eq!(s.pending_messages("a", &[]).await.expect("p").len(), 2);
        let left = s.pending_messages("a", &[m1]).await.expect("p");
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, "y");
    }

    #[tokio::test]
    async fn claims_need_the_generation_the_store_holds() {
        let s = MemoryStore::new();
        let first = opened(&s).await;
        assert_eq!(
            s.open_generation(&Generation::new("other", 5))
                .await
                .expect("open"),
            first,
            "the first generation stays"
        );
        s.put_worker(&rec("a"), 1000, at(0)).await.expect("put");
        s.wipe();
        s.put_worker(&rec("a"), 1000, at(0)).await.expect("put");
        let lost = s
            .resolve_or_claim(
                InstanceKey::new("/c", "x"),
                Some("a"),
                None,
                1,
                &first,
                at(1),
            )
            .await
            .expect("claim");
        assert_eq!(lost, ClaimOutcome::GenerationLost(None));
        assert_eq!(s.rows(), 0, "nothing placed in a store that lost its data");
        let second = s
            .open_generation(&Generation::new("g2", 9))
            .await
            .expect("open");
        assert_eq!(second.quarantine_until_wall_ms(), Some(9));
        assert!(matches!(
            s.resolve_or_claim(
                InstanceKey::new("/c", "x"),
                Some("a"),
                None,
                1,
                &second,
                at(1)
            )
            .await
            .expect("claim"),
            ClaimOutcome::Claimed(..)
        ));
    }

    #[tokio::test]
    async fn vacated_rows_go_one_grace_after_they_were_vacated() {
        let s = MemoryStore::new().with_row_grace(500);
        let g = opened(&s).await;
        s.put_worker(&rec("short"), 100, at(0)).await.expect("put");
        s.put_worker(&rec("long"), 100_000, at(0))
            .await
            .expect("put");
        for i in 0..100 {
            let owner = if i % 2 == 0 { "short" } else { "long" };
            s.resolve_or_claim(
                InstanceKey::new("/c", &format!("i{i}")),
                Some(owner),
                None,
                1,
                &g,
                at(1),
            )
            .await
            .expect("claim");
        }
        // One of the live owner's ids, served (settled), is released.
        let i1 = InstanceKey::new("/c", "i1");
        let epoch = s
            .placement(i1, at(1))
            .await
            .expect("row")
            .expect("placed")
            .placement
            .epoch;
        assert!(s.settle(i1, "long", epoch).await.expect("settle"));
        assert!(s
            .release(InstanceKey::new("/c", "i1"), "long", None)
            .await
            .expect("release"));
        s.expire_placements(0, at(50)).await.expect("expire");
        assert_eq!(s.rows(), 100, "released, but within its grace");
        // "short" lapses at 100: its rows are vacated from the next pass on.
        s.expire_placements(0, at(200)).await.expect("expire");
        assert_eq!(s.rows(), 100);
        s.expire_placements(0, at(549)).await.expect("expire");
        assert_eq!(s.rows(), 100);
        s.expire_placements(0, at(550)).await.expect("expire");
        assert_eq!(s.rows(), 99, "the released row went one grace after 50");
        s.expire_placements(0, at(699)).await.expect("expire");
        assert_eq!(s.rows(), 99);
        s.expire_placements(0, at(700)).await.expect("expire");
        assert_eq!(s.rows(), 49, "only the live owner's rows stay");
        assert!(s.get_worker("short", at(700)).await.expect("get").is_none());
    }

    #[tokio::test]
    async fn a_row_never_settled_is_dropped_at_its_release_and_its_epoch_kept() {
        let s = MemoryStore::new();
        let g = opened(&s).await;
        s.put_worker(&rec("w"), 100_000, at(0)).await.expect("put");
        let claim = |id: &'static str, floor| {
            let (s, g) = (&s, &g);
            async move {
                match s
                    .resolve_or_claim(InstanceKey::new("/c", id), Some("w"), None, floor, g, at(1))
                    .await
                    .expect("claim")
                {
                    ClaimOutcome::Claimed(p, _) => p.epoch,
                    other => panic!("{other:?}"),
                }
            }
        };
        let denied = claim("denied", 500).await;
        assert!(s
            .release(InstanceKey::new("/c", "denied"), "w", Some(denied))
            .await
            .expect("release"));
        assert_eq!(s.rows(), 0, "dropped at once, no grace");
        // The next claim of any id, at a floor below, mints above it.
        assert_eq!(claim("denied", 1).await, denied + 1);
        assert!(claim("other", 1).await > denied);
    }
}
