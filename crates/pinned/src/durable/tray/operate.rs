//! The operator's controls on one open tray ([`Operated`]): unpark it, or
//! skip its head item into its dead letters. The storage inspector
//! (`durable::inspect`) reaches them through the instance's open map, so
//! they run inside the live instance, under the tray's lock, and write
//! through its frontier like any other change.
//!
//! A Rust tray's items live in its typed fields, so a skip acks the head
//! without running the handler and records what the ack removed: the
//! fields it changed, as they were (each up to [`MAX_DEAD_FIELD_BYTES`]).
//! Never runs a handler or a hook.

use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::field::Entry;
use super::machine::OpenTray;
use super::{Fields, Tray, TrayError};

/// The tray row entry holding skipped items (a list, newest last).
pub(crate) const DEAD_LETTERS_KEY: &str = "~dead";
/// Most dead letters one tray row keeps (the oldest drop).
pub(crate) const MAX_DEAD_LETTERS: usize = 100;
/// Longest field value a dead letter keeps as it was; a longer one is
/// recorded as `{"truncated": <bytes>}`.
pub(crate) const MAX_DEAD_FIELD_BYTES: usize = 4096;

/// Why a control did not apply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OperateError {
    /// The tray's state does not allow it (not parked, dry, busy).
    #[error("{0}")]
    Inapplicable(String),
    /// The tray refused the write (closed, deleted, a panic, a store failure).
    #[error(transparent)]
    Tray(#[from] TrayError),
}

/// An open tray as the operator's controls see it, erased over its type.
pub(crate) trait Operated: Send + Sync {
    /// Clears the park and the delivery count and restarts the pump.
    fn operator_unpark(
        self: Arc<Self>,
    ) -> futures_util::future::BoxFuture<'static, Result<Json, OperateError>>;
    /// Acks the head item without running the handler, records it in the
    /// dead letters, and restarts the pump on the next item.
    fn operator_skip(
        self: Arc<Self>,
        by: String,
        now_ms: i64,
    ) -> futures_util::future::BoxFuture<'static, Result<Json, OperateError>>;
}

impl<T: Tray> Operated for OpenTray<T> {
    fn operator_unpark(
        self: Arc<Self>,
    ) -> futures_util::future::BoxFuture<'static, Result<Json, OperateError>> {
        Box::pin(async move {
            let (receipt, attempts) = {
                let mut state = self.state.lock();
                self.writable(&state)?;
                if !state.parked {
                    return Err(OperateError::Inapplicable(format!(
                        "tray {} is not parked",
                        self.label()
                    )));
                }
                let attempts = state.attempts;
                state.parked = false;
                state.attempts = 0;
                state.changed = true;
                OpenTray::<T>::set_marked(&mut state, true);
                (self.commit(&mut state)?, attempts)
            };
            self.start_pump();
            receipt.await?;
            Ok(json!({"unparked": true, "attempts": attempts}))
        })
    }

    fn operator_skip(
        self: Arc<Self>,
        by: String,
        now_ms: i64,
    ) -> futures_util::future::BoxFuture<'static, Result<Json, OperateError>> {
        Box::pin(async move {
            let (receipt, letter) = {
                let mut state = self.state.lock();
                self.writable(&state)?;
                if state.active.is_some() {
                    return Err(OperateError::Inapplicable(format!(
                        "tray {} is delivering its head item now; skip it once parked",
                        self.label()
                    )));
                }
                let Some(item) = state.tray.head() else {
                    return Err(OperateError::Inapplicable(format!(
                        "tray {} has no item to skip",
                        self.label()
                    )));
                };
                let before: Vec<(&'static str, Option<Entry>)> = state
                    .fields
                    .iter()
                    .map(|name| (*name, state.doc.get(name).cloned()))
                    .collect();
                self.segment(&mut state, |tray| {
                    tray.ack(&item);
                    tray.fields(&mut Fields::new(&mut |_, field| field.commit_takes()));
                })?;
                let attempts = state.attempts;
                state.attempts = 0;
                // A delivery an admission counted was of this item.
                state.primed = false;
                state.parked = false;
                state.dispatch_state = None;
                state.changed = true;
                let dry = state.tray.head().is_none() && state.inbox.is_empty();
                OpenTray::<T>::set_marked(&mut state, !dry);
                // The commit re-encodes the fields the ack changed.
                let _fields = self.commit(&mut state)?;
                let removed: serde_json::Map<String, Json> = before
                    .into_iter()
                    .filter(|(name, entry)| state.doc.get(name) != entry.as_ref())
                    .map(|(name, entry)| {
                        let value = match entry {
                            None => Json::Null,
                            Some(entry) if entry.json().len() > MAX_DEAD_FIELD_BYTES => {
                                json!({"truncated": entry.json().len()})
                            }
                            Some(entry) => serde_json::from_str(entry.json()).unwrap_or(Json::Null),
                        };
                        (name.to_owned(), value)
                    })
                    .collect();
                let mut dead: Vec<Json> = state
                    .doc
                    .get(DEAD_LETTERS_KEY)
                    .and_then(|entry| serde_json::from_str(entry.json()).ok())
                    .unwrap_or_default();
                let letter = json!({"fieldsBefore": removed, "attempts": attempts, "atMs": now_ms, "by": by});
                dead.push(letter.clone());
                let excess = dead.len().saturating_sub(MAX_DEAD_LETTERS);
                dead.drain(..excess);
                let entry =
                    Entry::of(&dead).map_err(|error| TrayError::Encode(error.to_string()))?;
                state.changed |= state.doc.put(DEAD_LETTERS_KEY, Some(entry));
                (self.commit(&mut state)?, letter)
            };
            self.start_pump();
            receipt.await?;
            Ok(json!({"skipped": letter}))
        })
    }
}
