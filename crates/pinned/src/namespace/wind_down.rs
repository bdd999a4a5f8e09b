//! Wind-down of one instance: close as soon as it is idle, abort at its
//! deadline if still busy; set by the instance itself or by pinboard's
//! `wind_down` messages, and revocable.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Namespace;
use super::Record;
use crate::instance::{Stage, WindDown};

impl Namespace {
    /// A `wind_down` control message: a deadline in seconds from now, or
    /// `None` to revoke. A no-op for an id that is not resident.
    pub(crate) fn wind_down_id(&self, id: &str, deadline: Option<Duration>) {
        let Some(slot) = self.slot(id) else {
            // A hibernated id winds down by closing its sockets: the last
            // one out releases the placement.
            if deadline.is_some() {
                self.sockets.close_id(id, 1012, "service restart");
            }
            return;
        };
        match deadline {
            None => unwind(&slot),
            Some(after) => {
                if matches!(slot.stage(), Stage::Closing | Stage::Closed) {
                    slot.releasing.store(true, Ordering::SeqCst);
                    return;
                }
                wind_down(&slot, Some(after));
            }
        }
    }
}

/// Sets or clears an instance's own wind-down.
pub(crate) fn wind_down(slot: &Arc<Record>, after: Option<Duration>) {
    // A deadline too far to represent never comes: no abort.
    let deadline = after.and_then(|after| Instant::now().checked_add(after));
    {
        let mut wind = slot.extra().wind.lock();
        let state = wind.get_or_insert_with(WindDown::default);
        if let Some(timer) = state.timer.take() {
            timer.abort();
        }
        state.deadline = deadline;
        if let Some(at) = deadline {
            let target = slot.clone();
            let timer = slot.host.domain.spawn(async move {
                tokio::time::sleep_until(at).await;
                Namespace::abort(&target);
            });
            state.timer = Some(timer.abort_handle());
        }
        slot.winding.store(true, Ordering::SeqCst);
    }
    slot.host.winding.notify_waiters();
    crate::namespace::hooks::wind_down(slot, slot.effective_deadline());
    Namespace::close_if_idle(slot);
}

/// Revokes an instance's wind-down (a `wind_down` message with a null
/// deadline).
pub(crate) fn unwind(slot: &Arc<Record>) {
    if let Some(extra) = slot.extra_if_any() {
        if let Some(timer) = extra.wind.lock().take().and_then(|state| state.timer) {
            timer.abort();
        }
    }
    slot.winding.store(false, Ordering::SeqCst);
}
