//! Failures that a retry loop repeats (registration, heartbeats, sweeper
//! scans, store calls): logged when they start, again when their cause
//! changes, once per reminder period while they last (with the count, not
//! the cause again), and once when they end, never on every retry.
//!
//! Owns the table of failing streams, keyed by a call site and a scope (a
//! worker's client id, a session, a sweeper scan). The table is bounded
//! ([`MAX_STREAMS`]; a new stream into a full table evicts the one that
//! failed least recently) and holds only failing streams: a recovery
//! removes its entry, and so does a silence of [`QUIET_PERIODS`] reminder
//! periods (for call sites that never see their success: a failure after
//! such a silence is a new one, logged with its cause). Never logs itself;
//! it answers whether and what the
//! caller's one log statement should say, so the statement keeps its level,
//! target and fields. All time is tokio's (tests run on a paused clock).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Default reminder period: a failure that lasts is logged again this
/// often, with its count.
pub const DEFAULT_REPEAT_PERIOD: Duration = Duration::from_secs(60);
/// Most failing streams tracked at once.
pub const MAX_STREAMS: usize = 1024;
/// Reminder periods without a failure after which a stream is over.
pub const QUIET_PERIODS: u32 = 10;

#[derive(Debug)]
struct Stream {
    cause: String,
    failures: u64,
    since: Instant,
    last_line: Instant,
    last_failure: Instant,
}

/// The failing streams of a process (see the module doc); one shared table
/// is [`repeats`].
#[derive(Debug)]
pub struct Repeats {
    streams: Mutex<HashMap<(&'static str, String), Stream>>,
    period_ms: AtomicU64,
}

/// What a failure's log line says: its cause (first, or changed), or that
/// it is the one logged before (a reminder), and the count so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Consecutive failures of this stream, this one included.
    pub failures: u64,
    /// Since the first of them.
    pub failing_for: Duration,
    /// The cause, when it is new; `None` for a reminder.
    cause: Option<String>,
}

impl Seen {
    /// Whether this line repeats a cause logged before (a reminder).
    pub fn is_reminder(&self) -> bool {
        self.cause.is_none()
    }

    /// [`failing_for`](Self::failing_for) in whole milliseconds.
    pub fn failing_for_ms(&self) -> u64 {
        u64::try_from(self.failing_for.as_millis()).unwrap_or(u64::MAX)
    }
}

/// The cause, or for a reminder a pointer to the line that had it.
impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(cause) => f.write_str(cause),
            None => f.write_str("unchanged since the first line of this failure"),
        }
    }
}

/// A failing stream that succeeded again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Consecutive failures before the success.
    pub failures: u64,
    /// From the first of them to the success.
    pub failing_for: Duration,
}

impl Recovered {
    /// [`failing_for`](Self::failing_for) in whole milliseconds.
    pub fn failing_for_ms(&self) -> u64 {
        u64::try_from(self.failing_for.as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for Repeats {
    fn default() -> Self {
        Self::new(DEFAULT_REPEAT_PERIOD)
    }
}

impl Repeats {
    /// An empty table reminding every `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            streams: Mutex::new(HashMap::new()),
            period_ms: AtomicU64::new(millis(period)),
        }
    }

    /// Sets the reminder period (at least 1 ms).
    pub fn set_period(&self, period: Duration) {
        self.period_ms.store(millis(period), Ordering::Relaxed);
    }

    /// The reminder period.
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms.load(Ordering::Relaxed))
    }

    /// `site` failed for `scope` with `cause`: `Some` when this failure
    /// should be logged (see [`Seen`]).
    pub fn failed(
        &self,
        site: &'static str,
        scope: &str,
        cause: impl fmt::Display,
    ) -> Option<Seen> {
        self.failed_at(site, scope, cause, Instant::now())
    }

    /// [`failed`](Self::failed) at `now`.
    pub fn failed_at(
        &self,
        site: &'static str,
        scope: &str,
        cause: impl fmt::Display,
        now: Instant,
    ) -> Option<Seen> {
        let cause = cause.to_string();
        let period = self.period();
        let mut streams = self.streams.lock();
        let key = (site, scope.to_owned());
        if streams.get(&key).is_some_and(|s| {
            now.saturating_duration_since(s.last_failure) >= period * QUIET_PERIODS
        }) {
            streams.remove(&key);
        }
        if let Some(s) = streams.get_mut(&key) {
            s.failures = s.failures.saturating_add(1);
            s.last_failure = now;
            let changed = s.cause != cause;
            if !changed && now.saturating_duration_since(s.last_line) < period {
                return None;
            }
            s.last_line = now;
            let seen = Seen {
                failures: s.failures,
                failing_for: now.saturating_duration_since(s.since),
                cause: changed.then(|| cause.clone()),
            };
            if changed {
                s.cause = cause;
            }
            return Some(seen);
        }
        if streams.len() >= MAX_STREAMS {
            let stalest = streams
                .iter()
                .min_by_key(|(_, s)| s.last_line)
                .map(|(k, _)| k.clone());
            if let Some(k) = stalest {
                streams.remove(&k);
            }
        }
        streams.insert(
            key,
            Stream {
                cause: cause.clone(),
                failures: 1,
                since: now,
                last_line: now,
                last_failure: now,
            },
        );
        Some(Seen {
            failures: 1,
            failing_for: Duration::ZERO,
            cause: Some(cause),
        })
    }

    /// `site` succeeded for `scope`: `Some` when that ends a failure (log
    /// the recovery), `None` when nothing was failing.
    pub fn recovered(&self, site: &'static str, scope: &str) -> Option<Recovered> {
        self.recovered_at(site, scope, Instant::now())
    }

    /// [`recovered`](Self::recovered) at `now`.
    pub fn recovered_at(&self, site: &'static str, scope: &str, now: Instant) -> Option<Recovered> {
        let mut streams = self.streams.lock();
        if streams.is_empty() {
            return None;
        }
        let s = streams.remove(&(site, scope.to_owned()))?;
        Some(Recovered {
            failures: s.failures,
            failing_for: now.saturating_duration_since(s.since),
        })
    }

    /// Streams failing now.
    pub fn len(&self) -> usize {
        self.streams.lock().len()
    }

    /// Whether nothing is failing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn millis(period: Duration) -> u64 {
    u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The process's shared table (its period set by the logging setup, see
/// [`LogSettings`](super::LogSettings)): for call sites that hold no state
/// of their own.
pub fn repeats() -> &'static Repeats {
    static SHARED: OnceLock<Repeats> = OnceLock::new();
    SHARED.get_or_init(Repeats::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "pinboard register";

    #[tokio::test(start_paused = true)]
    async fn first_changed_reminded_and_recovered_never_every_retry() {
        let r = Repeats::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let first = r
            .failed_at(SITE, "w1", "CaUsedAsEndEntity", t0)
            .expect("first");
        assert_eq!(
            (first.failures, first.to_string().as_str()),
            (1, "CaUsedAsEndEntity")
        );
        for i in 1..30u64 {
            let at = t0 + Duration::from_secs(2 * i);
            assert_eq!(
                r.failed_at(SITE, "w1", "CaUsedAsEndEntity", at),
                None,
                "retry {i}"
            );
        }
        let reminder = r
            .failed_at(
                SITE,
                "w1",
                "CaUsedAsEndEntity",
                t0 + Duration::from_secs(60),
            )
            .expect("a reminder after a period");
        assert!(reminder.is_reminder());
        assert_eq!(reminder.failures, 31);
        assert!(!reminder.to_string().contains("CaUsed"), "{reminder}");
        let changed = r
            .failed_at(
                SITE,
                "w1",
                "connection refused",
                t0 + Duration::from_secs(61),
            )
            .expect("a new cause is logged at once");
        assert_eq!(
            (changed.failures, changed.to_string().as_str()),
            (32, "connection refused")
        );
        assert_eq!(changed.failing_for, Duration::from_secs(61));
        assert!(
            r.failed_at(SITE, "w2", "other worker", t0).is_some(),
            "scopes are apart"
        );
        let back = r
            .recovered_at(SITE, "w1", t0 + Duration::from_secs(70))
            .expect("recovered");
        assert_eq!(back.failures, 32);
        assert_eq!(back.failing_for_ms(), 70_000);
        assert_eq!(r.recovered_at(SITE, "w1", t0), None, "once");
        assert!(
            r.failed_at(SITE, "w1", "CaUsedAsEndEntity", t0).is_some(),
            "anew"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_silence_ends_a_stream_that_never_heard_its_success() {
        let r = Repeats::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert!(r.failed_at(SITE, "", "store down", t0).is_some());
        let later = t0 + Duration::from_secs(u64::from(QUIET_PERIODS));
        let again = r
            .failed_at(SITE, "", "store down", later)
            .expect("a new failure");
        assert!(!again.is_reminder(), "its cause is logged again");
        assert_eq!(again.failures, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded() {
        let r = Repeats::default();
        let t0 = Instant::now();
        for i in 0..MAX_STREAMS as u64 + 10 {
            r.failed_at(SITE, &i.to_string(), "x", t0 + Duration::from_millis(i));
        }
        assert_eq!(r.len(), MAX_STREAMS);
        assert_eq!(
            r.recovered_at(SITE, "0", t0),
            None,
            "the stalest went first"
        );
    }
}
