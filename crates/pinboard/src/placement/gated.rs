//! A test double: a placement store that holds one caller between a read
//! and whatever it does with what it read, so a test can let another
//! caller act in between. The interleaving that makes a read-then-act
//! race is then a plain sequence of awaits, not a matter of luck. It can
//! also make the worker list fail, as a store that stopped answering.
//!
//! Owns nothing but the gate and the switch; every other call goes to the
//! wrapped store.
//! Test-only.

use std::sync::atomic::{AtomicBool, Ordering};

use pinned_store::InstanceKey;
use pinned_wire::registry::ControlMessage;
use tokio::sync::Notify;

use super::{
    Admission, ClaimOutcome, DrainDeadline, Generation, LiveWorker, PlacementEntry, PlacementStore,
    ReclaimOutcome, StoreError, WorkerRecord,
};
use crate::clock::Now;

/// `inner`, whose next [`PlacementStore::list_workers`] after [`arm`]
/// returns only once [`release`] was called.
///
/// [`arm`]: Gated::arm
/// [`release`]: Gated::release
pub(crate) struct Gated<S> {
    inner: S,
    armed: AtomicBool,
    paused: Notify,
    release: Notify,
    /// `list_workers` times out while set.
    listing_fails: AtomicBool,
}

impl<S> Gated<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            armed: AtomicBool::new(false),
            paused: Notify::new(),
            release: Notify::new(),
            listing_fails: AtomicBool::new(false),
        }
    }

    /// Hold the next caller of `list_workers` after its read.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// Until the held caller has read.
    pub(crate) async fn paused(&self) {
        self.paused.notified().await;
    }

    /// Let the held caller go on with what it read.
    pub(crate) fn release(&self) {
        self.release.notify_one();
    }

    /// Make `list_workers` answer a timeout (`true`) or read again.
    pub(crate) fn fail_listing(&self, fail: bool) {
        self.listing_fails.store(fail, Ordering::Release);
    }
}

impl<S: PlacementStore> PlacementStore for Gated<S> {
    async fn deployment_version(&self) -> Result<u64, StoreError> {
        self.inner.deployment_version().await
    }

    async fn admit_worker(&self, admission: &Admission<'_>, now: Now) -> Result<bool, StoreError> {
        self.inner.admit_worker(admission, now).await
    }

    async fn put_worker(
        &self,
        record: &WorkerRecord,
        ttl_ms: u64,
        now: Now,
    ) -> Result<(), StoreError> {
        self.inner.put_worker(record, ttl_ms, now).await
    }

    async fn renew_worker(
        &self,
        session_id: &str,
        headroom: i64,
        draining: bool,
        ttl_ms: u64,
        now: Now,
    ) -> Result<Option<WorkerRecord>, StoreError> {
        self.inner
            .renew_worker(session_id, headroom, draining, ttl_ms, now)
            .await
    }

    async fn set_server_drain(
        &self,
        session_id: &str,
        drain: Option<DrainDeadline>,
        now: Now,
    ) -> Result<bool, StoreError> {
        self.inner.set_server_drain(session_id, drain, now).await
    }

    async fn bind_hostname(&self, hostname: &str, now: Now) -> Result<(), StoreError> {
        self.inner.bind_hostname(hostname, now).await
    }

    async fn bound_hostnames(&self) -> Result<Vec<String>, StoreError> {
        self.inner.bound_hostnames().await
    }

    async fn get_worker(
        &self,
        session_id: &str,
        now: Now,
    ) -> Result<Option<LiveWorker>, StoreError> {
        self.inner.get_worker(session_id, now).await
    }

    async fn remove_worker(&self, session_id: &str) -> Result<bool, StoreError> {
        self.inner.remove_worker(session_id).await
    }

    async fn list_workers(&self, now: Now) -> Result<Vec<LiveWorker>, StoreError> {
        if self.listing_fails.load(Ordering::Acquire) {
            return Err(StoreError::Timeout(std::time::Duration::from_secs(1)));
        }
        let listed = self.inner.list_workers(now).await;
        if self.armed.swap(false, Ordering::AcqRel) {
            // Read, then held: the caller acts on what it read only after
            // the test let others act first.
            self.paused.notify_one();
            self.release.notified().await;
        }
        listed
    }

    async fn mark_superseded(
        &self,
        session_id: &str,
        error: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<(), StoreError> {
        self.inner
            .mark_superseded(session_id, error, ttl_ms, now)
            .await
    }

    async fn superseded(&self, session_id: &str, now: Now) -> Result<Option<String>, StoreError> {
        self.inner.superseded(session_id, now).await
    }

    async fn push_message(
        &self,
        session_id: &str,
        message: ControlMessage,
    ) -> Result<String, StoreError> {
        self.inner.push_message(session_id, message).await
    }

    async fn pending_messages(
        &self,
        session_id: &str,
        acks: &[String],
    ) -> Result<Vec<ControlMessage>, StoreError> {
        self.inner.pending_messages(session_id, acks).await
    }

    async fn resolve_or_claim(
        &self,
        instance: InstanceKey<'_>,
        candidate: Option<&str>,
        stale: Option<(&str, u64)>,
        floor: u64,
        generation: &Generation,
        now: Now,
    ) -> Result<ClaimOutcome, StoreError> {
        self.inner
            .resolve_or_claim(instance, candidate, stale, floor, generation, now)
            .await
    }

    async fn open_generation(&self, proposal: &Generation) -> Result<Generation, StoreError> {
        self.inner.open_generation(proposal).await
    }

    async fn generation(&self) -> Result<Option<Generation>, StoreError> {
        self.inner.generation().await
    }

    async fn expire_placements(&self, budget: usize, now: Now) -> Result<usize, StoreError> {
        self.inner.expire_placements(budget, now).await
    }

    async fn reclaim(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        prev_sessions: &[&str],
        floor: u64,
        now: Now,
    ) -> Result<ReclaimOutcome, StoreError> {
        self.inner
            .reclaim(instance, session_id, prev_sessions, floor, now)
            .await
    }

    async fn release(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
    ) -> Result<bool, StoreError> {
        self.inner.release(instance, session_id, epoch).await
    }

    async fn tag(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: Option<u64>,
        tag: &str,
    ) -> Result<bool, StoreError> {
        self.inner.tag(instance, session_id, epoch, tag).await
    }

    async fn settle(
        &self,
        instance: InstanceKey<'_>,
        session_id: &str,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        self.inner.settle(instance, session_id, epoch).await
    }

    async fn wake_candidates(
        &self,
        limit: usize,
        now: Now,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.wake_candidates(limit, now).await
    }

    async fn placement(
        &self,
        instance: InstanceKey<'_>,
        now: Now,
    ) -> Result<Option<PlacementEntry>, StoreError> {
        self.inner.placement(instance, now).await
    }

    async fn list_placements(&self, now: Now) -> Result<Vec<PlacementEntry>, StoreError> {
        self.inner.list_placements(now).await
    }

    async fn acquire_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<bool, StoreError> {
        self.inner.acquire_sweeper_lease(token, ttl_ms, now).await
    }

    async fn renew_sweeper_lease(
        &self,
        token: &str,
        ttl_ms: u64,
        now: Now,
    ) -> Result<bool, StoreError> {
        self.inner.renew_sweeper_lease(token, ttl_ms, now).await
    }

    async fn release_sweeper_lease(&self, token: &str) -> Result<bool, StoreError> {
        self.inner.release_sweeper_lease(token).await
    }
}
