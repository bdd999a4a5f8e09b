//! A store wrapper that counts the calls reaching it, by kind, for tests
//! that must show how many store calls a path makes. Every call passes
//! straight through.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use pinned::pinned_store::{
    BatchOp, Doc, DueAlarm, InstanceKey, MarkedInstance, Peek, StateStore, StoreError, Tray,
    TrayKey, TrayRow,
};

/// Wraps `S`; [`calls`](Counting::calls) lists each call as
/// `"<method> <ns>/<id> <detail>"`, in order.
#[derive(Debug)]
pub struct Counting<S> {
    inner: Arc<S>,
    calls: Mutex<Vec<String>>,
}

impl<S> Counting<S> {
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The calls so far that concern instance `id`.
    pub fn calls(&self, id: &str) -> Vec<String> {
        let tag = format!("/{id} ");
        self.calls
            .lock()
            .iter()
            .filter(|call| call.contains(&tag))
            .cloned()
            .collect()
    }

    fn note(&self, method: &str, instance: InstanceKey<'_>, detail: String) {
        self.calls
            .lock()
            .push(format!("{method} {}/{} {detail}", instance.ns, instance.id));
    }
}

#[async_trait]
impl<S: StateStore> StateStore for Counting<S> {
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note(
            "set_tray",
            instance,
            format!("{}/{}", tray.tray_ns, tray.tray_id),
        );
        self.inner
            .set_tray(instance, tray, marked, doc, epoch)
            .await
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note(
            "delete_tray",
            instance,
            format!("{}/{}", tray.tray_ns, tray.tray_id),
        );
        self.inner.delete_tray(instance, tray, epoch).await
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        self.note(
            "get_tray",
            instance,
            format!("{}/{}", tray.tray_ns, tray.tray_id),
        );
        self.inner.get_tray(instance, tray, epoch).await
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.note("list", instance, format!("{tray_ns:?} {marked:?}"));
        self.inner.list(instance, epoch, tray_ns, marked).await
    }

    async fn list_marked_and(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray: TrayKey<'_>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.note(
            "list_marked_and",
            instance,
            format!("{}/{}", tray.tray_ns, tray.tray_id),
        );
        self.inner.list_marked_and(instance, epoch, tray).await
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note("apply_batch", instance, format!("{} ops", ops.len()));
        self.inner.apply_batch(instance, ops, epoch).await
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note("delete_instance", instance, String::new());
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
