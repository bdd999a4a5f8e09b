//! The route directory: where each id lives and which workers are live,
//! as this node knows them. `(ns, id)` → the owning worker and epoch,
//! cached locally so the hot path needs no store round trip for an id it
//! has seen.
//!
//! Used alike by the proxy (resolve per request), the registry (forget a
//! session's routes, note releases), the sweeper (resolve and deliver),
//! upkeep (generation checks) and the dashboard. Owns, one file each:
//!
//! - the route cache ([`Routes::cached`], here): one [`Route`] per id
//!   this node resolved, up to `--route-cache-capacity` (beyond that the
//!   least useful go, by quick_cache's S3-FIFO-like policy: an id that
//!   keeps being asked for stays); entries also go when a worker refuses
//!   or fails for that id, on release through this node, and when a
//!   session ends here. A route evicted early costs one store read on its
//!   next request, nothing else;
//! - the worker view ([`workers`]): the live workers, re-read every
//!   `--worker-refresh-ms`, with the bounds on forced re-reads that
//!   unknown cluster sessions could otherwise cause;
//! - the store's generation and the quarantine ([`generation`]): a state
//!   machine, [`Standing`], and readiness;
//! - resolution ([`resolve`]): cached route, else the store's owner, else
//!   a claim;
//! - the placement side of a claim ([`claim`]): candidate choice, the
//!   move log, and the hand-back of a claim the worker refused.
//!
//! Never talks to workers. A cached route may go stale (the id moved, the
//! worker re-registered): the worker's epoch fence turns that into a
//! refusal, and the proxy then calls [`Routes::invalidate`] and resolves
//! again.

pub mod claim;
pub mod generation;
pub mod resolve;
pub mod workers;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use http::HeaderValue;
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;

pub use self::generation::{Readiness, Standing};
use self::workers::Snapshot;
pub use self::workers::{View, UNKNOWN_SESSION_CAPACITY};
use crate::clock::{Clock, Entropy, EpochFloor};
use crate::operator::moves::{MoveLog, MoveReason, MovedBy};
use crate::placement::{InstanceKey, PlacementStore, StoreError, WorkerRecord};
use crate::upstream::{UpstreamTls, WorkerConn};
use crate::world::{Scope, World};

/// A resolved route.
#[derive(Debug)]
pub struct Route {
    /// The owner.
    pub worker: Arc<WorkerConn>,
    /// Placement epoch.
    pub epoch: u64,
    /// `Pinboard-Epoch` value.
    pub epoch_header: HeaderValue,
    /// This node recorded the placement as settled (see [`Routes::settle`]).
    settled: AtomicBool,
}

impl Route {
    /// This node recorded the placement as settled already
    /// ([`Routes::settle`]): a warm route's answers need not call it.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    fn new(worker: Arc<WorkerConn>, epoch: u64) -> Self {
        Self {
            worker,
            epoch,
            epoch_header: HeaderValue::from(epoch),
            settled: AtomicBool::new(false),
        }
    }
}

/// Why an id could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No live, undrained worker hosts the namespace. 503 + `Retry-After`.
    #[error("no live worker hosts this namespace")]
    NoWorker,
    /// No live, undrained worker serves the namespace in the request's
    /// hostname world; the detail names it. 503 + `Retry-After`.
    #[error("{0}")]
    NoWorkerInWorld(String),
    /// A live worker of another world owns the id (ids are global: the
    /// store fences epochs per `(ns, id)`). 409.
    #[error("this id is placed in another hostname or env world")]
    OtherWorld,
    /// Quarantine (cold start or store loss): new placements wait. 503 +
    /// `Retry-After`.
    #[error("pinboard is starting; retry")]
    Quarantined,
    /// The store failed. 503 + `Retry-After`.
    #[error("placement store unavailable: {0}")]
    Store(#[from] StoreError),
}

/// What a re-resolution must avoid.
#[derive(Debug, Clone, Copy, Default)]
pub struct Avoid<'a> {
    /// Treat this `(session, epoch)` ownership as vacant.
    pub stale: Option<(&'a str, u64)>,
    /// Do not choose these sessions for a new placement (they refused it).
    pub exclude: &'a [String],
    /// Re-read the worker list first.
    pub refresh: bool,
}

/// One id to resolve, as the rounds of a claim pass it along.
#[derive(Debug, Clone, Copy)]
struct Lookup<'a> {
    /// The cache key, `"<ns>/<id>"`.
    key: &'a str,
    ns: &'a str,
    id: &'a str,
    /// The world asking.
    scope: Scope<'a>,
    /// What asks: a claim it makes that moves the id says so.
    by: MovedBy,
}

/// The "nobody can take it" error of `scope`: the hostless world keeps the
/// plain one, a hostname world names itself.
fn no_worker(scope: Scope<'_>) -> ResolveError {
    match scope {
        Scope::World(w) => w
            .no_worker_detail()
            .map_or(ResolveError::NoWorker, ResolveError::NoWorkerInWorld),
        Scope::Hostname(h) => no_worker(Scope::World(World {
            hostname: Some(h),
            env: None,
        })),
        Scope::Any => ResolveError::NoWorker,
    }
}

/// The cache of resolved routes, keyed `"<ns>/<id>"`.
type RouteCache = quick_cache::sync::Cache<String, Arc<Route>>;

/// How [`Routes`] caches and refreshes.
#[derive(Debug, Clone)]
pub struct RoutesSettings {
    /// Re-read the worker list at most this often, milliseconds.
    pub refresh_ms: u64,
    /// No new placement until this long after start, milliseconds.
    pub quarantine_ms: u64,
    /// The lease TTL workers are granted, milliseconds: after a store
    /// loss nothing new is placed for at least this long ([`generation`]).
    pub lease_ttl_ms: u64,
    /// Most routes kept in memory.
    pub route_capacity: usize,
    /// How long a session a forced re-read did not find stays known as
    /// unknown, milliseconds.
    pub unknown_session_ttl_ms: u64,
    /// Least time between two forced re-reads of the worker list, milliseconds.
    pub forced_refresh_interval_ms: u64,
    /// TLS to `https://` workers (`None`: a transport that is not sockets).
    pub upstream_tls: Option<UpstreamTls>,
}

/// The counters [`Routes`] keeps.
#[derive(Debug, Clone, Default)]
pub struct RoutesCounters {
    /// New placements claimed.
    pub placements: Counter,
    /// Reads of the worker list from the store.
    pub worker_reads: Counter,
    /// Claims handed back because the worker refused to activate the id.
    pub rolled_back: Counter,
    /// Times this node found the store's generation gone or changed.
    pub store_losses: Counter,
    /// Re-placements seen here, for the operator's "what moved" view.
    pub moves: Arc<MoveLog>,
}

/// The route directory (see the module doc).
pub struct Routes<S> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    floor: Arc<EpochFloor>,
    cache: RouteCache,
    snapshot: RwLock<Arc<Snapshot>>,
    /// A caller is re-reading the worker list ([`workers`]).
    refreshing: AtomicBool,
    refresh_ms: u64,
    /// After a failed regular re-read, the next waits until then
    /// (monotonic ms).
    refresh_retry_mono_ms: AtomicU64,
    /// Oldest worker view served while the store fails: one lease TTL.
    stale_limit_ms: u64,
    /// Where this node stands with the store's generation ([`generation`]).
    standing: RwLock<Standing>,
    quarantine_ms: u64,
    /// The quarantine after a store loss: `quarantine_ms`, at least one
    /// lease TTL.
    loss_quarantine_ms: u64,
    /// Sessions a forced re-read did not find, with when (monotonic ms).
    unknown_sessions: quick_cache::sync::Cache<String, u64>,
    unknown_session_ttl_ms: u64,
    /// Held by the caller doing (or waiting to do) a forced re-read.
    forced: tokio::sync::Mutex<()>,
    /// When the next forced re-read may start (monotonic ms).
    next_forced_mono_ms: AtomicU64,
    forced_interval_ms: u64,
    counters: RoutesCounters,
    upstream_tls: Option<UpstreamTls>,
}

impl<S> std::fmt::Debug for Routes<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("routes", &self.cache.len())
            .finish()
    }
}

impl<S: PlacementStore> Routes<S> {
    /// A route directory; nothing is placed until its generation is
    /// opened ([`open_generation`](Self::open_generation)). `counters`
    /// count the placements it claims and its reads of the worker list.
    pub fn new(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
        floor: Arc<EpochFloor>,
        settings: RoutesSettings,
        counters: RoutesCounters,
    ) -> Self {
        let RoutesSettings {
            refresh_ms,
            quarantine_ms,
            lease_ttl_ms,
            ..
        } = settings;
        Self {
            store,
            clock,
            entropy,
            floor,
            cache: RouteCache::new(settings.route_capacity.max(1)),
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            refreshing: AtomicBool::new(false),
            refresh_ms,
            refresh_retry_mono_ms: AtomicU64::new(0),
            stale_limit_ms: lease_ttl_ms.max(refresh_ms),
            standing: RwLock::new(Standing::Unopened),
            quarantine_ms,
            loss_quarantine_ms: quarantine_ms.max(lease_ttl_ms),
            unknown_sessions: quick_cache::sync::Cache::new(UNKNOWN_SESSION_CAPACITY),
            unknown_session_ttl_ms: settings.unknown_session_ttl_ms,
            forced: tokio::sync::Mutex::new(()),
            next_forced_mono_ms: AtomicU64::new(0),
            forced_interval_ms: settings.forced_refresh_interval_ms,
            counters,
            upstream_tls: settings.upstream_tls,
        }
    }

    /// The cached route for `key`, if any (no store access).
    pub fn cached(&self, key: &str) -> Option<Arc<Route>> {
        self.cache.get(key)
    }

    /// Number of cached routes.
    pub fn cached_routes(&self) -> usize {
        self.cache.len()
    }

    /// The owner of `route` answered 2xx for `(ns, id)` at its epoch:
    /// record the placement as settled, once per route and node. A store
    /// failure is logged; the next answer tries again.
    pub async fn settle(&self, ns: &str, id: &str, route: &Route) {
        if route.is_settled() {
            return;
        }
        let session = &route.worker.record.session_id;
        match self
            .store
            .settle(InstanceKey::new(ns, id), session, route.epoch)
            .await
        {
            Ok(_) => route.settled.store(true, Ordering::Release),
            Err(error) => {
                tracing::debug!(target: "pinboard::placement", ns, id, error = %pinned_edge::logging::Chain(&error), "could not record the placement as settled");
            }
        }
    }

    /// Forget the cached route for `key`.
    pub fn invalidate(&self, key: &str) {
        self.cache.remove(key);
    }

    /// Forget the cached route for `key` after its owner `session` failed
    /// or refused (why is not known yet): if the id's next claim here
    /// takes it from that owner, the move log asks the store why, or
    /// takes what this node learns first (see [`MoveLog::lost_sight`]).
    pub fn lose_sight(&self, key: &str, session: &str) {
        self.counters.moves.lost_sight(key, session);
        self.invalidate(key);
    }

    /// Forget every route to the given sessions (ended: deregistered, or
    /// by their own process's re-registration) and re-read workers next
    /// time. Their ids' next claims here are moves: a drain when the
    /// session was draining (a takeover when a newer deployment was
    /// winding it down), else a session ending.
    pub fn forget_sessions(&self, sessions: &[String]) {
        // The view read last knows a drain the cached routes' records may
        // predate.
        let snap = self.snapshot.read().clone();
        self.forget(sessions, |record| {
            let cached = if record.retire_at_wall_ms.is_some() {
                MoveReason::Takeover
            } else if record.refuses_new_ids() {
                MoveReason::Drain
            } else {
                MoveReason::SessionEnded
            };
            snap.letting_go(&record.session_id, cached)
        });
    }

    /// As [`forget_sessions`](Self::forget_sessions), for sessions that
    /// went for `reason` (superseded: replaced at their advertise URL, or
    /// taken over by a newer deployment).
    pub fn forget_gone(&self, sessions: &[String], reason: MoveReason) {
        self.forget(sessions, |_| reason);
    }

    fn forget(&self, sessions: &[String], reason: impl Fn(&WorkerRecord) -> MoveReason) {
        if sessions.is_empty() {
            return;
        }
        let moves = &self.counters.moves;
        self.cache.retain(|key, r| {
            let record = &r.worker.record;
            let ended = sessions.contains(&record.session_id);
            if ended {
                moves.departed(key, &record.session_id, reason(record));
            }
            !ended
        });
        *self.snapshot.write() = Arc::new(Snapshot::default());
    }

    /// Remember ids their owners released, `(key, session)` each, so their
    /// next claim here shows as a move: a wind-down when the operator asked
    /// for one through this node ([`MoveLog::winding_down`]), a takeover
    /// when a newer deployment is winding the owner down, a drain when the
    /// owner is draining in the local view, else an idle release. The view
    /// is read again first when it is stale: a drain pushed through this
    /// node marks it so, and a draining worker's first releases (its idle
    /// instances close at once) can come before any request re-read it;
    /// read then, they showed as idle releases. A failed read keeps the
    /// view held.
    pub async fn note_released<'a>(&self, released: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let snap = match self.workers(false).await {
            Ok(snap) => snap,
            Err(_) => self.snapshot.read().clone(),
        };
        for (key, session) in released {
            let reason = snap.letting_go(session, MoveReason::Released);
            self.counters.moves.released(key, session, reason);
        }
    }

    /// The store lost its data under every cached route: remember each
    /// id's owner, so an id its owner does not reclaim is a store-loss
    /// move when it is placed again (the store has no row to say where it
    /// came from). Bounded by the route cache and the move log's memory of
    /// departures.
    fn note_store_loss(&self) {
        let cached: Vec<(String, Arc<Route>)> = self.cache.iter().collect();
        self.counters.moves.store_lost(
            cached
                .iter()
                .map(|(key, route)| (key.as_str(), route.worker.record.session_id.as_str())),
        );
    }
}

#[cfg(test)]
mod tests;
