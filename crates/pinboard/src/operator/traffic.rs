//! Request rate, error rate and latency per namespace, as the proxy saw
//! them: counters since start that a reader turns into rates and a p99 by
//! taking differences between two reads (the dashboard polls them).
//!
//! Owns the per-namespace counters and their bound: at most
//! [`MAX_TRACKED_NAMESPACES`] namespaces get their own row (the first seen);
//! the rest add up under [`OTHER_NAMESPACES`], so made-up namespaces in
//! client paths cannot grow the table. One request costs a read lock, a
//! map lookup and three atomic adds; never blocks on I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

/// Most namespaces with a row of their own.
pub const MAX_TRACKED_NAMESPACES: usize = 64;
/// The row of every namespace beyond [`MAX_TRACKED_NAMESPACES`].
pub const OTHER_NAMESPACES: &str = "(other)";
/// Upper bounds of the latency buckets, in milliseconds (time to the
/// response head); one more bucket holds everything slower.
pub const LATENCY_BUCKETS_MS: [u64; 14] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000,
];

#[derive(Debug, Default)]
struct Row {
    requests: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
}

impl Row {
    fn add(&self, status: u16, took: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if status >= 500 {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_MS
            .iter()
            .position(|&b| ms < b)
            .unwrap_or(LATENCY_BUCKETS_MS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }
}

/// One namespace's counters since start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceTraffic {
    /// Namespace with its slash, or [`OTHER_NAMESPACES`].
    pub ns: String,
    /// Requests answered.
    pub requests: u64,
    /// Requests answered 5xx (by the worker or by pinboard).
    pub errors: u64,
    /// Requests per latency bucket ([`LATENCY_BUCKETS_MS`], then the rest).
    pub buckets: Vec<u64>,
}

/// Per-namespace traffic of this node.
#[derive(Debug, Default)]
pub struct Traffic {
    /// foldhash: every proxied request looks its namespace up here. Rows
    /// are never removed, so the first namespaces seen keep theirs.
    rows: RwLock<foldhash::HashMap<String, Row>>,
    other: Row,
}

impl Traffic {
    /// One request to `ns` answered `status` after `took`.
    pub fn record(&self, ns: &str, status: u16, took: Duration) {
        // A known namespace, or a full table, is counted under the read
        // lock; only a namespace's first request takes the write lock.
        {
            let rows = self.rows.read();
            if let Some(row) = rows.get(ns) {
                row.add(status, took);
                return;
            }
            if rows.len() >= MAX_TRACKED_NAMESPACES {
                self.other.add(status, took);
                return;
            }
        }
        let mut rows = self.rows.write();
        if !rows.contains_key(ns) && rows.len() >= MAX_TRACKED_NAMESPACES {
            self.other.add(status, took);
            return;
        }
        rows.entry(ns.to_owned()).or_default().add(status, took);
    }

    /// Every row, sorted by namespace (the `(other)` row last, when used).
    pub fn read(&self) -> Vec<NamespaceTraffic> {
        let snapshot = |ns: &str, row: &Row| NamespaceTraffic {
            ns: ns.to_owned(),
            requests: row.requests.load(Ordering::Relaxed),
            errors: row.errors.load(Ordering::Relaxed),
            buckets: row
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        };
        let mut out: Vec<NamespaceTraffic> = self
            .rows
            .read()
            .iter()
            .map(|(ns, row)| snapshot(ns, row))
            .collect();
        out.sort_unstable_by(|a, b| a.ns.cmp(&b.ns));
        if self.other.requests.load(Ordering::Relaxed) > 0 {
            out.push(snapshot(OTHER_NAMESPACES, &self.other));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_count_errors_and_buckets_and_stay_bounded() {
        let t = Traffic::default();
        t.record("/c", 200, Duration::from_micros(300));
        t.record("/c", 503, Duration::from_millis(70));
        t.record("/c", 200, Duration::from_secs(60));
        let rows = t.read();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].requests, rows[0].errors), (3, 1));
        assert_eq!(rows[0].buckets[0], 1, "under 1 ms");
        assert_eq!(rows[0].buckets[6], 1, "50..100 ms");
        assert_eq!(
            rows[0].buckets[LATENCY_BUCKETS_MS.len()],
            1,
            "slower than all"
        );
        for i in 0..MAX_TRACKED_NAMESPACES + 5 {
            t.record(&format!("/n{i}"), 200, Duration::ZERO);
        }
        let rows = t.read();
        assert_eq!(rows.len(), MAX_TRACKED_NAMESPACES + 1);
        let other = rows.last().expect("other");
        assert_eq!((other.ns.as_str(), other.requests), (OTHER_NAMESPACES, 6));
    }
}
