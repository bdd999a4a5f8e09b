//! The worker's wall clock: alarm due times, attestation expiry, activation
//! stamps. Read in this one place, so a test or a simulation can run the
//! whole worker on tokio's clock, which `tokio::time::pause` stops and
//! advances at will.
//!
//! Monotonic waits (idle sweeps, leases, deadlines) already use
//! `tokio::time`; this clock only answers "what time is it", never sleeps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a worker reads wall time. [`Clock::system`] by default; set another
/// with [`Options::clock`](crate::Options::clock).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = pinned::Clock::tokio();
/// let before = clock.now();
/// tokio::time::advance(std::time::Duration::from_secs(60)).await;
/// assert_eq!(clock.now().duration_since(before).unwrap().as_secs(), 60);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Clock(Source);

#[derive(Clone, Debug)]
enum Source {
    System,
    Tokio {
        wall: SystemTime,
        start: tokio::time::Instant,
    },
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl Clock {
    /// The operating system's wall clock.
    pub fn system() -> Self {
        Self(Source::System)
    }

    /// The wall time at this call, advanced by tokio's clock from then on:
    /// under `tokio::time::pause` it stands still and moves only as tokio's
    /// time does, so alarms come due on paused time. Needs a tokio runtime
    /// (its clock is read now).
    pub fn tokio() -> Self {
        Self(Source::Tokio {
            wall: SystemTime::now(),
            start: tokio::time::Instant::now(),
        })
    }

    /// The current wall time.
    pub fn now(&self) -> SystemTime {
        match &self.0 {
            Source::System => SystemTime::now(),
            Source::Tokio { wall, start } => *wall + start.elapsed(),
        }
    }

    /// Milliseconds since the Unix epoch (0 before it).
    pub(crate) fn unix_ms(&self) -> u64 {
        self.since_epoch()
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// Seconds since the Unix epoch, fractional (attestation times).
    pub(crate) fn unix_secs(&self) -> f64 {
        self.since_epoch().as_secs_f64()
    }

    fn since_epoch(&self) -> Duration {
        self.now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    }
}
