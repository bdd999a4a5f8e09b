//! Request rate, error rate and latency per namespace, as the proxy saw
//! them: counters since start that a reader turns into rates and a p99 by
//! taking differences between two reads (the dashboard polls them).
//!
//! Owns the per-namespace counters and their bound: at most
//! [`MAX_TRACKED_NAMESPACES`] namespaces get their own row (the first seen);
//! the rest add up under [`OTHER_NAMESPACES`], so made-up namespaces in
//! client paths cannot grow the table. One request costs a read lock, a
//! map lookup and four atomic adds; never blocks on I/O.
//!
//! The same counters are exported on `/metrics` ([`TrafficMetrics`], read
//! at scrape time, so a request pays nothing more for them):
//! `pinboard_proxy_namespace_requests_total{namespace}`,
//! `pinboard_proxy_namespace_5xx_total{namespace}` and the histogram
//! `pinboard_proxy_response_head_seconds{namespace}` (time to the response
//! head; buckets [`LATENCY_BUCKETS_MS`]), which is what a 5xx share and a
//! p99 per namespace are computed from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
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
    /// Time to the response head, summed (µs): a histogram's `_sum`.
    sum_us: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
}

impl Row {
    fn add(&self, status: u16, took: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if status >= 500 {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        let ms = us / 1000;
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
    /// Time to the response head of all of them, in microseconds.
    #[serde(skip)]
    pub sum_us: u64,
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
            sum_us: row.sum_us.load(Ordering::Relaxed),
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

/// A counter family of [`TrafficMetrics`]: name, help, and its value in a row.
type CounterFamily = (&'static str, &'static str, fn(&NamespaceTraffic) -> u64);

/// [`Traffic`] as Prometheus families, read at scrape time (see the
/// module doc). Every family is declared on every scrape, rows or not.
#[derive(Debug, Clone)]
pub struct TrafficMetrics(pub Arc<Traffic>);

impl Collector for TrafficMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.read();
        let counters: [CounterFamily; 2] = [
            (
                "pinboard_proxy_namespace_requests",
                "Client requests the proxy answered, per namespace (the first 64; the rest as (other))",
                |row| row.requests,
            ),
            (
                "pinboard_proxy_namespace_5xx",
                "Client requests the proxy answered 5xx (the worker's or pinboard's own), per namespace",
                |row| row.errors,
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for row in &rows {
                let labels = [("namespace", row.ns.as_str())];
                ConstCounter::new(value(row)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut heads = encoder.encode_descriptor(
            "pinboard_proxy_response_head_seconds",
            "Time from a client request to its response head, per namespace",
            None,
            MetricType::Histogram,
        )?;
        for row in &rows {
            let labels = [("namespace", row.ns.as_str())];
            let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_MS
                .iter()
                .map(|ms| *ms as f64 / 1000.0)
                .chain(std::iter::once(f64::MAX))
                .zip(row.buckets.iter().copied())
                .collect();
            let sum = row.sum_us as f64 / 1e6;
            heads
                .encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    sum,
                    row.requests,
                    &buckets,
                    None,
                )?;
        }
        Ok(())
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

    #[test]
    fn the_rows_are_exported_as_counters_and_a_histogram() {
        let t = Arc::new(Traffic::default());
        t.record("/c", 200, Duration::from_micros(1500));
        t.record("/c", 503, Duration::from_millis(70));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(TrafficMetrics(t)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "pinboard_proxy_namespace_requests_total{namespace=\"/c\"} 2",
            "pinboard_proxy_namespace_5xx_total{namespace=\"/c\"} 1",
            "pinboard_proxy_response_head_seconds_count{namespace=\"/c\"} 2",
            "pinboard_proxy_response_head_seconds_bucket{le=\"0.002\",namespace=\"/c\"} 1",
            "pinboard_proxy_response_head_seconds_bucket{le=\"0.1\",namespace=\"/c\"} 2",
            "pinboard_proxy_response_head_seconds_bucket{le=\"+Inf\",namespace=\"/c\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
