//! The `StateStore` contract: rows, batch ops and the trait every backend implements.
//!
//! Owns the vocabulary (wire.md §12.1): a row is keyed `(ns, id, tray_ns, tray_id)` and
//! holds `(marked, doc)`; every operation carries the caller's epoch and is fenced
//! against the instance's stored epoch (wire.md §8.3). It must never hold backend code;
//! backends live in their own modules and share only this contract.

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::StoreError;

/// A tray's whole durable payload: always a JSON object.
///
/// The Python reference checks at run time that `doc` is a `dict` (`tray doc must be a
/// dict, got …`) and that `marked` and the `list` filters have the right types; here the
/// signatures make those mistakes unrepresentable, so no such errors exist.
pub type Doc = Map<String, Value>;

/// One row as returned by [`StateStore::get_tray`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tray {
    /// `true` while the tray holds in-flight work (the instance must be re-activated to
    /// finish it), `false` at rest.
    pub marked: bool,
    /// The tray's payload.
    pub doc: Doc,
}

/// One row as returned by [`StateStore::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrayRow {
    /// The tray namespace (the declared tray attribute name).
    pub tray_ns: String,
    /// The tray id (`"~"` for a singleton tray).
    pub tray_id: String,
    /// See [`Tray::marked`].
    pub marked: bool,
    /// The tray's payload.
    pub doc: Doc,
}

/// One step of [`StateStore::apply_batch`]: the reference's `("tray", tray_ns, tray_id,
/// marked, doc)` op, where `marked = None` deletes the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Upsert the whole row (as [`StateStore::set_tray`]).
    Set {
        /// Tray namespace.
        tray_ns: String,
        /// Tray id.
        tray_id: String,
        /// New `marked` flag.
        marked: bool,
        /// New payload.
        doc: Doc,
    },
    /// Delete the row if present (as [`StateStore::delete_tray`]).
    Delete {
        /// Tray namespace.
        tray_ns: String,
        /// Tray id.
        tray_id: String,
    },
}

// === impl BatchOp ===

impl BatchOp {
    /// An upsert of `(tray_ns, tray_id)`.
    pub fn set(
        tray_ns: impl Into<String>,
        tray_id: impl Into<String>,
        marked: bool,
        doc: Doc,
    ) -> Self {
        BatchOp::Set {
            tray_ns: tray_ns.into(),
            tray_id: tray_id.into(),
            marked,
            doc,
        }
    }

    /// A delete of `(tray_ns, tray_id)`.
    pub fn delete(tray_ns: impl Into<String>, tray_id: impl Into<String>) -> Self {
        BatchOp::Delete {
            tray_ns: tray_ns.into(),
            tray_id: tray_id.into(),
        }
    }

    /// The reference's op shape: `marked = None` deletes (and ignores `doc`), otherwise
    /// upserts `(marked, doc)`.
    pub fn tray(
        tray_ns: impl Into<String>,
        tray_id: impl Into<String>,
        marked: Option<bool>,
        doc: Doc,
    ) -> Self {
        match marked {
            Some(marked) => BatchOp::set(tray_ns, tray_id, marked, doc),
            None => BatchOp::delete(tray_ns, tray_id),
        }
    }

    /// The `(tray_ns, tray_id)` this op touches.
    pub fn key(&self) -> (&str, &str) {
        match self {
            BatchOp::Set {
                tray_ns, tray_id, ..
            }
            | BatchOp::Delete { tray_ns, tray_id } => (tray_ns, tray_id),
        }
    }
}

/// Durable instance state as one row per tray, fenced by placement epoch.
///
/// Every operation takes the caller's `epoch` and first *acquires* the instance
/// `(ns, id)` atomically with the operation itself: an epoch below the stored instance
/// epoch fails with [`StoreError::FenceLost`] and applies nothing; an epoch at or above
/// it raises the stored epoch to `epoch` and runs. An instance never seen is at epoch 0.
/// Reads acquire too, so a read at a higher epoch fences out every older writer.
///
/// Operations on one instance that are awaited one after another apply in that order;
/// concurrent operations on one instance are serialized in the order they reach the
/// store. Operations on different instances run in parallel. A successful
/// return means the effect is committed (durable for the SQLite and Postgres stores).
///
/// The trait is object safe: the worker holds it as `Arc<dyn StateStore>`.
///
/// # Errors
///
/// Every method can fail with [`StoreError::FenceLost`] and with
/// [`StoreError::EpochOutOfRange`] for an epoch above `i64::MAX`; the others are backend
/// failures, classified by [`StoreError::retryable`].
///
/// # Cancel safety
///
/// Dropping a returned future before it completes leaves the operation either fully
/// applied or not applied at all; which one is unknown to the caller.
#[async_trait]
#[allow(clippy::too_many_arguments)] // mirrors the op signatures of wire.md §12.1
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// Fences, then upserts the whole row `(tray_ns, tray_id)` of instance `(ns, id)`
    /// with `(marked, doc)`. Idempotent.
    async fn set_tray(
        &self,
        ns: &str,
        id: &str,
        tray_ns: &str,
        tray_id: &str,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError>;

    /// Fences, then deletes the row if present. Idempotent.
    async fn delete_tray(
        &self,
        ns: &str,
        id: &str,
        tray_ns: &str,
        tray_id: &str,
        epoch: u64,
    ) -> Result<(), StoreError>;

    /// Fences, then reads one row: `None` when absent.
    async fn get_tray(
        &self,
        ns: &str,
        id: &str,
        tray_ns: &str,
        tray_id: &str,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError>;

    /// Fences, then returns every row of the instance, ordered by `(tray_ns, tray_id)`
    /// (byte order), keeping only rows whose `tray_ns` equals the `tray_ns` filter and
    /// whose `marked` equals the `marked` filter, when given (filters AND together).
    async fn list(
        &self,
        ns: &str,
        id: &str,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError>;

    /// Fences once, then applies `ops` in order, all or nothing. An empty batch only
    /// fences (and may advance the stored epoch).
    async fn apply_batch(
        &self,
        ns: &str,
        id: &str,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError>;
}

/// Refuses epochs that do not fit the stores' signed 64-bit column.
pub(crate) fn check_epoch(epoch: u64) -> Result<i64, StoreError> {
    i64::try_from(epoch).map_err(|_| StoreError::EpochOutOfRange { epoch })
}
