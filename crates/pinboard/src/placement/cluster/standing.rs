//! Where a node stands with each virtual shard's generation: the shard's
//! own store-loss state, kept in memory per node, one [`ShardStanding`]
//! per shard.
//!
//! Owns when a shard places new ids and when a shard's loss must make the
//! next claim refresh the epoch floor; never talks to Redis (the cluster
//! store reads and writes the generations and hands the answers here).
//!
//! A shard's generation works as the whole store's does on one Redis (see
//! `placement`'s "Generation"): written when missing, its value carrying
//! the wall time its quarantine ends, adopted by every node that finds it.

use crate::placement::Generation;

/// One shard as this node knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ShardStanding {
    /// The shard's generation; `None` before it was opened.
    pub(super) generation: Option<Generation>,
    /// No new placement in the shard before this (monotonic ms).
    pub(super) until_mono_ms: u64,
    /// The shard lost its data since the last claim in it was answered
    /// with that: the next claim must make the node re-read its epoch
    /// floor first (see `ClaimOutcome::ShardLost`).
    pub(super) reload_due: bool,
}

impl ShardStanding {
    /// Adopt `generation` at `now` (wall and monotonic ms), quarantined
    /// until its quarantine ends but at most `cap_ms` from now (a skewed
    /// clock cannot stretch it); `lost` when it replaces another one or
    /// none after the shard was opened (a loss). Returns the time left.
    pub(super) fn adopt(
        &mut self,
        generation: Generation,
        now_wall_ms: u64,
        now_mono_ms: u64,
        cap_ms: u64,
        lost: bool,
    ) -> u64 {
        if self.generation.as_ref() == Some(&generation) {
            return self.left_ms(now_mono_ms);
        }
        let left_ms = generation
            .quarantine_until_wall_ms()
            .unwrap_or(0)
            .saturating_sub(now_wall_ms)
            .min(cap_ms);
        self.generation = Some(generation);
        self.until_mono_ms = now_mono_ms.saturating_add(left_ms);
        self.reload_due |= lost;
        left_ms
    }

    /// Milliseconds of quarantine left at `now_mono_ms`; an unopened shard
    /// places nothing (`u64::MAX`).
    pub(super) fn left_ms(&self, now_mono_ms: u64) -> u64 {
        match self.generation {
            None => u64::MAX,
            Some(_) => self.until_mono_ms.saturating_sub(now_mono_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_quarantines_the_shard_and_asks_for_one_floor_reload() {
        let mut s = ShardStanding::default();
        assert_eq!(s.left_ms(0), u64::MAX, "unopened places nothing");
        let left = s.adopt(Generation::new("g1", 10_000), 9_000, 100, 5_000, false);
        assert_eq!(left, 1_000);
        assert_eq!(s.left_ms(600), 500);
        assert_eq!(s.left_ms(1_100), 0);
        assert!(!s.reload_due, "opening is no loss");
        // Another node noticed a loss and wrote g2, its quarantine ending
        // far away: capped at the loss window.
        let left = s.adopt(
            Generation::new("g2", 99_000_000),
            20_000,
            2_000,
            3_000,
            true,
        );
        assert_eq!(left, 3_000);
        assert!(s.reload_due);
        // Finding the same generation again changes nothing.
        s.reload_due = false;
        assert_eq!(
            s.adopt(
                Generation::new("g2", 99_000_000),
                21_000,
                3_000,
                3_000,
                true
            ),
            2_000
        );
        assert!(!s.reload_due);
    }
}
