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
//! Named schedules ride the same row, so every timer, `_alarm` and sweep
//! path serves them unchanged: with schedules the doc adds
//! `"schedules": {name: ms}` (and `"alarm": ms` for the alarm itself),
//! and `at` is the earliest of them all. A row without schedules is the
//! reference's exact shape.
//!
//! Timers: in local mode a process timer per id survives eviction (firing
//! activates the id) and a failed run retries after the namespace's sweep
//! interval. Behind pinboard the owner's timer fires only resident
//! instances inside the lease; eviction drops it, activation re-arms it,
//! and pinboard's sweeper delivers the rest through `POST …/_alarm`.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use futures_util::FutureExt;
use pinned_store::{Doc, InstanceKey, StateStore, StoreError, TrayKey};
use serde_json::Value;
use tokio::task::AbortHandle;

use super::Durable;
use crate::namespace::Record;
use crate::namespace::{panic_message, spawn_detached, Admission, Namespace};

/// Tray namespace of the alarm row.
pub const ALARM_TRAY_NS: &str = "pinned";
/// Tray id of the alarm row.
pub const ALARM_TRAY_ID: &str = "alarm";
/// The alarm row's key within its instance.
const ALARM_TRAY: TrayKey<'static> = TrayKey::new(ALARM_TRAY_NS, ALARM_TRAY_ID);

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
    /// A schedule name that is empty or longer than [`MAX_SCHEDULE_NAME`].
    #[error("a schedule name must be 1 to {MAX_SCHEDULE_NAME} bytes")]
    InvalidName,
    /// The instance holds [`MAX_SCHEDULES`] schedules already.
    #[error("an instance holds at most {MAX_SCHEDULES} schedules")]
    TooManySchedules,
    /// The store failed (a `FenceLost` means a newer activation owns it).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Most named schedules one instance holds.
pub const MAX_SCHEDULES: usize = 1024;
/// Longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME: usize = 256;

/// The alarm row, decoded: the alarm itself and the named schedules.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct AlarmRow {
    alarm: Option<i64>,
    /// Changes with every `Alarm::set` (never with schedule writes), so a
    /// run clears only the alarm it fired.
    nonce: Option<String>,
    schedules: BTreeMap<String, i64>,
}

impl AlarmRow {
    fn decode(doc: &Doc) -> Option<Self> {
        let (at, nonce) = parse(doc)?;
        let schedules: BTreeMap<String, i64> = match doc.get("schedules") {
            Some(Value::Object(entries)) => entries
                .iter()
                .filter_map(|(name, at)| Some((name.clone(), at.as_i64()?)))
                .collect(),
            _ => BTreeMap::new(),
        };
        let alarm = if schedules.is_empty() {
            Some(at)
        } else {
            doc.get("alarm").and_then(Value::as_i64)
        };
        Some(Self {
            alarm,
            nonce,
            schedules,
        })
    }

    /// When the row is due: the earliest of the alarm and the schedules.
    fn at(&self) -> Option<i64> {
        self.schedules.values().copied().chain(self.alarm).min()
    }

    /// The stored doc; `fresh_nonce` names a row that had none.
    fn encode(&self, fresh_nonce: impl FnOnce() -> String) -> Option<Doc> {
        let at = self.at()?;
        let mut doc = Doc::new();
        doc.insert("at".into(), at.into());
        doc.insert(
            "nonce".into(),
            self.nonce.clone().unwrap_or_else(fresh_nonce).into(),
        );
        if !self.schedules.is_empty() {
            let entries = self
                .schedules
                .iter()
                .map(|(name, at)| (name.clone(), Value::from(*at)))
                .collect();
            doc.insert("schedules".into(), Value::Object(entries));
            if let Some(alarm) = self.alarm {
                doc.insert("alarm".into(), alarm.into());
            }
        }
        Some(doc)
    }
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
    /// An operator paused the id: it fires once resumed.
    #[error("{}", pinned_wire::refusal::PAUSED_DETAIL)]
    Paused,
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
fn wall_ms(host: &Namespace) -> i64 {
    i64::try_from(host.domain.unix_ms()).unwrap_or(i64::MAX)
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

/// `(at, nonce)` of an alarm doc.
fn parse(doc: &Doc) -> Option<(i64, Option<String>)> {
    let at = match doc.get("at")? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f.ceil() as i64))?,
        _ => return None,
    };
    let nonce = doc.get("nonce").and_then(Value::as_str).map(str::to_owned);
    Some((at, nonce))
}

/// The instance's alarm. Get it from [`Context::alarm`](crate::Context::alarm).
#[derive(Clone)]
pub struct Alarm {
    slot: Arc<Record>,
}

impl std::fmt::Debug for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarm").field("id", &self.slot.id).finish()
    }
}

impl Alarm {
    pub(crate) fn new(slot: Arc<Record>) -> Self {
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
                crate::durable::abort_on_fence_lost(&self.slot, error);
            }
        })
    }

    async fn write(&self, at: Option<SystemTime>) -> Result<(), AlarmError> {
        let at = at.map(ms_of).transpose()?;
        let nonce = self.slot.host.domain.random_hex(16);
        modify(&self.slot, |row| {
            row.alarm = at;
            row.nonce = at.map(|_| nonce.clone());
            Ok(())
        })
        .await
    }

    /// Sets the alarm `after` from now.
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    pub async fn set_in(&self, after: Duration) -> Result<(), AlarmError> {
        self.set(Some(self.slot.host.domain.now() + after)).await
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
                InstanceKey::new(&self.slot.host.ns, &self.slot.id),
                ALARM_TRAY,
                epoch,
            )
            .await
            .inspect_err(|error| crate::durable::abort_on_fence_lost(&self.slot, error))?;
        let Some(row) = row.as_ref().and_then(|tray| AlarmRow::decode(&tray.doc)) else {
            return Ok(None);
        };
        let Some(at) = row.alarm else {
            return Ok(None);
        };
        let running = self.slot.timer_turns().running.lock().clone();
        if running.is_some() && running == row.nonce {
            return Ok(None);
        }
        let at = u64::try_from(at).unwrap_or(0);
        Ok(Some(UNIX_EPOCH + Duration::from_millis(at)))
    }
}

/// Reads the alarm row, lets `edit` change it, then writes it back (or
/// deletes it once nothing is left) and re-arms the timer for its earliest
/// time. Serialized per instance with every other row read-then-write.
async fn modify(
    slot: &Arc<Record>,
    edit: impl FnOnce(&mut AlarmRow) -> Result<(), AlarmError>,
) -> Result<(), AlarmError> {
    let store = slot.host.store.as_ref().ok_or(AlarmError::NoStore)?;
    let (ns, id) = (&*slot.host.ns, &*slot.id);
    let epoch = slot.epoch().unwrap_or(0);
    let _row = slot.timer_turns().row.lock().await;
    let stored = store
        .get_tray(InstanceKey::new(ns, id), ALARM_TRAY, epoch)
        .await?;
    let mut row = stored
        .as_ref()
        .and_then(|tray| AlarmRow::decode(&tray.doc))
        .unwrap_or_default();
    edit(&mut row)?;
    match (row.encode(|| slot.host.domain.random_hex(16)), row.at()) {
        (Some(doc), Some(at)) => {
            store
                .set_tray(InstanceKey::new(ns, id), ALARM_TRAY, false, doc, epoch)
                .await?;
            arm(&slot.host, &slot.id, at);
        }
        _ => {
            if stored.is_some() {
                store
                    .delete_tray(InstanceKey::new(ns, id), ALARM_TRAY, epoch)
                    .await?;
            }
            disarm(&slot.host, id);
        }
    }
    Ok(())
}

/// A lost fence aborts the instance (a newer activation owns its rows).
fn fenced<T>(slot: &Arc<Record>, answer: Result<T, AlarmError>) -> Result<T, AlarmError> {
    if let Err(AlarmError::Store(error)) = &answer {
        crate::durable::abort_on_fence_lost(slot, error);
    }
    answer
}

fn time_of(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Every named schedule of `slot`'s instance, earliest first.
pub(crate) async fn schedules(slot: &Arc<Record>) -> Result<Vec<(String, SystemTime)>, AlarmError> {
    let row = fenced(slot, read(slot).await)?;
    let mut schedules: Vec<(String, i64)> = row
        .map(|row| row.schedules.into_iter().collect())
        .unwrap_or_default();
    schedules.sort_by_key(|(name, at)| (*at, name.clone()));
    Ok(schedules
        .into_iter()
        .map(|(name, at)| (name, time_of(at)))
        .collect())
}

async fn read(slot: &Arc<Record>) -> Result<Option<AlarmRow>, AlarmError> {
    let store = slot.host.store.as_ref().ok_or(AlarmError::NoStore)?;
    let row = store
        .get_tray(
            InstanceKey::new(&slot.host.ns, &slot.id),
            ALARM_TRAY,
            slot.epoch().unwrap_or(0),
        )
        .await?;
    Ok(row.as_ref().and_then(|tray| AlarmRow::decode(&tray.doc)))
}

/// One named schedule of an instance: a durable timer of its own, beside
/// the instance's [`Alarm`] and any number of other schedules (up to
/// [`MAX_SCHEDULES`]). When due it runs
/// [`Object::scheduled`](crate::Object::scheduled) with its name, at least
/// once, through the same timers, `_alarm` calls and sweeps as the alarm;
/// a successful run removes it unless it was set again meanwhile.
///
/// ```
/// # async fn demo(ctx: pinned::Context) -> Result<(), pinned::AlarmError> {
/// use std::time::Duration;
/// ctx.schedule("daily-report").after(Duration::from_secs(86_400)).await?;
/// ctx.schedule("reminder").after(Duration::from_secs(60)).await?;
/// let all = ctx.schedules().await?; // earliest first
/// ctx.schedule("reminder").cancel().await?;
/// # let _ = all;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Schedule {
    slot: Arc<Record>,
    name: String,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("id", &self.slot.id)
            .field("name", &self.name)
            .finish()
    }
}

impl Schedule {
    pub(crate) fn new(slot: Arc<Record>, name: &str) -> Self {
        Self {
            slot,
            name: name.to_owned(),
        }
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn checked_name(&self) -> Result<&str, AlarmError> {
        if self.name.is_empty() || self.name.len() > MAX_SCHEDULE_NAME {
            return Err(AlarmError::InvalidName);
        }
        Ok(&self.name)
    }

    /// Sets the schedule to fire at `at` (replacing its earlier time).
    /// Resolves once committed.
    ///
    /// # Errors
    ///
    /// No store, an invalid name or time, [`AlarmError::TooManySchedules`],
    /// a store failure.
    pub async fn at(&self, at: SystemTime) -> Result<(), AlarmError> {
        let name = self.checked_name()?.to_owned();
        let at = ms_of(at)?;
        let set = modify(&self.slot, |row| {
            if !row.schedules.contains_key(&name) && row.schedules.len() >= MAX_SCHEDULES {
                return Err(AlarmError::TooManySchedules);
            }
            row.schedules.insert(name, at);
            Ok(())
        })
        .await;
        fenced(&self.slot, set)
    }

    /// Sets the schedule to fire `after` from now.
    ///
    /// # Errors
    ///
    /// As [`at`](Self::at).
    pub async fn after(&self, after: Duration) -> Result<(), AlarmError> {
        self.at(self.slot.host.domain.now() + after).await
    }

    /// Removes the schedule; `false` when it was not set.
    ///
    /// # Errors
    ///
    /// No store, an invalid name, a store failure.
    pub async fn cancel(&self) -> Result<bool, AlarmError> {
        let name = self.checked_name()?.to_owned();
        let mut removed = false;
        let cancelled = modify(&self.slot, |row| {
            removed = row.schedules.remove(&name).is_some();
            Ok(())
        })
        .await;
        fenced(&self.slot, cancelled)?;
        Ok(removed)
    }

    /// When the schedule fires next; `None` when it is not set.
    ///
    /// # Errors
    ///
    /// No store, an invalid name, a store failure.
    pub async fn get(&self) -> Result<Option<SystemTime>, AlarmError> {
        let name = self.checked_name()?;
        let row = fenced(&self.slot, read(&self.slot).await)?;
        Ok(row
            .and_then(|row| row.schedules.get(name).copied())
            .map(time_of))
    }
}

/// Runs the instance's due alarm, if any. `wait`: queue behind a run in
/// progress (timers) instead of answering [`Run::Running`] (`_alarm`).
/// Runs in the instance's `alarm` span ([`Record::task_span`]).
pub(crate) async fn run(slot: &Arc<Record>, wait: bool) -> Result<Run, RunError> {
    let span = slot.task_span(crate::namespace::record::Work::Alarm);
    span.instrument(run_once(slot, wait))
        .await
        .inspect_err(|error| {
            if let RunError::Store(error) = error {
                crate::durable::abort_on_fence_lost(slot, error);
            }
        })
}

async fn run_once(slot: &Arc<Record>, wait: bool) -> Result<Run, RunError> {
    let Some(store) = slot.host.store.clone() else {
        return Ok(Run::Fired(false));
    };
    let state = slot.timer_turns();
    let _turn = if wait {
        state.run.lock().await
    } else {
        match state.run.try_lock() {
            Ok(turn) => turn,
            Err(_) => return Ok(Run::Running),
        }
    };
    let _entry = slot.hold();
    let (ns, id) = (&*slot.host.ns, &*slot.id);
    let epoch = slot.epoch().unwrap_or(0);
    let row = {
        let _row = state.row.lock().await;
        store
            .get_tray(InstanceKey::new(ns, id), ALARM_TRAY, epoch)
            .await
            .map_err(RunError::Store)?
    };
    let Some(row) = row.as_ref().and_then(|tray| AlarmRow::decode(&tray.doc)) else {
        return Ok(Run::Fired(false));
    };
    let now = wall_ms(&slot.host);
    let alarm_due = row.alarm.is_some_and(|at| at <= now);
    let mut due: Vec<(String, i64)> = row
        .schedules
        .iter()
        .filter(|(_, at)| **at <= now)
        .map(|(name, at)| (name.clone(), *at))
        .collect();
    due.sort_by_key(|(name, at)| (*at, name.clone()));
    if !alarm_due && due.is_empty() {
        // Not due yet (a sweep raced a newer `set`): keep the timer.
        if let Some(at) = row.at() {
            arm(&slot.host, &slot.id, at);
        }
        return Ok(Run::Fired(false));
    }
    let instance = slot.instance().ok_or(RunError::Closed)?;
    // Exclusive hosts: the alarm is a turn like a request, never inside one.
    let _turn = match &slot.turn {
        None => None,
        Some(turn) => tokio::select! {
            biased;
            () = slot.cancelled() => return Err(RunError::Closed),
            permit = turn.acquire() => Some(permit.map_err(|_| RunError::Closed)?),
        },
    };
    let mut failure: Option<String> = None;
    let mut alarm_ran = false;
    if alarm_due {
        *state.running.lock() = row.nonce.clone();
        let handler = (slot.host.lifecycle.alarm)(instance.clone(), slot.clone());
        let outcome = AssertUnwindSafe(handler).catch_unwind().await;
        *state.running.lock() = None;
        match outcome {
            Ok(Ok(())) => alarm_ran = true,
            Ok(Err(error)) => failure = Some(error.to_string()),
            Err(panic) => failure = Some(panic_message(panic.as_ref())),
        }
    }
    let mut fired: Vec<(String, i64)> = Vec::new();
    for (name, at) in due {
        let handler = (slot.host.lifecycle.scheduled)(instance.clone(), slot.clone(), name.clone());
        match AssertUnwindSafe(handler).catch_unwind().await {
            Ok(Ok(())) => fired.push((name, at)),
            Ok(Err(error)) => failure = Some(format!("schedule {name:?}: {error}")),
            Err(panic) => {
                failure = Some(format!(
                    "schedule {name:?}: {}",
                    panic_message(panic.as_ref())
                ));
            }
        }
    }
    if failure.is_some() {
        slot.host.metrics.callback_failed("alarm");
    }
    // Clear only what this run fired: an alarm `set` during the handler
    // replaced the nonce, a schedule set again changed its time; both stay.
    if alarm_ran || !fired.is_empty() {
        let fired_nonce = row.nonce.clone();
        modify(slot, |current| {
            if alarm_ran && current.nonce == fired_nonce {
                current.alarm = None;
                current.nonce = None;
            }
            for (name, at) in &fired {
                if current.schedules.get(name) == Some(at) {
                    current.schedules.remove(name);
                }
            }
            Ok(())
        })
        .await
        .map_err(|error| match error {
            AlarmError::Store(error) => RunError::Store(error),
            other => RunError::Handler(other.to_string()),
        })?;
    }
    match failure {
        Some(failure) => Err(RunError::Handler(failure)),
        None => Ok(Run::Fired(true)),
    }
}

/// The timers of `host`'s namespace, when it has a durable layer.
fn timers(host: &Namespace) -> Option<&DashMap<Arc<str>, Timer>> {
    Durable::of(host).map(|durable| &durable.timers)
}

/// Arms (or re-arms) the timer of `id` for wall time `at` (ms).
pub(crate) fn arm(host: &Arc<Namespace>, id: &str, at: i64) {
    let Some(timers) = timers(host) else {
        return;
    };
    let delay = Duration::from_millis(u64::try_from(at - wall_ms(host)).unwrap_or(0));
    let task_host = host.clone();
    let id: Arc<str> = Arc::from(id);
    let target = id.clone();
    // The timer holds the namespace: it is aborted when disarmed or
    // re-armed, at shut-down, and ends when the worker is dropped.
    let Some(handle) = host.domain.try_spawn(async move {
        tokio::select! {
            () = task_host.stop.cancelled() => {}
            () = tokio::time::sleep(delay) => fire(task_host, target, at).await,
        }
    }) else {
        return;
    };
    if let Some(previous) = timers.insert(
        id,
        Timer {
            at,
            handle: handle.abort_handle(),
        },
    ) {
        previous.handle.abort();
    }
}

/// Drops the timer of `id`.
pub(crate) fn disarm(host: &Namespace, id: &str) {
    if let Some((_, timer)) = timers(host).and_then(|timers| timers.remove(id)) {
        timer.handle.abort();
    }
}

/// A timer came due.
async fn fire(host: Arc<Namespace>, id: Arc<str>, at: i64) {
    // This timer is done; a newer one (re-armed meanwhile) stays.
    if let Some(timers) = timers(&host) {
        timers.remove_if(&*id, |_, timer| timer.at == at);
    }
    let outcome = if !host.control.fires_evicted_alarms() {
        // Behind pinboard only a resident instance inside the lease
        // fires here; the sweeper delivers the rest.
        let Some(slot) = host.resident_slot(&id) else {
            return;
        };
        if !host.control.lease_healthy() {
            return;
        }
        run(&slot, true).await
    } else {
        match host.enter(&id, None).await {
            Ok((entry, _)) => {
                let slot = entry.slot().clone();
                drop(entry);
                run(&slot, true).await
            }
            Err(Admission::Refused(refusal)) => Err(RunError::Handler(refusal.detail().to_owned())),
            Err(Admission::Paused) => Err(RunError::Paused),
            Err(_) => Err(RunError::Handler("activation failed".to_owned())),
        }
    };
    if let Err(error) = outcome {
        if matches!(error, RunError::Paused) {
            tracing::debug!(namespace = %host.ns, id = %id, "alarm due on a paused instance; it fires once resumed");
        } else {
            tracing::error!(namespace = %host.ns, id = %id, error = %pinned_edge::logging::Chain(&error), "alarm run failed; it fires again");
        }
        if host.control.fires_evicted_alarms() {
            let retry = wall_ms(&host)
                + i64::try_from(host.options.sweep_interval.as_millis()).unwrap_or(i64::MAX);
            if !timers(&host).is_some_and(|timers| timers.contains_key(&*id)) {
                arm(&host, &id, retry);
            }
        }
    }
}

/// Re-arms an activated instance's stored alarm.
pub(crate) fn rearm_from_store(host: &Arc<Namespace>, slot: &Arc<Record>) {
    let Some(store) = host.store.clone() else {
        return;
    };
    let host = host.clone();
    let slot = slot.clone();
    spawn_detached(&host.domain.clone(), async move {
        let epoch = slot.epoch().unwrap_or(0);
        match store
            .get_tray(InstanceKey::new(&host.ns, &slot.id), ALARM_TRAY, epoch)
            .await
        {
            Ok(Some(tray)) => {
                if let Some((at, _)) = parse(&tray.doc) {
                    arm(&host, &slot.id, at);
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(namespace = %host.ns, id = %slot.id, error = %pinned_edge::logging::Chain(&error), "cannot read the alarm row");
            }
        }
    });
}
