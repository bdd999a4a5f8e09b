//! The operator's storage inspector on the worker: the ids of a namespace
//! that hold durable state ([`view::list`]), one id's rows decoded
//! ([`view::show`]) and the per-key controls ([`act`]): unpark a tray,
//! skip its head item into the tray's dead letters, pause and resume the
//! id's activation, delete the id's state. [`routes`] is their HTTP shell,
//! `/_pinned/state/…`, authenticated like every `/_pinned` route.
//!
//! Owns where the controls keep what they add:
//!
//! - **Pause**: the unmarked row `("pinned", "paused")`, doc
//!   `{"atMs": <when>, "by": <who>}`. Every activation of a durable
//!   namespace reads it first (in the same fenced call as the id's marked
//!   rows, which the trays open afterwards) and a paused id answers 503
//!   [`PAUSED_DETAIL`]; a resume deletes the row. It lives in the store, so
//!   it holds on every worker and across restarts.
//! - **Dead letters**: a skipped head item is acked without its handler
//!   and recorded in the tray row's own `~dead` list (the fields the ack
//!   changed, as they were, with the attempts, when and who; newest last,
//!   at most [`MAX_DEAD_LETTERS`](crate::durable::tray::operate::MAX_DEAD_LETTERS)).
//!
//! Reads are unfenced peeks ([`StateStore::peek`](pinned_store::StateStore::peek)):
//! they never move an epoch. Every action runs on this worker as the id's
//! owner, at the owner's epoch ([`act`] says how); it never writes a row
//! of an instance that is live behind its back.

use std::sync::Arc;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use http::StatusCode;
use pinned_store::{InstanceKey, TrayKey, TrayRow};

use crate::namespace::Record;
use crate::response;
use crate::BoxError;

pub(crate) mod act;
pub(crate) mod routes;
pub(crate) mod view;

/// The 503 `detail` of a request to a paused id.
pub(crate) use pinned_wire::refusal::PAUSED_DETAIL;
/// Tray id of the pause row (tray namespace `pinned`).
pub(crate) const PAUSE_TRAY_ID: &str = "paused";
/// The pause row's key within its instance.
pub(crate) const PAUSE_TRAY: TrayKey<'static> = TrayKey::new("pinned", PAUSE_TRAY_ID);
/// Ids a list page scans when the caller names no `limit`.
pub(crate) const DEFAULT_LIST_LIMIT: usize = 50;
/// Most ids one list page scans.
pub(crate) const MAX_LIST_LIMIT: usize = 200;

/// Ids held by an operator action under way on this worker: their
/// activation is refused until the action ends.
#[derive(Debug, Default)]
pub(crate) struct Holds(DashMap<String, ()>);

/// One held id; dropping it lets the id activate again.
pub(crate) struct Hold<'a> {
    holds: &'a Holds,
    id: String,
}

impl Holds {
    /// Holds `id`, `None` when another action holds it.
    pub(crate) fn hold(&self, id: &str) -> Option<Hold<'_>> {
        match self.0.entry(id.to_owned()) {
            dashmap::mapref::entry::Entry::Occupied(_) => None,
            dashmap::mapref::entry::Entry::Vacant(vacant) => {
                vacant.insert(());
                Some(Hold {
                    holds: self,
                    id: id.to_owned(),
                })
            }
        }
    }

    /// Whether an action holds `id`.
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.0.contains_key(id)
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.holds.0.remove(&self.id);
    }
}

/// Whether `record`'s id may activate (not held here, and no pause row):
/// `None` when it may not, else its marked rows, read with the pause row in
/// one fenced call (the activation's pending work).
pub(crate) fn admits<'a>(
    holds: &'a Holds,
    store: &'a dyn pinned_store::StateStore,
    record: &'a Arc<Record>,
) -> BoxFuture<'a, Result<Option<Vec<TrayRow>>, BoxError>> {
    async move {
        if holds.holds(&record.id) {
            return Ok(None);
        }
        let epoch = record.epoch().unwrap_or(0);
        let key = InstanceKey::new(&record.host.ns, &record.id);
        let rows = store.list_marked_and(key, epoch, PAUSE_TRAY).await?;
        let paused = rows.iter().any(|row| row.key() == PAUSE_TRAY);
        Ok((!paused).then_some(rows))
    }
    .boxed()
}

/// 503 [`PAUSED_DETAIL`].
pub(crate) fn paused_response() -> axum::response::Response {
    response::detail(StatusCode::SERVICE_UNAVAILABLE, PAUSED_DETAIL)
}
