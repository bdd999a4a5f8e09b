//! The inspector's read side: a namespace's ids with durable state, paged
//! and filtered ([`list`]), and one id's rows decoded ([`show`]).
//!
//! Reads only through [`StateStore::peek`] and
//! [`StateStore::instance_ids`], which take no fence: looking never moves
//! an epoch. Must never write.

use futures_util::{StreamExt, TryStreamExt};
use pinned_store::{InstanceKey, Peek, PeekedRow, StateStore, StoreError};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::PAUSE_TRAY_ID;
use crate::durable::alarm::{ALARM_TRAY_ID, ALARM_TRAY_NS};
use crate::durable::tray::machine::{
    ADMITTED_KEY, ATTEMPTS_KEY, INBOX_KEY, PARKED_KEY, STATE_KEY, VERSION_KEY,
};
use crate::durable::tray::operate::DEAD_LETTERS_KEY;

/// Peeks run at once while a list page is read.
const PEEKS_AT_ONCE: usize = 8;

/// What a list page keeps of the ids it scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filter {
    /// Every id holding a row.
    All,
    /// Ids with a marked row (tray work pending).
    Marked,
    /// Ids with a parked tray.
    Parked,
    /// Ids whose alarm (or a schedule) is due.
    AlarmDue,
}

impl Filter {
    /// The filter named `name` (`marked`, `parked`, `alarm-due`).
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "all" => Some(Self::All),
            "marked" => Some(Self::Marked),
            "parked" => Some(Self::Parked),
            "alarm-due" => Some(Self::AlarmDue),
            _ => None,
        }
    }
}

/// One id of a list page.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Summary {
    id: String,
    rows: usize,
    epoch: Option<u64>,
    marked: bool,
    parked: bool,
    paused: bool,
    alarm_at_ms: Option<i64>,
    alarm_due: bool,
}

/// One list page: the ids kept, and the cursor to pass as `after` for the
/// next page (`None` once the namespace is read to its end).
#[derive(Debug, Serialize)]
pub(crate) struct Page {
    ns: String,
    ids: Vec<Summary>,
    next: Option<String>,
}

/// Scans up to `limit` ids of `ns` after `after` and keeps those `filter`
/// wants: a filtered page may hold fewer (even none) with a `next` to go on.
pub(crate) async fn list(
    store: &dyn StateStore,
    ns: &str,
    filter: Filter,
    after: Option<&str>,
    limit: usize,
    now_ms: i64,
) -> Result<Page, StoreError> {
    let ids = store.instance_ids(ns, after, limit).await?;
    let next = (ids.len() == limit).then(|| ids.last().cloned()).flatten();
    let peeks: Vec<(String, Peek)> = futures_util::stream::iter(ids)
        .map(|id| async move {
            let peek = store.peek(InstanceKey::new(ns, &id)).await?;
            Ok::<_, StoreError>((id, peek))
        })
        .buffered(PEEKS_AT_ONCE)
        .try_collect()
        .await?;
    let ids = peeks
        .into_iter()
        .map(|(id, peek)| summarize(id, &peek, now_ms))
        .filter(|summary| match filter {
            Filter::All => true,
            Filter::Marked => summary.marked,
            Filter::Parked => summary.parked,
            Filter::AlarmDue => summary.alarm_due,
        })
        .collect();
    Ok(Page {
        ns: ns.to_owned(),
        ids,
        next,
    })
}

fn summarize(id: String, peek: &Peek, now_ms: i64) -> Summary {
    let alarm_at_ms = alarm_row(peek).and_then(|row| row.doc.get("at").and_then(Value::as_i64));
    Summary {
        id,
        rows: peek.rows.len(),
        epoch: peek.epoch,
        marked: peek.rows.iter().any(|r| r.row.marked),
        parked: peek.rows.iter().any(is_parked),
        paused: pause_row(peek).is_some(),
        alarm_at_ms,
        alarm_due: alarm_at_ms.is_some_and(|at| at <= now_ms),
    }
}

fn is_parked(row: &PeekedRow) -> bool {
    row.row.tray_ns != ALARM_TRAY_NS && row.row.doc.get(PARKED_KEY) == Some(&Value::Bool(true))
}

fn alarm_row(peek: &Peek) -> Option<&pinned_store::TrayRow> {
    peek.rows
        .iter()
        .map(|r| &r.row)
        .find(|r| r.tray_ns == ALARM_TRAY_NS && r.tray_id == ALARM_TRAY_ID)
}

fn pause_row(peek: &Peek) -> Option<&pinned_store::TrayRow> {
    peek.rows
        .iter()
        .map(|r| &r.row)
        .find(|r| r.tray_ns == ALARM_TRAY_NS && r.tray_id == PAUSE_TRAY_ID)
}

/// The items of a `~inbox` entry in delivery order: a list, or the
/// reference's queue entry `{"taken": [...], "items": [...]}` (takes first).
pub(crate) fn inbox_items(entry: Option<&Value>) -> Vec<Value> {
    match entry {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::Object(queue)) => ["taken", "items"]
            .iter()
            .filter_map(|name| queue.get(*name).and_then(Value::as_array))
            .flatten()
            .cloned()
            .collect(),
        _ => Vec::new(),
    }
}

/// `instance`'s rows decoded: its epoch, pause, alarm and schedules, and
/// each tray row's fields and bookkeeping (inbox, head item, attempts,
/// park, dead letters), with the world that wrote it.
pub(crate) fn show(instance: InstanceKey<'_>, peek: &Peek, resident: bool, now_ms: i64) -> Value {
    let alarm = alarm_row(peek).map(|row| {
        let at = row.doc.get("at").and_then(Value::as_i64);
        json!({
            "atMs": at,
            "due": at.is_some_and(|at| at <= now_ms),
            "alarmMs": row.doc.get("alarm").cloned().or_else(|| {
                (!row.doc.contains_key("schedules")).then(|| at.map(Value::from)).flatten()
            }),
            "schedules": row.doc.get("schedules").cloned().unwrap_or_else(|| json!({})),
            "nonce": row.doc.get("nonce"),
        })
    });
    let trays: Vec<Value> = peek
        .rows
        .iter()
        .filter(|r| r.row.tray_ns != ALARM_TRAY_NS)
        .map(|r| {
            let doc = &r.row.doc;
            let fields: Map<String, Value> = doc
                .iter()
                .filter(|(name, _)| !name.starts_with('~'))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            let reserved = [
                VERSION_KEY,
                INBOX_KEY,
                ATTEMPTS_KEY,
                PARKED_KEY,
                STATE_KEY,
                ADMITTED_KEY,
                DEAD_LETTERS_KEY,
            ];
            let other: Map<String, Value> = doc
                .iter()
                .filter(|(name, _)| name.starts_with('~') && !reserved.contains(&name.as_str()))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            let inbox = inbox_items(doc.get(INBOX_KEY));
            json!({
                "tray": r.row.tray_ns,
                "key": r.row.tray_id,
                "marked": r.row.marked,
                "world": {"hostname": r.world.hostname, "env": r.world.env},
                "version": doc.get(VERSION_KEY),
                "fields": fields,
                "inbox": inbox.len(),
                "head": inbox.first(),
                "attempts": doc.get(ATTEMPTS_KEY).and_then(Value::as_u64).unwrap_or(0),
                "parked": is_parked(r),
                "dispatchState": doc.get(STATE_KEY),
                "dead": doc.get(DEAD_LETTERS_KEY).cloned().unwrap_or_else(|| json!([])),
                "other": other,
            })
        })
        .collect();
    let pinned: Vec<Value> = peek
        .rows
        .iter()
        .filter(|r| r.row.tray_ns == ALARM_TRAY_NS)
        .map(|r| {
            json!({
                "key": r.row.tray_id,
                "marked": r.row.marked,
                "world": {"hostname": r.world.hostname, "env": r.world.env},
                "doc": r.row.doc,
            })
        })
        .collect();
    json!({
        "ns": instance.ns,
        "id": instance.id,
        "epoch": peek.epoch,
        "rows": peek.rows.len(),
        "resident": resident,
        "paused": pause_row(peek).map(|row| Value::Object(row.doc.clone())),
        "alarm": alarm,
        "trays": trays,
        "pinnedRows": pinned,
    })
}
