//! [`FailingStore`]: a store wrapper that fails one chosen write, for
//! crash tests, and every call (or every write) while an [`Outage`] is
//! switched on. Behind the `test-util` feature; never in production.
//!
//! A failed write models a crash between two writes (the write is not
//! applied) or an indeterminate commit (applied, then reported failed); an
//! outage models an unreachable database. Every other call passes straight
//! through to the wrapped store, and each call on an instance is written in
//! a journal ([`FailingStore::calls`]), for a test that must show which
//! store calls a path makes.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use crate::{
    BatchOp, Doc, DueAlarm, InstanceKey, MarkedInstance, Peek, StateStore, StoreError, Tray,
    TrayKey, TrayRow,
};

/// The source of every error an [`Outage`] answers: it names a database
/// address (10.0.0.9), for a test to check that the cause stays in the log
/// and out of answers.
const OUTAGE_CAUSE: &str = "connection refused (postgres at 10.0.0.9:5432)";

/// What an outage of a [`FailingStore`] takes down; each call it covers
/// fails as an unreachable database at 10.0.0.9 does
/// ([`StoreError::Unavailable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outage {
    /// Nothing: every call reaches the wrapped store.
    None,
    /// The writes (see [`FailingStore`]); reads still pass.
    Writes,
    /// Every call.
    All,
}

/// Wraps a store and fails its `fail_at`-th write (`set_tray`,
/// `delete_tray`, `apply_batch` and `delete_instance` count; the first
/// write is 1), and what an [`Outage`] covers while it is switched on.
#[derive(Debug)]
pub struct FailingStore<S> {
    inner: Arc<S>,
    fail_at: usize,
    applied: bool,
    writes: AtomicUsize,
    failed: AtomicBool,
    outage: AtomicU8,
    /// `(ns, id, "<method> <what>")` of every call on an instance, in order.
    journal: Mutex<Vec<(String, String, String)>>,
}

impl<S: StateStore> FailingStore<S> {
    /// Fails write `fail_at` without applying it (`applied = false`: a crash
    /// before the commit) or after applying it (`applied = true`: a commit
    /// whose answer was lost).
    pub fn new(inner: Arc<S>, fail_at: usize, applied: bool) -> Self {
        Self {
            inner,
            fail_at,
            applied,
            writes: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            outage: AtomicU8::new(Outage::None as u8),
            journal: Mutex::new(Vec::new()),
        }
    }

    /// Fails no chosen write: only an [`Outage`] switched on fails calls.
    pub fn passing(inner: Arc<S>) -> Self {
        Self::new(inner, usize::MAX, false)
    }

    /// Switches an outage on (or off, with [`Outage::None`]) from the next
    /// call on.
    pub fn set_outage(&self, outage: Outage) {
        self.outage.store(outage as u8, Ordering::SeqCst);
    }

    /// `Err` when the current outage covers a call (`write` or a read).
    fn reachable(&self, write: bool) -> Result<(), StoreError> {
        let outage = self.outage.load(Ordering::SeqCst);
        if outage == Outage::All as u8 || (write && outage == Outage::Writes as u8) {
            return Err(StoreError::Unavailable {
                source: OUTAGE_CAUSE.into(),
            });
        }
        Ok(())
    }

    /// Writes seen so far (including the failed one).
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// Whether the chosen write has failed.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// The calls made on `instance` so far, in order, each as `"<method>
    /// <what>"`: `"get_tray <tray_ns>/<tray_id>"`, `"list <tray_ns filter>
    /// <marked filter>"` (`Debug` of the options), `"list_marked_and
    /// <tray_ns>/<tray_id>"`, `"apply_batch <n> ops"`, and so on.
    pub fn calls(&self, instance: InstanceKey<'_>) -> Vec<String> {
        self.journal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(ns, id, _)| ns == instance.ns && id == instance.id)
            .map(|(_, _, call)| call.clone())
            .collect()
    }

    fn note(&self, instance: InstanceKey<'_>, call: String) {
        self.journal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((instance.ns.to_owned(), instance.id.to_owned(), call));
    }

    /// Counts a write: `Err` for the chosen one once `apply` ran (when the
    /// failure is after applying) or instead of it. A write an outage
    /// refuses is not counted (it never reached the store).
    async fn write<F>(&self, apply: F) -> Result<(), StoreError>
    where
        F: std::future::Future<Output = Result<(), StoreError>>,
    {
        self.reachable(true)?;
        let write = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if write != self.fail_at {
            return apply.await;
        }
        if self.applied {
            apply.await?;
        }
        self.failed.store(true, Ordering::SeqCst);
        Err(StoreError::Setup {
            source: format!("injected failure of write {write}").into(),
        })
    }
}

#[async_trait]
impl<S: StateStore> StateStore for FailingStore<S> {
    async fn set_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        marked: bool,
        doc: Doc,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note(
            instance,
            format!("set_tray {}/{}", tray.tray_ns, tray.tray_id),
        );
        self.write(self.inner.set_tray(instance, tray, marked, doc, epoch))
            .await
    }

    async fn delete_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note(
            instance,
            format!("delete_tray {}/{}", tray.tray_ns, tray.tray_id),
        );
        self.write(self.inner.delete_tray(instance, tray, epoch))
            .await
    }

    async fn get_tray(
        &self,
        instance: InstanceKey<'_>,
        tray: TrayKey<'_>,
        epoch: u64,
    ) -> Result<Option<Tray>, StoreError> {
        self.note(
            instance,
            format!("get_tray {}/{}", tray.tray_ns, tray.tray_id),
        );
        self.reachable(false)?;
        self.inner.get_tray(instance, tray, epoch).await
    }

    async fn list(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray_ns: Option<&str>,
        marked: Option<bool>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.note(instance, format!("list {tray_ns:?} {marked:?}"));
        self.reachable(false)?;
        self.inner.list(instance, epoch, tray_ns, marked).await
    }

    async fn list_marked_and(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
        tray: TrayKey<'_>,
    ) -> Result<Vec<TrayRow>, StoreError> {
        self.note(
            instance,
            format!("list_marked_and {}/{}", tray.tray_ns, tray.tray_id),
        );
        self.reachable(false)?;
        self.inner.list_marked_and(instance, epoch, tray).await
    }

    async fn apply_batch(
        &self,
        instance: InstanceKey<'_>,
        ops: Vec<BatchOp>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note(instance, format!("apply_batch {} ops", ops.len()));
        self.write(self.inner.apply_batch(instance, ops, epoch))
            .await
    }

    async fn delete_instance(
        &self,
        instance: InstanceKey<'_>,
        epoch: u64,
    ) -> Result<(), StoreError> {
        self.note(instance, "delete_instance".to_owned());
        self.write(self.inner.delete_instance(instance, epoch))
            .await
    }

    async fn due_alarms(&self, due_by_ms: i64, limit: usize) -> Result<Vec<DueAlarm>, StoreError> {
        self.reachable(false)?;
        self.inner.due_alarms(due_by_ms, limit).await
    }

    async fn marked_instances(
        &self,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<MarkedInstance>, StoreError> {
        self.reachable(false)?;
        self.inner.marked_instances(after, limit).await
    }

    async fn instance_ids(
        &self,
        ns: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.reachable(false)?;
        self.inner.instance_ids(ns, after, limit).await
    }

    async fn peek(&self, instance: InstanceKey<'_>) -> Result<Peek, StoreError> {
        self.reachable(false)?;
        self.inner.peek(instance).await
    }

    async fn reclaim_fences(&self, below_epoch: u64, limit: usize) -> Result<u64, StoreError> {
        self.inner.reclaim_fences(below_epoch, limit).await
    }
}
