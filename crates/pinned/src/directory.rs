//! The directory of one hosted namespace: which ids are resident, how a new
//! id is admitted and activated, and how instances leave (idle eviction,
//! wind-down, drain, abort).
//!
//! Invariants:
//! - at most one record per id; a burst of first requests shares one
//!   activation (the map's entry lock decides who creates the record);
//! - a record leaves the map only at the end of its teardown, after its
//!   in-flight count reached zero and its `on_stop` handlers ran;
//! - refusals for ids that are not resident never touch resident ones.
//!
//! The directory never parses HTTP; [`dispatch`](crate::dispatch) turns its
//! answers into responses.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use futures_util::future::FutureExt;
use parking_lot::Mutex;
use pinned_wire::refusal::Refusal;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::context::Context;
use crate::fence::FenceTable;
use crate::host::HostOptions;
use crate::metrics::Metrics;
use crate::object::Lifecycle;
use crate::plane::Plane;
use crate::slot::{Activation, Busy, Instance, Phase, Slot, WindDown};

/// A request inside an instance record.
pub(crate) enum Entered {
    /// The instance is live.
    Live(Busy, Instance),
    /// The record is not live yet: its activation may not have started.
    Activating(Busy),
}

/// Why a request could not enter an instance.
#[derive(Debug)]
pub(crate) enum Admission {
    /// A 503 refusal with the reference's detail.
    Refused(Refusal),
    /// The activation failed or panicked: 500.
    ActivationFailed,
    /// The worker was closed: 500.
    ShutDown,
}

impl From<Refusal> for Admission {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

/// Which drain a host is in. The worker's own drain and the control
/// plane's (the `draining` echo of acks) are kept apart: revoking one never
/// revokes the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DrainKind {
    /// `Worker::drain` (SIGTERM).
    Local,
    /// pinboard's `draining: true` echo.
    Server,
}

#[derive(Default)]
struct DrainState {
    /// `Some(deadline)` while draining; the inner `None` never aborts.
    local: Option<Option<Instant>>,
    server: Option<Option<Instant>>,
    timer: Option<AbortHandle>,
}

impl DrainState {
    fn draining(&self) -> bool {
        self.local.is_some() || self.server.is_some()
    }

    fn deadline(&self) -> Option<Instant> {
        match (self.local.flatten(), self.server.flatten()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// How long a closing instance waits for its placement release before the
/// release continues in the background (about one registry call).
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// One row of `/_pinned/stats` `instances`.
pub(crate) struct InstanceRow {
    pub(crate) seq: u64,
    pub(crate) id: Arc<str>,
    pub(crate) connections: u32,
    pub(crate) tasks: u64,
    pub(crate) idle_ms: u64,
    pub(crate) activated_at: Option<u64>,
}

/// Everything one hosted namespace shares among its instances.
pub(crate) struct HostShared {
    pub(crate) ns: Arc<str>,
    pub(crate) options: HostOptions,
    /// The object type's activation and lifecycle hooks.
    pub(crate) lifecycle: Lifecycle,
    /// The object's routes, built once for the namespace.
    pub(crate) router: Router,
    slots: DashMap<Arc<str>, Arc<Slot>>,
    /// Records in `slots`, kept apart so capacity checks never walk the map.
    count: AtomicUsize,
    seq: AtomicU64,
    base: Instant,
    /// Signalled when a closing instance's in-flight count reaches zero.
    pub(crate) settled: Notify,
    /// Signalled when a record leaves the map.
    changed: Notify,
    /// Signalled when the host or one of its instances starts winding down
    /// (waiters re-check their own instance: one `Notify` per host keeps
    /// idle instances small).
    pub(crate) winding: Notify,
    draining: AtomicBool,
    /// The worker's own drain (SIGTERM, `close`) is in force: the process
    /// is on its way out.
    leaving: AtomicBool,
    drain: Mutex<DrainState>,
    shut_down: AtomicBool,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) duration: Histogram,
    activations: AtomicU64,
    evictions: AtomicU64,
    sweeper: Mutex<Option<AbortHandle>>,
    /// Calls `on_unhealthy`/`on_restored` as the lease's health changes.
    lease_watch: Mutex<Option<AbortHandle>>,
    /// Audience of tokens the worker mints for its own in-process calls.
    pub(crate) local_aud: String,
    /// The worker secret: verifies attestations.
    pub(crate) secret: Arc<str>,
    /// The control plane, `None` in local mode.
    pub(crate) plane: Option<Arc<Plane>>,
    pub(crate) fences: FenceTable,
    /// The worker, for in-process cluster calls (set once built).
    pub(crate) worker: std::sync::OnceLock<std::sync::Weak<crate::worker::Inner>>,
    /// The worker's state store, if any.
    pub(crate) store: Option<Arc<dyn pinned_store::StateStore>>,
    /// The application states ([`Options::state`](crate::Options::state)).
    pub(crate) states: Arc<crate::state::States>,
    /// Armed alarm timers by id.
    pub(crate) timers: DashMap<Arc<str>, crate::alarm::Timer>,
}

/// What a host is built from, besides its options.
pub(crate) struct HostParts {
    pub(crate) ns: Arc<str>,
    pub(crate) options: HostOptions,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) local_aud: String,
    pub(crate) secret: Arc<str>,
    pub(crate) plane: Option<Arc<Plane>>,
    pub(crate) store: Option<Arc<dyn pinned_store::StateStore>>,
    pub(crate) states: Arc<crate::state::States>,
}

impl HostShared {
    pub(crate) fn new(parts: HostParts) -> Self {
        let HostParts {
            ns,
            options,
            lifecycle,
            metrics,
            local_aud,
            secret,
            plane,
            store,
            states,
        } = parts;
        let router = (lifecycle.routes)();
        let duration = metrics.duration_for(&ns);
        Self {
            ns,
            options,
            lifecycle,
            router,
            slots: DashMap::new(),
            count: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            base: Instant::now(),
            settled: Notify::new(),
            changed: Notify::new(),
            winding: Notify::new(),
            draining: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            drain: Mutex::new(DrainState::default()),
            shut_down: AtomicBool::new(false),
            metrics,
            duration,
            activations: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            sweeper: Mutex::new(None),
            lease_watch: Mutex::new(None),
            local_aud,
            secret,
            plane,
            fences: FenceTable::default(),
            worker: std::sync::OnceLock::new(),
            store,
            states,
            timers: DashMap::new(),
        }
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The worker's own drain is in force (a control-plane drain alone
    /// does not count: that process keeps running).
    pub(crate) fn leaving(&self) -> bool {
        self.leaving.load(Ordering::SeqCst)
    }

    pub(crate) fn drain_deadline(&self) -> Option<Instant> {
        self.drain.lock().deadline()
    }

    /// The ids of every record (resident, activating or closing).
    pub(crate) fn ids(&self) -> Vec<String> {
        self.slots
            .iter()
            .map(|entry| entry.key().to_string())
            .collect()
    }

    /// Whether `id` has a record that is not closing.
    pub(crate) fn is_resident(&self, id: &str) -> bool {
        self.slot(id)
            .is_some_and(|slot| matches!(slot.phase(), Phase::Activating | Phase::Live))
    }

    /// The record of `id` when it is live.
    pub(crate) fn resident_slot(&self, id: &str) -> Option<Arc<Slot>> {
        self.slot(id).filter(|slot| slot.phase() == Phase::Live)
    }

    fn slot(&self, id: &str) -> Option<Arc<Slot>> {
        self.slots.get(id).map(|entry| entry.value().clone())
    }

    /// Aborts instance `id` if resident (a duplicate placement, an operator).
    pub(crate) fn abort_id(&self, id: &str) {
        if let Some(slot) = self.slot(id) {
            Self::abort(&slot);
        }
    }

    /// A `wind_down` control message: a deadline in seconds from now, or
    /// `None` to revoke. A no-op for an id that is not resident.
    pub(crate) fn wind_down_id(&self, id: &str, deadline: Option<Duration>) {
        let Some(slot) = self.slot(id) else { return };
        match deadline {
            None => unwind(&slot),
            Some(after) => {
                if matches!(slot.phase(), Phase::Closing | Phase::Closed) {
                    slot.releasing.store(true, Ordering::SeqCst);
                    return;
                }
                wind_down(&slot, Some(after));
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    pub(crate) fn counters(&self) -> (u64, u64) {
        (
            self.activations.load(Ordering::Relaxed),
            self.evictions.load(Ordering::Relaxed),
        )
    }

    /// Enters instance `id`, activating it first when it is not resident.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an activation runs in its own task, so a client that
    /// goes away mid-activation leaves it to finish for the next request.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
    ) -> Result<(Busy, Instance), Admission> {
        match self.admit(id, epoch).await? {
            Entered::Live(busy, instance) => Ok((busy, instance)),
            Entered::Activating(busy) => Self::activation(busy).await,
        }
    }

    /// Enters instance `id` without activating it: a record that is not
    /// live yet (constructed by this request or an earlier one) comes back
    /// as [`Entered::Activating`], for the caller to authorize the request
    /// before [`activation`](Self::activation) starts it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        id: &str,
        epoch: Option<u64>,
    ) -> Result<Entered, Admission> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(self.shut_down_answer());
        }
        // Past its lease the placement may live elsewhere: a woken process
        // serves nothing until it has re-registered.
        if let Some(plane) = &self.plane {
            if plane.lease.expired() {
                return Err(Refusal::LeaseExpired.into());
            }
        }
        if let Some(epoch) = epoch {
            let ttl = self.plane.as_ref().and_then(|plane| plane.lease.ttl());
            self.fences.admit(id, epoch, ttl)?;
        }
        loop {
            if self.shut_down.load(Ordering::SeqCst) {
                return Err(self.shut_down_answer());
            }
            let resident = self.slots.get(id).map(|entry| entry.value().clone());
            let Some(slot) = resident else {
                match self.create(id, epoch)? {
                    Some(busy) => return Ok(Entered::Activating(busy)),
                    None => continue,
                }
            };
            match slot.enter() {
                Ok((busy, phase)) => {
                    if slot.winding.load(Ordering::Relaxed) || self.draining() {
                        if let Some(deadline) = slot.effective_deadline() {
                            if Instant::now() >= deadline {
                                return Err(Refusal::PastWindDown.into());
                            }
                        }
                    }
                    return match phase {
                        Phase::Live => match slot.instance() {
                            Some(instance) => Ok(Entered::Live(busy, instance)),
                            None => Err(Admission::ActivationFailed),
                        },
                        _ => Ok(Entered::Activating(busy)),
                    };
                }
                // While its placement release is in flight the proxy must
                // re-resolve, not re-activate here; otherwise (local mode, a
                // close that keeps its placement) the close is waited out
                // and the id activates afresh.
                Err(_) => {
                    if self.plane.is_some() && slot.releasing.load(Ordering::SeqCst) {
                        return Err(Refusal::Closing.into());
                    }
                    self.wait_gone(&slot).await;
                }
            }
        }
    }

    /// What a closed worker answers. Behind pinboard, a request routed just
    /// before the deregistration landed gets the retryable draining refusal
    /// so pinboard places it elsewhere; locally, the reference's 500.
    fn shut_down_answer(&self) -> Admission {
        if self.plane.is_some() {
            Admission::Refused(Refusal::Draining)
        } else {
            Admission::ShutDown
        }
    }

    /// Creates and starts activating a record for `id`; `None` when another
    /// request created one first.
    fn create(self: &Arc<Self>, id: &str, epoch: Option<u64>) -> Result<Option<Busy>, Refusal> {
        // Existing instances keep serving; only new activations refuse.
        if let Some(plane) = &self.plane {
            if !plane.lease.healthy() {
                return Err(Refusal::LeaseUnhealthy);
            }
        }
        if self.draining() {
            return Err(Refusal::Draining);
        }
        if self.count.fetch_add(1, Ordering::SeqCst) >= self.options.max_instances {
            self.count.fetch_sub(1, Ordering::SeqCst);
            return Err(Refusal::Capacity);
        }
        let key: Arc<str> = Arc::from(id);
        let entry = self.slots.entry(key.clone());
        let vacant = match entry {
            Entry::Occupied(_) => {
                self.count.fetch_sub(1, Ordering::SeqCst);
                return Ok(None);
            }
            Entry::Vacant(vacant) => vacant,
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        // The requester's entry; the activation task takes its own when it
        // starts.
        let slot = Arc::new(Slot::new(key, self.clone(), seq, 1));
        // The activation (and the store reads it makes) runs at the
        // admitted epoch.
        if let Some(epoch) = epoch {
            let _ = slot.adopt_epoch(epoch);
        }
        vacant.insert(slot.clone());
        Ok(Some(slot.adopt()))
    }

    /// Drops a request's entry into a record whose activation it was
    /// refused; a record nobody else entered and that never started
    /// activating is closed with its placement released (the reference's
    /// "denied cold request discards the constructed instance").
    pub(crate) fn discard(busy: Busy) {
        let slot = busy.slot().clone();
        let untouched = slot.phase() == Phase::Activating
            && slot.activation.lock().is_none()
            && slot.in_flight() == 1;
        drop(busy);
        if untouched {
            Self::abort(&slot);
        }
    }

    /// Activates the record `busy` entered (once, whoever asks first) and
    /// waits for the outcome.
    pub(crate) async fn activation(busy: Busy) -> Result<(Busy, Instance), Admission> {
        busy.slot().host.start_activation(busy.slot());
        Self::await_activation(busy).await
    }

    /// Starts the activation of `slot` unless it started already.
    fn start_activation(self: &Arc<Self>, slot: &Arc<Slot>) {
        let host = self.clone();
        let mut pending = slot.activation.lock();
        if pending.is_some() || slot.phase() != Phase::Activating || slot.activated_at().is_some() {
            return;
        }
        let task_slot = slot.clone();
        let entry = slot.hold();
        let span = slot.span();
        let handle = tokio::spawn(async move {
            let slot = task_slot;
            let _entry = entry;
            let ctx = Context::new(slot.clone());
            let activate = AssertUnwindSafe((host.lifecycle.activate)(ctx)).catch_unwind();
            let outcome = tokio::select! {
                outcome = activate => outcome,
                () = slot.cancel.cancelled() => return Activation::Aborted,
            };
            let failure = match outcome {
                Ok(Ok(instance)) => {
                    slot.set_instance(instance.clone());
                    let activated = slot.go_live(wall_ms());
                    *slot.activation.lock() = None;
                    if !activated {
                        return Activation::Aborted;
                    }
                    host.activations.fetch_add(1, Ordering::Relaxed);
                    host.metrics.activations.inc();
                    host.metrics.active_instances.inc();
                    host.rearm_from_store(&slot);
                    tracing::info!(namespace = %host.ns, id = %slot.id, "activated instance");
                    return Activation::Ready(instance);
                }
                Ok(Err(error)) => error.to_string(),
                Err(panic) => panic_message(panic.as_ref()),
            };
            tracing::error!(namespace = %host.ns, id = %slot.id, error = %failure, "instance activation failed");
            host.metrics.request_failed("lifespan", "http");
            slot.cancel.cancel();
            host.remove(&slot);
            Activation::Failed
        }.instrument(span));
        *pending = Some(
            async move { handle.await.unwrap_or(Activation::Failed) }
                .boxed()
                .shared(),
        );
    }

    async fn await_activation(busy: Busy) -> Result<(Busy, Instance), Admission> {
        let pending = busy.slot().activation.lock().clone();
        let outcome = match pending {
            Some(activation) => activation.await,
            None => match (busy.slot().phase(), busy.slot().instance()) {
                (Phase::Live, Some(instance)) => Activation::Ready(instance),
                // Aborted and torn down before this request looked.
                (Phase::Closing | Phase::Closed, _) => Activation::Aborted,
                _ => Activation::Failed,
            },
        };
        match outcome {
            Activation::Ready(instance) => Ok((busy, instance)),
            Activation::Failed => Err(Admission::ActivationFailed),
            Activation::Aborted => Err(Refusal::Aborted.into()),
        }
    }

    /// Waits until `slot` has left the map.
    async fn wait_gone(&self, slot: &Arc<Slot>) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let present = self
                .slots
                .get(&*slot.id)
                .is_some_and(|entry| Arc::ptr_eq(entry.value(), slot));
            if !present {
                return;
            }
            changed.await;
        }
    }

    fn remove(&self, slot: &Arc<Slot>) {
        slot.finish();
        if self
            .slots
            .remove_if(&*slot.id, |_, current| Arc::ptr_eq(current, slot))
            .is_some()
        {
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
        self.changed.notify_waiters();
    }

    /// Closes `slot` if nothing is in flight (idle eviction, or the last
    /// entry leaving a winding-down instance).
    pub(crate) fn close_if_idle(slot: &Arc<Slot>) {
        if slot.begin_idle_close() {
            spawn_detached(teardown(slot.clone(), false).instrument(slot.span()));
        }
    }

    /// Aborts `slot`: cancels its work and closes it.
    pub(crate) fn abort(slot: &Arc<Slot>) {
        if slot.begin_abort() {
            // Cancelled now, not when the teardown task runs: a handler
            // finishing in the same poll must see the abort and answer 503.
            slot.cancel.cancel();
            spawn_detached(teardown(slot.clone(), true).instrument(slot.span()));
        }
    }

    /// One pass of the idle sweep: detached instances wind down, idle ones
    /// are offered to `on_idle` (winding-down ones close when idle).
    pub(crate) fn sweep(&self) {
        let idle_ms = u64::try_from(self.options.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        let detached_ms =
            u64::try_from(self.options.detached_timeout.as_millis()).unwrap_or(u64::MAX);
        let draining = self.draining();
        for slot in self.live() {
            if slot.streams() > 0 {
                slot.connected();
            } else if !slot.winding.load(Ordering::SeqCst) && slot.detached_ms() >= detached_ms {
                tracing::warn!(namespace = %self.ns, id = %slot.id, "no client for the detached timeout; winding the instance down");
                wind_down(&slot, Some(Duration::ZERO));
                continue;
            }
            if slot.in_flight() != 0 {
                continue;
            }
            if draining || slot.winding_down() {
                Self::close_if_idle(&slot);
            } else if slot.idle_ms() >= idle_ms {
                crate::hooks::idle(&slot);
            }
        }
        self.fences
            .sweep(self.plane.as_ref().and_then(|plane| plane.lease.ttl()));
    }

    /// The live records.
    pub(crate) fn live(&self) -> Vec<Arc<Slot>> {
        self.slots
            .iter()
            .filter(|entry| entry.value().phase() == Phase::Live)
            .map(|entry| entry.value().clone())
            .collect()
    }

    fn all(&self) -> Vec<Arc<Slot>> {
        self.slots
            .iter()
            .map(|entry| entry.value().clone())
            .collect()
    }

    /// Aborts every instance.
    pub(crate) fn abort_all(&self) {
        for slot in self.all() {
            Self::abort(&slot);
        }
    }

    /// Starts the idle sweep (idempotent).
    pub(crate) fn start(self: &Arc<Self>) {
        let mut sweeper = self.sweeper.lock();
        if sweeper.is_some() {
            return;
        }
        let weak = Arc::downgrade(self);
        let period = self.options.sweep_interval;
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(host) = weak.upgrade() else { return };
                host.sweep();
            }
        });
        *sweeper = Some(task.abort_handle());
        if let Some(plane) = &self.plane {
            let watcher = tokio::spawn(crate::hooks::watch_lease(
                Arc::downgrade(self),
                plane.lease.health(),
            ));
            *self.lease_watch.lock() = Some(watcher.abort_handle());
        }
    }

    /// Drains (`kind`): refuse new activations, evict idle instances now,
    /// abort the rest at `deadline` from now (never, for `None`).
    pub(crate) fn start_drain(self: &Arc<Self>, kind: DrainKind, deadline: Option<Duration>) {
        let at = deadline.map(|after| Instant::now() + after);
        {
            let mut drain = self.drain.lock();
            match kind {
                DrainKind::Local => drain.local = Some(at),
                DrainKind::Server => drain.server = Some(at),
            }
            self.rearm(&mut drain);
        }
        tracing::info!(namespace = %self.ns, ?kind, ?deadline, "draining");
        for slot in self.live() {
            crate::hooks::wind_down(&slot, slot.effective_deadline());
        }
        self.sweep();
    }

    /// Revokes one kind of drain; the other stays in force.
    pub(crate) fn stop_drain(self: &Arc<Self>, kind: DrainKind) {
        let mut drain = self.drain.lock();
        let was = match kind {
            DrainKind::Local => drain.local.take(),
            DrainKind::Server => drain.server.take(),
        };
        self.rearm(&mut drain);
        if was.is_some() {
            tracing::info!(namespace = %self.ns, ?kind, "drain revoked");
        }
    }

    /// Publishes the drain state: flag, abort timer, lease cap.
    fn rearm(self: &Arc<Self>, drain: &mut DrainState) {
        let was_draining = self.draining.swap(drain.draining(), Ordering::SeqCst);
        self.leaving.store(drain.local.is_some(), Ordering::SeqCst);
        if drain.draining() && !was_draining {
            self.winding.notify_waiters();
        }
        if let Some(timer) = drain.timer.take() {
            timer.abort();
        }
        let deadline = drain.deadline();
        if let Some(plane) = &self.plane {
            plane.lease.cap(deadline);
        }
        if let Some(at) = deadline {
            let weak = Arc::downgrade(self);
            let timer = tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                if let Some(host) = weak.upgrade() {
                    tracing::warn!(namespace = %host.ns, "drain deadline reached; aborting instances");
                    host.abort_all();
                }
            });
            drain.timer = Some(timer.abort_handle());
        }
    }

    /// Resolves once no record is left.
    pub(crate) async fn wait_empty(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.len() == 0 {
                return;
            }
            changed.await;
        }
    }

    /// Closes everything and refuses all further requests.
    pub(crate) async fn shut_down(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        if let Some(sweeper) = self.sweeper.lock().take() {
            sweeper.abort();
        }
        if let Some(watch) = self.lease_watch.lock().take() {
            watch.abort();
        }
        if let Some(timer) = self.drain.lock().timer.take() {
            timer.abort();
        }
        self.timers.retain(|_, timer| {
            timer.abort();
            false
        });
        self.abort_all();
        self.wait_empty().await;
    }

    pub(crate) fn rows(&self) -> Vec<InstanceRow> {
        let mut rows: Vec<InstanceRow> = self
            .slots
            .iter()
            .map(|entry| {
                let slot = entry.value();
                let streams = slot.streams();
                InstanceRow {
                    seq: slot.seq,
                    id: slot.id.clone(),
                    connections: streams,
                    tasks: slot.in_flight().saturating_sub(u64::from(streams)),
                    idle_ms: slot.idle_ms(),
                    activated_at: slot.activated_at(),
                }
            })
            .collect();
        rows.sort_unstable_by_key(|row| row.seq);
        rows
    }
}

/// Sets or clears an instance's own wind-down.
pub(crate) fn wind_down(slot: &Arc<Slot>, after: Option<Duration>) {
    let deadline = after.map(|after| Instant::now() + after);
    {
        let mut wind = slot.wind.lock();
        let state = wind.get_or_insert_with(|| Box::new(WindDown::default()));
        if let Some(timer) = state.timer.take() {
            timer.abort();
        }
        state.deadline = deadline;
        if let Some(at) = deadline {
            let target = slot.clone();
            let timer = tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                HostShared::abort(&target);
            });
            state.timer = Some(timer.abort_handle());
        }
        slot.winding.store(true, Ordering::SeqCst);
    }
    slot.host.winding.notify_waiters();
    crate::hooks::wind_down(slot, slot.effective_deadline());
    HostShared::close_if_idle(slot);
}

/// Revokes an instance's wind-down (a `wind_down` message with a null
/// deadline).
pub(crate) fn unwind(slot: &Arc<Slot>) {
    let mut wind = slot.wind.lock();
    if let Some(state) = wind.take() {
        if let Some(timer) = state.timer {
            timer.abort();
        }
    }
    slot.winding.store(false, Ordering::SeqCst);
}

/// Closes one instance: signal, let open work settle, run `on_stop`
/// handlers last-registered first, then leave the map.
async fn teardown(slot: Arc<Slot>, aborted: bool) {
    let host = slot.host.clone();
    if let Some(wind) = slot.wind.lock().as_mut() {
        if let Some(timer) = wind.timer.take() {
            timer.abort();
        }
    }
    let was_live = slot.activated_at().is_some();
    slot.cancel.cancel();
    loop {
        let settled = host.settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        if slot.in_flight() == 0 {
            break;
        }
        settled.await;
    }
    if let Some(instance) = slot.instance() {
        let stop = (host.lifecycle.on_stop)(instance, Context::new(slot.clone()));
        if let Err(error) = settle(stop).await {
            tracing::error!(namespace = %host.ns, id = %slot.id, %error, "Object::on_stop failed");
            host.metrics.shutdown_failed("directory");
        }
    }
    let hooks = std::mem::take(&mut *slot.on_stop.lock());
    for hook in hooks.into_iter().rev() {
        if let Err(error) = settle(hook()).await {
            tracing::error!(namespace = %host.ns, id = %slot.id, %error, "on_stop handler failed");
            host.metrics.shutdown_failed("directory");
        }
    }
    // The record may outlive the teardown (a task or the state itself can
    // hold a `Context`); the state must not. Dropping it here breaks any
    // cycle user code built through a `Context`.
    drop(slot.take_instance());
    if host.plane.is_some() {
        // Behind pinboard an evicted instance's alarm is the sweeper's.
        host.disarm(&slot.id);
    }
    if slot.releasing.load(Ordering::SeqCst) {
        release(&host, &slot).await;
    }
    host.evictions.fetch_add(1, Ordering::Relaxed);
    host.metrics.evictions.inc();
    if aborted {
        host.metrics.aborts.inc();
    }
    if was_live {
        host.metrics.active_instances.dec();
    }
    if aborted {
        tracing::info!(namespace = %host.ns, id = %slot.id, "aborted instance");
    } else {
        tracing::info!(namespace = %host.ns, id = %slot.id, "evicted instance");
    }
    host.remove(&slot);
}

/// Awaits a hook, turning a panic into an error message.
async fn settle(
    hook: impl std::future::Future<Output = Result<(), crate::BoxError>>,
) -> Result<(), String> {
    match AssertUnwindSafe(hook).catch_unwind().await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(panic) => Err(format!("panicked: {}", panic_message(panic.as_ref()))),
    }
}

/// Releases the placement of a closing instance: the fence first (so a
/// late request at that epoch bounces), then `/registry/release`, waited up
/// to [`RELEASE_WAIT`] and finished in the background after that.
async fn release(host: &Arc<HostShared>, slot: &Arc<Slot>) {
    let epoch = slot.epoch();
    if let Some(epoch) = epoch {
        host.fences.release(&slot.id, epoch);
    }
    let Some(plane) = &host.plane else { return };
    let call = tokio::spawn({
        let plane = plane.clone();
        let ns = host.ns.to_string();
        let id = slot.id.to_string();
        async move { plane.release(ns, id, epoch).await }
    });
    if tokio::time::timeout(RELEASE_WAIT, call).await.is_err() {
        tracing::warn!(namespace = %host.ns, id = %slot.id, "placement release still pending; continuing in the background");
    }
}

/// Spawns `work` on the current runtime; a no-op once the runtime is gone
/// (a guard dropped during runtime shutdown has nothing left to close).
pub(crate) fn spawn_detached(work: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(work);
    }
}

pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic".to_owned()
    }
}
