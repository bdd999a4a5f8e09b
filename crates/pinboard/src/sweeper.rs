//! The alarm and durable-wake sweeper: reads the workers' state store
//! (Postgres) for due alarm rows and marked rows (the activities index) and
//! delivers `POST /<ns>/<id>/_alarm` and `POST /<ns>/<id>/_wake` to each id's
//! owner through normal placement, so an evicted id activates on any live
//! worker hosting its namespace, exactly as a client request would
//! (wire.md §4.4, §4.5, §12.5, §14).
//!
//! Owns the sweep loop, the sweeper lease and the per-lap bookkeeping
//! ([`decide`]). Never writes to the state store (both scans are unfenced
//! reads: the worker deletes an alarm row after its handler ran), never
//! places an id other than through [`crate::routes::Routes`], and
//! never sends `Pinboard-Proxy-Secret` on `_wake` (the SIM harness asserts
//! it is absent from every data-plane call).
//!
//! Enabled by `--database-url` / `DATABASE_URL`. At start the sweeper creates
//! the reference's tables if no worker has yet (idempotent DDL, retried each
//! interval until Postgres answers), then runs one lap every
//! `--sweep-interval-ms` (default 5 000, the JS `sweepIntervalMs`).
//!
//! # Choices (inferred where the sources are silent)
//!
//! - **One sweeper at a time.** A lease in the placement store: in Redis the
//!   key `<prefix>sweeper` holds a random per-process token, taken with
//!   `SET NX PX`, renewed at the start of every lap by a compare-and-set Lua
//!   script and deleted (compare-and-delete) on shutdown. Its TTL is three
//!   sweep intervals, so one slow or lost renewal keeps the holder, and a
//!   dead holder is replaced within about three intervals. A holder whose
//!   renewal is refused tries to take the lease again in the same lap (it
//!   may have lapsed during a slow lap). The node considers the lease held
//!   until one TTL after it *sent* the granting command and checks that
//!   before every call it starts; a store error drops it at once. On the
//!   memory placement store (one node) the lease is in memory and the node
//!   always holds it. A lap without the lease reads nothing.
//! - **A lap** reads (1) `due_alarms(now, n)` and (2) one page of
//!   `marked_instances` after a cursor kept across laps (wrapping to the
//!   start when a page comes back short; with more marked ids than the limit
//!   a full pass takes several laps), and starts at most
//!   `--sweep-limit` (default 256; the reference's harness uses 8) calls per
//!   scan. Due alarms are read with `n = limit + alarms in flight` (at most
//!   four times the limit) so calls still running cannot starve newer rows.
//!   Calls run in spawned tasks, at most `--sweep-concurrency` (default 32)
//!   at once across laps; a lap never waits for them. A key (call, ns, id)
//!   is called at most once at a time, and a row whose previous call
//!   finished after the scan started is left to the next lap (its alarm may
//!   just have fired): under normal operation each due alarm is posted once
//!   per lap, and a lap posts nothing twice.
//! - **Each call** resolves the id like the proxy (cached route, else the
//!   live owner, else a new placement on a live undrained host of the
//!   namespace, subject to the cold-start quarantine) in the world that wrote
//!   the row (`scope_of`: its `hostname`/`env` stamps; `*` is any world, a
//!   hostname without env any env of it; placement rows name none), then posts an empty
//!   body with `Pinboard-Attestation` (minted with the owner's secret,
//!   `aud` = its session, like the proxy's) and `Pinboard-Epoch`, plus
//!   `Pinboard-Proxy-Secret` on `_alarm` only (the JS document requires it).
//!   A call that takes longer than [`CALL_TIMEOUT`] is abandoned; the row
//!   stays and the next lap calls again. "Due" is judged by this node's wall
//!   clock (`doc.at <= now`); the worker re-reads the row on every run, so a
//!   skewed clock costs at most a `{"fired": false}` call.
//! - **Answers** ([`decide::classify_answer`]):
//!
//! | answer | meaning | next |
//! | --- | --- | --- |
//! | 200 `{"fired": bool}` (`_alarm`) | ran, or nothing was due | done; the worker deleted the row |
//! | 200 `{"ok": true}` (`_wake`) | resident | done this lap; a still-marked id is woken every lap (cheap, and it re-activates an id whose worker died) |
//! | 202 | alarm run in progress / activating | call again next lap |
//! | 409 (`_alarm`) | the store's epoch is above ours | next lap re-places above it (`Replace`) |
//! | 503 with `Pinned-Refusal`, `host draining`, `capacity` | not here | next lap places elsewhere (`MoveAway`), as the proxy does |
//! | 503 `released placement epoch` | — | `Replace` |
//! | 503 stale epoch, closing, lease expired, any other 503 | — | re-read the placement next lap |
//! | 403 `invalid attestation` / `invalid proxy secret` | our worker view is stale | refresh workers next lap |
//! | 503 `instance paused by an operator; …` | an operator paused the id (`pinboard state pause`) | no failure; called again next lap, refused until resumed |
//! | 404 / 405 | the worker has no such route (the Python reference has no `_alarm`) | logged once; that worker is skipped for that call, and never chosen for new placements made for it |
//! | 500 | the handler failed | call again next lap (at-least-once) |
//! | connect failure / timeout | — | drop the cached route; next lap re-reads (a dead worker's record lapses and the id is re-placed) |
//! | anything else | — | logged; call again next lap |
//!
//! Logs: a scan, lease or call that fails is a warning with its cause,
//! logged when it starts failing, again with a count while it lasts
//! (`--log-repeat-ms`) and when it works again, not every lap (one stream
//! per scan, per worker session for its calls, per id for a failing
//! handler). Refusals (the id is re-placed next lap) and quarantine are
//! routine: debug.
//!
//! Metrics: `pinboard_sweep_laps_total`, `pinboard_sweep_alarms_delivered_total`,
//! `pinboard_sweep_wakes_total`, `pinboard_sweep_failures_total`,
//! `pinboard_sweep_lease_held`, `pinboard_sweep_last_lap_timestamp_ms`. Tracing target `pinboard::sweeper`.
//!
//! Known limits: rows with an invalid namespace or id are skipped (debug
//! log, every lap); the set of workers without a route is kept for the
//! process lifetime (a handful of session ids).

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, StatusCode, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use pinned_edge::logging::{repeats, Chain};
use pinned_store::{
    DueAlarm, MarkedInstance, PostgresOptions, PostgresStore, StateStore, WorldStamp,
};
use pinned_wire::headers::{ATTESTATION, EPOCH, PROXY_SECRET, REFUSAL};
use pinned_wire::ids::{validate_id, validate_namespace};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use self::decide::{
    classify_answer, classify_transport, lease_ttl_ms, Call, Key, LeaseKeeper, LeaseOp, Ledger,
    Outcome, Replan,
};
use crate::app::App;
use crate::config::Config;
use crate::operator::moves::MovedBy;
use crate::placement::{InstanceKey, PlacementStore};
use crate::proxy::classify::{RetryAction, MAX_REFUSAL_BODY};
use crate::routes::{Avoid, ResolveError, Route};
use crate::world::{Scope, World};
use futures_util::future::BoxFuture;

/// The site of every repeated-failure stream of the sweeper (see
/// [`repeats`]); the scope says which scan, session or id.
const REPEATS: &str = "pinboard sweeper";

/// Logs a failure of `scope` (see the module doc) at warn.
fn failed(scope: &str, error: impl std::fmt::Display, what: &'static str) {
    if let Some(seen) = repeats().failed(REPEATS, scope, error) {
        tracing::warn!(target: "pinboard::sweeper", scope, error = %seen, failures = seen.failures, "{what}");
    }
}

/// Logs the end of `scope`'s failures, if it was failing.
fn recovered(scope: &str) {
    if let Some(after) = repeats().recovered(REPEATS, scope) {
        tracing::info!(target: "pinboard::sweeper", scope, failures = after.failures, failing_for_ms = after.failing_for_ms(), "works again");
    }
}

/// Longest one `_alarm` / `_wake` call may take (the alarm handler runs
/// inside it). Inferred: generous, so slow handlers are not cut off, yet a
/// hung worker cannot pin an id forever.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Sweeper settings (from [`Config`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepSettings {
    /// Interval between laps, ms.
    pub interval_ms: u64,
    /// Most calls started per scan.
    pub limit: usize,
    /// Most calls in flight at once.
    pub concurrency: usize,
}

impl From<&Config> for SweepSettings {
    fn from(c: &Config) -> Self {
        Self {
            interval_ms: c.sweep_interval_ms.max(1),
            limit: c.sweep_limit.max(1),
            concurrency: c.sweep_concurrency.max(1),
        }
    }
}

/// What the sweeper reads from the workers' state store: due alarms and
/// the activities index (ids with marked rows). Production reads a
/// [`StateStore`] ([`StateActivities`]); a simulation supplies its own.
pub trait Activities: Send + Sync + 'static {
    /// Up to `limit` alarm rows due by `due_by_ms`.
    ///
    /// # Errors
    ///
    /// When the state store cannot be read.
    fn due_alarms(
        &self,
        due_by_ms: i64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DueAlarm>, pinned_store::StoreError>>;

    /// Up to `limit` `(ns, id)` with marked rows (and the world that wrote
    /// them), after `after`, in order.
    ///
    /// # Errors
    ///
    /// When the state store cannot be read.
    fn marked_instances<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<MarkedInstance>, pinned_store::StoreError>>;
}

/// [`Activities`] read from a [`StateStore`] (Postgres in production).
#[derive(Debug, Clone)]
pub struct StateActivities(pub Arc<dyn StateStore>);

impl Activities for StateActivities {
    fn due_alarms(
        &self,
        due_by_ms: i64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<DueAlarm>, pinned_store::StoreError>> {
        self.0.due_alarms(due_by_ms, limit)
    }

    fn marked_instances<'a>(
        &'a self,
        after: Option<(&'a str, &'a str)>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<MarkedInstance>, pinned_store::StoreError>> {
        self.0.marked_instances(after, limit)
    }
}

/// State shared by the loop and its call tasks.
struct Shared<S> {
    app: Arc<App<S>>,
    store: Arc<dyn Activities>,
    ledger: Mutex<Ledger>,
    permits: Arc<Semaphore>,
}

/// The sweep loop of one pinboard node.
pub struct Sweeper<S> {
    shared: Arc<Shared<S>>,
    settings: SweepSettings,
    token: String,
    keeper: LeaseKeeper,
    was_held: bool,
    cursor: Option<(String, String)>,
}

impl<S> std::fmt::Debug for Sweeper<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("settings", &self.settings)
            .field("held", &self.was_held)
            .finish_non_exhaustive()
    }
}

/// Open the Postgres state store at `url` (no connection yet) and spawn the
/// sweeper on it; it stops (and gives the lease up) when `shutdown` turns
/// true or its sender is dropped.
///
/// # Errors
///
/// When the URL is malformed.
pub fn spawn_postgres<S: PlacementStore>(
    app: Arc<App<S>>,
    url: &str,
    settings: SweepSettings,
    token: String,
    mut shutdown: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, pinned_store::StoreError> {
    let pg = Arc::new(PostgresStore::connect(url, PostgresOptions::default())?);
    let sweeper = Sweeper::new(app, pg.clone(), settings, token);
    Ok(tokio::spawn(
        async move {
            // Create the reference's tables if no worker did yet (idempotent).
            loop {
                match pg.setup().await {
                    Ok(()) => {
                        recovered("state store setup");
                        break;
                    }
                    Err(error) => failed(
                        "state store setup",
                        Chain(&error),
                        "state store not ready; retrying",
                    ),
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(settings.interval_ms)) => {}
                    _ = shutdown.changed() => return,
                }
            }
            sweeper.run(shutdown).await;
        }
        .instrument(tracing::Span::current()),
    ))
}

impl<S: PlacementStore> Sweeper<S> {
    /// A sweeper over `store`, holding the lease under `token` (unique per
    /// process).
    pub fn new(
        app: Arc<App<S>>,
        store: Arc<dyn StateStore>,
        settings: SweepSettings,
        token: String,
    ) -> Self {
        Self::with_activities(app, Arc::new(StateActivities(store)), settings, token)
    }

    /// A sweeper reading `activities` (see [`Activities`]).
    pub fn with_activities(
        app: Arc<App<S>>,
        store: Arc<dyn Activities>,
        settings: SweepSettings,
        token: String,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                app,
                store,
                ledger: Mutex::new(Ledger::default()),
                permits: Arc::new(Semaphore::new(settings.concurrency)),
            }),
            keeper: LeaseKeeper::new(lease_ttl_ms(settings.interval_ms)),
            settings,
            token,
            was_held: false,
            cursor: None,
        }
    }

    /// Run a lap every interval (the first one now) until `shutdown` turns
    /// true or its sender is dropped; then give the lease up. Calls still in
    /// flight finish on their own.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future skips the lease release; the lease then lapses
    /// after its TTL.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(
            target: "pinboard::sweeper",
            interval_ms = self.settings.interval_ms,
            limit = self.settings.limit,
            lease_ttl_ms = self.keeper.ttl_ms(),
            "sweeper started"
        );
        let mut tick = tokio::time::interval(Duration::from_millis(self.settings.interval_ms));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.lap().await,
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        let app = &self.shared.app;
        if self.was_held {
            if let Err(error) = app.store.release_sweeper_lease(&self.token).await {
                tracing::warn!(target: "pinboard::sweeper", error = %Chain(&error), "could not release the sweeper lease");
            }
        }
        app.metrics.sweep_lease_held.set(0);
        tracing::info!(target: "pinboard::sweeper", "sweeper stopped");
    }

    /// One lap: the lease, then due alarms, then one page of marked ids,
    /// then the placements that need a wake (orphaned or unsettled). The
    /// calls it starts run on after it returns (see
    /// [`lap_to_completion`](Self::lap_to_completion)).
    pub async fn lap(&mut self) {
        drop(self.lap_calls().await);
    }

    /// One lap, returning once every call it started has finished: the
    /// lap a caller can await (a simulation, a test, shutdown).
    pub async fn lap_to_completion(&mut self) {
        for call in self.lap_calls().await {
            // A call task that panicked is the ledger's guard's business.
            let _ = call.await;
        }
    }

    async fn lap_calls(&mut self) -> Vec<JoinHandle<()>> {
        let mut calls = Vec::new();
        if !self.lease().await {
            return calls;
        }
        self.shared.app.metrics.sweep_laps.inc();
        let started = self.shared.app.clock.now().wall_ms;
        self.shared
            .app
            .metrics
            .sweep_last_lap_ms
            .set(i64::try_from(started).unwrap_or(i64::MAX));
        self.sweep_alarms(&mut calls).await;
        self.sweep_marked(&mut calls).await;
        self.sweep_placements(&mut calls).await;
        calls
    }

    /// Orphans (owner lapsed or gone) are re-placed and woken, so a dead
    /// worker's instances resume with no client asking; unsettled
    /// placements (the owner never answered 2xx at their epoch, e.g. a wake
    /// answered 202) are woken until they are.
    async fn sweep_placements(&mut self, calls: &mut Vec<JoinHandle<()>>) {
        let app = &self.shared.app;
        let limit = self.settings.limit;
        let rows = match app.store.wake_candidates(limit, app.clock.now()).await {
            Ok(rows) => {
                recovered("placement scan");
                rows
            }
            Err(error) => {
                app.metrics.sweep_failures.inc();
                failed("placement scan", Chain(&error), "placement scan failed");
                return;
            }
        };
        self.shared.ledger.lock().begin_scan();
        let keys: Vec<Key> = rows
            .into_iter()
            .map(|(ns, id)| Key {
                call: Call::Wake,
                ns,
                id,
            })
            .collect();
        // A placement row does not say which world wrote the id's state.
        let worlds = vec![WorldStamp::any(); keys.len()];
        self.dispatch(keys, worlds, calls);
    }

    /// Renew or take the lease; whether this node holds it now.
    async fn lease(&mut self) -> bool {
        let app = &self.shared.app;
        let ttl = self.keeper.ttl_ms();
        let mut op = Some(self.keeper.first_op());
        while let Some(o) = op {
            let now = app.clock.now();
            let answer = match o {
                LeaseOp::Acquire => app.store.acquire_sweeper_lease(&self.token, ttl, now).await,
                LeaseOp::Renew => app.store.renew_sweeper_lease(&self.token, ttl, now).await,
            };
            let granted = match answer {
                Ok(g) => {
                    recovered("sweeper lease");
                    Some(g)
                }
                Err(error) => {
                    app.metrics.sweep_failures.inc();
                    failed(
                        "sweeper lease",
                        Chain(&error),
                        "sweeper lease: placement store failed",
                    );
                    None
                }
            };
            op = self.keeper.after(o, granted, now.mono_ms);
        }
        let held = self.keeper.holds(app.clock.now().mono_ms);
        if held != self.was_held {
            if held {
                tracing::info!(target: "pinboard::sweeper", "sweeper lease taken: this node sweeps");
            } else {
                tracing::info!(target: "pinboard::sweeper", "sweeper lease lost: another node sweeps");
            }
            self.was_held = held;
        }
        app.metrics.sweep_lease_held.set(i64::from(held));
        held
    }

    async fn sweep_alarms(&mut self, calls: &mut Vec<JoinHandle<()>>) {
        let limit = self.settings.limit;
        let fetch = {
            let mut ledger = self.shared.ledger.lock();
            ledger.begin_scan();
            limit
                .saturating_add(ledger.busy(Call::Alarm))
                .min(limit.saturating_mul(4))
        };
        let now = self.shared.app.clock.now();
        let due_by = i64::try_from(now.wall_ms).unwrap_or(i64::MAX);
        let rows = match self.shared.store.due_alarms(due_by, fetch).await {
            Ok(rows) => {
                recovered("due-alarm scan");
                rows
            }
            Err(error) => {
                self.shared.app.metrics.sweep_failures.inc();
                failed("due-alarm scan", Chain(&error), "due-alarm scan failed");
                return;
            }
        };
        let complete = rows.len() < fetch;
        let (keys, worlds): (Vec<Key>, Vec<WorldStamp>) = rows
            .into_iter()
            .map(|r| {
                let key = Key {
                    call: Call::Alarm,
                    ns: r.ns,
                    id: r.id,
                };
                (key, r.world)
            })
            .unzip();
        if complete {
            // Every due alarm is in `keys`: plans for other alarm rows are moot.
            self.shared
                .ledger
                .lock()
                .retain_replans(|k| k.call != Call::Alarm || keys.contains(k));
        }
        self.dispatch(keys, worlds, calls);
    }

    async fn sweep_marked(&mut self, calls: &mut Vec<JoinHandle<()>>) {
        let limit = self.settings.limit;
        self.shared.ledger.lock().begin_scan();
        let after = self.cursor.as_ref().map(|(n, i)| (n.as_str(), i.as_str()));
        let from_start = after.is_none();
        let page = match self.shared.store.marked_instances(after, limit).await {
            Ok(page) => {
                recovered("activities scan");
                page
            }
            Err(error) => {
                self.shared.app.metrics.sweep_failures.inc();
                failed("activities scan", Chain(&error), "activities scan failed");
                return;
            }
        };
        self.cursor = if page.len() < limit {
            None
        } else {
            page.last().map(|m| (m.ns.clone(), m.id.clone()))
        };
        let (keys, worlds): (Vec<Key>, Vec<WorldStamp>) = page
            .into_iter()
            .map(|m| {
                let key = Key {
                    call: Call::Wake,
                    ns: m.ns,
                    id: m.id,
                };
                (key, m.world)
            })
            .unzip();
        if from_start && self.cursor.is_none() {
            self.shared
                .ledger
                .lock()
                .retain_replans(|k| k.call != Call::Wake || keys.contains(k));
        }
        self.dispatch(keys, worlds, calls);
    }

    /// Start calls for `keys` (each to be placed in the world beside it),
    /// in order, within the limits.
    fn dispatch(&self, keys: Vec<Key>, worlds: Vec<WorldStamp>, calls: &mut Vec<JoinHandle<()>>) {
        let mut started = 0;
        for (key, world) in keys.into_iter().zip(worlds) {
            if started >= self.settings.limit {
                break;
            }
            if validate_namespace(&key.ns).is_err() || validate_id(&key.id).is_err() {
                tracing::debug!(target: "pinboard::sweeper", ns = %key.ns, id = %key.id, "skipping a row with an invalid namespace or id");
                continue;
            }
            if !self.keeper.holds(self.shared.app.clock.now().mono_ms) {
                break;
            }
            let Ok(permit) = self.shared.permits.clone().try_acquire_owned() else {
                tracing::debug!(target: "pinboard::sweeper", "call limit reached; the rest waits for the next lap");
                break;
            };
            let Some(replan) = self.shared.ledger.lock().admit(&key) else {
                continue;
            };
            started += 1;
            let guard = InFlight {
                shared: self.shared.clone(),
                key,
                replan: None,
                _permit: permit,
            };
            calls.push(tokio::spawn(
                deliver(guard, replan, world).instrument(tracing::Span::current()),
            ));
        }
    }
}

/// One call in flight: finishes its key in the ledger (with the plan for
/// the next call) and frees its concurrency slot when dropped, whichever way
/// the task ends.
struct InFlight<S> {
    shared: Arc<Shared<S>>,
    key: Key,
    replan: Option<Replan>,
    _permit: OwnedSemaphorePermit,
}

impl<S> Drop for InFlight<S> {
    fn drop(&mut self) {
        let replan = self.replan.take();
        self.shared.ledger.lock().finish(&self.key, replan);
    }
}

/// What one call came to.
enum Attempt {
    /// No route: no worker, quarantine, store failure.
    Unresolved(ResolveError),
    /// The owner has no route for this call.
    Skipped { session: String },
    /// The request could not be built (a bad advertise URL or secret).
    Unbuildable { session: String },
    /// The worker answered.
    Answered {
        session: String,
        epoch: u64,
        status: StatusCode,
        outcome: Outcome,
    },
    /// The connection failed or the call timed out.
    Transport {
        session: String,
        epoch: u64,
        error: String,
    },
}

async fn deliver<S: PlacementStore>(
    mut guard: InFlight<S>,
    replan: Option<Replan>,
    world: WorldStamp,
) {
    let shared = guard.shared.clone();
    let key = &guard.key;
    let metrics = &shared.app.metrics;
    let (ns, id, call) = (key.ns.as_str(), key.id.as_str(), key.call.name());
    let cache_key = format!("{ns}/{id}");
    let next = match attempt(&shared, key, &cache_key, replan, &world).await {
        Attempt::Unresolved(error) => {
            metrics.sweep_failures.inc();
            match &error {
                // Routine: placements wait out a quarantine.
                ResolveError::Quarantined => {
                    tracing::debug!(target: "pinboard::sweeper", call, ns, id, error = %Chain(&error), "cannot resolve")
                }
                // One stream per namespace: a store down, or nobody to
                // take the namespace's ids.
                _ => failed(ns, Chain(&error), "cannot resolve an id to wake"),
            }
            None
        }
        Attempt::Skipped { session } => {
            tracing::trace!(target: "pinboard::sweeper", call, ns, id, session, "owner has no route for this call");
            None
        }
        Attempt::Unbuildable { session } => {
            metrics.sweep_failures.inc();
            failed(
                &session,
                "cannot build the request",
                "cannot build the request to the worker",
            );
            None
        }
        Attempt::Transport {
            session,
            epoch,
            error,
        } => {
            metrics.sweep_failures.inc();
            shared.app.routes.lose_sight(&cache_key, &session);
            failed(&session, &error, "worker unreachable");
            Some(Replan {
                action: classify_transport(),
                session,
                epoch,
            })
        }
        Attempt::Answered {
            session,
            epoch,
            status,
            outcome,
        } => match outcome {
            Outcome::Done { fired } => {
                recovered(&session);
                recovered(&cache_key);
                match shared
                    .app
                    .store
                    .settle(InstanceKey::new(ns, id), &session, epoch)
                    .await
                {
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(target: "pinboard::sweeper", ns, id, %error, "could not record the placement as settled");
                    }
                }
                match key.call {
                    Call::Alarm => metrics.sweep_alarms_delivered.inc(),
                    Call::Wake => metrics.sweep_wakes.inc(),
                };
                tracing::debug!(target: "pinboard::sweeper", call, ns, id, session, epoch, ?fired, "delivered");
                None
            }
            Outcome::Pending => {
                if key.call == Call::Wake {
                    metrics.sweep_wakes.inc();
                }
                tracing::debug!(target: "pinboard::sweeper", call, ns, id, session, "in progress; again next lap");
                None
            }
            Outcome::Retry(action) => {
                metrics.sweep_failures.inc();
                shared.app.routes.lose_sight(&cache_key, &session);
                tracing::debug!(target: "pinboard::sweeper", call, ns, id, session, epoch, %status, ?action, "refused; next lap re-resolves");
                Some(Replan {
                    action,
                    session,
                    epoch,
                })
            }
            Outcome::Paused => {
                tracing::debug!(target: "pinboard::sweeper", call, ns, id, session, "paused by an operator; again next lap");
                None
            }
            Outcome::Unsupported => {
                metrics.sweep_failures.inc();
                if shared.ledger.lock().mark_unsupported(key.call, &session) {
                    tracing::warn!(target: "pinboard::sweeper", call, session, %status, "worker has no route for this call; skipping it from now on");
                }
                None
            }
            Outcome::HandlerFailed => {
                metrics.sweep_failures.inc();
                failed(
                    &cache_key,
                    format_args!("{call} answered {status}"),
                    "handler failed; again next lap",
                );
                None
            }
            Outcome::Unexpected => {
                metrics.sweep_failures.inc();
                failed(
                    &session,
                    format_args!("{call} answered {status}"),
                    "unexpected answer; again next lap",
                );
                None
            }
        },
    };
    guard.replan = next;
}

/// The workers that may take an id whose row `world` wrote: the world it
/// names, or any worker of the namespace when it names none (`*`: a
/// single-world fleet, or a writer whose store was not told its world). A
/// hostname without an environment is every environment of that hostname.
fn scope_of(world: &WorldStamp) -> Scope<'_> {
    match (world.hostname(), world.env()) {
        (None, _) => Scope::Any,
        (Some(hostname), None) => Scope::Hostname(hostname),
        (Some(hostname), Some(env)) => Scope::World(World {
            hostname: Some(hostname),
            env: Some(env),
        }),
    }
}

/// Resolve `key` like the proxy (applying the plan a previous answer left)
/// in the world that wrote its row, then post the call and classify the
/// answer.
async fn attempt<S: PlacementStore>(
    shared: &Shared<S>,
    key: &Key,
    cache_key: &str,
    replan: Option<Replan>,
    world: &WorldStamp,
) -> Attempt {
    let app = &shared.app;
    let mut exclude = shared.ledger.lock().unsupported_sessions(key.call);
    let mut stale = None;
    let mut refresh = false;
    if let Some(p) = &replan {
        match p.action {
            RetryAction::Reread => app.routes.invalidate(cache_key),
            RetryAction::RefreshWorkers => refresh = true,
            RetryAction::Replace => stale = Some((p.session.as_str(), p.epoch)),
            RetryAction::MoveAway => {
                stale = Some((p.session.as_str(), p.epoch));
                exclude.push(p.session.clone());
            }
        }
    }
    let avoid = Avoid {
        stale,
        exclude: &exclude,
        refresh,
    };
    let route = match app
        .routes
        .resolve_as(
            MovedBy::Sweeper,
            cache_key,
            &key.ns,
            &key.id,
            scope_of(world),
            avoid,
        )
        .await
    {
        Ok(route) => route,
        Err(error) => return Attempt::Unresolved(error),
    };
    let worker = &route.worker;
    let session = worker.record.session_id.clone();
    if shared.ledger.lock().is_unsupported(key.call, &session) {
        return Attempt::Skipped { session };
    }
    let Some(req) = build(app, key, &route) else {
        return Attempt::Unbuildable { session };
    };
    let epoch = route.epoch;
    let exchange = async {
        let res = app.outbound.call(&worker.record.advertise_url, req).await?;
        let status = res.status();
        let refusal = res.headers().contains_key(REFUSAL);
        let small = res
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_REFUSAL_BODY);
        let body = if small {
            res.into_body().collect().await.ok().map(|c| c.to_bytes())
        } else {
            None
        };
        Ok::<_, crate::upstream::SendError>((status, refusal, body))
    };
    match tokio::time::timeout(CALL_TIMEOUT, exchange).await {
        Err(_) => Attempt::Transport {
            session,
            epoch,
            error: "timed out".into(),
        },
        Ok(Err(error)) => Attempt::Transport {
            session,
            epoch,
            error: error.to_string(),
        },
        Ok(Ok((status, refusal, body))) => {
            let json = body
                .as_ref()
                .and_then(|b: &Bytes| serde_json::from_slice::<serde_json::Value>(b).ok());
            Attempt::Answered {
                session,
                epoch,
                status,
                outcome: classify_answer(key.call, status, refusal, json.as_ref()),
            }
        }
    }
}

/// `POST <advertiseUrl><ns>/<id>/_alarm|_wake` with the attestation and the
/// epoch (and the proxy secret on `_alarm` only).
fn build<S: PlacementStore>(
    app: &App<S>,
    key: &Key,
    route: &Route,
) -> Option<Request<crate::upstream::UpstreamBody>> {
    let worker = &route.worker;
    let path = PathAndQuery::try_from(format!("{}/{}{}", key.ns, key.id, key.call.route())).ok()?;
    let uri = worker.absolute_uri(&path).ok()?;
    let now = app.clock.now();
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .version(Version::HTTP_11)
        .header(header::HOST, worker.host.clone())
        .header(header::CONTENT_LENGTH, HeaderValue::from_static("0"))
        .header(
            ATTESTATION,
            worker.attestation(&*app.clock, now.mono_ms, None),
        )
        .header(EPOCH, route.epoch_header.clone());
    if key.call == Call::Alarm {
        builder = builder.header(
            PROXY_SECRET,
            HeaderValue::from_str(&worker.record.secret).ok()?,
        );
    }
    builder.body(crate::upstream::empty()).ok()
}

#[cfg(test)]
mod tests;
