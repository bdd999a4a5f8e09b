//! [`TrayEnv`]: what an open tray is given by the instance that holds it
//! (its slot, its durable log, its store, and the open map as an [`OpenMap`]), built
//! once per instance by the open map.
//!
//! The open map sits above the tray and names it; the tray reaches back
//! only through this, so it never names the map's file. Nothing here
//! opens, pumps or writes anything.

use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;
use pinned_store::StateStore;

use super::frontier::Frontier;
use super::opened::Opened;
use super::TrayError;
use crate::namespace::Record;

/// What an open tray asks of the map that holds it open.
pub(crate) trait OpenMap: Send + Sync {
    /// Removes a passivated or deleted tray from the map, if `tray` (by
    /// address) is still the one open under its key.
    fn forget(&self, name: &'static str, key: &str, tray: *const ());

    /// Passivates `tray` (by address) when nothing but the map and
    /// `holders - 1` others hold it: true when it left the map.
    fn passivate(&self, name: &'static str, key: &str, tray: *const (), holders: usize) -> bool;

    /// The tray named `name` under `key` on this instance, opened from its
    /// row if it is not open; `None` when it does not exist (never created,
    /// or deleted) or is not declared.
    fn resolve(
        self: Arc<Self>,
        name: String,
        key: String,
    ) -> BoxFuture<'static, Result<Option<Arc<dyn Opened>>, TrayError>>;
}

/// The surroundings of every tray one instance opens.
#[derive(Clone)]
pub(crate) struct TrayEnv {
    /// Weak: the slot holds its trays strongly (until the end of its
    /// teardown), so a strong pointer back would be a cycle.
    pub(crate) slot: Weak<Record>,
    /// The instance's durable log, shared by all its trays.
    pub(crate) frontier: Arc<Frontier>,
    /// The store, for the reads of paged fields.
    pub(crate) store: Arc<dyn StateStore>,
    /// Weak, like the slot: the map owns the trays in it.
    pub(crate) map: Weak<dyn OpenMap>,
}
