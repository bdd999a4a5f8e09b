//! The in-flight guard: one [`Busy`] per request, background task, open
//! stream or activation inside an instance record.
//!
//! The record's state machine ([`Slot`](crate::instance::Slot)) only counts entries and reports
//! the last one out ([`Vacated`]); this guard is where that report reaches
//! the namespace, which acts on it: a teardown waiting for the record to
//! settle is woken, a winding-down instance that became idle closes. The
//! guard never does more than that: the actions themselves live in
//! [`teardown`](super::teardown).

use std::sync::Arc;

use super::Namespace;
use super::Record;
use crate::instance::{Stage, Vacated};

/// One in-flight entry of an instance (a request, a background task, an open
/// stream). Dropping it leaves; the namespace acts on the last one out.
pub(crate) struct Busy {
    slot: Arc<Record>,
    stream: bool,
    /// The leave was stamped already ([`leave_at`](Self::leave_at)): the
    /// drop reads no clock.
    stamped: bool,
}

impl Busy {
    pub(crate) fn slot(&self) -> &Arc<Record> {
        &self.slot
    }

    /// Leaves at `now_ms` (on the host's clock, [`Namespace::ms_at`]), a
    /// time the caller has just worked out (a request's end, also observed
    /// by its duration histogram): the instance's activity is stamped with
    /// it instead of a clock read of its own.
    #[inline]
    pub(crate) fn leave_at(mut self, now_ms: u64) {
        self.slot.touch_at(now_ms);
        self.stamped = true;
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = (!self.stamped).then(|| self.slot.host.elapsed_ms());
        if let Some(vacated) = self.slot.leave(self.stream, now) {
            Namespace::vacated(&self.slot, vacated);
        }
    }
}

// === impl Record: the guards of a record ===

impl Record {
    /// Enters the instance: counts one in-flight entry unless it is closing.
    /// Returns the phase seen on entry (`Activating` or `Live`). `now_ms`
    /// (on the host's clock, [`Namespace::ms_at`]) is when the request
    /// arrived.
    #[inline]
    pub(crate) fn enter(self: &Arc<Self>, now_ms: u64) -> Result<(Busy, Stage), Stage> {
        // Built before the phase is judged: on a refusal, dropping it undoes
        // the count (and wakes a teardown waiting for it to reach zero).
        let entered = self.count_entry(now_ms);
        let busy = Busy {
            slot: self.clone(),
            stream: false,
            stamped: false,
        };
        entered.map(|phase| (busy, phase))
    }

    /// Takes over an in-flight entry already counted in the state word (the
    /// ones a new slot is created with).
    pub(crate) fn adopt(self: &Arc<Self>) -> Busy {
        Busy {
            slot: self.clone(),
            stream: false,
            stamped: false,
        }
    }

    /// Counts one in-flight entry whatever the phase: for work started by
    /// the instance itself (background tasks, the activation).
    pub(crate) fn hold(self: &Arc<Self>) -> Busy {
        self.count_hold(false);
        Busy {
            slot: self.clone(),
            stream: false,
            stamped: false,
        }
    }

    /// Like [`hold`](Self::hold), also counted as an open stream.
    pub(crate) fn hold_stream(self: &Arc<Self>) -> Busy {
        self.count_hold(true);
        Busy {
            slot: self.clone(),
            stream: true,
            stamped: false,
        }
    }
}

// === impl Namespace: acting on the last entry out ===

impl Namespace {
    /// The last in-flight entry left `slot`.
    pub(super) fn vacated(slot: &Arc<Record>, vacated: Vacated) {
        match vacated {
            // A teardown may be waiting for the last entry to leave.
            Vacated::Settled => slot.host.settled.notify_waiters(),
            Vacated::Idle if slot.winding_down() => Self::close_if_idle(slot),
            Vacated::Idle => {}
        }
    }
}
