//! [`AbortAfterWrite`]: a store wrapper that ends the process abruptly
//! right after a chosen write has landed, for the examples' crash tests.
//!
//! The write is committed when the wrapped store answers; the process
//! aborts before that answer reaches the worker, so nothing the worker
//! would do next (answer a request, answer a message, write again)
//! happens. That is the moment a real crash leaves a sender without its
//! answer: deterministic here, rare under a SIGKILL from outside. It never
//! fails, changes or delays a write; every other call passes straight
//! through.

use std::fmt;

use async_trait::async_trait;
use pinned::pinned_store::{
    BatchOp, Doc, DueAlarm, InstanceKey, MarkedInstance, Peek, StateStore, StoreError, Tray,
    TrayKey, TrayRow,
};
use serde_json::{Map, Value};

/// Picks the fatal write: the row's instance and tray, and its doc as it
/// landed.
type Fatal = dyn Fn(InstanceKey<'_>, TrayKey<'_>, &Map<String, Value>) -> bool + Send + Sync;

/// Wraps a store and aborts the process once a row write that `fatal`
/// picks has landed (`set_tray`, or an upsert within `apply_batch`).
pub struct AbortAfterWrite<S> {
    inner: S,
    fatal: Box<Fatal>,
}

impl<S: StateStore> AbortAfterWrite<S> {
    /// Wraps `inner`; `fatal` is asked about every row each landed write
    /// upserted.
    pub fn new(
        inner: S,
        fatal: impl Fn(InstanceKey<'_>, TrayKey<'_>, &Map<String, Value>) -> bool
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self {
            inner,
            fatal: Box::new(fatal),
        }
    }

    fn abort_if_fatal(&self, instance: InstanceKey<'_>, tray: TrayKey<'_>, doc: &Doc) {
        if (self.fatal)(instance, tray, doc) {
            eprintln!(
                "crash point: the write of {}/{} row {}/{} landed; aborting before it is answered",
                instance.ns, instance.id, tray.tray_ns, tray.tray_id
            );
            std::process::abort();
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for AbortAfterWrite<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbortAfterWrite")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: StateStore> StateStore for AbortAfterWrite<S> {
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let landed = doc.clone();
        self.inner
            .set_tray(instance, tray, marked, doc, epoch)
            .await?;
        self.abort_if_fatal(instance, tray, &landed);
        Ok(())
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.inner.delete_tray(instance, tray, epoch).await
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        self.inner.get_tray(instance, tray, epoch).await
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.inner.list(instance, epoch, tray_ns, marked).await
    }

    async fn list_marked_and(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray: TrayKey<'_>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.inner.list_marked_and(instance, epoch, tray).await
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        // Only the upserts' docs are kept (a row's image is the same text
        // the store wrote); a doc that does not parse cannot be fatal.
        let landed: Vec<(String, String, Doc)> = ops
            .iter()
            .filter_map(|op| match op {
                BatchOp::Set {
                    tray_ns,
                    tray_id,
                    doc,
                    ..
                } => Some((tray_ns.clone(), tray_id.clone(), doc.to_doc().ok()?)),
                BatchOp::Delete { .. } => None,
            })
            .collect();
        self.inner.apply_batch(instance, ops, epoch).await?;
        for (tray_ns, tray_id, doc) in &landed {
            self.abort_if_fatal(instance, TrayKey::new(tray_ns, tray_id), doc);
        }
        Ok(())
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.inner.delete_instance(instance, epoch).await
    }

    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError> {
        self.inner.due_alarms(due_by_ms, limit).await
    }

    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError> {
        self.inner.marked_instances(after, limit).await
    }

    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.instance_ids(ns, after, limit).await
    }

    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError> {
        self.inner.peek(instance).await
    }

    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        self.inner.reclaim_fences(below_epoch, limit).await
    }
}
