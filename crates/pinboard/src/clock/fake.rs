//! A test double: a clock that stands still until a test moves it, for the
//! unit tests that step through leases and quarantines by hand.
//!
//! Owns nothing but the time it answers. Test-only.

use parking_lot::Mutex;

use super::{Clock, Now};

/// A hand-moved clock: it answers the [`Now`] inside it, which a test sets
/// or advances through the field (`clock.0.lock().wall_ms += 1_000`).
pub(crate) struct FakeClock(pub(crate) Mutex<Now>);

impl FakeClock {
    /// Stands at `wall_ms` on the wall clock, monotonic 0.
    pub(crate) fn at(wall_ms: u64) -> Self {
        Self(Mutex::new(Now {
            wall_ms,
            mono_ms: 0,
        }))
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Now {
        *self.0.lock()
    }
}
