//! Calling an object's lifecycle hooks ([`Object::on_idle`],
//! [`Object::on_wind_down`], [`Object::on_unhealthy`],
//! [`Object::on_restored`]) for the namespace, without ever blocking it: a
//! hook is polled once in place (the defaults finish there, costing no
//! task), and only one that is still pending continues in a task of its
//! own, inside the instance's span.
//!
//! A hook's failure or panic is logged and counted in
//! `pinned_callback_failures_total{hook}`; it never reaches the caller.
//!
//! [`Object::on_idle`]: crate::Object::on_idle
//! [`Object::on_wind_down`]: crate::Object::on_wind_down
//! [`Object::on_unhealthy`]: crate::Object::on_unhealthy
//! [`Object::on_restored`]: crate::Object::on_restored

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::time::Instant;

use crate::instance::Stage;
use crate::namespace::Idle;
use crate::namespace::Record;
use crate::namespace::{panic_message, spawn_detached, Namespace};
use crate::BoxError;

/// Runs `hook` and hands its outcome to `then`, in place when it is ready
/// at once, in a task otherwise.
fn run<T, F>(
    slot: &Arc<Record>,
    name: &'static str,
    hook: BoxFuture<'static, Result<T, BoxError>>,
    then: F,
) where
    T: Send + 'static,
    F: FnOnce(&Arc<Record>, Option<T>) + Send + 'static,
{
    let mut hook = AssertUnwindSafe(hook).catch_unwind();
    let settle = move |slot: &Arc<Record>, outcome: std::thread::Result<Result<T, BoxError>>| {
        let value = match outcome {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                failed(slot, name, &error.to_string());
                None
            }
            Err(panic) => {
                failed(
                    slot,
                    name,
                    &format!("panicked: {}", panic_message(panic.as_ref())),
                );
                None
            }
        };
        then(slot, value);
    };
    match (&mut hook).now_or_never() {
        Some(outcome) => settle(slot, outcome),
        None => {
            let slot = slot.clone();
            let span = slot.task_span(crate::namespace::record::Work::Hook);
            let domain = slot.host.domain.clone();
            spawn_detached(
                &domain,
                span.instrument(async move {
                    let outcome = hook.await;
                    settle(&slot, outcome);
                }),
            );
        }
    }
}

fn failed(slot: &Record, name: &'static str, error: &str) {
    tracing::error!(namespace = %slot.host.ns, id = %slot.id, hook = name, %error, "lifecycle hook failed");
    slot.host.metrics.callback_failed(name);
}

/// The sweep found `slot` idle (and not winding down): ask the object
/// whether to evict it. Asked once per idle period.
pub(crate) fn idle(slot: &Arc<Record>) {
    let Some(instance) = slot.instance() else {
        Namespace::close_if_idle(slot);
        return;
    };
    let activity = slot.activity_mark();
    if !slot.mark_idle_asked(activity) {
        return;
    }
    let hook = (slot.host.lifecycle.on_idle)(instance, slot.clone());
    run(slot, "on_idle", hook, |slot, decision| match decision {
        Some(Idle::Keep) => {}
        // Evict, or the hook failed: the reference closes the instance.
        Some(Idle::Evict) | None => Namespace::close_if_idle(slot),
    });
}

/// `slot` started winding down or its deadline changed.
pub(crate) fn wind_down(slot: &Arc<Record>, deadline: Option<Instant>) {
    if slot.stage() != Stage::Live {
        return;
    }
    let Some(instance) = slot.instance() else {
        return;
    };
    let hook = (slot.host.lifecycle.on_wind_down)(instance, slot.clone(), deadline);
    run(slot, "on_wind_down", hook, |_, _| {});
}

/// The worker's lease health changed: tell every live instance.
pub(crate) fn lease_health(host: &Namespace, healthy: bool) {
    let (hook, name) = if healthy {
        (host.lifecycle.on_restored, "on_restored")
    } else {
        (host.lifecycle.on_unhealthy, "on_unhealthy")
    };
    for slot in host.live() {
        let Some(instance) = slot.instance() else {
            continue;
        };
        let call = hook(instance, slot.clone());
        run(&slot, name, call, |_, _| {});
    }
}

/// Follows the lease's health for `host` until the lease is gone or the
/// worker stops.
pub(crate) async fn watch_lease(
    host: Arc<Namespace>,
    mut health: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = host.stop.cancelled() => return,
            changed = health.changed() => if changed.is_err() { return },
        }
        let healthy = *health.borrow_and_update();
        lease_health(&host, healthy);
    }
}
