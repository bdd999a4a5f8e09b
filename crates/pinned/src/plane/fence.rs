//! The per-id placement-epoch fence of one host: a request carrying an
//! epoch older than one already admitted for its id, or the epoch whose
//! placement was released, bounces with a retryable 503 so pinboard
//! re-resolves instead of reaching a stale owner.
//!
//! Entries expire after twice the lease TTL (60 s before the first ack):
//! by then pinboard has re-placed anything that moved. The table never
//! touches instances; the namespace consults it before residency.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use pinned_wire::refusal::Refusal;
use tokio::time::Instant;

/// Fence TTL before the first lease ack.
const DEFAULT_TTL: Duration = Duration::from_secs(60);

struct Fence {
    max_epoch: u64,
    released: bool,
    updated: Instant,
}

/// Highest admitted epoch per id.
#[derive(Default)]
pub(crate) struct FenceTable {
    fences: DashMap<Arc<str>, Fence>,
}

impl FenceTable {
    fn ttl(lease_ttl: Option<Duration>) -> Duration {
        lease_ttl.map_or(DEFAULT_TTL, |ttl| ttl * 2)
    }

    /// Admits `epoch` for `id` or refuses it.
    pub(crate) fn admit(
        &self,
        id: &str,
        epoch: u64,
        lease_ttl: Option<Duration>,
    ) -> Result<(), Refusal> {
        let now = Instant::now();
        let ttl = Self::ttl(lease_ttl);
        if let Some(mut fence) = self.fences.get_mut(id) {
            if now.saturating_duration_since(fence.updated) <= ttl && epoch <= fence.max_epoch {
                if epoch < fence.max_epoch {
                    return Err(Refusal::StaleEpoch);
                }
                if fence.released {
                    return Err(Refusal::ReleasedEpoch);
                }
                fence.updated = now;
                return Ok(());
            }
            *fence = Fence {
                max_epoch: epoch,
                released: false,
                updated: now,
            };
            return Ok(());
        }
        self.fences.insert(
            Arc::from(id),
            Fence {
                max_epoch: epoch,
                released: false,
                updated: now,
            },
        );
        Ok(())
    }

    /// Marks `epoch` of `id` released (a higher admitted epoch is kept).
    pub(crate) fn release(&self, id: &str, epoch: u64) {
        let now = Instant::now();
        let mut fence = self.fences.entry(Arc::from(id)).or_insert(Fence {
            max_epoch: epoch,
            released: false,
            updated: now,
        });
        if fence.max_epoch == epoch {
            fence.released = true;
            fence.updated = now;
        }
    }

    /// Forgets entries idle longer than the TTL.
    pub(crate) fn sweep(&self, lease_ttl: Option<Duration>) {
        let now = Instant::now();
        let ttl = Self::ttl(lease_ttl);
        self.fences
            .retain(|_, fence| now.saturating_duration_since(fence.updated) <= ttl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stale_and_released_epochs_bounce() {
        let table = FenceTable::default();
        assert!(table.admit("a", 5, None).is_ok());
        assert!(table.admit("a", 5, None).is_ok());
        assert_eq!(table.admit("a", 4, None), Err(Refusal::StaleEpoch));
        table.release("a", 5);
        assert_eq!(table.admit("a", 5, None), Err(Refusal::ReleasedEpoch));
        assert!(table.admit("a", 6, None).is_ok());
        // Releasing an older epoch leaves the newer admission alone.
        table.release("a", 5);
        assert!(table.admit("a", 6, None).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_twice_the_lease_ttl() {
        let table = FenceTable::default();
        let ttl = Some(Duration::from_secs(10));
        assert!(table.admit("a", 9, ttl).is_ok());
        tokio::time::advance(Duration::from_secs(21)).await;
        assert!(table.admit("a", 3, ttl).is_ok(), "forgotten after 2 x TTL");
        tokio::time::advance(Duration::from_secs(21)).await;
        table.sweep(ttl);
        assert!(table.fences.is_empty());
    }
}
