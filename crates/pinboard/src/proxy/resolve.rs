//! Resolution: `(ns, id)` → the owning worker and epoch, cached locally so
//! the hot path needs no store round trip for an id it has seen.
//!
//! Owns the route cache, the local snapshot of live workers and the
//! placement decision for new ids (candidate choice, cold-start quarantine).
//! Never talks to workers. A cached route may go stale (the id moved, the
//! worker re-registered): the worker's epoch fence turns that into a refusal,
//! and the proxy then calls [`Directory::invalidate`] and resolves again.
//!
//! The route cache holds one entry per id this node has resolved, up to
//! `--route-cache-capacity` entries (beyond that the least useful go, by
//! quick_cache's S3-FIFO-like policy: an id that keeps being asked for stays);
//! entries also go when a worker refuses or fails for that id, on release
//! through this node, and when a session ends here. A route evicted early
//! costs one store read on its next request, nothing else.
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
//! # Quarantine: cold start and store loss (inferred)
//!
//! During a quarantine no *new* placement is made: ids that already have a
//! live owner resolve normally, and workers re-registering with their
//! `instances` reclaim what they hold; everything else answers 503 +
//! `Retry-After`. A quarantine lasts from the moment the store's generation
//! (see `placement`) was written (the generation carries when it ends, so
//! every node that adopts it keeps to the same window), which happens in
//! two cases:
//!
//! - *Cold start on an empty store*, for `--quarantine-ms` (default one
//!   lease TTL): the memory store always (a restarted pinboard has
//!   forgotten every placement), Redis when it holds no generation. A node
//!   joining a Redis that already holds one (a rolling restart of pinboard
//!   nodes) inherits only what is left of that generation's quarantine,
//!   usually nothing.
//! - *Store loss*: Redis lost its data (`FLUSHALL`, a restart without
//!   persistence) while pinboard ran, for at least one lease TTL
//!   (`--quarantine-ms` when longer). Every claim names the generation its
//!   node knows and the store refuses it when the generation is gone or
//!   another, so the first claim after a loss finds out, before placing
//!   anything; so does the maintenance check every `--worker-refresh-ms`
//!   and `/readyz`. The node then writes a new generation (or adopts the
//!   one another node wrote) and waits out the quarantine while every live
//!   worker, answered `reregister` on its next heartbeat, re-registers and
//!   reclaims its instances. The loss happened at most one lease TTL after
//!   every live worker's last renewal, so by the end of the quarantine each
//!   one has either re-registered (its heartbeat interval is at most a third
//!   of the TTL) or seen its own lease run out (it serves nothing any more):
//!   an id of a live owner is never placed elsewhere before its owner had
//!   the time to reclaim it. A shorter window (as `--quarantine-ms` may ask
//!   for at cold start) handed the ids of the workers that came back last
//!   to the first one back, and the latecomers' reclaims found them owned
//!   there and aborted their live instances as duplicates.
//!
//! A directory whose generation was never opened places nothing.
//!
//! # Refused claims
//!
//! [`Directory::resolve_claiming`] says whether this call claimed the id.
//! When the worker then refuses to activate it and the request ends
//! without an answer from any worker, the proxy hands the claim back
//! ([`Directory::roll_back`]): an invented id leaves no row behind but the
//! short grace of a released one. The hand-back is a compare-and-release
//! at the claimed `(session, epoch)`, so a row another request moved on
//! since is left alone; it trusts the refusal as the re-placement after a
//! refusal always has (`Avoid::stale`): a worker that refused an id did
//! not activate it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use parking_lot::{Mutex, RwLock};
use pinned_wire::attestation;
use prometheus_client::metrics::counter::Counter;

use crate::clock::{Clock, Entropy, EpochFloor, Now};
use crate::operator::moves::{Claim, MoveLog, MoveReason};
use crate::placement::InstanceKey;
use crate::placement::{
    choose_candidate, ClaimOutcome, Generation, Placement, PlacementStore, StoreError, WorkerRecord,
};
use crate::upstream::{Pool, UpstreamTls};
use crate::world::{Scope, World};

/// A live worker as the proxy uses it.
pub struct WorkerConn {
    /// The worker's record.
    pub record: WorkerRecord,
    /// `Host` header value for the advertise URL.
    pub host: HeaderValue,
    /// Scheme and authority of the advertise URL, for building upstream URIs
    /// without allocating; `None` when the URL has a base path (then the
    /// proxy concatenates strings).
    pub origin: Option<(http::uri::Scheme, http::uri::Authority)>,
    /// The advertise URL's path without its trailing `/` (usually empty):
    /// proxied request targets go below it.
    pub base_path: Box<str>,
    /// Keep-alive connections to the worker, kept across record changes of
    /// the same session (headroom moves with every heartbeat).
    pub pool: Arc<Pool>,
    /// HMAC key derived once from the worker secret.
    key: attestation::Key,
    /// Anonymous attestation cached per wall second: `(iat, token)`.
    token: Mutex<(u64, HeaderValue)>,
}

impl std::fmt::Debug for WorkerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConn")
            .field("session_id", &self.record.session_id)
            .field("advertise_url", &self.record.advertise_url)
            .finish_non_exhaustive()
    }
}

impl WorkerConn {
    /// `None` when the advertise URL cannot be reached (not a URL, or an
    /// `https://` host TLS cannot verify); `tls` handshakes with an
    /// `https://` worker (without it, a non-socket transport, the pool is
    /// never used).
    pub(crate) fn new(record: WorkerRecord, tls: Option<&UpstreamTls>) -> Option<Self> {
        Self::with_pool(record, None, tls)
    }

    /// As [`new`](Self::new), reusing `pool` when given (the same session
    /// with a changed record).
    fn with_pool(
        record: WorkerRecord,
        pool: Option<Arc<Pool>>,
        tls: Option<&UpstreamTls>,
    ) -> Option<Self> {
        let uri: http::Uri = record.advertise_url.parse().ok()?;
        let authority = uri.authority()?.clone();
        let host = HeaderValue::from_str(authority.as_str()).ok()?;
        let origin = match (uri.scheme(), uri.path()) {
            (Some(scheme), "" | "/") => Some((scheme.clone(), authority.clone())),
            _ => None,
        };
        let base_path = uri.path().trim_end_matches('/').into();
        let pool = match pool {
            Some(pool) => pool,
            None => {
                let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
                let connector = tls.filter(|_| https).map(UpstreamTls::connector);
                match Pool::new(authority, connector) {
                    Ok(pool) => pool,
                    Err(error) => {
                        tracing::warn!(
                            target: "pinboard::proxy",
                            advertise_url = %record.advertise_url,
                            %error,
                            "worker skipped: its advertise URL cannot be reached over TLS"
                        );
                        return None;
                    }
                }
            }
        };
        Some(Self {
            pool,
            origin,
            base_path,
            key: attestation::Key::new(&record.secret),
            record,
            host,
            token: Mutex::new((0, HeaderValue::from_static(""))),
        })
    }

    /// An attestation for this worker's session, minted with its secret.
    /// Anonymous tokens are reused within one wall second.
    pub fn attestation(&self, now_wall_secs: f64, caller: Option<(&str, i64)>) -> HeaderValue {
        let r = &self.record;
        if let Some((from, depth)) = caller {
            let t = attestation::mint(
                &r.secret,
                &r.session_id,
                now_wall_secs,
                Some(from),
                Some(depth),
            );
            return HeaderValue::from_str(&t).unwrap_or_else(|_| HeaderValue::from_static(""));
        }
        let iat = now_wall_secs.floor() as u64;
        let mut cached = self.token.lock();
        if cached.0 != iat {
            let t = self.key.mint(&r.session_id, now_wall_secs, None, None);
            *cached = (
                iat,
                HeaderValue::from_str(&t).unwrap_or_else(|_| HeaderValue::from_static("")),
            );
        }
        cached.1.clone()
    }
}

/// A resolved route.
#[derive(Debug)]
pub struct Route {
    /// The owner.
    pub worker: Arc<WorkerConn>,
    /// Placement epoch.
    pub epoch: u64,
    /// `Pinboard-Epoch` value.
    pub epoch_header: HeaderValue,
    /// This node recorded the placement as settled (see [`Directory::settle`]).
    settled: AtomicBool,
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

/// A worker view up to this many refresh intervals old is still served
/// while one caller refreshes it; older, every caller waits for a fresh one.
const STALE_GRACE_FACTOR: u64 = 4;

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

#[derive(Debug, Default)]
struct Snapshot {
    /// Keyed by session id; foldhash, as every cached route's liveness
    /// check looks its owner up here.
    by_session: foldhash::HashMap<String, Arc<WorkerConn>>,
    /// Bound hostnames, lowercase: the store's record and every live
    /// worker's (see [`View::binds`]).
    bound: Arc<foldhash::HashSet<Box<str>>>,
    fetched_mono_ms: Option<u64>,
}

/// This node's worker view at one moment ([`Directory::view`]): what a
/// request reads once and hands to its first resolution, so that a
/// request reads the view once.
#[derive(Debug, Clone)]
pub struct View(Arc<Snapshot>);

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

/// The cache of resolved routes, keyed `"<ns>/<id>"`.
type RouteCache = quick_cache::sync::Cache<String, Arc<Route>>;

/// How a [`Directory`] caches and refreshes.
#[derive(Debug, Clone)]
pub struct DirectorySettings {
    /// Re-read the worker list at most this often, milliseconds.
    pub refresh_ms: u64,
    /// No new placement until this long after start, milliseconds.
    pub quarantine_ms: u64,
    /// The lease TTL workers are granted, milliseconds: after a store
    /// loss nothing new is placed for at least this long (module doc).
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

/// The counters a [`Directory`] keeps.
#[derive(Debug, Clone, Default)]
pub struct DirectoryCounters {
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

/// Whether a node should get traffic (`/readyz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The store answers and new ids are placed.
    Ready,
    /// The store did not answer (in time).
    StoreUnreachable(String),
    /// New placements wait this many more milliseconds.
    Quarantined {
        /// Milliseconds left.
        left_ms: u64,
    },
}

/// Route cache plus the local worker view.
pub struct Directory<S> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    floor: Arc<EpochFloor>,
    routes: RouteCache,
    snapshot: RwLock<Arc<Snapshot>>,
    /// A caller is re-reading the worker list (see [`Directory::workers`]).
    refreshing: AtomicBool,
    refresh_ms: u64,
    /// No new placement before this (monotonic ms).
    quarantine_until_mono_ms: AtomicU64,
    quarantine_ms: u64,
    /// The quarantine after a store loss: `quarantine_ms`, at least one
    /// lease TTL.
    loss_quarantine_ms: u64,
    /// The store generation this node knows; `None` until opened.
    generation: RwLock<Option<Arc<Generation>>>,
    /// Sessions a forced re-read did not find, with when (monotonic ms).
    unknown_sessions: quick_cache::sync::Cache<String, u64>,
    unknown_session_ttl_ms: u64,
    /// Held by the caller doing (or waiting to do) a forced re-read.
    forced: tokio::sync::Mutex<()>,
    /// When the next forced re-read may start (monotonic ms).
    next_forced_mono_ms: AtomicU64,
    forced_interval_ms: u64,
    counters: DirectoryCounters,
    upstream_tls: Option<UpstreamTls>,
}

impl<S> std::fmt::Debug for Directory<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("routes", &self.routes.len())
            .finish()
    }
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

impl<S: PlacementStore> Directory<S> {
    /// A directory; new placements wait until `settings.quarantine_ms`
    /// after now. `counters` count the placements it claims and its reads
    /// of the worker list.
    pub fn new(
        store: Arc<S>,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
        floor: Arc<EpochFloor>,
        settings: DirectorySettings,
        counters: DirectoryCounters,
    ) -> Self {
        let DirectorySettings {
            refresh_ms,
            quarantine_ms,
            lease_ttl_ms,
            ..
        } = settings;
        let start = clock.now().mono_ms;
        Self {
            store,
            clock,
            entropy,
            floor,
            routes: RouteCache::new(settings.route_capacity.max(1)),
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            refreshing: AtomicBool::new(false),
            refresh_ms,
            quarantine_until_mono_ms: AtomicU64::new(start + quarantine_ms),
            quarantine_ms,
            loss_quarantine_ms: quarantine_ms.max(lease_ttl_ms),
            generation: RwLock::new(None),
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
        self.routes.get(key)
    }

    /// Number of cached routes.
    pub fn cached_routes(&self) -> usize {
        self.routes.len()
    }

    /// The owner of `route` answered 2xx for `(ns, id)` at its epoch:
    /// record the placement as settled, once per route and node (a warm
    /// route pays one atomic load). A store failure is logged; the next
    /// answer tries again.
    pub async fn settle(&self, ns: &str, id: &str, route: &Route) {
        if route.settled.load(Ordering::Acquire) {
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
        self.routes.remove(key);
    }

    /// Forget every route to the given sessions and re-read workers next time.
    pub fn forget_sessions(&self, sessions: &[String]) {
        self.forget(sessions, |record| {
            if record.refuses_new_ids() {
                MoveReason::Drain
            } else {
                MoveReason::SessionEnded
            }
        });
    }

    /// As [`forget_sessions`](Self::forget_sessions), for sessions a new
    /// process at their advertise URL superseded: their ids' next claims
    /// here are moves of that kind.
    pub fn forget_replaced(&self, sessions: &[String]) {
        self.forget(sessions, |_| MoveReason::Replaced);
    }

    fn forget(&self, sessions: &[String], reason: impl Fn(&WorkerRecord) -> MoveReason) {
        if sessions.is_empty() {
            return;
        }
        let moves = &self.counters.moves;
        self.routes.retain(|key, r| {
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
    /// next claim here shows as a move: a drain when the owner is draining
    /// in the local view. Reads no store.
    pub fn note_released<'a>(&self, released: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let snap = self.snapshot.read().clone();
        for (key, session) in released {
            let draining = snap
                .by_session
                .get(session)
                .is_some_and(|w| w.record.refuses_new_ids());
            let reason = if draining {
                MoveReason::Drain
            } else {
                MoveReason::Released
            };
            self.counters.moves.departed(key, session, reason);
        }
    }

    /// Mark the worker list stale (a registration changed it).
    pub fn workers_changed(&self) {
        let mut snap = self.snapshot.write();
        if snap.fetched_mono_ms.is_some() {
            *snap = Arc::new(Snapshot {
                by_session: snap.by_session.clone(),
                bound: snap.bound.clone(),
                fetched_mono_ms: None,
            });
        }
    }

    /// The worker view: the cached one while it is younger than the
    /// refresh interval, else re-read; with `force`, a view read after this
    /// call (see [`forced_workers`](Self::forced_workers)).
    async fn workers(&self, force: bool) -> Result<Arc<Snapshot>, StoreError> {
        if force {
            return self.forced_workers().await;
        }
        let now_mono_ms = self.clock.mono_ms();
        {
            let snap = self.snapshot.read();
            if let Some(at) = snap.fetched_mono_ms {
                let age = now_mono_ms.saturating_sub(at);
                if age < self.refresh_ms {
                    return Ok(snap.clone());
                }
                // Stale but recent: one caller refreshes, the others keep
                // going on the old view instead of all waiting on the
                // store at once.
                if age < self.refresh_ms.saturating_mul(STALE_GRACE_FACTOR)
                    && self.refreshing.swap(true, Ordering::AcqRel)
                {
                    return Ok(snap.clone());
                }
            }
        }
        let _refreshing = RefreshGuard(&self.refreshing);
        self.fetch_workers().await
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
        Ok(View(self.workers(false).await?))
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

    /// Read the store's generation, writing a new one when it holds none,
    /// and adopt it (with what is left of its quarantine). Call once before
    /// serving; until then nothing is placed.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn open_generation(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        let proposal = self.propose(now, self.quarantine_ms);
        let held = self.store.open_generation(&proposal).await?;
        let written = held == proposal;
        let left_ms = self.adopt(held.clone(), now, self.quarantine_ms);
        if written {
            tracing::info!(target: "pinboard::placement", generation = %held.0, quarantine_ms = left_ms, "the store held no state: new generation, cold-start quarantine");
        } else {
            tracing::info!(target: "pinboard::placement", generation = %held.0, quarantine_ms = left_ms, "the store holds state: joined its generation");
        }
        Ok(())
    }

    /// A new generation whose quarantine lasts `quarantine_ms` from now.
    fn propose(&self, now: Now, quarantine_ms: u64) -> Generation {
        Generation::new(
            &self.entropy.token_hex(16),
            now.wall_ms.saturating_add(quarantine_ms),
        )
    }

    /// Take `generation` as the store's and quarantine until its quarantine
    /// ends (at most `cap_ms` from now, so a skewed clock cannot stretch
    /// it); returns the time left.
    fn adopt(&self, generation: Generation, now: Now, cap_ms: u64) -> u64 {
        let left_ms = generation
            .quarantine_until_wall_ms()
            .unwrap_or(0)
            .saturating_sub(now.wall_ms)
            .min(cap_ms);
        self.quarantine_until_mono_ms
            .store(now.mono_ms.saturating_add(left_ms), Ordering::Release);
        *self.generation.write() = Some(Arc::new(generation));
        left_ms
    }

    /// The store no longer holds this node's generation (it lost its data,
    /// or another node noticed first and wrote `held`): adopt or write one,
    /// and quarantine for the store-loss window (at least a lease TTL, see
    /// the module doc). Cached routes stay: they name the owners the store
    /// had before, which still hold their instances, and they go as usual
    /// when the worker view (re-read every refresh) no longer lists them.
    async fn store_lost(&self, held: Option<Generation>) -> Result<(), StoreError> {
        // Epochs minted before the loss are gone from the store: the next
        // claim keeps above the durable mark.
        self.floor.reload_durable();
        let now = self.clock.now();
        let window = self.loss_quarantine_ms;
        let generation = match held {
            Some(g) => g,
            None => {
                self.store
                    .open_generation(&self.propose(now, window))
                    .await?
            }
        };
        let previous = self.generation.read().clone();
        if previous.as_deref() == Some(&generation) {
            return Ok(());
        }
        let left_ms = self.adopt(generation.clone(), now, window);
        self.counters.store_losses.inc();
        tracing::warn!(
            target: "pinboard::placement",
            previous = previous.as_deref().map_or("none", |g| g.0.as_str()),
            generation = %generation.0,
            quarantine_ms = left_ms,
            "the placement store lost its data: no new placements until workers re-registered"
        );
        Ok(())
    }

    /// Compare the store's generation with this node's, and handle a loss.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn check_generation(&self) -> Result<(), StoreError> {
        let held = self.store.generation().await?;
        let known = self.generation.read().clone();
        if held.as_ref() != known.as_deref() {
            self.store_lost(held).await?;
        }
        Ok(())
    }

    /// Milliseconds left of the quarantine (0 when placing).
    pub fn quarantine_left_ms(&self) -> u64 {
        if self.generation.read().is_none() {
            return self.quarantine_ms.max(1);
        }
        let until = self.quarantine_until_mono_ms.load(Ordering::Acquire);
        until.saturating_sub(self.clock.now().mono_ms)
    }

    /// Whether this node should get traffic: the store answers (a
    /// generation check within `timeout`, which also notices a loss) and no
    /// quarantine holds new placements back.
    pub async fn readiness(&self, timeout: Duration) -> Readiness {
        match tokio::time::timeout(timeout, self.check_generation()).await {
            Err(_) => {
                return Readiness::StoreUnreachable(format!(
                    "no answer within {} ms",
                    timeout.as_millis()
                ))
            }
            Ok(Err(e)) => return Readiness::StoreUnreachable(e.to_string()),
            Ok(Ok(())) => {}
        }
        match self.quarantine_left_ms() {
            0 => Readiness::Ready,
            left_ms => Readiness::Quarantined { left_ms },
        }
    }

    /// Hand back a claim the worker refused (see the module doc): the row
    /// is released if it is still `placement`, and the route forgotten.
    ///
    /// # Errors
    ///
    /// When the store fails.
    pub async fn roll_back(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        placement: &Placement,
    ) -> Result<bool, StoreError> {
        self.invalidate(key);
        let released = self
            .store
            .release(
                InstanceKey::new(ns, id),
                &placement.session_id,
                Some(placement.epoch),
            )
            .await?;
        if released {
            self.counters.rolled_back.inc();
        }
        Ok(released)
    }

    /// Note a claim in the move log: after a refusal (a drain when the
    /// refusing owner is draining), else whatever departure was seen here,
    /// else `gone`: the row's previous owner, with what the store says of
    /// why it went.
    #[allow(clippy::too_many_arguments)]
    fn record_move(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        placement: &Placement,
        avoid: Avoid<'_>,
        snap: &Snapshot,
        now: Now,
        gone: Option<(&str, MoveReason)>,
    ) {
        let known = avoid.stale.map(|(from, _)| {
            let draining = snap
                .by_session
                .get(from)
                .is_some_and(|w| w.record.refuses_new_ids());
            let reason = if draining {
                MoveReason::Drain
            } else {
                MoveReason::Refusal
            };
            (from, reason)
        });
        let known = known.or(gone);
        self.counters.moves.claimed(
            Claim {
                key,
                ns,
                id,
                to: &placement.session_id,
                epoch: placement.epoch,
                at_ms: now.wall_ms,
            },
            known,
        );
    }

    /// Why the session `from` that owned a row this node just claimed is
    /// gone, as far as the store knows (its supersession note; none: its
    /// lease lapsed, or it deregistered). Only for a move this node saw
    /// nothing of, so it costs one store read per such move.
    async fn gone_reason(&self, from: &str, now: Now) -> MoveReason {
        match self.store.superseded(from, now).await {
            Ok(reason) => MoveReason::of_gone_session(reason.as_deref()),
            Err(error) => {
                tracing::debug!(target: "pinboard::placement", from, error = %pinned_edge::logging::Chain(&error), "could not read why a session went");
                MoveReason::LeaseLapsed
            }
        }
    }

    /// Resolve `(ns, id)` (cache key `key`): cached route, else the store's
    /// live owner, else a new placement on a live undrained host of `ns`.
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<Arc<Route>, ResolveError> {
        Ok(self.resolve_claiming(key, ns, id, scope, avoid).await?.0)
    }

    /// As [`resolve`](Self::resolve), and whether this call claimed the id
    /// (a new placement) rather than finding an owner.
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve_claiming(
        &self,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<(Arc<Route>, bool), ResolveError> {
        self.resolve_claiming_in(None, key, ns, id, scope, avoid)
            .await
    }

    /// As [`resolve_claiming`](Self::resolve_claiming), on `view` (read
    /// for this request already, [`view`](Self::view)) rather than a
    /// second read of the worker view, unless `avoid` asks for a fresh one.
    ///
    /// # Errors
    ///
    /// [`ResolveError`]: no worker, quarantine, or a store failure.
    pub async fn resolve_claiming_in(
        &self,
        mut view: Option<View>,
        key: &str,
        ns: &str,
        id: &str,
        scope: Scope<'_>,
        avoid: Avoid<'_>,
    ) -> Result<(Arc<Route>, bool), ResolveError> {
        if avoid.stale.is_none() && !avoid.refresh {
            if let Some(r) = self.cached(key) {
                // A cached owner is trusted only while it is in the live
                // worker view (refreshed at most every `refresh_ms`, so this
                // costs no store call per request): a frozen or dead owner
                // answers nothing at all, and must lose its ids once its
                // lease lapsed, not after a client timeout.
                let snap = match view.take() {
                    Some(View(snap)) => snap,
                    None => self.workers(false).await?,
                };
                if snap.by_session.contains_key(&r.worker.record.session_id) {
                    // Routes are cached per id (ids are global); the world
                    // is checked on every hit: two comparisons.
                    if !scope.admits(&r.worker.record, ns) {
                        return Err(ResolveError::OtherWorld);
                    }
                    return Ok((r, false));
                }
                self.counters.moves.departed(
                    key,
                    &r.worker.record.session_id,
                    MoveReason::LeaseLapsed,
                );
                self.invalidate(key);
            }
        }
        let mut force = avoid.refresh;
        for _round in 0..3 {
            let snap = match view.take() {
                Some(View(snap)) if !force => snap,
                _ => self.workers(force).await?,
            };
            force = true;
            let now = self.clock.now();
            let generation = self.generation.read().clone();
            let quarantined = generation.is_none()
                || now.mono_ms < self.quarantine_until_mono_ms.load(Ordering::Acquire);
            let mut candidates: Vec<&Arc<WorkerConn>> = snap
                .by_session
                .values()
                .filter(|w| {
                    w.record.hosts(ns)
                        && !w.record.refuses_new_ids()
                        && scope.admits(&w.record, ns)
                        && !avoid.exclude.contains(&w.record.session_id)
                })
                .collect();
            // A map has no order: sort, so a seeded roll picks the same worker.
            candidates.sort_unstable_by(|a, b| a.record.session_id.cmp(&b.record.session_id));
            let candidate = if quarantined {
                None
            } else {
                choose_candidate(&candidates, |w| w.record.headroom, self.entropy.next_u64())
                    .map(|i| candidates[i].record.session_id.as_str())
            };
            let floor = self.floor.floor_for_claim(now).await;
            let unknown = Generation(String::new());
            let (placement, claimed) = match self
                .store
                .resolve_or_claim(
                    InstanceKey::new(ns, id),
                    candidate,
                    avoid.stale,
                    floor,
                    generation.as_deref().unwrap_or(&unknown),
                    now,
                )
                .await?
            {
                ClaimOutcome::Owned(p) => (p, false),
                ClaimOutcome::Claimed(p, from) => {
                    self.counters.placements.inc();
                    let gone = match from {
                        Some(from)
                            if avoid.stale.is_none() && !self.counters.moves.remembers(key) =>
                        {
                            let reason = self.gone_reason(&from, now).await;
                            Some((from, reason))
                        }
                        _ => None,
                    };
                    let gone = gone.as_ref().map(|(from, reason)| (from.as_str(), *reason));
                    self.record_move(key, ns, id, &p, avoid, &snap, now, gone);
                    self.floor.minted(p.epoch).await;
                    (p, true)
                }
                ClaimOutcome::Vacant if quarantined => return Err(ResolveError::Quarantined),
                ClaimOutcome::Vacant => return Err(no_worker(scope)),
                ClaimOutcome::CandidateGone => continue,
                ClaimOutcome::GenerationLost(held) => {
                    self.store_lost(held).await?;
                    if self.quarantine_left_ms() > 0 {
                        return Err(ResolveError::Quarantined);
                    }
                    continue;
                }
            };
            self.floor.observe(placement.epoch);
            let worker = match snap.by_session.get(&placement.session_id) {
                Some(w) => w.clone(),
                None => match self.store.get_worker(&placement.session_id, now).await? {
                    Some(live) => match WorkerConn::new(live.record, self.upstream_tls.as_ref()) {
                        Some(c) => Arc::new(c),
                        None => continue,
                    },
                    None => continue,
                },
            };
            if !scope.admits(&worker.record, ns) {
                // Found, not claimed: a claim only ever names a candidate
                // of this world.
                return Err(ResolveError::OtherWorld);
            }
            let route = Arc::new(Route {
                worker,
                epoch: placement.epoch,
                epoch_header: HeaderValue::from(placement.epoch),
                settled: AtomicBool::new(false),
            });
            self.routes.insert(key.to_owned(), route.clone());
            return Ok((route, claimed));
        }
        Err(no_worker(scope))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Now, SeededEntropy};
    use crate::placement::MemoryStore;

    const HOSTLESS: Scope<'static> = Scope::World(World::HOSTLESS);

    struct FakeClock(Mutex<Now>);
    impl Clock for FakeClock {
        fn now(&self) -> Now {
            *self.0.lock()
        }
    }

    fn rec(sid: &str, headroom: i64) -> WorkerRecord {
        WorkerRecord {
            session_id: sid.into(),
            client_id: "c".into(),
            secret: "s".into(),
            advertise_url: format!("http://{sid}.invalid:1"),
            namespaces: vec!["/c".into()],
            headroom,
            ..Default::default()
        }
    }

    async fn setup(
        quarantine_ms: u64,
    ) -> (Directory<MemoryStore>, Arc<FakeClock>, Arc<MemoryStore>) {
        setup_leased(quarantine_ms, quarantine_ms).await
    }

    /// As [`setup`], granting leases of `lease_ttl_ms`.
    async fn setup_leased(
        quarantine_ms: u64,
        lease_ttl_ms: u64,
    ) -> (Directory<MemoryStore>, Arc<FakeClock>, Arc<MemoryStore>) {
        let clock = Arc::new(FakeClock(Mutex::new(Now {
            wall_ms: 5_000,
            mono_ms: 0,
        })));
        let store = Arc::new(MemoryStore::new());
        for sid in ["a", "b"] {
            store
                .put_worker(&rec(sid, 10), 10_000, clock.now())
                .await
                .expect("put");
        }
        let dir = Directory::new(
            store.clone(),
            clock.clone(),
            Arc::new(SeededEntropy::seeded(3)),
            Arc::new(EpochFloor::default()),
            DirectorySettings {
                refresh_ms: 0,
                quarantine_ms,
                lease_ttl_ms,
                route_capacity: 1000,
                unknown_session_ttl_ms: 1000,
                forced_refresh_interval_ms: 100,
                upstream_tls: None,
            },
            DirectoryCounters::default(),
        );
        dir.open_generation().await.expect("generation");
        (dir, clock, store)
    }

    #[tokio::test]
    async fn quarantine_blocks_new_placements_only() {
        let (dir, clock, store) = setup(1000).await;
        store
            .resolve_or_claim(
                InstanceKey::new("/c", "old"),
                Some("a"),
                None,
                1,
                &store.generation().await.expect("read").expect("opened"),
                clock.now(),
            )
            .await
            .expect("claim");
        assert!(dir
            .resolve("/c/old", "/c", "old", HOSTLESS, Avoid::default())
            .await
            .is_ok());
        assert!(matches!(
            dir.resolve("/c/new", "/c", "new", HOSTLESS, Avoid::default())
                .await,
            Err(ResolveError::Quarantined)
        ));
        clock.0.lock().mono_ms = 1000;
        let r = dir
            .resolve("/c/new", "/c", "new", HOSTLESS, Avoid::default())
            .await
            .expect("placed");
        assert_eq!(r.epoch, 5_000_000);
        assert!(dir.cached("/c/new").is_some());
    }

    #[tokio::test]
    async fn a_store_loss_quarantines_for_a_lease_even_without_a_cold_start_quarantine() {
        let (dir, clock, store) = setup_leased(0, 3000).await;
        dir.resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
            .await
            .expect("no cold-start quarantine");
        // The store loses everything; one worker is back (re-registered),
        // the other, which may hold ids, is not yet.
        store.wipe();
        store
            .put_worker(&rec("a", 10), 10_000, clock.now())
            .await
            .expect("put");
        for _ in 0..2 {
            assert!(matches!(
                dir.resolve("/c/y", "/c", "y", HOSTLESS, Avoid::default())
                    .await,
                Err(ResolveError::Quarantined)
            ));
        }
        assert_eq!(dir.quarantine_left_ms(), 3000);
        clock.0.lock().mono_ms = 2999;
        clock.0.lock().wall_ms += 2999;
        assert!(matches!(
            dir.resolve("/c/y", "/c", "y", HOSTLESS, Avoid::default())
                .await,
            Err(ResolveError::Quarantined)
        ));
        clock.0.lock().mono_ms = 3000;
        clock.0.lock().wall_ms += 1;
        let placed = dir
            .resolve("/c/y", "/c", "y", HOSTLESS, Avoid::default())
            .await
            .expect("placed once every lease that could hold it has run out");
        assert_eq!(placed.worker.record.session_id, "a");
    }

    #[tokio::test]
    async fn the_route_cache_stays_bounded_and_evicted_ids_resolve_from_the_store() {
        let (dir, _, _) = setup(0).await;
        let mut owners = std::collections::HashMap::new();
        for i in 0..5000 {
            let (key, id) = (format!("/c/i{i}"), format!("i{i}"));
            let route = dir
                .resolve(&key, "/c", &id, HOSTLESS, Avoid::default())
                .await
                .expect("placed");
            owners.insert(key, (route.worker.record.session_id.clone(), route.epoch));
        }
        // Capacity 1 000 in `setup`; quick_cache's bound is approximate.
        assert!(
            dir.cached_routes() <= 1100,
            "{} routes cached",
            dir.cached_routes()
        );
        for (key, (owner, epoch)) in &owners {
            let id = &key["/c/".len()..];
            let route = dir
                .resolve(key, "/c", id, HOSTLESS, Avoid::default())
                .await
                .expect("resolved");
            assert_eq!(
                (&route.worker.record.session_id, route.epoch),
                (owner, *epoch),
                "{key} moved"
            );
        }
    }

    #[tokio::test]
    async fn excluding_every_host_leaves_no_worker() {
        let (dir, _, _) = setup(0).await;
        let all = ["a".to_owned(), "b".to_owned()];
        let err = dir
            .resolve(
                "/c/y",
                "/c",
                "y",
                HOSTLESS,
                Avoid {
                    stale: None,
                    exclude: &all,
                    refresh: false,
                },
            )
            .await;
        assert!(matches!(err, Err(ResolveError::NoWorker)));
    }

    #[tokio::test]
    async fn move_away_places_elsewhere_with_a_larger_epoch() {
        let (dir, _, _) = setup(0).await;
        let first = dir
            .resolve("/c/x", "/c", "x", HOSTLESS, Avoid::default())
            .await
            .expect("placed");
        let owner = first.worker.record.session_id.clone();
        let moved = dir
            .resolve(
                "/c/x",
                "/c",
                "x",
                HOSTLESS,
                Avoid {
                    stale: Some((&owner, first.epoch)),
                    exclude: std::slice::from_ref(&owner),
                    refresh: false,
                },
            )
            .await
            .expect("moved");
        assert_ne!(moved.worker.record.session_id, owner);
        assert!(moved.epoch > first.epoch);
        // Only the excluded worker hosts the namespace: no worker.
        let err = dir
            .resolve(
                "/c/x",
                "/c",
                "x",
                HOSTLESS,
                Avoid {
                    stale: Some((&moved.worker.record.session_id, moved.epoch)),
                    exclude: std::slice::from_ref(&moved.worker.record.session_id),
                    refresh: false,
                },
            )
            .await;
        assert!(err.is_ok(), "the other worker can take it back");
        assert!(matches!(
            dir.resolve("/z/x", "/z", "x", HOSTLESS, Avoid::default())
                .await,
            Err(ResolveError::NoWorker)
        ));
    }

    #[tokio::test]
    async fn worlds_place_apart_and_ids_stay_global() {
        let (dir, clock, store) = setup(0).await;
        let mut app = rec("app", 1);
        app.hostname = Some("app".into());
        app.env = Some("staging".into());
        store
            .put_worker(&app, 10_000, clock.now())
            .await
            .expect("put");
        dir.workers_changed();
        let staging = Scope::World(World {
            hostname: Some("APP"),
            env: Some("staging"),
        });
        let production = Scope::World(World {
            hostname: Some("app"),
            env: Some("production"),
        });
        for i in 0..20 {
            let id = format!("h{i}");
            let key = format!("/c/{id}");
            let hostless = dir
                .resolve(&key, "/c", &id, HOSTLESS, Avoid::default())
                .await
                .expect("hostless");
            assert_ne!(hostless.worker.record.session_id, "app");
            // The same id from another world: its owner is elsewhere (cached
            // route and store read alike).
            assert!(matches!(
                dir.resolve(&key, "/c", &id, staging, Avoid::default())
                    .await,
                Err(ResolveError::OtherWorld)
            ));
            dir.invalidate(&key);
            assert!(matches!(
                dir.resolve(&key, "/c", &id, staging, Avoid::default())
                    .await,
                Err(ResolveError::OtherWorld)
            ));
            let id = format!("s{i}");
            let placed = dir
                .resolve(&format!("/c/{id}"), "/c", &id, staging, Avoid::default())
                .await
                .expect("staging");
            assert_eq!(placed.worker.record.session_id, "app");
        }
        match dir
            .resolve("/c/p", "/c", "p", production, Avoid::default())
            .await
        {
            Err(e @ ResolveError::NoWorkerInWorld(_)) => assert_eq!(
                e.to_string(),
                r#"no live worker serves this namespace for hostname "app" in env "production""#
            ),
            other => panic!("{other:?}"),
        }
        // The sweeper places anywhere.
        let any = dir
            .resolve("/c/s0", "/c", "s0", Scope::Any, Avoid::default())
            .await
            .expect("any");
        assert_eq!(any.worker.record.session_id, "app");
    }
}
