//! Alarms: one durable wake-up time per instance, at-least-once.
//!
//! The alarm is the tray row `("pinned", "alarm")`, unmarked, doc
//! `{"at": <epoch ms, rounded up>, "nonce": <fresh per write>}`, written at
//! the instance's epoch. A due alarm runs the object's
//! [`Object::alarm`](crate::Object::alarm), one run at a time per instance,
//! counted as in flight and, in exclusive mode, inside a turn of its own
//! (never during a request's); the row is deleted
//! after the handler succeeds unless a newer `set` replaced it (the nonce
//! tells), so a failure or a crash leaves it to fire again.
//!
//! Timers: in local mode a process timer per id survives eviction (firing
//! activates the id) and a failed run retries after the namespace's sweep
//! interval. Behind pinboard the owner's timer fires only resident
//! instances inside the lease; eviction drops it, activation re-arms it,
//! and pinboard's sweeper delivers the rest through `POST …/_alarm`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;
use parking_lot::Mutex;
use pinned_store::{Doc, StateStore, StoreError};
use serde_json::Value;
use tokio::task::AbortHandle;

use crate::context::Context;
use crate::directory::{panic_message, spawn_detached, Admission, HostShared};
use crate::slot::Slot;

/// Tray namespace of the alarm row.
pub const ALARM_TRAY_NS: &str = "pinned";
/// Tray id of the alarm row.
pub const ALARM_TRAY_ID: &str = "alarm";

/// Why an alarm operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AlarmError {
    /// The worker has no state store.
    #[error("alarms need a state store; configure one with Options::store")]
    NoStore,
    /// A time before the Unix epoch or too far in the future.
    #[error("invalid alarm time")]
    InvalidTime,
    /// The store failed (a `FenceLost` means a newer activation owns it).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Per-instance alarm state, allocated on first use.
#[derive(Default)]
pub(crate) struct AlarmState {
    /// Serializes row reads-then-writes (a run's clear against `set`).
    row_turn: tokio::sync::Mutex<()>,
    /// One run at a time.
    run_turn: tokio::sync::Mutex<()>,
    /// The nonce of the alarm being run, hidden from `get`.
    running: Mutex<Option<String>>,
}

/// How one run ended.
#[derive(Debug)]
pub(crate) enum Run {
    /// Ran (`true`) or nothing was due (`false`).
    Fired(bool),
    /// Another run is in progress.
    Running,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("alarm store: {0}")]
    Store(StoreError),
    #[error("the instance closed before its alarm ran")]
    Closed,
    #[error("alarm handler failed: {0}")]
    Handler(String),
}

/// A timer armed for one id.
pub(crate) struct Timer {
    at: i64,
    handle: AbortHandle,
}

impl Timer {
    /// Cancels the timer.
    pub(crate) fn abort(&self) {
        self.handle.abort();
    }
}

/// The host's wall clock in epoch ms, as alarm rows store it.
fn wall_ms(host: &HostShared) -> i64 {
    i64::try_from(host.clock.unix_ms()).unwrap_or(i64::MAX)
}

fn ms_of(at: SystemTime) -> Result<i64, AlarmError> {
    let since = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| AlarmError::InvalidTime)?;
    // Rounded up: an alarm never fires before the time it was given.
    let micros = since.as_micros();
    let ms = micros.div_ceil(1000);
    i64::try_from(ms).map_err(|_| AlarmError::InvalidTime)
}

fn nonce() -> String {
    let mut bytes = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    hex::encode(bytes)
}

/// `(at, nonce)` of an alarm doc.
fn parse(doc: &Doc) -> Option<(i64, Option<String>)> {
    let at = match doc.get("at")? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f.ceil() as i64))?,
        _ => return None,
    };
    let nonce = doc.get("nonce").and_then(Value::as_str).map(str::to_owned);
    Some((at, nonce))
}

impl Slot {
    pub(crate) fn alarm_state(&self) -> &AlarmState {
        self.alarm.get_or_init(Box::default)
    }
}

/// The instance's alarm. Get it from [`Context::alarm`](crate::Context::alarm).
#[derive(Clone)]
pub struct Alarm {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarm").field("id", &self.slot.id).finish()
    }
}

impl Alarm {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        Self { slot }
    }

    fn store(&self) -> Result<&Arc<dyn StateStore>, AlarmError> {
        self.slot.host.store.as_ref().ok_or(AlarmError::NoStore)
    }

    /// Sets the alarm to `at` (replacing any earlier one), or clears it with
    /// `None`. Resolves once the row is committed.
    ///
    /// # Errors
    ///
    /// No store, a time before 1970, a store failure.
    pub async fn set(&self, at: Option<SystemTime>) -> Result<(), AlarmError> {
        self.write(at).await.inspect_err(|error| {
            if let AlarmError::Store(error) = error {
                crate::store::abort_on_fence_lost(&self.slot, error);
            }
        })
    }

    async fn write(&self, at: Option<SystemTime>) -> Result<(), AlarmError> {
        let store = self.store()?;
        let (ns, id) = (&*self.slot.host.ns, &*self.slot.id);
        let epoch = self.slot.epoch().unwrap_or(0);
        let state = self.slot.alarm_state();
        let _row = state.row_turn.lock().await;
        match at {
            None => {
                store
                    .delete_tray(ns, id, ALARM_TRAY_NS, ALARM_TRAY_ID, epoch)
                    .await?;
                self.slot.host.disarm(id);
            }
            Some(at) => {
                let at = ms_of(at)?;
                let mut doc = Doc::new();
                doc.insert("at".into(), at.into());
                doc.insert("nonce".into(), nonce().into());
                store
                    .set_tray(ns, id, ALARM_TRAY_NS, ALARM_TRAY_ID, false, doc, epoch)
                    .await?;
                self.slot.host.arm(&self.slot.id, at);
            }
        }
        Ok(())
    }

    /// Sets the alarm `after` from now.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    pub async fn set_in(&self, after: Duration) -> Result<(), AlarmError> {
        self.set(Some(self.slot.host.clock.now() + after)).await
    }

    /// The stored alarm time; `None` when there is none, or while its own
    /// handler runs (unless the handler set a new one).
    ///
    /// # Errors
    ///
    /// No store, a store failure.
    pub async fn get(&self) -> Result<Option<SystemTime>, AlarmError> {
        let store = self.store()?;
        let epoch = self.slot.epoch().unwrap_or(0);
        let row = store
            .get_tray(
                &self.slot.host.ns,
                &self.slot.id,
                ALARM_TRAY_NS,
                ALARM_TRAY_ID,
                epoch,
            )
            .await
            .inspect_err(|error| crate::store::abort_on_fence_lost(&self.slot, error))?;
        let Some((at, nonce)) = row.as_ref().and_then(|tray| parse(&tray.doc)) else {
            return Ok(None);
        };
        let running = self.slot.alarm_state().running.lock().clone();
        if running.is_some() && running == nonce {
            return Ok(None);
        }
        let at = u64::try_from(at).unwrap_or(0);
        Ok(Some(UNIX_EPOCH + Duration::from_millis(at)))
    }
}

/// Runs the instance's due alarm, if any. `wait`: queue behind a run in
/// progress (timers) instead of answering [`Run::Running`] (`_alarm`).
pub(crate) async fn run(slot: &Arc<Slot>, wait: bool) -> Result<Run, RunError> {
    run_once(slot, wait).await.inspect_err(|error| {
        if let RunError::Store(error) = error {
            crate::store::abort_on_fence_lost(slot, error);
        }
    })
}

async fn run_once(slot: &Arc<Slot>, wait: bool) -> Result<Run, RunError> {
    let Some(store) = slot.host.store.clone() else {
        return Ok(Run::Fired(false));
    };
    let state = slot.alarm_state();
    let _turn = if wait {
        state.run_turn.lock().await
    } else {
        match state.run_turn.try_lock() {
            Ok(turn) => turn,
            Err(_) => return Ok(Run::Running),
        }
    };
    let _entry = slot.hold();
    let (ns, id) = (&*slot.host.ns, &*slot.id);
    let epoch = slot.epoch().unwrap_or(0);
    let row = {
        let _row = state.row_turn.lock().await;
        store
            .get_tray(ns, id, ALARM_TRAY_NS, ALARM_TRAY_ID, epoch)
            .await
            .map_err(RunError::Store)?
    };
    let Some((at, nonce)) = row.as_ref().and_then(|tray| parse(&tray.doc)) else {
        return Ok(Run::Fired(false));
    };
    if at > wall_ms(&slot.host) {
        // Not due yet (a sweep raced a newer `set`): keep the timer.
        slot.host.arm(&slot.id, at);
        return Ok(Run::Fired(false));
    }
    let instance = slot.instance().ok_or(RunError::Closed)?;
    // Exclusive hosts: the alarm is a turn like a request, never inside one.
    let _turn = match &slot.turn {
        None => None,
        Some(turn) => tokio::select! {
            biased;
            () = slot.cancel.cancelled() => return Err(RunError::Closed),
            permit = turn.acquire() => Some(permit.map_err(|_| RunError::Closed)?),
        },
    };
    *state.running.lock() = nonce.clone();
    let handler = (slot.host.lifecycle.alarm)(instance, Context::new(slot.clone()));
    let outcome = AssertUnwindSafe(handler).catch_unwind().await;
    *state.running.lock() = None;
    if !matches!(outcome, Ok(Ok(()))) {
        slot.host.metrics.callback_failed("alarm");
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(RunError::Handler(error.to_string())),
        Err(panic) => return Err(RunError::Handler(panic_message(panic.as_ref()))),
    }
    // Clear only the alarm this run fired: a `set` during the handler
    // replaced the nonce and stays.
    let _row = state.row_turn.lock().await;
    let current = store
        .get_tray(ns, id, ALARM_TRAY_NS, ALARM_TRAY_ID, epoch)
        .await
        .map_err(RunError::Store)?;
    if current
        .as_ref()
        .and_then(|tray| parse(&tray.doc))
        .map(|(_, n)| n)
        == Some(nonce)
    {
        store
            .delete_tray(ns, id, ALARM_TRAY_NS, ALARM_TRAY_ID, epoch)
            .await
            .map_err(RunError::Store)?;
    }
    Ok(Run::Fired(true))
}

impl HostShared {
    /// Arms (or re-arms) the timer of `id` for wall time `at` (ms).
    pub(crate) fn arm(self: &Arc<Self>, id: &Arc<str>, at: i64) {
        let delay = Duration::from_millis(u64::try_from(at - wall_ms(self)).unwrap_or(0));
        let host = Arc::downgrade(self);
        let target = id.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let handle = runtime.spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(host) = host.upgrade() {
                host.fire(target, at).await;
            }
        });
        if let Some(previous) = self.timers.insert(
            id.clone(),
            Timer {
                at,
                handle: handle.abort_handle(),
            },
        ) {
            previous.handle.abort();
        }
    }

    /// Drops the timer of `id`.
    pub(crate) fn disarm(&self, id: &str) {
        if let Some((_, timer)) = self.timers.remove(id) {
            timer.handle.abort();
        }
    }

    /// A timer came due.
    async fn fire(self: Arc<Self>, id: Arc<str>, at: i64) {
        // This timer is done; a newer one (re-armed meanwhile) stays.
        self.timers.remove_if(&*id, |_, timer| timer.at == at);
        let outcome = if !self.control.fires_evicted_alarms() {
            // Behind pinboard only a resident instance inside the lease
            // fires here; the sweeper delivers the rest.
            let Some(slot) = self.resident_slot(&id) else {
                return;
            };
            if !self.control.lease_healthy() {
                return;
            }
            run(&slot, true).await
        } else {
            match self.enter(&id, None).await {
                Ok((entry, _)) => {
                    let slot = entry.slot().clone();
                    drop(entry);
                    run(&slot, true).await
                }
                Err(Admission::Refused(refusal)) => {
                    Err(RunError::Handler(refusal.detail().to_owned()))
                }
                Err(_) => Err(RunError::Handler("activation failed".to_owned())),
            }
        };
        match outcome {
            Ok(_) => {}
            Err(error) => {
                tracing::error!(namespace = %self.ns, id = %id, %error, "alarm run failed; it fires again");
                if self.control.fires_evicted_alarms() {
                    let retry = wall_ms(&self)
                        + i64::try_from(self.options.sweep_interval.as_millis())
                            .unwrap_or(i64::MAX);
                    if !self.timers.contains_key(&*id) {
                        self.arm(&id, retry);
                    }
                }
            }
        }
    }

    /// Re-arms an activated instance's stored alarm.
    pub(crate) fn rearm_from_store(self: &Arc<Self>, slot: &Arc<Slot>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let host = self.clone();
        let slot = slot.clone();
        spawn_detached(async move {
            let epoch = slot.epoch().unwrap_or(0);
            match store
                .get_tray(&host.ns, &slot.id, ALARM_TRAY_NS, ALARM_TRAY_ID, epoch)
                .await
            {
                Ok(Some(tray)) => {
                    if let Some((at, _)) = parse(&tray.doc) {
                        host.arm(&slot.id, at);
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(namespace = %host.ns, id = %slot.id, %error, "cannot read the alarm row");
                }
            }
        });
    }
}
