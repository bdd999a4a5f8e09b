//! Draining: the worker's own drain and the control plane's, kept apart;
//! what a drain refuses, and the timer that aborts what is left at its
//! deadline.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::Namespace;

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
pub(super) struct DrainState {
    /// `Some(deadline)` while draining; the inner `None` never aborts.
    local: Option<Option<Instant>>,
    server: Option<Option<Instant>>,
    pub(super) timer: Option<AbortHandle>,
}

impl DrainState {
    fn draining(&self) -> bool {
        self.local.is_some() || self.server.is_some()
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        match (self.local.flatten(), self.server.flatten()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Namespace {
    /// Drains (`kind`): refuse new activations, evict idle instances now,
    /// abort the rest at `deadline` from now (never, for `None`).
    pub(crate) fn start_drain(self: &Arc<Self>, kind: DrainKind, deadline: Option<Duration>) {
        // A deadline too far to represent never comes: no abort.
        let at = deadline.and_then(|after| Instant::now().checked_add(after));
        {
            let mut drain = self.drain.lock();
            match kind {
                DrainKind::Local => drain.local = Some(at),
                DrainKind::Server => drain.server = Some(at),
            }
            self.rearm(&mut drain);
        }
        tracing::info!(namespace = %self.ns, ?kind, ?deadline, "draining");
        // Hibernatable sockets cannot follow their ids to another worker
        // (yet): they close with 1012 so their clients reconnect there.
        self.sockets.close_all(1012, "service restart", false);
        let live = self.live();
        for slot in &live {
            crate::namespace::hooks::wind_down(slot, slot.effective_deadline());
        }
        // A drain makes every idle record due at once, so this is a walk of
        // them all (once per drain; the sweep's index serves the rest): the
        // idle ones close now, the busy ones as their last entry leaves.
        for slot in &live {
            Self::close_if_idle(slot);
        }
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
        self.control.cap_lease(deadline);
        if let Some(at) = deadline {
            let host = self.clone();
            let timer = self.domain.spawn(async move {
                tokio::select! {
                    () = host.stop.cancelled() => {}
                    () = tokio::time::sleep_until(at) => {
                        // A drain that finished in time (a clean stop)
                        // leaves nothing to abort: no warning for that.
                        match host.len() {
                            0 => tracing::debug!(namespace = %host.ns, "drain deadline reached; nothing left to abort"),
                            live => tracing::warn!(namespace = %host.ns, instances = live, "drain deadline reached; aborting instances"),
                        }
                        host.abort_all();
                    }
                }
            });
            drain.timer = Some(timer.abort_handle());
        }
    }
}
