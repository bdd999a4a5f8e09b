//! What the durable layer above does at the namespace's lifecycle points,
//! as one interface the namespace calls ([`Durability`]) and never looks
//! behind: the namespace decides *when* (an activation, a teardown, a
//! start, a shut-down), the durable layer *what* (open and resume trays,
//! re-arm and stop timers, wake instances with pending work).
//!
//! Built once per namespace by the factory that builds the namespace (see
//! [`NamespaceParts`](super::NamespaceParts)); a worker without a store hands none.

use std::any::Any;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::{Namespace, Record};
use crate::BoxError;

/// The durable layer's side of one namespace.
pub(crate) trait Durability: Any + Send + Sync {
    /// Before anything of an activation runs: false when the id is paused
    /// by an operator or held by an operator action under way (the
    /// activation is then refused with [`Admission::Paused`](super::Admission::Paused)),
    /// else hang what the instance will hold (its trays, with the pending
    /// work read in the same store call) on its record.
    fn open<'a>(&'a self, record: &'a Arc<Record>) -> BoxFuture<'a, Result<bool, BoxError>>;

    /// Once the object's state exists and before the instance serves:
    /// resume what `open` hung (the trays' handlers need the object).
    fn resume<'a>(&'a self, record: &'a Arc<Record>) -> BoxFuture<'a, Result<(), BoxError>>;

    /// The instance went live: re-arm its stored timers.
    fn activated(&self, host: &Arc<Namespace>, record: &Arc<Record>);

    /// Teardown, once open work settled: close the trays (their close
    /// hooks run before the object's `on_stop`).
    fn closing<'a>(&'a self, record: &'a Arc<Record>) -> BoxFuture<'a, ()>;

    /// Teardown, after `on_stop`: land what the trays enlisted and take
    /// them off the record, and drop the id's timer unless this worker
    /// fires evicted alarms itself; true when tray work is still pending.
    fn settle<'a>(&'a self, host: &'a Namespace, record: &'a Arc<Record>) -> BoxFuture<'a, bool>;

    /// Teardown, the record gone from the map: locally, wake the id again
    /// later when it left with work `pending`.
    fn closed(&self, host: &Arc<Namespace>, id: &str, pending: bool);

    /// The namespace started: wake the instances whose rows claim work.
    fn started(&self, host: &Arc<Namespace>);

    /// The namespace shut down: stop every timer.
    fn shut_down(&self);

    /// The durable layer's own view of itself.
    fn as_any(&self) -> &dyn Any;
}
