//! The fence reclaimer: a worker task that deletes the epoch (fence) rows
//! of ids that hold no data, once they are too old to matter.
//!
//! Every store operation, reads included, leaves its id a fence row, and
//! ids are chosen by clients: a scanner's random ids, or bare reads, would
//! each leave one for ever. A fence row only stops owners with a smaller
//! epoch, and pinboard mints epochs at `wall_ms * 1000` or above; so once
//! an epoch is older than every lease that could still be live plus the
//! store's transaction deadline, every owner an older epoch names has lost
//! its lease and stopped, and any later owner is given a larger epoch (the
//! epoch floor). The next operation on the id writes its fence again. The
//! store does the deleting ([`StateStore::reclaim_fences`]); this task owns
//! only when and below which epoch, never which rows.

use std::sync::Arc;
use std::time::Duration;

use pinned_store::StateStore;
use tokio_util::sync::CancellationToken;

use crate::time::Domain;

/// Default time between two passes.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);

/// Default least age of an epoch whose fence row may go.
pub(crate) const DEFAULT_AGE: Duration = Duration::from_secs(3600);

/// The store's transaction deadline (wire.md §12.3): an operation that
/// passed its fence may still be writing this long after.
const TRANSACTION_DEADLINE: Duration = Duration::from_secs(30);

/// Rows deleted by one store call.
const BATCH: usize = 1000;

/// Store calls in one pass at most: a pass deletes at most
/// `BATCH * BATCHES` rows, the rest wait for the next.
const BATCHES: usize = 100;

/// When and how far back the reclaimer deletes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// Between two passes; zero: never.
    pub(crate) interval: Duration,
    /// Least age of a reclaimed epoch.
    pub(crate) age: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            age: DEFAULT_AGE,
        }
    }
}

impl Schedule {
    /// The age a pass uses: the configured one, and at least twice the
    /// lease TTL pinboard last granted plus the transaction deadline.
    fn age(&self, lease_ttl: Option<Duration>) -> Duration {
        let floor = lease_ttl.map_or(Duration::ZERO, |ttl| ttl * 2 + TRANSACTION_DEADLINE);
        self.age.max(floor)
    }

    /// The epoch below which a pass at `now_ms` (wall) reclaims.
    pub(crate) fn below_epoch(&self, now_ms: u64, lease_ttl: Option<Duration>) -> u64 {
        let age_ms = u64::try_from(self.age(lease_ttl).as_millis()).unwrap_or(u64::MAX);
        now_ms.saturating_sub(age_ms).saturating_mul(1000)
    }
}

/// Runs passes until `stop`: the first one interval after the start.
pub(crate) async fn run(
    store: Arc<dyn StateStore>,
    domain: Domain,
    schedule: Schedule,
    lease_ttl: impl Fn() -> Option<Duration> + Send + 'static,
    stop: CancellationToken,
) {
    if schedule.interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = domain.sleep(schedule.interval) => {}
        }
        let below = schedule.below_epoch(domain.unix_ms(), lease_ttl());
        let mut reclaimed = 0u64;
        for _ in 0..BATCHES {
            let call = store.reclaim_fences(below, BATCH);
            let gone = tokio::select! {
                () = stop.cancelled() => return,
                gone = call => gone,
            };
            match gone {
                Ok(gone) => {
                    reclaimed += gone;
                    if gone < BATCH as u64 {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %pinned_edge::logging::Chain(&error), "could not reclaim the fence rows of ids without data");
                    break;
                }
            }
        }
        tracing::debug!(
            reclaimed,
            below_epoch = below,
            "fence rows of ids without data reclaimed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_is_at_least_two_leases_and_a_transaction() {
        let schedule = Schedule {
            interval: Duration::from_secs(1),
            age: Duration::from_secs(10),
        };
        assert_eq!(schedule.below_epoch(100_000, None), 90_000_000);
        // A 60 s lease: 150 s back.
        assert_eq!(
            schedule.below_epoch(1_000_000, Some(Duration::from_secs(60))),
            850_000_000
        );
        assert_eq!(schedule.below_epoch(5, None), 0, "never below zero");
    }
}
