//! The worker's lease with pinboard: when it may serve, and when it must
//! stop taking new ids.
//!
//! Every valid register or heartbeat ack renews it to `send time +
//! expiresInMs` (anchored at send, so a slow ack never stretches what the
//! server granted), capped by a drain deadline when one is set. The lease is
//! *healthy* until `deadline - buffer`, *expired* from `deadline` on. The
//! buffer adapts to the TTL pinboard grants: at most half of it, so a short
//! lease with the default buffer is never born unhealthy. Local
//! mode never sets a deadline: always healthy, never expired.
//!
//! Reads are lock-free (one atomic load), since the request path checks the
//! lease on every request. This module never aborts instances: the
//! namespace refuses requests by these answers and nothing else.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::metrics::Metrics;

/// Default lease buffer: the worker's own safety margin before pinboard may
/// re-place its ids.
pub const DEFAULT_LEASE_BUFFER: Duration = Duration::from_secs(5);

const NONE: u64 = u64::MAX;

/// Lease state of one worker.
pub(crate) struct Lease {
    base: Instant,
    /// The configured buffer; the one in force is at most half the TTL.
    buffer: Duration,
    /// The buffer in force, in ms.
    effective_buffer_ms: AtomicU64,
    /// The configured buffer was shrunk to fit a TTL (logged once).
    shrunk: AtomicBool,
    /// Milliseconds since `base`; `NONE` before the first ack.
    deadline: AtomicU64,
    /// Renewals may not extend past this (a drain deadline); `NONE` = no cap.
    cap: AtomicU64,
    /// The last granted TTL in ms (for the fence table's TTL), 0 before.
    ttl_ms: AtomicU64,
    unhealthy: AtomicBool,
    flaps: AtomicU64,
    watch: Mutex<Option<AbortHandle>>,
    /// Health as published to the hosts (their instances' `on_unhealthy`
    /// and `on_restored`).
    health: tokio::sync::watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

impl Lease {
    pub(crate) fn new(buffer: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            base: Instant::now(),
            buffer,
            effective_buffer_ms: AtomicU64::new(
                u64::try_from(buffer.as_millis()).unwrap_or(u64::MAX),
            ),
            shrunk: AtomicBool::new(false),
            deadline: AtomicU64::new(NONE),
            cap: AtomicU64::new(NONE),
            ttl_ms: AtomicU64::new(0),
            unhealthy: AtomicBool::new(false),
            flaps: AtomicU64::new(0),
            watch: Mutex::new(None),
            health: tokio::sync::watch::Sender::new(true),
            metrics,
        }
    }

    /// Health changes: `false` when the lease crosses into unhealthy,
    /// `true` when an ack restores it.
    pub(crate) fn health(&self) -> tokio::sync::watch::Receiver<bool> {
        self.health.subscribe()
    }

    /// When pinboard may re-place this worker's ids (the last ack's send
    /// time plus its TTL, capped by a drain deadline); `None` before the
    /// first ack and in local mode.
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::SeqCst) {
            NONE => None,
            deadline => Some(self.base + Duration::from_millis(deadline)),
        }
    }

    /// The safety margin before [`expires_at`](Self::expires_at).
    pub(crate) fn buffer(&self) -> Duration {
        Duration::from_millis(self.effective_buffer_ms.load(Ordering::Relaxed))
    }

    fn buffer_ms(&self) -> u64 {
        self.effective_buffer_ms.load(Ordering::Relaxed)
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(NONE - 1)
    }

    fn now_ms(&self) -> u64 {
        self.ms(Instant::now())
    }

    /// New activations allowed: no deadline yet, or before `deadline - buffer`.
    pub(crate) fn healthy(&self) -> bool {
        match self.deadline.load(Ordering::SeqCst) {
            NONE => true,
            deadline => self.now_ms() < deadline.saturating_sub(self.buffer_ms()),
        }
    }

    /// Nothing may be served: the deadline passed.
    pub(crate) fn expired(&self) -> bool {
        match self.deadline.load(Ordering::SeqCst) {
            NONE => false,
            deadline => self.now_ms() >= deadline,
        }
    }

    /// Times the lease crossed into unhealthy.
    pub(crate) fn flaps(&self) -> u64 {
        self.flaps.load(Ordering::Relaxed)
    }

    /// The last granted TTL.
    pub(crate) fn ttl(&self) -> Option<Duration> {
        match self.ttl_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Caps future renewals at `deadline` (`None` lifts the cap; the next
    /// ack restores the full TTL).
    pub(crate) fn cap(&self, deadline: Option<Instant>) {
        self.cap
            .store(deadline.map_or(NONE, |at| self.ms(at)), Ordering::SeqCst);
    }

    /// An ack granted `ttl` from `anchor` (the send time).
    pub(crate) fn renewed(self: &Arc<Self>, ttl: Duration, anchor: Instant) {
        let buffer = self.buffer.min(ttl / 2);
        if buffer < self.buffer && !self.shrunk.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                configured = ?self.buffer,
                ttl = ?ttl,
                buffer = ?buffer,
                "lease buffer longer than half the granted lease; using half the lease"
            );
        }
        self.effective_buffer_ms.store(
            u64::try_from(buffer.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let mut deadline = self.ms(anchor + ttl);
        let cap = self.cap.load(Ordering::SeqCst);
        if cap != NONE {
            deadline = deadline.min(cap);
        }
        self.ttl_ms.store(
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
        self.deadline.store(deadline, Ordering::SeqCst);
        // A renewal capped at a drain deadline that has (nearly) passed
        // leaves the lease unhealthy: restoring it here would only have the
        // watch flag it again at once, a flap on every heartbeat.
        if self.now_ms() < deadline.saturating_sub(self.buffer_ms()) {
            if self.unhealthy.swap(false, Ordering::SeqCst) {
                tracing::info!("lease restored");
                self.health.send_replace(true);
            }
            self.metrics.lease_healthy.set(1);
        }
        self.arm(deadline);
    }

    /// Watches for the crossing into unhealthy, to count flaps and log.
    fn arm(self: &Arc<Self>, deadline: u64) {
        let at = self.base + Duration::from_millis(deadline.saturating_sub(self.buffer_ms()));
        let lease = Arc::downgrade(self);
        let mut watch = self.watch.lock();
        if let Some(previous) = watch.take() {
            previous.abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let task = runtime.spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(lease) = lease.upgrade() else { return };
            if !lease.unhealthy.swap(true, Ordering::SeqCst) {
                let flaps = lease.flaps.fetch_add(1, Ordering::Relaxed) + 1;
                lease.metrics.lease_healthy.set(0);
                tracing::warn!(
                    flaps,
                    "lease unhealthy: no heartbeat ack within the health window"
                );
                lease.health.send_replace(false);
            }
        });
        *watch = Some(task.abort_handle());
    }

    /// Stops the watch timer.
    pub(crate) fn close(&self) {
        if let Some(watch) = self.watch.lock().take() {
            watch.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_buffer_shrinks_to_half_a_short_lease() {
        // The case: a 3 s lease and the default 5 s buffer.
        let lease = Arc::new(Lease::new(Duration::from_secs(5), Arc::new(Metrics::new())));
        lease.renewed(Duration::from_secs(3), Instant::now());
        assert_eq!(lease.buffer(), Duration::from_millis(1500));
        assert!(lease.healthy(), "a fresh 3 s lease is healthy");
        tokio::time::advance(Duration::from_millis(1600)).await;
        assert!(!lease.healthy(), "within the buffer of its end");
        assert!(!lease.expired());
        // A long lease keeps the configured buffer.
        lease.renewed(Duration::from_secs(30), Instant::now());
        assert_eq!(lease.buffer(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn healthy_then_unhealthy_then_expired_then_restored() {
        let lease = Arc::new(Lease::new(Duration::from_secs(5), Arc::new(Metrics::new())));
        assert!(lease.healthy() && !lease.expired());
        lease.renewed(Duration::from_secs(10), Instant::now());
        tokio::time::advance(Duration::from_millis(4_900)).await;
        assert!(lease.healthy());
        tokio::time::advance(Duration::from_millis(200)).await;
        tokio::task::yield_now().await;
        assert!(!lease.healthy() && !lease.expired());
        assert_eq!(lease.flaps(), 1);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(lease.expired());
        lease.renewed(Duration::from_secs(10), Instant::now());
        assert!(lease.healthy() && !lease.expired());
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_capped_at_a_passed_deadline_do_not_flap() {
        let lease = Arc::new(Lease::new(Duration::from_secs(1), Arc::new(Metrics::new())));
        lease.renewed(Duration::from_secs(10), Instant::now());
        lease.cap(Some(Instant::now() + Duration::from_secs(2)));
        tokio::time::advance(Duration::from_secs(3)).await;
        tokio::task::yield_now().await;
        assert_eq!(lease.flaps(), 0, "renewals before the cap kept it healthy");
        for _ in 0..5 {
            lease.renewed(Duration::from_secs(10), Instant::now());
            tokio::time::advance(Duration::from_millis(300)).await;
            tokio::task::yield_now().await;
            assert!(lease.expired() && !lease.healthy());
        }
        assert_eq!(lease.flaps(), 1, "one crossing, not one per renewal");
        // Lifting the cap restores it.
        lease.cap(None);
        lease.renewed(Duration::from_secs(10), Instant::now());
        assert!(lease.healthy());
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_is_anchored_at_send_and_capped() {
        let lease = Arc::new(Lease::new(Duration::from_secs(1), Arc::new(Metrics::new())));
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(3)).await;
        lease.renewed(Duration::from_secs(4), sent);
        tokio::time::advance(Duration::from_millis(1_100)).await;
        assert!(lease.expired(), "4 s from the send, not from the ack");
        lease.cap(Some(Instant::now() + Duration::from_secs(2)));
        lease.renewed(Duration::from_secs(10), Instant::now());
        tokio::time::advance(Duration::from_millis(2_100)).await;
        assert!(lease.expired(), "capped at the drain deadline");
    }
}
