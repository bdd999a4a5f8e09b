//! The two-phase ledger of keyed cross-tray dispatch
//! ([`TrayCtx::dispatch`](super::TrayCtx::dispatch)), in the reference's
//! rows: the source tray's `~dispatch` lists the keyed admissions its head
//! item made (`{"key", "target": [tray_ns, tray_id], "outcome", "cleaned"}`),
//! the target tray's `~ignore` lists the keys admitted into it and not yet
//! released.
//!
//! Phase one, the admission: the target's row (the edit, its queue appends
//! tagged `~admit` with the key, the key added to `~ignore`) is enlisted,
//! then the source's record. A re-run of the item finds its record and
//! admits nothing; a re-run whose record was lost finds the key in the
//! target's `~ignore` (or its tagged entries still queued) and absorbs the
//! appends. Phase two, before the item's ack: each record's key is released
//! from its target's `~ignore`, then the record is marked cleaned. The ack
//! drops the records in the same row write as the item's pop, so a re-run
//! after a crash before the ack still finds them.
//!
//! Nobody waits for these writes, so they are enlisted to land soon, not
//! now: under a handler that makes its admissions and returns, phase one,
//! phase two and the ack leave the log in one batch, one store write for
//! the item. A batch lands whole or not at all and in enlist order, so
//! every state a crash can leave is one the write-by-write order could
//! leave too (or the state before the item ran, which redelivers it).
//!
//! It owns those two entries and nothing else: it never acks an item, and
//! it reaches other trays only through the open map the tray was given.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::field::{Entry, Fields};
use super::frontier::{Receipt, Urgency};
use super::keyed::KeyedAdmission;
use super::machine::{OpenTray, TrayState};
use super::row::Entries;
use super::{Tray, TrayError};

/// The source tray's records of its head item's keyed admissions.
pub(crate) const DISPATCH_KEY: &str = "~dispatch";
/// The target tray's keys admitted and not yet released.
pub(crate) const IGNORE_KEY: &str = "~ignore";

/// What [`TrayCtx::dispatch`](super::TrayCtx::dispatch) did with the
/// admission (the reference's outcome strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dispatched {
    /// The edit's queue appends landed in the target (or it made none and
    /// the target did not hold the key).
    Admitted,
    /// The key was admitted before (this item ran before): nothing was
    /// appended again.
    Absorbed,
}

impl Dispatched {
    /// `"admitted"` or `"absorbed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Absorbed => "absorbed",
        }
    }
}

/// One entry of `~dispatch`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) key: Json,
    /// `[tray_ns, tray_id]`.
    pub(crate) target: (String, String),
    pub(crate) outcome: Dispatched,
    pub(crate) cleaned: bool,
}

fn decoded<V: serde::de::DeserializeOwned + Default>(
    doc: &Entries,
    name: &str,
) -> Result<V, String> {
    doc.get(name)
        .map(|entry| serde_json::from_str(entry.json()))
        .transpose()
        .map(Option::unwrap_or_default)
        .map_err(|error| format!("malformed {name}: {error}"))
}

fn put<V: Serialize>(
    state: &mut TrayState<impl Tray>,
    name: &str,
    list: &[V],
) -> Result<(), TrayError> {
    let entry = if list.is_empty() {
        None
    } else {
        Some(Entry::of(list).map_err(|error| TrayError::Encode(format!("{name}: {error}")))?)
    };
    state.changed |= state.doc.put(name, entry);
    Ok(())
}

impl<T: Tray> OpenTray<T> {
    fn ledger_malformed(&self, reason: String) -> TrayError {
        TrayError::Malformed {
            tray: T::NAME.to_owned(),
            key: self.key.clone(),
            reason,
        }
    }

    fn records(&self, state: &TrayState<T>) -> Result<Vec<Record>, TrayError> {
        decoded(&state.doc, DISPATCH_KEY).map_err(|reason| self.ledger_malformed(reason))
    }

    fn ignored(&self, state: &TrayState<T>) -> Result<Vec<Json>, TrayError> {
        decoded(&state.doc, IGNORE_KEY).map_err(|reason| self.ledger_malformed(reason))
    }

    /// The record of the head item's admission under `key`, if it made one.
    pub(crate) fn dispatch_record(&self, key: &Json) -> Result<Option<Record>, TrayError> {
        let state = self.state.lock();
        Ok(self
            .records(&state)?
            .into_iter()
            .find(|record| record.key == *key))
    }

    /// Phase one on the target: admits `edit` (mark, edit, its queue
    /// appends tagged or absorbed) and adds `key` to `~ignore`, in one row
    /// write; the pump starts.
    pub(crate) fn admit_keyed(
        self: &Arc<Self>,
        key: &Json,
        edit: impl FnOnce(&mut T),
    ) -> Result<Dispatched, TrayError> {
        let outcome = {
            let mut state = self.state.lock();
            self.writable(&state)?;
            let mut ignored = self.ignored(&state)?;
            let mut admission = KeyedAdmission::new(key, ignored.contains(key));
            let mut before: Vec<(&'static str, u64)> = Vec::new();
            state.tray.fields(&mut Fields::new(&mut |name, field| {
                if let Some(keyed) = field.keyed() {
                    before.push((name, keyed.appended()));
                }
            }));
            Self::set_marked(&mut state, true);
            self.segment(&mut state, edit)?;
            state.tray.fields(&mut Fields::new(&mut |name, field| {
                let since = before.iter().find(|(field, _)| *field == name);
                if let (Some(keyed), Some((_, since))) = (field.keyed(), since) {
                    keyed.admit_appended(*since, &mut admission);
                }
            }));
            let outcome = if admission.absorbed() {
                Dispatched::Absorbed
            } else {
                Dispatched::Admitted
            };
            if !ignored.contains(key) {
                ignored.push(key.clone());
                put(&mut state, IGNORE_KEY, &ignored)?;
            }
            // Counts the target's next delivery with it when its pump is idle;
            // the write lands with the source's record (see `record_dispatch`).
            let _receipt = self.commit_admission(&mut state)?;
            outcome
        };
        self.start_pump();
        Ok(outcome)
    }

    /// Phase one on the source: records the admission, after the target's
    /// write on the instance's log.
    pub(crate) fn record_dispatch(&self, record: Record) -> Result<Receipt, TrayError> {
        let mut state = self.state.lock();
        self.writable(&state)?;
        let mut records = self.records(&state)?;
        records.push(record);
        put(&mut state, DISPATCH_KEY, &records)?;
        // Nobody waits for it (a handler that must, awaits `written`): it
        // leaves with the next write that must land now, at the latest the
        // item's ack with the next delivery's count.
        self.commit_with(&mut state, Urgency::Soon)
    }

    /// Phase two on the target: releases `key` from `~ignore`.
    pub(crate) fn release(&self, key: &Json) -> Result<(), TrayError> {
        let mut state = self.state.lock();
        let mut ignored = self.ignored(&state)?;
        let before = ignored.len();
        ignored.retain(|held| held != key);
        if ignored.len() == before {
            return Ok(());
        }
        self.writable(&state)?;
        put(&mut state, IGNORE_KEY, &ignored)?;
        // Phase two leaves with the source's ack, in one batch.
        let _receipt = self.commit_with(&mut state, Urgency::Soon)?;
        Ok(())
    }

    /// Phase two on the source, before the head item's ack: every record
    /// not yet cleaned has its key released from its target, then is
    /// marked cleaned. A target that no longer exists took its `~ignore`
    /// with it.
    pub(crate) async fn settle(self: &Arc<Self>) -> Result<(), TrayError> {
        let pending: Vec<Record> = {
            let state = self.state.lock();
            self.records(&state)?
                .into_iter()
                .filter(|record| !record.cleaned)
                .collect()
        };
        for record in pending {
            let map = self.owner.upgrade().ok_or(TrayError::Closed)?;
            let (tray_ns, tray_id) = &record.target;
            if let Some(target) = map.resolve(tray_ns.clone(), tray_id.clone()).await? {
                target.release(&record.key)?;
            }
            let mut state = self.state.lock();
            let mut records = self.records(&state)?;
            for held in &mut records {
                if held.key == record.key {
                    held.cleaned = true;
                }
            }
            put(&mut state, DISPATCH_KEY, &records)?;
            let _receipt = self.commit_with(&mut state, Urgency::Soon)?;
        }
        Ok(())
    }

    /// Drops the records, as part of the head item's ack.
    pub(crate) fn purge_dispatches(state: &mut TrayState<T>) {
        state.changed |= state.doc.put(DISPATCH_KEY, None);
    }
}
