//! The namespace layer: one hosted namespace ([`Namespace`]) with its
//! instance table (which ids are resident), admission and capacity (how a
//! new id is admitted and activated), and how instances leave (idle
//! eviction, wind-down, drain, abort, teardown). The handle an object gets
//! on one of its instances, [`Context`](context::Context), is this layer's
//! too.
//!
//! It sits on the instance layer (each [`Record`] holds a
//! [`Slot`](crate::instance::Slot)) and the control-plane layer (leases,
//! fences, the switchboard), and never reaches above: the durable layer is
//! handed to it as a [`Durability`] and the object's hooks as a
//! [`Lifecycle`], both built by the worker's factory.
//!
//! Invariants:
//! - at most one record per id; a burst of first requests shares one
//!   activation (the map's entry lock decides who creates the record);
//! - a record leaves the map only at the end of its teardown, after its
//!   in-flight count reached zero and its `on_stop` handlers ran;
//! - refusals for ids that are not resident never touch resident ones.
//!
//! The namespace never parses HTTP; [`dispatch`](crate::serve::dispatch) turns its
//! answers into responses.
//!
//! This module owns the record map and the sweep; the phases of a record's
//! life have a module each: [`admission`] (entering, creating, activating),
//! [`drain`], [`wind_down`] and [`teardown`]; [`busy`] is the in-flight
//! guard through which a record reports its last entry out.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use dashmap::DashMap;
use parking_lot::Mutex;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::instance::{Id, Stage};
use crate::metrics::Metrics;
use crate::namespace::churn_log::ChurnLog;
use crate::namespace::options::HostOptions;
use crate::plane::control::ControlPlane;
use crate::plane::fence::FenceTable;
use crate::plane::registration::Commanded;

mod admission;
mod busy;
pub(crate) mod churn_log;
pub(crate) mod context;
mod deadlines;
mod drain;
mod durability;
pub(crate) mod held_sockets;
pub(crate) mod hooks;
mod lifecycle;
pub(crate) mod options;
pub(crate) mod record;
pub(crate) mod socket_task;
pub(crate) mod sockets;
mod states;
mod teardown;
mod wind_down;
pub(crate) mod work_span;

pub(crate) use self::admission::{Admission, Attempt, Entered};
pub(crate) use self::busy::Busy;
use self::deadlines::Deadlines;
pub(crate) use self::drain::DrainKind;
use self::drain::DrainState;
pub(crate) use self::durability::Durability;
pub use self::lifecycle::Idle;
pub(crate) use self::lifecycle::Lifecycle;
pub(crate) use self::record::Record;
pub(crate) use self::states::States;
pub(crate) use self::wind_down::wind_down;
pub(crate) use crate::task::{panic_message, run_detached, spawn_detached};

/// What one sweep pass does to a record.
#[derive(Clone, Copy)]
enum Sweep {
    /// No client for the detached timeout: wind down now.
    Detached,
    /// Winding down (or draining) and idle: close.
    Close,
    /// Idle for the idle timeout: ask `on_idle`.
    Idle,
}

/// One row of `/_pinned/stats` `instances`.
pub(crate) struct InstanceRow {
    pub(crate) seq: u32,
    pub(crate) id: Id,
    pub(crate) connections: u32,
    pub(crate) tasks: u64,
    pub(crate) idle_ms: u64,
    pub(crate) activated_at: Option<u64>,
}

/// A record as the key of its own map entry, found by its id: hashed and
/// compared as the id string, so the map looks it up by `&str` while the
/// id is stored once, in the record.
#[derive(Clone)]
pub(crate) struct Keyed(pub(crate) Arc<Record>);

impl Keyed {
    /// Whether this entry is `slot` itself (not a newer record of the id).
    pub(crate) fn is(&self, slot: &Arc<Record>) -> bool {
        Arc::ptr_eq(&self.0, slot)
    }
}

impl Borrow<str> for Keyed {
    fn borrow(&self) -> &str {
        &self.0.id
    }
}

impl Hash for Keyed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the `str` it borrows as: lookups by `&str` hash that.
        <str as Hash>::hash(self.0.id.as_str(), state);
    }
}

impl PartialEq for Keyed {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Keyed {}

/// Everything one hosted namespace shares among its instances.
pub(crate) struct Namespace {
    pub(crate) ns: Arc<str>,
    pub(crate) options: HostOptions,
    /// The object type's activation and lifecycle hooks.
    pub(crate) lifecycle: Lifecycle,
    /// The object's routes behind the request stack, built once for the
    /// namespace.
    pub(crate) router: Router,
    /// The durable layer's side of the namespace (`None` without a store).
    pub(crate) durable: Option<Arc<dyn Durability>>,
    /// The records, found by id: each is its own key ([`Keyed`]), so a
    /// bucket is one pointer and the id is stored once. Hashed with
    /// foldhash (seeded per map, as hashbrown's default): every request
    /// hashes its id here, and SipHash cost a warm request about 130
    /// instructions more (`worker-bench`).
    slots: DashMap<Keyed, (), foldhash::fast::RandomState>,
    /// Records in `slots`, kept apart so capacity checks never walk the map.
    count: AtomicUsize,
    /// Of those, the records whose teardown began (they leave soon and no
    /// longer count against `max_instances`, up to as many again).
    closing: AtomicUsize,
    /// Insertion order (wrapping: [`rows`](Self::rows) sorts by age).
    seq: AtomicU32,
    /// The live records by when the sweep must look at each again.
    deadlines: Deadlines<Record>,
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
    /// The budget of churn lines logged at `info`.
    pub(crate) churn: ChurnLog,
    sweeper: Mutex<Option<AbortHandle>>,
    /// Calls `on_unhealthy`/`on_restored` as the lease's health changes.
    lease_watch: Mutex<Option<AbortHandle>>,
    /// Audience of tokens the worker mints for its own in-process calls.
    pub(crate) local_aud: String,
    /// The worker secret: verifies attestations.
    pub(crate) secret: Arc<str>,
    /// Local mode or behind pinboard.
    pub(crate) control: ControlPlane,
    pub(crate) fences: FenceTable,
    /// Where in-process cluster calls go (the worker's namespace table is
    /// behind it; the host holds only the sending half).
    pub(crate) switchboard: crate::plane::switchboard::Switchboard,
    /// Cancelled when the worker is dropped: ends this host's background
    /// tasks (sweep, lease watch, drain timer), which hold it strongly.
    pub(crate) stop: CancellationToken,
    /// The worker's state store, if any.
    pub(crate) store: Option<Arc<dyn pinned_store::StateStore>>,
    /// The application states ([`Options::state`](crate::Options::state)).
    pub(crate) states: Arc<crate::namespace::States>,
    /// The worker's clock, tasks and randomness.
    pub(crate) domain: crate::time::Domain,
    /// The hibernatable sockets, by id: they outlive the records.
    pub(crate) sockets: self::sockets::Sockets,
    /// The sockets pinboard holds that the instances heard of, and the
    /// sends to them.
    pub(crate) held: self::held_sockets::HeldSockets,
}

/// What a host is built from, besides its options.
pub(crate) struct NamespaceParts {
    pub(crate) ns: Arc<str>,
    pub(crate) options: HostOptions,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) router: Router,
    pub(crate) durable: Option<Arc<dyn Durability>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) local_aud: String,
    pub(crate) secret: Arc<str>,
    pub(crate) control: ControlPlane,
    pub(crate) store: Option<Arc<dyn pinned_store::StateStore>>,
    pub(crate) states: Arc<crate::namespace::States>,
    pub(crate) domain: crate::time::Domain,
    pub(crate) switchboard: crate::plane::switchboard::Switchboard,
    pub(crate) stop: CancellationToken,
    /// The hibernatable sockets open in the whole worker, and their bound.
    pub(crate) worker_sockets: (Arc<AtomicUsize>, usize),
}

impl Namespace {
    pub(crate) fn new(parts: NamespaceParts) -> Self {
        let NamespaceParts {
            ns,
            options,
            lifecycle,
            router,
            durable,
            metrics,
            local_aud,
            secret,
            control,
            store,
            states,
            domain,
            switchboard,
            stop,
            worker_sockets,
        } = parts;
        let duration = metrics.duration_for(&ns);
        let held_plane = control.pinboard().cloned();
        let held = self::held_sockets::HeldSockets::new(&ns, held_plane, domain.clone());
        let deadlines = Deadlines::new(options.sweep_interval);
        let churn = ChurnLog::new(options.churn_lines_per_second);
        Self {
            ns,
            options,
            lifecycle,
            router,
            durable,
            slots: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            count: AtomicUsize::new(0),
            closing: AtomicUsize::new(0),
            seq: AtomicU32::new(0),
            deadlines,
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
            churn,
            sweeper: Mutex::new(None),
            lease_watch: Mutex::new(None),
            local_aud,
            secret,
            control,
            fences: FenceTable::default(),
            switchboard,
            stop,
            store,
            states,
            domain,
            sockets: self::sockets::Sockets::new(worker_sockets.0, worker_sockets.1),
            held,
        }
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// `at` as the records' activity stamps count it: milliseconds since
    /// the host's clock base (no clock read: the request path stamps with
    /// instants it has already read).
    #[inline]
    pub(crate) fn ms_at(&self, at: Instant) -> u64 {
        // In 64 bits: `as_millis` divides 128-bit nanoseconds, twice a
        // request.
        let since = at.saturating_duration_since(self.base);
        since
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(since.subsec_millis()))
    }

    /// The host was shut down: every request is refused.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
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

    /// The ids of every record (resident, activating or closing) and of
    /// every hibernated id (sockets open, no record): their placement is
    /// here.
    pub(crate) fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .slots
            .iter()
            .map(|entry| entry.key().0.id.to_string())
            .collect();
        ids.extend(
            self.sockets
                .ids()
                .into_iter()
                .filter(|id| !self.slots.contains_key(id.as_str())),
        );
        ids
    }

    /// Whether `id` has a record that is not closing.
    pub(crate) fn is_resident(&self, id: &str) -> bool {
        self.slot(id)
            .is_some_and(|slot| matches!(slot.stage(), Stage::Activating | Stage::Live))
    }

    /// The record of `id` when it is live.
    pub(crate) fn resident_slot(&self, id: &str) -> Option<Arc<Record>> {
        self.slot(id).filter(|slot| slot.stage() == Stage::Live)
    }

    pub(crate) fn slot(&self, id: &str) -> Option<Arc<Record>> {
        self.slots.get(id).map(|entry| entry.key().0.clone())
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

    /// One pass of the idle sweep: the records whose deadline came, by the
    /// index ([`Deadlines`]), are looked at: detached ones wind down, idle
    /// ones are offered to `on_idle`, idle ones that are winding down (or
    /// draining) close, and every other one is queued again at its
    /// deadline as it is now (one touched since it was queued is such a
    /// record).
    ///
    /// A pass costs what is due, not what is resident: the request path
    /// only stamps a record's activity, which moves its deadlines later, and
    /// the index finds that out when the deadline it holds comes. The
    /// actions run after the look, and the records still live after them
    /// are queued again in batches, so a pass never holds the map or the
    /// index for long.
    pub(crate) fn sweep(&self) {
        let started = std::time::Instant::now();
        // One clock read for the pass.
        let now = self.elapsed_ms();
        let due = self.deadlines.take_due(now);
        let visited = due.len() as u64;
        let mut later = Vec::with_capacity(due.len());
        let mut act = Vec::new();
        for slot in due {
            // A closing record leaves with its teardown.
            if slot.stage() != Stage::Live {
                continue;
            }
            match self.look(&slot, now) {
                Some(action) => act.push((slot, action)),
                None => {
                    let at = self.next_look(&slot, now);
                    later.push((slot, at));
                }
            }
        }
        for (slot, action) in act {
            match action {
                Sweep::Detached => {
                    tracing::warn!(namespace = %self.ns, id = %slot.id, "no client for the detached timeout; winding the instance down");
                    wind_down(&slot, Some(Duration::ZERO));
                }
                Sweep::Close => Self::close_if_idle(&slot),
                Sweep::Idle => crate::namespace::hooks::idle(&slot),
            }
            // Still live after its action (`on_idle` kept it, a request
            // beat the close, a detached one's abort runs in a task): looked
            // at again an idle timeout on, at the earliest; a record that
            // closed is left out when queued.
            let at = self
                .next_look(&slot, now)
                .max(now.saturating_add(self.idle_ms()));
            later.push((slot, at));
        }
        self.deadlines.queue_all(later);
        self.fences.sweep(self.control.lease_ttl());
        if let Some(overflow) = self.churn.flush(now) {
            overflow.log(&self.ns);
        }
        self.metrics.sweep_passes.inc();
        self.metrics.sweep_visits.inc_by(visited);
        self.metrics
            .sweep_seconds
            .inc_by(started.elapsed().as_secs_f64());
    }

    /// What the sweep does to the live record `slot` at `now_ms`, if
    /// anything is due.
    fn look(&self, slot: &Record, now_ms: u64) -> Option<Sweep> {
        if slot.streams() > 0 || self.sockets.has(&slot.id) {
            // An open stream or socket is a connected client.
            slot.connected_at(now_ms);
        } else if !slot.winding.load(Ordering::SeqCst)
            && slot.detached_ms_at(now_ms) >= self.detached_ms()
        {
            return Some(Sweep::Detached);
        }
        if slot.in_flight() != 0 {
            None
        } else if self.draining() || slot.winding_down() {
            Some(Sweep::Close)
        } else if slot.idle_ms_at(now_ms) >= self.idle_ms() {
            Some(Sweep::Idle)
        } else {
            None
        }
    }

    /// When the sweep must look at the live record `slot` again, nothing
    /// being due at `now_ms`: at its idle deadline (an idle timeout from
    /// now for a busy record, which cannot have been idle that long before
    /// then) or its detached deadline (a detached timeout from now while it
    /// winds down, which it is exempt from), whichever comes first.
    ///
    /// A record's own stamps (a request, a stream's end) only ever move
    /// this later, which is why the request path never tells the index.
    pub(crate) fn next_look(&self, slot: &Record, now_ms: u64) -> u64 {
        let idle_from = if slot.in_flight() == 0 {
            slot.activity_ms()
        } else {
            now_ms
        };
        let connected = if slot.winding_alone() {
            now_ms
        } else {
            slot.connected_mark()
        };
        idle_from
            .saturating_add(self.idle_ms())
            .min(connected.saturating_add(self.detached_ms()))
    }

    /// Queues a record that went live at `now_ms` (on the host's clock) in
    /// the sweep's index.
    pub(crate) fn went_live(&self, slot: &Arc<Record>, now_ms: u64) {
        let at = self.next_look(slot, now_ms);
        self.deadlines.queue(slot.clone(), at);
    }

    fn idle_ms(&self) -> u64 {
        u64::try_from(self.options.idle_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    fn detached_ms(&self) -> u64 {
        u64::try_from(self.options.detached_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// The live records.
    pub(crate) fn live(&self) -> Vec<Arc<Record>> {
        self.slots
            .iter()
            .filter(|entry| entry.key().0.stage() == Stage::Live)
            .map(|entry| entry.key().0.clone())
            .collect()
    }

    fn all(&self) -> Vec<Arc<Record>> {
        self.slots
            .iter()
            .map(|entry| entry.key().0.clone())
            .collect()
    }

    /// Starts the idle sweep (idempotent).
    pub(crate) fn start(self: &Arc<Self>) {
        let mut sweeper = self.sweeper.lock();
        if sweeper.is_some() {
            return;
        }
        let host = self.clone();
        let period = self.options.sweep_interval;
        let task = self.domain.spawn(async move {
            let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = host.stop.cancelled() => return,
                    _ = ticks.tick() => host.sweep(),
                }
            }
        });
        *sweeper = Some(task.abort_handle());
        if let Some(durable) = &self.durable {
            durable.started(self);
        }
        if let Some(lease) = self.control.lease() {
            let watcher = self.domain.spawn(crate::namespace::hooks::watch_lease(
                self.clone(),
                lease.health(),
            ));
            *self.lease_watch.lock() = Some(watcher.abort_handle());
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
        if let Some(durable) = &self.durable {
            durable.shut_down();
        }
        self.sockets.close_all(1001, "worker closing", true);
        self.abort_all();
        self.wait_empty().await;
        self.sockets.all_closed().await;
    }

    /// This namespace as the control plane commands it.
    pub(crate) fn commanded(self: &Arc<Self>) -> Arc<dyn Commanded> {
        Arc::new(Commands(self.clone()))
    }

    pub(crate) fn rows(&self) -> Vec<InstanceRow> {
        let mut rows: Vec<InstanceRow> = self
            .slots
            .iter()
            .map(|entry| {
                let slot = &entry.key().0;
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
        // Oldest first: the furthest behind the next number to be given.
        let next = self.seq.load(Ordering::Relaxed);
        rows.sort_unstable_by_key(|row| std::cmp::Reverse(next.wrapping_sub(row.seq)));
        rows
    }
}

/// A namespace as the control plane commands it.
struct Commands(Arc<Namespace>);

impl Commanded for Commands {
    fn ns(&self) -> &str {
        &self.0.ns
    }

    fn env(&self) -> Option<String> {
        self.0.options.env.clone()
    }

    fn ids(&self) -> Vec<String> {
        self.0.ids()
    }

    fn abort_id(&self, id: &str) {
        self.0.abort_id(id);
    }

    fn abort_all(&self) {
        self.0.abort_all();
    }

    fn wind_down_id(&self, id: &str, deadline: Option<Duration>) {
        self.0.wind_down_id(id, deadline);
    }

    fn server_drain(&self, draining: bool, deadline: Option<Duration>) {
        if draining {
            self.0.start_drain(DrainKind::Server, deadline);
        } else {
            self.0.stop_drain(DrainKind::Server);
        }
    }
}
