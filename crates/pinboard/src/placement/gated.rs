//! A test double: a placement store that holds one caller between a read
//! and whatever it does with what it read, so a test can let another
//! caller act in between. The interleaving that makes a read-then-act
//! race is then a plain sequence of awaits, not a matter of luck. It can
//! also make the worker list fail, as a store that stopped answering.
//!
//! Owns nothing but the gate and the switch; every other call goes to the
//! wrapped store (`forward_calls!`), `list_workers` through both.
//! Test-only.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use super::forward::forward_calls;
use super::{LiveWorker, PlacementStore, StoreError};
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
    forward_calls!(inner:
        deployment_version, admit_worker, put_worker, renew_worker, set_server_drain,
        bind_hostname, bound_hostnames, get_worker, remove_worker, mark_superseded,
        superseded, push_message, pending_messages, resolve_or_claim, open_generation,
        generation, expire_placements, reclaim, release, tag, settle, wake_candidates,
        placement, list_placements, acquire_sweeper_lease, renew_sweeper_lease,
        release_sweeper_lease,
    );

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
}
