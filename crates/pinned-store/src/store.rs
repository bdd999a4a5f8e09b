//! The `StateStore` contract: rows, batch ops and the trait every backend implements.
//!
//! Owns the vocabulary (wire.md §12.1): a row is keyed `(ns, id, tray_ns, tray_id)` and
//! holds `(marked, doc)`; every operation carries the caller's epoch and is fenced
//! against the instance's stored epoch (wire.md §8.3). It must never hold backend code;
//! backends live in their own modules and share only this contract.

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::{DocText, InstanceKey, StoreError, TrayKey};

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

impl TrayRow {
    /// The row's key; keys order as [`StateStore::list`] orders rows.
    pub fn key(&self) -> TrayKey<'_> {
        TrayKey::new(&self.tray_ns, &self.tray_id)
    }
}

/// The alarm row's tray namespace (wire.md §12.5): an instance's alarm is the row
/// `(ns, id, ALARM_TRAY_NS, ALARM_TRAY_ID)` with doc `{"at": <epoch ms>, "nonce": <id>}`.
pub const ALARM_TRAY_NS: &str = "pinned";
/// The alarm row's tray id; see [`ALARM_TRAY_NS`].
pub const ALARM_TRAY_ID: &str = "alarm";
/// The alarm row's key within its instance: ([`ALARM_TRAY_NS`], [`ALARM_TRAY_ID`]).
pub const ALARM_TRAY: TrayKey<'static> = TrayKey::new(ALARM_TRAY_NS, ALARM_TRAY_ID);

/// The placement world a row was written in: the writer's `hostname` and `env`
/// (wire.md §12.2's columns, stamped from the store's options on every write), each
/// [`WorldStamp::ANY`] (`"*"`) when the writer named none, as single-world fleets do.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorldStamp {
    /// The writer's hostname, or `"*"`.
    pub hostname: String,
    /// The writer's environment, or `"*"`.
    pub env: String,
}

/// An alarm row `(ns, id, "pinned", "alarm")` whose `at` is due, as returned by
/// [`StateStore::due_alarms`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueAlarm {
    /// The instance's namespace.
    pub ns: String,
    /// The instance id.
    pub id: String,
    /// When the alarm is due, in epoch milliseconds (`doc.at`).
    pub at: i64,
    /// `doc.nonce` when it is a string, else `None`.
    pub nonce: Option<String>,
    /// The world of the worker that wrote the alarm row.
    pub world: WorldStamp,
}

/// An instance with at least one marked row, as returned by
/// [`StateStore::marked_instances`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedInstance {
    /// The instance's namespace.
    pub ns: String,
    /// The instance id.
    pub id: String,
    /// The world of the worker that wrote its marked rows. Should they disagree (rows
    /// written by workers of two worlds), one that names a hostname wins over `"*"`,
    /// then the smallest `(hostname, env)` in byte order.
    pub world: WorldStamp,
}

// === impl WorldStamp ===

impl WorldStamp {
    /// The column value of "no hostname" / "no environment" (the stores' default).
    pub const ANY: &'static str = "*";

    /// The stamp of a writer that names no world (`"*"`, `"*"`).
    pub fn any() -> Self {
        Self::new(Self::ANY, Self::ANY)
    }

    /// The stamp `hostname`, `env` (as the columns hold them).
    pub fn new(hostname: impl Into<String>, env: impl Into<String>) -> Self {
        Self {
            hostname: hostname.into(),
            env: env.into(),
        }
    }

    /// The hostname, `None` for `"*"`.
    pub fn hostname(&self) -> Option<&str> {
        Some(self.hostname.as_str()).filter(|h| *h != Self::ANY)
    }

    /// The environment, `None` for `"*"`.
    pub fn env(&self) -> Option<&str> {
        Some(self.env.as_str()).filter(|e| *e != Self::ANY)
    }
}

impl Default for WorldStamp {
    fn default() -> Self {
        Self::any()
    }
}

// === impl DueAlarm ===

impl DueAlarm {
    /// The instance whose alarm is due, borrowed from this row.
    pub fn instance(&self) -> InstanceKey<'_> {
        InstanceKey::new(&self.ns, &self.id)
    }
}

// === impl MarkedInstance ===

impl MarkedInstance {
    /// The instance, borrowed.
    pub fn instance(&self) -> InstanceKey<'_> {
        InstanceKey::new(&self.ns, &self.id)
    }
}

/// One row as [`StateStore::peek`] reads it: the row and the world that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekedRow {
    /// The row.
    pub row: TrayRow,
    /// The world of the worker that last wrote it.
    pub world: WorldStamp,
}

/// An instance's rows and fence as [`StateStore::peek`] reads them, unfenced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peek {
    /// The instance's stored epoch, `None` when it has no fence row (never
    /// written, or its fence was reclaimed).
    pub epoch: Option<u64>,
    /// Every row, ordered by `(tray_ns, tray_id)` (byte order).
    pub rows: Vec<PeekedRow>,
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
        /// New payload, encoded.
        doc: DocText,
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
        doc: impl Into<DocText>,
    ) -> Self {
        BatchOp::Set {
            tray_ns: tray_ns.into(),
            tray_id: tray_id.into(),
            marked,
            doc: doc.into(),
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

    /// The tray row this op touches.
    pub fn key(&self) -> TrayKey<'_> {
        match self {
            BatchOp::Set {
                tray_ns, tray_id, ..
            }
            | BatchOp::Delete { tray_ns, tray_id } => TrayKey::new(tray_ns, tray_id),
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
pub trait StateStore: Send + Sync + std::fmt::Debug {
    /// Fences, then upserts the whole row `tray` of `instance` with `(marked, doc)`.
    /// Idempotent.
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError>;

    /// Fences, then deletes the row `tray` of `instance` if present. Idempotent.
    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError>;

    /// Fences, then reads the row `tray` of `instance`: `None` when absent.
    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError>;

    /// Fences, then returns every row of `instance`, ordered by `(tray_ns, tray_id)`
    /// (byte order), keeping only rows whose `tray_ns` equals the `tray_ns` filter and
    /// whose `marked` equals the `marked` filter, when given (filters AND together).
    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError>;

    /// Fences `instance` once, then applies `ops` in order, all or nothing. An empty
    /// batch only fences (and may advance the stored epoch).
    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError>;

    /// Fences, then returns the marked rows of `instance` and the row `tray` whether
    /// marked or not (once), ordered as [`list`](Self::list): what an activation reads
    /// before anything of it runs (its pending work and one row of its own) in one call.
    /// The default makes two calls, `list` of the marked rows then `get_tray`; a backend
    /// whose every call is a round trip answers both with one.
    async fn list_marked_and(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray: TrayKey<'_>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        let mut rows = self.list(instance, epoch, None, Some(true)).await?;
        if let Err(at) = rows.binary_search_by(|row| row.key().cmp(&tray)) {
            if let Some(found) = self.get_tray(instance, tray, epoch).await? {
                rows.insert(
                    at,
                    TrayRow {
                        tray_ns: tray.tray_ns.to_owned(),
                        tray_id: tray.tray_id.to_owned(),
                        marked: found.marked,
                        doc: found.doc,
                    },
                );
            }
        }
        Ok(rows)
    }

    /// Fences, then deletes every row of `instance` at once (its trays, its
    /// alarm): what is left is an instance never written, except that its
    /// epoch stays, so an older owner still cannot write. Atomic.
    ///
    /// The default lists the rows and deletes them in one
    /// [`apply_batch`](Self::apply_batch); a row written between the two
    /// stays, so backends override it with one statement.
    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let rows = self.list(instance, epoch, None, None).await?;
        let ops = rows
            .into_iter()
            .map(|row| BatchOp::Delete {
                tray_ns: row.tray_ns,
                tray_id: row.tray_id,
            })
            .collect();
        self.apply_batch(instance, ops, epoch).await
    }

    /// Scans every instance's alarm row ([`ALARM_TRAY_NS`], [`ALARM_TRAY_ID`]) for those
    /// with `doc.at <= due_by_ms`, ordered by `at`, then `(ns, id)` (byte order), at most
    /// `limit` of them. Whether the row is marked does not matter.
    ///
    /// Rows whose `doc.at` is missing or is not an integer-valued JSON number within
    /// `i64` (`1000` and `1000.0` count, `1000.5`, `"1000"` and `null` do not) are
    /// skipped.
    ///
    /// Unfenced and read-only: it neither reads nor advances any instance's epoch and does
    /// not wait for in-flight operations on the instances it reports, so a row may change
    /// right after it was read. For pinboard's alarm sweep (wire.md §12.5, §14.1).
    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError>;

    /// The distinct instances `(ns, id)` having at least one marked row (wire.md §14.2's
    /// activities index), with the world that wrote them, ordered by `(ns, id)` (byte
    /// order), starting strictly after `after` when given (keyset pagination: pass the
    /// last pair of the previous page), at most `limit` of them.
    ///
    /// Unfenced and read-only, like [`due_alarms`](Self::due_alarms); each page is its
    /// own snapshot.
    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError>;

    /// The distinct ids of namespace `ns` holding at least one row, ordered by id (byte
    /// order), starting strictly after `after` when given (keyset pagination), at most
    /// `limit` of them. For the operator's storage inspector.
    ///
    /// Unfenced and read-only, like [`due_alarms`](Self::due_alarms).
    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// Every row of `instance` with the world that wrote it, and its stored epoch,
    /// read without acquiring the instance: a peek neither reads at nor advances any
    /// epoch, so it never fences out the instance's owner. For the operator's storage
    /// inspector; what it reads may change right after.
    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError>;

    /// Deletes the epoch (fence) rows of instances that hold no row at all and whose
    /// stored epoch is below `below_epoch`, at most `limit` of them; answers how many
    /// went. An instance with an operation under way is left for a later call.
    ///
    /// Every operation creates its instance's fence row, reads included, so ids that
    /// are only ever read (a scanner's random ids) would each leave one for ever. Removing
    /// one is safe once no owner with a smaller epoch can still act: the caller picks
    /// `below_epoch` from the time the epoch was minted at (pinboard mints
    /// `wall_ms * 1000` or above) minus more than a lease TTL and a transaction deadline,
    /// so every owner an older epoch names has lost its lease and stopped; any later
    /// owner gets a larger epoch (pinboard's epoch floor), and the next operation writes
    /// the row again at its own.
    ///
    /// Unfenced, like [`due_alarms`](Self::due_alarms). The default reclaims nothing:
    /// a backend that keeps no fence rows (or cannot tell) need not override it.
    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        let _ = (below_epoch, limit);
        Ok(0)
    }
}

/// `Arc<S>` is a store whenever `S` is, so `Arc<dyn StateStore>` (what
/// [`StoreConfig::open`](crate::StoreConfig::open) returns) can be passed wherever an
/// `impl StateStore` is wanted. Every method forwards to `S`.
#[async_trait]
impl<S: StateStore + ?Sized> StateStore for std::sync::Arc<S> {
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError> {
        (**self).set_tray(instance, tray, marked, doc, epoch).await
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        (**self).delete_tray(instance, tray, epoch).await
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        (**self).get_tray(instance, tray, epoch).await
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        (**self).list(instance, epoch, tray_ns, marked).await
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        (**self).apply_batch(instance, ops, epoch).await
    }

    async fn list_marked_and(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray: TrayKey<'_>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        (**self).list_marked_and(instance, epoch, tray).await
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        (**self).delete_instance(instance, epoch).await
    }

    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError> {
        (**self).due_alarms(due_by_ms, limit).await
    }

    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError> {
        (**self).marked_instances(after, limit).await
    }

    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        (**self).instance_ids(ns, after, limit).await
    }

    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError> {
        (**self).peek(instance).await
    }

    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        (**self).reclaim_fences(below_epoch, limit).await
    }
}

/// `doc.at` of an alarm row as epoch ms: an integer-valued JSON number within `i64`.
pub(crate) fn alarm_at(doc: &Doc) -> Option<i64> {
    let at = doc.get("at")?.as_number()?;
    if let Some(at) = at.as_i64() {
        return Some(at);
    }
    if at.is_u64() {
        return None; // above i64::MAX
    }
    let at = at.as_f64()?;
    // -2^63 is exactly representable, 2^63 is the first value out of range.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if at.fract() == 0.0 && (-LIMIT..LIMIT).contains(&at) {
        Some(at as i64) // integer-valued and in range: exact
    } else {
        None
    }
}

/// `doc.nonce` of an alarm row when it is a string.
pub(crate) fn alarm_nonce(doc: &Doc) -> Option<String> {
    doc.get("nonce")?.as_str().map(str::to_owned)
}

/// A scan limit as SQL `LIMIT`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Refuses epochs that do not fit the stores' signed 64-bit column.
pub(crate) fn check_epoch(epoch: u64) -> Result<i64, StoreError> {
    i64::try_from(epoch).map_err(|_| StoreError::EpochOutOfRange { epoch })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::MemoryStore;

    /// Writes, scans and reads back at `epoch` through any store, as generic code would.
    async fn round_trip(store: impl StateStore, epoch: u64) -> Result<Option<Tray>, StoreError> {
        let doc = json!({"v": 1}).as_object().cloned().unwrap_or_default();
        let a = InstanceKey::new("/n", "a");
        store
            .set_tray(a, TrayKey::singleton("t"), true, doc, epoch)
            .await?;
        let extra = vec![BatchOp::set("t", "k", false, Doc::new())];
        store.apply_batch(a, extra, epoch).await?;
        assert_eq!(store.list(a, epoch, Some("t"), None).await?.len(), 2);
        assert!(store.due_alarms(i64::MAX, 10).await?.is_empty());
        let marked = store.marked_instances(None, 10).await?;
        assert_eq!(
            marked,
            vec![MarkedInstance {
                ns: "/n".to_owned(),
                id: "a".to_owned(),
                world: WorldStamp::any(),
            }]
        );
        store.delete_tray(a, TrayKey::new("t", "k"), epoch).await?;
        store.get_tray(a, TrayKey::singleton("t"), epoch).await
    }

    #[tokio::test]
    async fn an_arc_dyn_store_is_a_store() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
        let tray = round_trip(Arc::clone(&store), 2).await.expect("round trip");
        assert_eq!(
            tray.map(|t| (t.marked, t.doc["v"].clone())),
            Some((true, json!(1)))
        );

        // The clone forwarded to the one store underneath: it holds the rows the generic
        // code left, and a newer epoch there fences the generic code out.
        let rows = store
            .list(InstanceKey::new("/n", "a"), 3, None, None)
            .await
            .expect("list");
        assert_eq!(rows.len(), 1);
        let err = round_trip(store, 2)
            .await
            .expect_err("epoch 2 is fenced by 3");
        assert!(err.is_fence_lost(), "{err}");
    }
}
