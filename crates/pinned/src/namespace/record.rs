//! One instance record of the namespace: the instance's [`Slot`] (its
//! life, from the instance layer) with what the namespace keeps beside it:
//! the id it is found by, its namespace, its insertion order, its place in
//! the sweep's index, the object's state and the activation under way.
//!
//! The record is what [`Context`](crate::Context) is a handle to. It adds
//! to the slot only what needs the namespace: its clock, its drain, its
//! name in the instance's span.

use super::work_span::WorkSpan;
use std::ops::Deref;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use tokio::time::Instant;

use super::deadlines::{Queued, NOT_QUEUED};
use super::Namespace;
use crate::instance::{ActivationFuture, Id, Instance, Slot, Stage};

/// One instance record. Shared as `Arc<Record>`.
///
/// Every resident instance has one, so its size is the worker's memory per
/// idle instance (with the object's state, a map bucket and a pointer in
/// the sweep's index).
pub(crate) struct Record {
    /// The instance id; the namespace's map finds the record by it.
    pub(crate) id: Id,
    pub(crate) host: Arc<Namespace>,
    /// Insertion order, for `/_pinned/stats` (wrapping).
    pub(crate) seq: u32,
    /// Which bucket of the sweep's index holds the record, as
    /// [`Deadlines`](super::deadlines::Deadlines) notes it (beside `seq`,
    /// in what was its upper half: the note costs the record no room).
    queued: AtomicU32,
    /// The instance's life.
    slot: Slot,
    /// The object's state and the activation that makes it, under one
    /// lock (one lock word for both keeps the record small; the activation
    /// task that sets the state waits out a starter still holding it).
    held: Mutex<Held>,
}

/// What a record holds of its object.
#[derive(Default)]
struct Held {
    /// The object's state: set when the activation succeeds, taken at the
    /// end of teardown (so nothing the state holds can keep it alive).
    instance: Option<Instance>,
    /// The activation under way (boxed: it is there only while the
    /// instance activates).
    activation: Option<Box<ActivationFuture>>,
}

impl Deref for Record {
    type Target = Slot;

    fn deref(&self) -> &Slot {
        &self.slot
    }
}

impl Record {
    /// A record in `Activating` holding `initial` in-flight entries (the
    /// requester's and the activation task's), last active at `now_ms` (on
    /// the host's clock: the request's arrival).
    pub(crate) fn new(id: &str, host: Arc<Namespace>, seq: u32, initial: u64, now_ms: u64) -> Self {
        let slot = Slot::new(now_ms, host.options.exclusive, initial);
        Self {
            id: Id::new(id),
            host,
            seq,
            queued: AtomicU32::new(NOT_QUEUED),
            slot,
            held: Mutex::new(Held::default()),
        }
    }

    pub(crate) fn instance(&self) -> Option<Instance> {
        self.held.lock().instance.clone()
    }

    pub(crate) fn set_instance(&self, instance: Instance) {
        self.held.lock().instance = Some(instance);
    }

    /// Takes the state out of a record whose teardown finished.
    pub(crate) fn take_instance(&self) -> Option<Instance> {
        self.held.lock().instance.take()
    }

    /// The activation under way, locked (with the state: never call
    /// [`instance`](Self::instance) while holding it).
    pub(crate) fn activation(&self) -> MappedMutexGuard<'_, Option<Box<ActivationFuture>>> {
        MutexGuard::map(self.held.lock(), |held| &mut held.activation)
    }

    /// Milliseconds since the last activity, floored at 0.
    pub(crate) fn idle_ms(&self) -> u64 {
        self.slot.idle_ms_at(self.host.elapsed_ms())
    }

    /// The instance's tracing span: everything the instance does (its
    /// activation, requests, background tasks, alarm runs, teardown) runs
    /// inside one, so its logs carry the namespace, id and epoch. Always a
    /// root: work started from inside another instance span (a tray flush
    /// enlisted by a handler) names its instance once, not once per hop.
    /// `None` when nothing listens at `debug`.
    ///
    /// At `debug`, as the request spans (tower-http's are): with the
    /// examples' `info` logging a new id made one, about 4 300
    /// instructions of subscriber work, and every warm request entered it,
    /// about 450 more (`worker-bench`: new ids 1.85x and warm 1.05x a bare
    /// axum counter at `info`). Lifecycle lines at `info` (activation,
    /// eviction) name the namespace and id in their own fields.
    ///
    /// Made once per instance, and again when its epoch changes (a span's
    /// fields are written when it is made), and kept with the instance
    /// while a subscriber listens: making one per request cost the
    /// subscriber a record and the fields formatted, about 4 000
    /// instructions a request, and a clone of its own about 600 more.
    pub(crate) fn shared_span(&self) -> Option<Arc<tracing::Span>> {
        if !tracing::level_enabled!(tracing::Level::DEBUG) {
            return None;
        }
        let epoch = self.slot.epoch();
        if let Some(span) = self.slot.kept_span(epoch) {
            return Some(span);
        }
        let span = tracing::debug_span!(
            parent: None,
            "instance",
            namespace = %self.host.ns,
            id = %self.id,
            epoch,
        );
        if span.is_disabled() {
            return None;
        }
        let span = Arc::new(span);
        self.slot.keep_span(epoch, span.clone());
        Some(span)
    }

    /// The spans of work for the instance ([`WorkSpan`]): the
    /// [`shared_span`](Self::shared_span) and, when debug spans are wanted (the console
    /// at debug, or traces exported), a debug child named by `what` that
    /// continues the trace of the current span (the request that started
    /// the work).
    pub(crate) fn task_span(&self, what: Work) -> WorkSpan {
        let shared = self.shared_span();
        let none = tracing::Span::none();
        let instance = shared.as_deref().unwrap_or(&none);
        // One call site per kind: a span's name is its call site's.
        let work = match what {
            Work::Activation => tracing::debug_span!(parent: instance, "activation"),
            Work::TrayFlush => tracing::debug_span!(parent: instance, "tray flush"),
            Work::Task => tracing::debug_span!(parent: instance, "task"),
            Work::Hook => tracing::debug_span!(parent: instance, "hook"),
            Work::Teardown => tracing::debug_span!(parent: instance, "teardown"),
            Work::Alarm => tracing::debug_span!(parent: instance, "alarm"),
        };
        if !work.is_disabled() {
            pinned_edge::trace::follow(&work);
        }
        WorkSpan::new(shared, work)
    }

    /// Winding down: the namespace drains or the instance was told to.
    pub(crate) fn winding_down(&self) -> bool {
        self.host.draining() || self.slot.winding_alone()
    }

    /// The earliest of the instance's own deadline and the namespace's.
    pub(crate) fn effective_deadline(&self) -> Option<Instant> {
        match (self.slot.own_deadline(), self.host.drain_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Queued for Record {
    fn note(&self) -> &AtomicU32 {
        &self.queued
    }

    fn is_live(&self) -> bool {
        self.stage() == Stage::Live
    }

    fn is_closed(&self) -> bool {
        self.stage() == Stage::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record is most of an idle instance's memory: 168 bytes make a
    /// 192-byte allocation with the `Arc` counts and glibc's header (the
    /// next size up costs 16 bytes per resident instance).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_idle_record_stays_small() {
        assert!(
            std::mem::size_of::<Record>() <= 168,
            "Record grew to {} bytes: move rarely used parts to the slot's `Extra`",
            std::mem::size_of::<Record>()
        );
    }
}

/// What a [`Record::task_span`] is for: its span's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// `activation`: the instance's activation (and its trays' resumption).
    Activation,
    /// `tray flush`: enlisted effects written and dispatched.
    TrayFlush,
    /// `task`: a background task (`Context::spawn`/`spawn_fallible`).
    Task,
    /// `hook`: a lifecycle hook that did not finish at once.
    Hook,
    /// `teardown`: the instance closing.
    Teardown,
    /// `alarm`: an alarm and schedule run (`Object::alarm`).
    Alarm,
}
