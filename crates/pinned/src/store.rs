//! [`InstanceStore`]: the instance's view of the worker's `StateStore`,
//! bound to its `(ns, id)` and writing at its placement epoch.
//!
//! It refuses instance writes to the reserved tray namespace `pinned`
//! (the alarm row lives there) and otherwise passes straight through; it
//! never caches.

use std::sync::Arc;

use pinned_store::{BatchOp, Doc, StateStore, StoreError, Tray, TrayRow};

use crate::slot::Slot;

/// The tray namespace reserved for the worker's own rows (alarms).
pub const RESERVED_TRAY_NS: &str = "pinned";

/// Why an instance store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstanceStoreError {
    /// Instance code may not write the reserved tray namespace `pinned`.
    #[error("tray namespace {0:?} is reserved for pinned itself")]
    Reserved(String),
    /// The store refused or failed (a `FenceLost` means a newer activation
    /// owns the instance).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The instance's durable rows. Get it from
/// [`Context::store`](crate::Context::store).
#[derive(Clone)]
pub struct InstanceStore {
    store: Arc<dyn StateStore>,
    slot: Arc<Slot>,
}

impl std::fmt::Debug for InstanceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceStore")
            .field("ns", &self.slot.host.ns)
            .field("id", &self.slot.id)
            .finish()
    }
}

fn writable(tray_ns: &str) -> Result<(), InstanceStoreError> {
    if tray_ns == RESERVED_TRAY_NS {
        return Err(InstanceStoreError::Reserved(tray_ns.to_owned()));
    }
    Ok(())
}

impl InstanceStore {
    pub(crate) fn new(store: Arc<dyn StateStore>, slot: Arc<Slot>) -> Self {
        Self { store, slot }
    }

    /// The epoch every operation carries: the instance's placement epoch,
    /// 0 before any admitted epoch (local mode).
    pub fn epoch(&self) -> u64 {
        self.slot.epoch().unwrap_or(0)
    }

    /// Upserts tray `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// The reserved namespace, a lost fence, a store failure.
    pub async fn set_tray(
        &self,
        tray_ns: &str,
        tray_id: &str,
        marked: bool,
        doc: Doc,
    ) -> Result<(), InstanceStoreError> {
        writable(tray_ns)?;
        let (ns, id) = (&*self.slot.host.ns, &*self.slot.id);
        Ok(self
            .store
            .set_tray(ns, id, tray_ns, tray_id, marked, doc, self.epoch())
            .await?)
    }

    /// Deletes tray `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// The reserved namespace, a lost fence, a store failure.
    pub async fn delete_tray(
        &self,
        tray_ns: &str,
        tray_id: &str,
    ) -> Result<(), InstanceStoreError> {
        writable(tray_ns)?;
        let (ns, id) = (&*self.slot.host.ns, &*self.slot.id);
        Ok(self
            .store
            .delete_tray(ns, id, tray_ns, tray_id, self.epoch())
            .await?)
    }

    /// Reads tray `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// A lost fence, a store failure.
    pub async fn get_tray(
        &self,
        tray_ns: &str,
        tray_id: &str,
    ) -> Result<Option<Tray>, InstanceStoreError> {
        let (ns, id) = (&*self.slot.host.ns, &*self.slot.id);
        Ok(self
            .store
            .get_tray(ns, id, tray_ns, tray_id, self.epoch())
            .await?)
    }

    /// Every row of the instance, filtered (ANDed), ordered by
    /// `(tray_ns, tray_id)`.
    ///
    /// # Errors
    ///
    /// A lost fence, a store failure.
    pub async fn list(
        &self,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, InstanceStoreError> {
        let (ns, id) = (&*self.slot.host.ns, &*self.slot.id);
        Ok(self
            .store
            .list(ns, id, self.epoch(), tray_ns, marked)
            .await?)
    }

    /// Applies `ops` atomically, in order.
    ///
    /// # Errors
    ///
    /// An op in the reserved namespace, a lost fence, a store failure.
    pub async fn apply_batch(&self, ops: Vec<BatchOp>) -> Result<(), InstanceStoreError> {
        for op in &ops {
            writable(op.key().0)?;
        }
        let (ns, id) = (&*self.slot.host.ns, &*self.slot.id);
        Ok(self.store.apply_batch(ns, id, ops, self.epoch()).await?)
    }
}
