//! The sweeper as the operator sees it from one node: enabled or not,
//! whether this node holds the lease, and its counters since start.
//!
//! Owns the answer's shape; reads only this node's metrics (another node's
//! laps are in that node's answer), never the store.

use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;

/// Answer of `GET /registry/sweeper`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweeperStatus {
    /// Whether this node runs a sweeper (`--database-url` set).
    pub enabled: bool,
    /// Whether this node holds the sweeper lease now (one node at a time).
    pub held_here: bool,
    /// Laps this node ran holding the lease.
    pub laps: u64,
    /// Milliseconds since this node's last lap started, `null` before its first.
    pub last_lap_ago_ms: Option<u64>,
    /// `_alarm` calls answered 200.
    pub alarms_delivered: u64,
    /// `_wake` calls answered 200 or 202.
    pub wakes: u64,
    /// Scans and calls that failed or are retried next lap.
    pub failures: u64,
}

impl SweeperStatus {
    /// From this node's metrics at `now_wall_ms`.
    pub fn read(enabled: bool, metrics: &Metrics, now_wall_ms: u64) -> Self {
        let last = u64::try_from(metrics.sweep_last_lap_ms.get()).unwrap_or(0);
        Self {
            enabled,
            held_here: metrics.sweep_lease_held.get() == 1,
            laps: metrics.sweep_laps.get(),
            last_lap_ago_ms: (last > 0).then(|| now_wall_ms.saturating_sub(last)),
            alarms_delivered: metrics.sweep_alarms_delivered.get(),
            wakes: metrics.sweep_wakes.get(),
            failures: metrics.sweep_failures.get(),
        }
    }
}
