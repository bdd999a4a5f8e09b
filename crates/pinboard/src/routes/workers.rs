//! The worker view: the live workers as this node last read them from
//! the store, with the hostnames bound to worlds.
//!
//! Owns when the list is re-read (every `--worker-refresh-ms`, after a
//! registration through this node, and forced for an unknown cluster
//! session); never decides placements.
//!
//! # Unknown sessions (cluster calls)
//!
//! A cluster call names its caller's session; an unknown one would cost a
//! forced re-read of the worker list, so forged `Pinboard-Session` headers
//! could make every request a store read. Two bounds stop that:
//!
//! - a session found unknown by a forced re-read is remembered as unknown
//!   for `--unknown-session-ttl-ms` (at most [`UNKNOWN_SESSION_CAPACITY`]
//!   of them): within that time it is looked up in the regularly refreshed
//!   view only, never forced (so a session that registered on another node
//!   since is still found, within one `--worker-refresh-ms`);
//! - forced re-reads are coalesced (callers that ask while one is on its
//!   way share it) and rate-limited to one per
//!   `--forced-refresh-interval-ms`: a caller asking sooner waits for the
//!   next one instead of causing its own.
//!
//! So a flood of forged sessions costs at most one store read per interval,
//! however many requests and distinct sessions it carries.
//!
//! # A store that does not answer
//!
//! A regular re-read that fails (the store timed out, a cluster master
//! died and its replica is not promoted yet) leaves the view it would have
//! replaced in place, and that view keeps serving for up to one lease TTL
//! after it was read: a warm request needs no store call, so an outage of
//! the store must not fail it through the view. This is safe because the
//! view only says which owners to trust: an owner that lapsed meanwhile is
//! fenced by its own lease and epoch (it refuses, and the request resolves
//! again, which needs the store), and nothing can be placed anew while the
//! store is out. While one caller re-reads, the others go on with the old
//! view; after a failed re-read the next waits one refresh interval. A view
//! older than a lease TTL is not served: every caller waits for a fresh
//! read and fails with the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Routes;
use crate::operator::moves::MoveReason;
use crate::placement::{PlacementStore, StoreError};
use crate::upstream::WorkerConn;

/// Most sessions remembered as unknown at once (see the module doc).
pub const UNKNOWN_SESSION_CAPACITY: usize = 10_000;

/// Clears the refreshing flag however the refresh ends (a cancelled
/// request included).
struct RefreshGuard<'a>(&'a AtomicBool);

impl Drop for RefreshGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The live workers at one read of the store.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    /// Keyed by session id; foldhash, as every cached route's liveness
    /// check looks its owner up here.
    pub(super) by_session: foldhash::HashMap<String, Arc<WorkerConn>>,
    /// Bound hostnames, lowercase: the store's record and every live
    /// worker's (see [`View::binds`]).
    bound: Arc<foldhash::HashSet<Box<str>>>,
    /// When this view was read (monotonic ms); `None` once a registration
    /// here marked it changed (the next caller reads it again).
    fetched_mono_ms: Option<u64>,
    /// When its content was read, kept when marked changed: how old a view
    /// served through a store outage is (see the module doc).
    read_mono_ms: Option<u64>,
}

impl Snapshot {
    /// Why an id that live `session` let go of (released, refused) left
    /// it, as far as this view tells: a takeover when a newer deployment
    /// is winding the session down, a drain when it refuses new ids, else
    /// `otherwise`.
    pub(super) fn letting_go(&self, session: &str, otherwise: MoveReason) -> MoveReason {
        match self.by_session.get(session).map(|w| &w.record) {
            Some(r) if r.retire_at_wall_ms.is_some() => MoveReason::Takeover,
            Some(r) if r.refuses_new_ids() => MoveReason::Drain,
            _ => otherwise,
        }
    }
}

/// This node's worker view at one moment ([`Routes::view`]): what a
/// request reads once and hands to its first resolution, so that a
/// request reads the view once.
#[derive(Debug, Clone)]
pub struct View(pub(super) Arc<Snapshot>);

impl View {
    /// No hostname is bound (a deployment without hostname worlds).
    pub fn binds_none(&self) -> bool {
        self.0.bound.is_empty()
    }

    /// Whether `hostname` is bound, ASCII case-insensitively: a client's
    /// `Host` naming it selects its world (`crate::world`). The bound
    /// hostnames are every one a worker registered that the store
    /// remembers ([`PlacementStore::bind_hostname`]) and every live
    /// worker's, read with the worker list: no store call per request.
    pub fn binds(&self, hostname: &str) -> bool {
        let bound = &self.0.bound;
        if bound.is_empty() || hostname.len() > crate::world::MAX_HOSTNAME_LEN {
            return false;
        }
        if hostname.bytes().any(|b| b.is_ascii_uppercase()) {
            return bound.contains(hostname.to_ascii_lowercase().as_str());
        }
        bound.contains(hostname)
    }
}

impl<S: PlacementStore> Routes<S> {
    /// Mark the worker list stale (a registration changed it).
    pub fn workers_changed(&self) {
        let mut snap = self.snapshot.write();
        if snap.fetched_mono_ms.is_some() {
            *snap = Arc::new(Snapshot {
                by_session: snap.by_session.clone(),
                bound: snap.bound.clone(),
                fetched_mono_ms: None,
                read_mono_ms: snap.read_mono_ms,
            });
        }
    }

    /// The worker view: the cached one while it is younger than the
    /// refresh interval, else re-read; with `force`, a view read after this
    /// call (see [`forced_workers`](Self::forced_workers)).
    pub(super) async fn workers(&self, force: bool) -> Result<Arc<Snapshot>, StoreError> {
        self.workers_at(force, self.clock.mono_ms()).await
    }

    /// As [`workers`](Self::workers), at `now_mono_ms` (read by the caller).
    async fn workers_at(&self, force: bool, now_mono_ms: u64) -> Result<Arc<Snapshot>, StoreError> {
        if force {
            return self.forced_workers().await;
        }
        let old = {
            let snap = self.snapshot.read();
            if let Some(at) = snap.fetched_mono_ms {
                let age = now_mono_ms.saturating_sub(at);
                if age < self.refresh_ms {
                    return Ok(snap.clone());
                }
            }
            snap.clone()
        };
        let usable = old
            .read_mono_ms
            .is_some_and(|at| now_mono_ms.saturating_sub(at) < self.stale_limit_ms);
        let marked_changed = old.fetched_mono_ms.is_none();
        // Stale: one caller re-reads, the others go on with the old view
        // (unless a registration here changed it: then each waits, so a
        // request right after a registration sees the new worker).
        if usable && !marked_changed {
            let retry_at = self.refresh_retry_mono_ms.load(Ordering::Acquire);
            if now_mono_ms < retry_at || self.refreshing.swap(true, Ordering::AcqRel) {
                return Ok(old);
            }
        } else {
            self.refreshing.store(true, Ordering::Release);
        }
        let _refreshing = RefreshGuard(&self.refreshing);
        match self.fetch_workers().await {
            Ok(snap) => Ok(snap),
            Err(error) if usable => {
                self.refresh_retry_mono_ms.store(
                    self.clock.mono_ms().saturating_add(self.refresh_ms),
                    Ordering::Release,
                );
                tracing::debug!(target: "pinboard::placement", error = %pinned_edge::logging::Chain(&error), "worker list re-read failed; the view read before serves on");
                Ok(old)
            }
            Err(error) => Err(error),
        }
    }

    /// A worker view read from the store no earlier than this call:
    /// coalesced (callers queue on one lock; whoever finds a view read
    /// since it asked takes that one) and rate-limited (a re-read starts at
    /// least `forced_refresh_interval_ms` after the previous forced one;
    /// the caller holding the lock waits for that moment).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped caller gives up its place in the queue.
    async fn forced_workers(&self) -> Result<Arc<Snapshot>, StoreError> {
        let asked = self.clock.now().mono_ms;
        let _turn = self.forced.lock().await;
        let fresh_since = |at: u64| {
            let snap = self.snapshot.read();
            snap.fetched_mono_ms
                .filter(|fetched| *fetched >= at)
                .map(|_| snap.clone())
        };
        if let Some(snap) = fresh_since(asked) {
            return Ok(snap);
        }
        let next = self.next_forced_mono_ms.load(Ordering::Acquire);
        let now = self.clock.now().mono_ms;
        if next > now {
            tokio::time::sleep(Duration::from_millis(next - now)).await;
            // A regular refresh may have read the list meanwhile.
            if let Some(snap) = fresh_since(asked) {
                return Ok(snap);
            }
        }
        self.next_forced_mono_ms.store(
            self.clock
                .now()
                .mono_ms
                .saturating_add(self.forced_interval_ms),
            Ordering::Release,
        );
        self.fetch_workers().await
    }

    /// Read the worker list from the store and install it as the view.
    async fn fetch_workers(&self) -> Result<Arc<Snapshot>, StoreError> {
        let now = self.clock.now();
        self.counters.worker_reads.inc();
        let (live, stored) =
            tokio::try_join!(self.store.list_workers(now), self.store.bound_hostnames())?;
        let old = self.snapshot.read().clone();
        // A live worker's hostname is bound even where the store's record
        // of it is gone (lost with the store, until it registers again).
        let mut bound: foldhash::HashSet<Box<str>> = stored
            .into_iter()
            .map(|h| h.to_ascii_lowercase().into_boxed_str())
            .collect();
        for w in &live {
            if let Some(h) = &w.record.hostname {
                bound.insert(h.to_ascii_lowercase().into_boxed_str());
            }
        }
        let bound = if *old.bound == bound {
            old.bound.clone()
        } else {
            Arc::new(bound)
        };
        let mut by_session =
            foldhash::HashMap::with_capacity_and_hasher(live.len(), Default::default());
        for w in live {
            let sid = w.record.session_id.clone();
            let conn = match old.by_session.get(&sid) {
                Some(c) if c.record == w.record => c.clone(),
                known => {
                    let pool = known
                        .filter(|c| c.record.advertise_url == w.record.advertise_url)
                        .map(|c| c.pool.clone());
                    match WorkerConn::with_pool(w.record, pool, self.upstream_tls.as_ref()) {
                        Some(c) => Arc::new(c),
                        None => continue,
                    }
                }
            };
            by_session.insert(sid, conn);
        }
        let snap = Arc::new(Snapshot {
            by_session,
            bound,
            fetched_mono_ms: Some(now.mono_ms),
            read_mono_ms: Some(now.mono_ms),
        });
        *self.snapshot.write() = snap.clone();
        Ok(snap)
    }

    /// The worker view (cached, re-read every `refresh_ms` and after a
    /// registration here), for [`View::binds`] and a first
    /// [`resolve_claiming_in`](Self::resolve_claiming_in).
    ///
    /// # Errors
    ///
    /// When the store fails (a view to refresh).
    pub async fn view(&self) -> Result<View, StoreError> {
        self.view_at(self.clock.mono_ms()).await
    }

    /// As [`view`](Self::view), at `now_mono_ms` on this directory's
    /// clock (read by the caller, who needs it too).
    ///
    /// # Errors
    ///
    /// When the store fails (a view to refresh).
    pub async fn view_at(&self, now_mono_ms: u64) -> Result<View, StoreError> {
        Ok(View(self.workers_at(false, now_mono_ms).await?))
    }

    /// Number of live workers in the local view.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn live_workers(&self) -> Result<usize, StoreError> {
        Ok(self.workers(false).await?.by_session.len())
    }

    /// A live worker by session id: from the local view, else from one
    /// forced re-read, unless that session was recently found unknown (see
    /// the module doc).
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn worker(&self, session_id: &str) -> Result<Option<Arc<WorkerConn>>, StoreError> {
        if let Some(w) = self.workers(false).await?.by_session.get(session_id) {
            return Ok(Some(w.clone()));
        }
        let now = self.clock.now().mono_ms;
        if let Some(since) = self.unknown_sessions.get(session_id) {
            if now.saturating_sub(since) < self.unknown_session_ttl_ms {
                return Ok(None);
            }
        }
        let found = self
            .workers(true)
            .await?
            .by_session
            .get(session_id)
            .cloned();
        match &found {
            Some(_) => {
                self.unknown_sessions.remove(session_id);
            }
            None => self.unknown_sessions.insert(session_id.to_owned(), now),
        }
        Ok(found)
    }
}
