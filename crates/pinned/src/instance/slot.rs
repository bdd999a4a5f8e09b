//! The instance's life as a state machine: its stage, what keeps it in
//! flight, its abort signal, its activity stamps and its turns.
//!
//! The stage and the in-flight count share one atomic word, so "is it idle?"
//! and "may a request still enter?" are decided by a single compare-and-swap:
//! the idle sweeper moves `(Live, 0)` to `(Closing, 0)` and a request that
//! raced it sees `Closing` on entry and backs out.
//!
//! This module is a state machine and nothing more: it never does I/O,
//! spawns work, reads a clock or knows the namespace that holds it (times
//! come in as arguments, in the holder's milliseconds). A transition its
//! owner must act on (the last in-flight entry leaving) is *reported*, as
//! the [`Vacated`] that [`Slot::leave`] returns; the namespace layer's
//! in-flight guard hands it to the namespace, which decides what follows
//! (wake a waiting teardown, close a winding-down instance). What the
//! layers above hang on an instance (open trays) is kept here unopened.
//!
//! Lifecycle: `Activating` → `Live` → `Closing` → `Closed`. An activation that
//! fails goes straight from `Activating` to `Closed`; an abort during
//! activation moves `Activating` to `Closing`.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::future::{BoxFuture, Shared};
use once_cell::race::OnceBox;
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::abort::{self, Cancelled};
use crate::BoxError;

/// An instance id: up to 24 bytes are stored inline in the record (no
/// allocation of their own), longer ones on the heap.
pub(crate) type Id = compact_str::CompactString;

/// A live instance's state, type-erased so one namespace layer serves any object.
pub(crate) type Instance = Arc<dyn Any + Send + Sync>;

/// How an activation ended, as seen by every request that waited on it.
#[derive(Clone, Debug)]
pub(crate) enum Activation {
    Ready(Instance),
    /// The activation returned an error or panicked: answer 500.
    Failed,
    /// The instance was aborted before its activation finished: answer 503.
    Aborted,
    /// An operator paused the id (or holds it for an action): answer 503
    /// with [`PAUSED_DETAIL`](crate::durable::inspect::PAUSED_DETAIL).
    Paused,
}

pub(crate) type ActivationFuture = Shared<BoxFuture<'static, Activation>>;

/// A registered `on_stop` handler.
pub(crate) type StopHook = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// The lifecycle stage, stored in the high half of [`Slot::state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Stage {
    /// Constructed; the object's `activate` is running.
    Activating = 0,
    /// Serving requests.
    Live = 1,
    /// Teardown started: no new request enters.
    Closing = 2,
    /// Gone from its namespace.
    Closed = 3,
}

const PHASE_SHIFT: u32 = 32;
const COUNT_MASK: u64 = u32::MAX as u64;
const NO_EPOCH: u64 = u64::MAX;
/// Set in `last_activity` once `on_idle` was asked about the idle period
/// that activity began (milliseconds never reach it).
const IDLE_ASKED: u64 = 1 << 63;

fn stage_of(word: u64) -> Stage {
    match word >> PHASE_SHIFT {
        0 => Stage::Activating,
        1 => Stage::Live,
        2 => Stage::Closing,
        _ => Stage::Closed,
    }
}

fn count_of(word: u64) -> u64 {
    word & COUNT_MASK
}

fn word(phase: Stage, count: u64) -> u64 {
    ((phase as u64) << PHASE_SHIFT) | count
}

/// What leaving a record whose state word was `old` reports: something
/// only for the last entry out, and only in a phase the owner acts on.
fn vacated(old: u64) -> Option<Vacated> {
    if count_of(old) != 1 {
        return None;
    }
    match stage_of(old) {
        Stage::Closing | Stage::Closed => Some(Vacated::Settled),
        Stage::Live => Some(Vacated::Idle),
        // The activation task holds an entry until it ends; its own exit
        // decides what comes next.
        Stage::Activating => None,
    }
}

/// Raises `epoch` to `next` if `next` is newer; true when that replaced an
/// older epoch (not the first one).
fn raise(epoch: &AtomicU64, next: u64) -> bool {
    epoch
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
            (current == NO_EPOCH || next > current).then_some(next)
        })
        .is_ok_and(|previous| previous != NO_EPOCH)
}

/// What the last in-flight entry leaving a record means to its owner
/// (returned by [`Slot::leave`]; nothing when others are still in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vacated {
    /// The record is closing (or closed) and now empty: a teardown waiting
    /// for its work to settle may go on.
    Settled,
    /// The record is live and now idle: if it is winding down, it should
    /// close.
    Idle,
}

/// Wind-down state of one instance.
#[derive(Default)]
pub(crate) struct WindDown {
    /// `None` inside `Some(WindDown)` means "close when idle, never abort".
    pub(crate) deadline: Option<Instant>,
    pub(crate) timer: Option<AbortHandle>,
}

/// What a layer above hangs on an instance and this layer only keeps
/// (the durable layer's open trays, taken at the end of teardown).
pub(crate) type Attachment = Arc<dyn Any + Send + Sync>;

/// The turns of an instance's timers (alarm and schedules), allocated on
/// first use.
#[derive(Default)]
pub(crate) struct TimerTurns {
    /// Serializes row reads-then-writes (a run's clear against `set`).
    pub(crate) row: tokio::sync::Mutex<()>,
    /// One run at a time.
    pub(crate) run: tokio::sync::Mutex<()>,
    /// The nonce of the alarm being run, hidden from `get`.
    pub(crate) running: Mutex<Option<String>>,
}

/// The parts of a record that few instances use, allocated on the first
/// use: an idle instance that never registered an `on_stop` handler, wound
/// down, took a tag, set an alarm or opened trays pays one pointer for
/// them all.
#[derive(Default)]
pub(crate) struct Extra {
    pub(crate) on_stop: Mutex<Vec<StopHook>>,
    pub(crate) wind: Mutex<Option<WindDown>>,
    /// The owner tag, stamped again when the instance adopts a newer epoch.
    tag: Mutex<Option<Arc<str>>>,
    /// Timer turns.
    timers: OnceLock<TimerTurns>,
    /// The open trays (objects that declare trays, on a worker with a
    /// store); taken at the end of teardown.
    trays: Mutex<Option<Attachment>>,
    /// The instance's tracing span as its holder last made it, with the
    /// epoch it names (only while something listens: see
    /// [`Slot::kept_span`]).
    span: Mutex<Option<(Option<u64>, Arc<tracing::Span>)>>,
}

/// One instance's life. The namespace layer's record holds it inline.
///
/// Every resident instance has one, so its size is most of the worker's
/// memory per idle instance: what only some instances need sits behind
/// [`Extra`] or a box.
pub(crate) struct Slot {
    /// `phase << 32 | in-flight count`.
    state: AtomicU64,
    /// Open streaming bodies and WebSockets (a subset of the in-flight count).
    streams: AtomicU32,
    /// Mirrors `extra.wind.is_some()` so the request path never takes the lock.
    pub(crate) winding: AtomicBool,
    /// The close under way releases the placement (control-plane mode).
    pub(crate) releasing: AtomicBool,
    /// The abort signal is raised (teardown began): with `abort_waiters`,
    /// what requests, streams and background work end on.
    aborted: AtomicBool,
    /// The holder's milliseconds of the last activity, with [`IDLE_ASKED`]
    /// set once `on_idle` was asked about the idle period it began (a new
    /// activity, stored whole, clears it: the request path writes nothing
    /// more for it).
    last_activity: AtomicU64,
    /// The holder's milliseconds when a client last had a request or an
    /// open stream on the instance (`detached_timeout`).
    last_connected: AtomicU64,
    /// Wall-clock ms of the completed activation, 0 before.
    activated_at: AtomicU64,
    epoch: AtomicU64,
    /// Woken when `aborted` is raised.
    abort_waiters: Notify,
    /// Exclusive (turn-based) instances: one request at a time.
    pub(crate) turn: Option<Box<Semaphore>>,
    /// One pointer until something needs it.
    extra: OnceBox<Extra>,
}

impl Slot {
    /// A slot in `Activating` holding `initial` in-flight entries (the
    /// requester's and the activation task's), last active at `now_ms`;
    /// `exclusive` gives it a turn.
    pub(crate) fn new(now_ms: u64, exclusive: bool, initial: u64) -> Self {
        Self {
            state: AtomicU64::new(word(Stage::Activating, initial)),
            streams: AtomicU32::new(0),
            winding: AtomicBool::new(false),
            releasing: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            last_activity: AtomicU64::new(now_ms),
            last_connected: AtomicU64::new(now_ms),
            activated_at: AtomicU64::new(0),
            epoch: AtomicU64::new(NO_EPOCH),
            abort_waiters: Notify::new(),
            turn: exclusive.then(|| Box::new(Semaphore::new(1))),
            extra: OnceBox::new(),
        }
    }

    /// The rarely used parts, allocated now if they were not yet.
    pub(crate) fn extra(&self) -> &Extra {
        // Two first uses at once may both allocate; one box is kept.
        self.extra.get_or_init(Box::default)
    }

    /// The rarely used parts, if anything allocated them.
    pub(crate) fn extra_if_any(&self) -> Option<&Extra> {
        self.extra.get()
    }

    /// The timer turns (allocated on first use).
    pub(crate) fn timer_turns(&self) -> &TimerTurns {
        self.extra().timers.get_or_init(TimerTurns::default)
    }

    pub(crate) fn stage(&self) -> Stage {
        stage_of(self.state.load(Ordering::SeqCst))
    }

    pub(crate) fn in_flight(&self) -> u64 {
        count_of(self.state.load(Ordering::SeqCst))
    }

    pub(crate) fn streams(&self) -> u32 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Raises the abort signal (teardown began): requests, open streams
    /// and background work waiting on [`cancelled`](Self::cancelled) end.
    pub(crate) fn cancel(&self) {
        abort::raise(&self.aborted, &self.abort_waiters);
    }

    /// Whether the abort signal was raised.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Completes once the abort signal is raised.
    pub(crate) fn cancelled(&self) -> Cancelled<'_> {
        abort::cancelled(&self.aborted, &self.abort_waiters)
    }

    /// The open trays hung on the instance, if any.
    pub(crate) fn trays(&self) -> Option<Attachment> {
        self.extra_if_any()?.trays.lock().clone()
    }

    pub(crate) fn set_trays(&self, trays: Attachment) {
        *self.extra().trays.lock() = Some(trays);
    }

    /// Takes the trays out of an instance that is leaving.
    pub(crate) fn take_trays(&self) -> Option<Attachment> {
        self.extra_if_any()?.trays.lock().take()
    }

    /// Counts one in-flight entry unless the record is closing. Returns the
    /// phase seen on entry: `Ok` with `Activating` or `Live` (the entry is
    /// counted), `Err` with `Closing` or `Closed` (the entry is counted too,
    /// and the caller must [`leave`](Self::leave) again at once). `now` is
    /// when the request arrived, in the holder's milliseconds.
    pub(crate) fn count_entry(&self, now: u64) -> Result<Stage, Stage> {
        let old = self.state.fetch_add(1, Ordering::SeqCst);
        match stage_of(old) {
            phase @ (Stage::Activating | Stage::Live) => {
                // A request is both activity and a connected client.
                self.last_activity.store(now, Ordering::Relaxed);
                self.last_connected.store(now, Ordering::Relaxed);
                Ok(phase)
            }
            phase @ (Stage::Closing | Stage::Closed) => Err(phase),
        }
    }

    /// Counts one in-flight entry whatever the phase: for work started by
    /// the instance itself (background tasks, the activation, open
    /// streams); `stream` also counts it as an open stream.
    pub(crate) fn count_hold(&self, stream: bool) {
        if stream {
            self.streams.fetch_add(1, Ordering::Relaxed);
        }
        self.state.fetch_add(1, Ordering::SeqCst);
    }

    /// One in-flight entry leaves (`stream`: it was an open stream; `now`:
    /// stamp the activity then, unless the caller stamped it already with
    /// [`touch_at`](Self::touch_at)). Reports the transition the owner must
    /// act on when it was the last one out.
    #[must_use = "the owner must act on the last entry out"]
    pub(crate) fn leave(&self, stream: bool, now: Option<u64>) -> Option<Vacated> {
        if stream {
            self.streams.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(now) = now {
            self.touch_at(now);
            if stream {
                // Its client was there until the stream ended: the
                // detached timeout counts from here.
                self.connected_at(now);
            }
        }
        vacated(self.state.fetch_sub(1, Ordering::SeqCst))
    }

    /// `Activating` → `Live`; false when the slot was aborted meanwhile.
    pub(crate) fn go_live(&self, wall_ms: u64) -> bool {
        self.activated_at.store(wall_ms.max(1), Ordering::Relaxed);
        self.transition(|phase| (phase == Stage::Activating).then_some(Stage::Live))
    }

    /// `(Live, 0)` → `(Closing, 0)`: the only way an idle instance closes.
    /// `release` says whether the close releases the placement (the
    /// namespace's `release_placement_on_idle`).
    pub(crate) fn begin_idle_close(&self, release: bool) -> bool {
        let closing = self
            .state
            .compare_exchange(
                word(Stage::Live, 0),
                word(Stage::Closing, 0),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok();
        if closing {
            self.releasing.store(release, Ordering::SeqCst);
        }
        closing
    }

    /// `Activating | Live` → `Closing` whatever is in flight (an abort).
    pub(crate) fn begin_abort(&self) -> bool {
        // An abort always releases, also one that upgrades a kept close.
        self.releasing.store(true, Ordering::SeqCst);
        self.transition(|phase| {
            matches!(phase, Stage::Activating | Stage::Live).then_some(Stage::Closing)
        })
    }

    /// Marks the record gone.
    pub(crate) fn finish(&self) {
        self.transition(|_| Some(Stage::Closed));
    }

    fn transition(&self, next: impl Fn(Stage) -> Option<Stage>) -> bool {
        self.state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |old| {
                next(stage_of(old)).map(|phase| word(phase, count_of(old)))
            })
            .is_ok()
    }

    /// Stamps the last activity at `now` (the holder's milliseconds).
    pub(crate) fn touch_at(&self, now: u64) {
        self.last_activity.store(now, Ordering::Relaxed);
    }

    /// A client was connected at `now_ms` (a request entered, or a stream
    /// is open).
    pub(crate) fn connected_at(&self, now_ms: u64) {
        self.last_connected.store(now_ms, Ordering::Relaxed);
    }

    /// When a client last had a request or an open stream on the
    /// instance, in the holder's milliseconds.
    pub(crate) fn connected_mark(&self) -> u64 {
        self.last_connected.load(Ordering::Relaxed)
    }

    /// Milliseconds from the last connected client to `now_ms` (a pass
    /// reads the clock once, not once per record).
    pub(crate) fn detached_ms_at(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.last_connected.load(Ordering::Relaxed))
    }

    /// The last activity, as an opaque mark for [`mark_idle_asked`](Self::mark_idle_asked).
    pub(crate) fn activity_mark(&self) -> u64 {
        self.last_activity.load(Ordering::Relaxed)
    }

    /// The holder's milliseconds of the last activity.
    pub(crate) fn activity_ms(&self) -> u64 {
        self.last_activity.load(Ordering::Relaxed) & !IDLE_ASKED
    }

    /// Records that `on_idle` is asked for the idle period that `mark`
    /// (an [`activity_mark`](Self::activity_mark)) began; false when it was
    /// asked for that period already, or an activity since ended it.
    pub(crate) fn mark_idle_asked(&self, mark: u64) -> bool {
        mark & IDLE_ASKED == 0
            && self
                .last_activity
                .compare_exchange(
                    mark,
                    mark | IDLE_ASKED,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Milliseconds from the last activity to `now_ms`, floored at 0.
    pub(crate) fn idle_ms_at(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.activity_ms())
    }

    pub(crate) fn activated_at(&self) -> Option<u64> {
        match self.activated_at.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(ms),
        }
    }

    pub(crate) fn epoch(&self) -> Option<u64> {
        match self.epoch.load(Ordering::SeqCst) {
            NO_EPOCH => None,
            epoch => Some(epoch),
        }
    }

    /// Raises the instance epoch to `epoch` if it is newer (a resident
    /// instance adopting a newer placement). True when it replaced an older
    /// epoch (not the first one).
    pub(crate) fn adopt_epoch(&self, epoch: u64) -> bool {
        raise(&self.epoch, epoch)
    }

    /// The span kept with [`keep_span`](Self::keep_span), if it names
    /// `epoch` (shared: a request enters it without a clone of its own,
    /// which would cost the subscriber a reference count in its registry).
    pub(crate) fn kept_span(&self, epoch: Option<u64>) -> Option<Arc<tracing::Span>> {
        match &*self.extra_if_any()?.span.lock() {
            Some((kept, span)) if *kept == epoch => Some(span.clone()),
            _ => None,
        }
    }

    /// Keeps the holder's `span` of the instance, naming `epoch`, for
    /// [`kept_span`](Self::kept_span): a span is made once per instance
    /// (and again when its epoch changes), not once per request.
    pub(crate) fn keep_span(&self, epoch: Option<u64>, span: Arc<tracing::Span>) {
        *self.extra().span.lock() = Some((epoch, span));
    }

    /// The owner tag last stamped with `Context::tag`.
    pub(crate) fn tag(&self) -> Option<Arc<str>> {
        self.extra_if_any()?.tag.lock().clone()
    }

    pub(crate) fn set_tag(&self, tag: &str) {
        *self.extra().tag.lock() = Some(Arc::from(tag));
    }

    /// Winding down on its own (a namespace drain is its holder's to add).
    pub(crate) fn winding_alone(&self) -> bool {
        self.winding.load(Ordering::SeqCst)
    }

    /// Its own wind-down deadline, if any.
    pub(crate) fn own_deadline(&self) -> Option<Instant> {
        self.extra_if_any()
            .and_then(|extra| extra.wind.lock().as_ref().and_then(|wind| wind.deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adopting_a_newer_epoch_reports_a_replacement() {
        let epoch = AtomicU64::new(NO_EPOCH);
        let adopt = |next: u64| raise(&epoch, next);
        assert!(!adopt(3), "the first epoch replaces nothing");
        assert!(!adopt(3), "the same epoch is not newer");
        assert!(!adopt(2), "an older epoch is not adopted");
        assert!(adopt(4), "a newer epoch replaces the old one");
        assert_eq!(epoch.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn only_the_last_entry_out_reports() {
        assert_eq!(vacated(word(Stage::Live, 2)), None, "another entry is in");
        assert_eq!(vacated(word(Stage::Live, 1)), Some(Vacated::Idle));
        assert_eq!(vacated(word(Stage::Closing, 1)), Some(Vacated::Settled));
        assert_eq!(vacated(word(Stage::Closed, 1)), Some(Vacated::Settled));
        assert_eq!(vacated(word(Stage::Activating, 1)), None);
        assert_eq!(vacated(word(Stage::Closing, 3)), None);
    }

    #[test]
    fn on_idle_is_asked_once_per_idle_period() {
        let slot = Slot::new(1_000, false, 0);
        let mark = slot.activity_mark();
        assert!(slot.mark_idle_asked(mark), "first ask of the period");
        assert!(!slot.mark_idle_asked(slot.activity_mark()), "asked already");
        assert_eq!(slot.activity_ms(), 1_000, "the mark hides in the stamp");
        assert_eq!(slot.idle_ms_at(1_500), 500);
        // A new activity, even within the same millisecond, opens a period.
        slot.touch_at(1_000);
        assert!(slot.mark_idle_asked(slot.activity_mark()));
        // An activity between the read and the ask: that period is over.
        slot.touch_at(1_500);
        let stale = slot.activity_mark();
        slot.touch_at(2_000);
        assert!(!slot.mark_idle_asked(stale));
        assert!(slot.mark_idle_asked(slot.activity_mark()));
    }

    #[test]
    fn word_packs_phase_and_count() {
        let w = word(Stage::Closing, 7);
        assert_eq!(stage_of(w), Stage::Closing);
        assert_eq!(count_of(w), 7);
        assert_eq!(stage_of(word(Stage::Live, 0)), Stage::Live);
    }
}
