//! The inspector's per-key controls, run on the id's owner: unpark a tray,
//! skip its head item into its dead letters, pause and resume the id,
//! delete its state.
//!
//! Unpark and skip work on the tray itself: the id is entered at the
//! owner's epoch (activated if it was not resident, its parked tray
//! reopening from its marked row) and the open tray does it under its
//! lock, writing through its frontier
//! ([`Operated`](crate::durable::tray::operate::Operated)). Pause, resume and
//! delete work on rows: the id is held on this worker (its activation is
//! refused meanwhile), a resident instance is aborted and waited out, then
//! the rows are read and written in fenced steps at the owner's epoch, so
//! the store refuses the write (409) when a newer owner took the id
//! meanwhile. Must never write the rows of a live instance.

use std::sync::Arc;
use std::time::Duration;

use pinned_store::{BatchOp, Doc, InstanceKey, StateStore, StoreError, TrayRow};
use serde_json::{json, Value};

use super::PAUSE_TRAY_ID;
use crate::durable::alarm::ALARM_TRAY_NS;
use crate::durable::tray::operate::OperateError;
use crate::durable::tray::{InstanceTrays, TrayError};
use crate::durable::Durable;
use crate::namespace::{Admission, Namespace};

/// How long an action waits for a resident instance it aborted to leave.
pub(crate) const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

/// One control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Clear a tray's park and attempts: its head item is delivered afresh.
    Unpark,
    /// Move a tray's head item to its dead letters.
    Skip,
    /// Refuse the id's activation until resumed.
    Pause,
    /// Undo a pause.
    Resume,
    /// Delete every row of the id (its epoch stays).
    Delete,
}

impl Action {
    /// The action named `name`.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "unpark" => Some(Self::Unpark),
            "skip" => Some(Self::Skip),
            "pause" => Some(Self::Pause),
            "resume" => Some(Self::Resume),
            "delete" => Some(Self::Delete),
            _ => None,
        }
    }

    /// Its name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Unpark => "unpark",
            Self::Skip => "skip",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Delete => "delete",
        }
    }

    /// Whether it works on one tray row (and needs its key).
    pub(crate) fn needs_tray(self) -> bool {
        matches!(self, Self::Unpark | Self::Skip)
    }
}

/// Why an action was not done.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActError {
    /// Another action holds the id on this worker: 409.
    #[error("another operator action on this id is under way; retry")]
    Busy,
    /// The resident instance did not leave in time: 503.
    #[error("the resident instance did not close within {0:?}; retry")]
    StillResident(Duration),
    /// The action does not apply to the rows as they are: 409.
    #[error("{0}")]
    Inapplicable(String),
    /// The epoch was superseded: a newer owner took the id: 409.
    #[error("{0}; a newer owner took the id, act through it")]
    Superseded(StoreError),
    /// The store failed: 503.
    #[error("store failed: {0}")]
    Store(StoreError),
    /// The id could not be entered (a refusal, a failed activation): 503.
    #[error("{0}")]
    NotEntered(String),
}

impl From<StoreError> for ActError {
    fn from(error: StoreError) -> Self {
        if error.is_fence_lost() {
            Self::Superseded(error)
        } else {
            Self::Store(error)
        }
    }
}

/// Who asked and which tray row, as the caller names them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Request {
    /// The tray namespace (for unpark and skip).
    pub(crate) tray: Option<String>,
    /// The tray id (`~` for a singleton tray).
    pub(crate) key: String,
    /// Who asked (recorded with a pause and a dead letter).
    pub(crate) by: String,
}

/// Runs `action` on `id` of `host` at `epoch` (`None`: local mode), as
/// its owner.
pub(crate) async fn act(
    host: &Arc<Namespace>,
    durable: &Durable,
    store: &dyn StateStore,
    id: &str,
    epoch: Option<u64>,
    action: Action,
    request: &Request,
) -> Result<Value, ActError> {
    let now_ms = i64::try_from(host.domain.unix_ms()).unwrap_or(i64::MAX);
    let (outcome, epoch, closed) = match action {
        Action::Unpark | Action::Skip => {
            let (outcome, epoch) = on_tray(host, id, epoch, action, request, now_ms).await?;
            (outcome, epoch, false)
        }
        Action::Pause | Action::Resume | Action::Delete => {
            on_rows(host, durable, store, id, epoch, action, request, now_ms).await?
        }
    };
    tracing::info!(namespace = %host.ns, %id, epoch, action = action.name(), by = %request.by, "operator action applied");
    Ok(json!({
        "ok": true,
        "ns": &*host.ns,
        "id": id,
        "action": action.name(),
        "epoch": epoch,
        "closedInstance": closed,
        "outcome": outcome,
    }))
}

/// Unpark or skip inside the live instance.
async fn on_tray(
    host: &Arc<Namespace>,
    id: &str,
    epoch: Option<u64>,
    action: Action,
    request: &Request,
    now_ms: i64,
) -> Result<(Value, u64), ActError> {
    let tray = request.tray.as_deref().unwrap_or_default();
    let (entry, _) = host
        .enter(id, epoch)
        .await
        .map_err(|refused| match refused {
            Admission::Paused => {
                ActError::Inapplicable("the id is paused: resume it first".to_owned())
            }
            Admission::Refused(refusal) => ActError::NotEntered(refusal.detail().to_owned()),
            Admission::ActivationFailed | Admission::ShutDown => {
                ActError::NotEntered("the instance failed to activate".to_owned())
            }
        })?;
    let slot = entry.slot().clone();
    let open = InstanceTrays::of(&slot)
        .and_then(|trays| trays.operated(tray, &request.key))
        .ok_or_else(|| {
            ActError::Inapplicable(format!(
                "tray {tray}/{} is not open on the instance (not declared, or nothing pending there)",
                request.key
            ))
        })?;
    let done = match action {
        Action::Unpark => open.operator_unpark().await,
        _ => open.operator_skip(request.by.clone(), now_ms).await,
    };
    drop(entry);
    let outcome = done.map_err(|error| match error {
        OperateError::Inapplicable(reason) => ActError::Inapplicable(reason),
        OperateError::Tray(TrayError::Store(error)) => ActError::from(error),
        OperateError::Tray(other) => ActError::NotEntered(other.to_string()),
    })?;
    Ok((outcome, slot.epoch().unwrap_or(0)))
}

/// Pause, resume or delete on the rows, the instance held and closed.
#[allow(clippy::too_many_arguments)]
async fn on_rows(
    host: &Arc<Namespace>,
    durable: &Durable,
    store: &dyn StateStore,
    id: &str,
    epoch: Option<u64>,
    action: Action,
    request: &Request,
    now_ms: i64,
) -> Result<(Value, u64, bool), ActError> {
    let Some(_hold) = durable.holds.hold(id) else {
        return Err(ActError::Busy);
    };
    let closed = match host.slot(id) {
        Some(slot) => {
            tracing::info!(namespace = %host.ns, %id, action = action.name(), "aborting the instance for an operator action");
            Namespace::abort(&slot);
            tokio::time::timeout(CLOSE_PATIENCE, host.wait_gone(&slot))
                .await
                .map_err(|_| ActError::StillResident(CLOSE_PATIENCE))?;
            true
        }
        None => false,
    };
    let instance = InstanceKey::new(&host.ns, id);
    // Locally the one worker owns every id at its stored epoch.
    let epoch = match epoch {
        Some(epoch) => epoch,
        None => store.peek(instance).await?.epoch.unwrap_or(0),
    };
    let rows = store.list(instance, epoch, None, None).await?;
    let (ops, outcome) = plan(&rows, action, request, now_ms);
    match action {
        Action::Delete => {
            store.delete_instance(instance, epoch).await?;
            crate::durable::alarm::disarm(host, id);
        }
        _ => store.apply_batch(instance, ops, epoch).await?,
    }
    // Locally no sweeper wakes an id whose rows claim work.
    if action == Action::Resume
        && host.control.fires_evicted_alarms()
        && rows.iter().any(|row| row.marked)
    {
        drop(_hold);
        let (host, id) = (host.clone(), id.to_owned());
        crate::namespace::spawn_detached(&host.domain.clone(), async move {
            crate::durable::tray::wake::wake(&host, &id).await;
        });
    }
    Ok((outcome, epoch, closed))
}

/// The row writes of a pause, a resume or a delete of `rows`, and what it
/// did, as JSON.
fn plan(rows: &[TrayRow], action: Action, request: &Request, now_ms: i64) -> (Vec<BatchOp>, Value) {
    let paused = rows
        .iter()
        .any(|r| r.tray_ns == ALARM_TRAY_NS && r.tray_id == PAUSE_TRAY_ID);
    match action {
        Action::Pause => {
            let doc = json!({"atMs": now_ms, "by": request.by});
            let doc: Doc = doc.as_object().cloned().unwrap_or_default();
            (
                vec![BatchOp::set(ALARM_TRAY_NS, PAUSE_TRAY_ID, false, doc)],
                json!({"paused": true, "wasPaused": paused}),
            )
        }
        Action::Resume => (
            vec![BatchOp::delete(ALARM_TRAY_NS, PAUSE_TRAY_ID)],
            json!({"paused": false, "wasPaused": paused}),
        ),
        _ => (Vec::new(), json!({"deletedRows": rows.len()})),
    }
}
