//! Teardown: how an instance leaves (idle close, abort, or the discard of
//! a record no request was authorized to enter), in order: signal, let
//! open work settle, run `Object::on_stop` and the `on_stop` handlers,
//! drop the state, release the placement, leave the map.
//!
//! Only closes of an instance are lifecycle events (counted as evictions
//! and aborts, logged at info); a discarded record never activated, so
//! its close is neither: it is logged at debug and counts nothing but the
//! denial that caused it (`pinned_auth_denials_total`, counted where the
//! request was denied).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::FutureExt;

use super::churn_log::{churn_line, Churn};
use super::Record;
use super::{panic_message, run_detached, spawn_detached, Namespace};
use crate::instance::Stage;

/// How long a closing instance waits for its placement release before the
/// release continues in the background (about one registry call).
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Why an instance record closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// Idle (or winding down with nothing left in flight): open work is
    /// awaited; the placement is released if the namespace says so.
    Idle,
    /// Aborted: work is cancelled and the placement released.
    Abort,
    /// A constructed record whose every request was denied: it never
    /// activated, so its close is no instance lifecycle event; the
    /// placement its claim made is released at once.
    Discard,
}

impl Namespace {
    pub(super) fn remove(&self, slot: &Arc<Record>) {
        if slot.stage() == Stage::Closing {
            self.closing.fetch_sub(1, Ordering::SeqCst);
        }
        slot.finish();
        if self
            .slots
            .remove_if(slot.id.as_str(), |current, ()| current.is(slot))
            .is_some()
        {
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
        self.deadlines.forget(slot);
        self.changed.notify_waiters();
    }

    /// Closes `slot` if nothing is in flight (idle eviction, or the last
    /// entry leaving a winding-down instance).
    pub(crate) fn close_if_idle(slot: &Arc<Record>) {
        if slot.begin_idle_close(slot.host.releases_on_idle(slot)) {
            Self::close_begun(slot);
        }
    }

    /// Tears down `slot`, whose idle close already began: its first poll
    /// here (most idle closes have nothing to wait for), the rest in a
    /// task ([`run_detached`]).
    pub(super) fn close_begun(slot: &Arc<Record>) {
        slot.host.closing.fetch_add(1, Ordering::SeqCst);
        run_detached(
            &slot.host.domain,
            slot.task_span(crate::namespace::record::Work::Teardown)
                .instrument(teardown(slot.clone(), Close::Idle)),
        );
    }

    /// Aborts `slot`: cancels its work and closes it.
    pub(crate) fn abort(slot: &Arc<Record>) {
        Self::close_cancelling(slot, Close::Abort);
    }

    /// Closes a record that never activated and that no request was
    /// authorized to enter, releasing its placement (see [`Close::Discard`]).
    pub(super) fn discard_unserved(slot: &Arc<Record>) {
        Self::close_cancelling(slot, Close::Discard);
    }

    fn close_cancelling(slot: &Arc<Record>, close: Close) {
        if slot.begin_abort() {
            slot.host.closing.fetch_add(1, Ordering::SeqCst);
            // Cancelled now, not when the teardown task runs: a handler
            // finishing in the same poll must see the abort and answer 503.
            slot.cancel();
            spawn_detached(
                &slot.host.domain,
                slot.task_span(crate::namespace::record::Work::Teardown)
                    .instrument(teardown(slot.clone(), close)),
            );
        }
    }

    /// Aborts instance `id` if resident (a duplicate placement, an
    /// operator); a hibernated id's sockets are closed.
    pub(crate) fn abort_id(&self, id: &str) {
        if let Some(slot) = self.slot(id) {
            Self::abort(&slot);
        } else {
            self.sockets.close_id(id, 1012, "service restart");
        }
    }

    /// Whether an idle close of `slot` releases its placement: not when it
    /// hibernates (its sockets stay open here and keep the placement).
    pub(crate) fn releases_on_idle(&self, slot: &Record) -> bool {
        self.options.release_placement_on_idle && !self.hibernates(slot)
    }

    /// Whether an idle close of `slot` leaves its sockets open: it has some
    /// and neither it nor its namespace is winding down.
    fn hibernates(&self, slot: &Record) -> bool {
        !slot.winding_down() && !self.sockets.is_shut() && self.sockets.has(&slot.id)
    }

    /// Aborts every instance.
    pub(crate) fn abort_all(&self) {
        for slot in self.all() {
            Self::abort(&slot);
        }
    }
}

/// Closes one instance: signal, let open work settle, run `on_stop`
/// handlers last-registered first, then leave the map.
async fn teardown(slot: Arc<Record>, close: Close) {
    let host = slot.host.clone();
    if let Some(extra) = slot.extra_if_any() {
        if let Some(timer) = extra
            .wind
            .lock()
            .as_mut()
            .and_then(|wind| wind.timer.take())
        {
            timer.abort();
        }
    }
    let was_live = slot.activated_at().is_some();
    slot.cancel();
    loop {
        let settled = host.settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        if slot.in_flight() == 0 {
            break;
        }
        settled.await;
    }
    if let Some(durable) = &host.durable {
        durable.closing(&slot).await;
    }
    if let Some(instance) = slot.instance() {
        let stop = (host.lifecycle.on_stop)(instance, slot.clone());
        if let Err(error) = settle(stop).await {
            tracing::error!(namespace = %host.ns, id = %slot.id, %error, "Object::on_stop failed");
            host.metrics.shutdown_failed("directory");
        }
    }
    let hooks = slot
        .extra_if_any()
        .map(|extra| std::mem::take(&mut *extra.on_stop.lock()))
        .unwrap_or_default();
    for hook in hooks.into_iter().rev() {
        if let Err(error) = settle(hook()).await {
            tracing::error!(namespace = %host.ns, id = %slot.id, %error, "on_stop handler failed");
            host.metrics.shutdown_failed("directory");
        }
    }
    // Everything the trays (and the hooks above) enlisted lands before the
    // placement is released.
    let pending = match &host.durable {
        Some(durable) => durable.settle(&host, &slot).await,
        None => false,
    };
    // The record may outlive the teardown (a task or the state itself can
    // hold a `Context`); the state must not. Dropping it here breaks any
    // cycle user code built through a `Context`.
    drop(slot.take_instance());
    // What the instance heard of the sockets pinboard holds goes with it:
    // they stay open there, and the next owner hears of them as they speak.
    host.held.forget(&slot.id);
    if slot.releasing.load(Ordering::SeqCst) {
        // Its sockets cannot outlive a placement that goes.
        host.sockets.close_id(&slot.id, 1012, "service restart");
        release(&host, &slot).await;
    } else if let Some(set) = host.sockets.set(&slot.id).filter(|_| close == Close::Idle) {
        set.note_epoch(slot.epoch());
        host.metrics.hibernations.inc();
        churn_line!(
            host,
            Churn::Hibernated,
            slot.id,
            "hibernating instance: its sockets stay open"
        );
    }
    if close != Close::Discard {
        host.evictions.fetch_add(1, Ordering::Relaxed);
        host.metrics.evictions.inc();
    }
    if close == Close::Abort {
        host.metrics.aborts.inc();
    }
    if was_live {
        host.metrics.active_instances.dec();
    }
    match close {
        Close::Idle => churn_line!(host, Churn::Evicted, slot.id, "evicted instance"),
        Close::Abort => churn_line!(host, Churn::Aborted, slot.id, "aborted instance"),
        Close::Discard => {
            tracing::debug!(namespace = %host.ns, id = %slot.id, "discarded a denied record")
        }
    }
    host.remove(&slot);
    // Hibernated, but its last socket closed meanwhile: nothing keeps the
    // placement now (the socket's own check saw this record still there).
    if !slot.releasing.load(Ordering::SeqCst)
        && close == Close::Idle
        && host.options.release_placement_on_idle
        && !host.sockets.has(&slot.id)
        && host.slot(&slot.id).is_none()
    {
        release_placement(&host, &slot.id, slot.epoch()).await;
    }
    if let Some(durable) = &host.durable {
        durable.closed(&host, &slot.id, pending);
    }
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
async fn release(host: &Arc<Namespace>, slot: &Arc<Record>) {
    release_placement(host, &slot.id, slot.epoch()).await;
}

/// Releases the placement of `id` at `epoch`, as [`release`] does.
pub(super) async fn release_placement(host: &Arc<Namespace>, id: &str, epoch: Option<u64>) {
    if let Some(epoch) = epoch {
        host.fences.release(id, epoch);
    }
    let Some(plane) = host.control.pinboard() else {
        return;
    };
    let call = host.domain.spawn({
        let plane = plane.clone();
        let ns = host.ns.to_string();
        let id = id.to_owned();
        async move { plane.release(ns, id, epoch).await }
    });
    if tokio::time::timeout(RELEASE_WAIT, call).await.is_err() {
        tracing::warn!(namespace = %host.ns, %id, "placement release still pending; continuing in the background");
    }
}
