//! Time and randomness as inputs: the [`Clock`] trait (wall and monotonic
//! milliseconds), the [`Entropy`] trait (session ids, candidate choice) and
//! the epoch floor.
//!
//! Owns how pinboard reads time and randomness; never sleeps, never does I/O.
//! Every decision in `registry`, `placement` and `proxy::classify` takes its
//! `now` from here, so a simulation can drive virtual time and seeded
//! randomness.
//!
//! # Epoch minting (inferred)
//!
//! A placement epoch is `max(previous epoch of that id + 1, floor)` where the
//! floor is `wall_ms * 1000`, never lower than any floor this process handed
//! out before ([`EpochFloor`]). The store keeps the previous epoch; the floor
//! is what keeps epochs strictly increasing after the store lost its data
//! (Redis restarted empty): any later placement starts above every epoch minted
//! earlier, as long as no id was re-placed more than 1 000 times within one
//! millisecond and the wall clock did not step back across a restart. The
//! in-process high-water mark absorbs clock rollback while the process lives.
//!
//! A floor built [`with_durable`](EpochFloor::with_durable) also reads and
//! raises a [`DurableMark`]: a high-water mark kept outside the placement
//! store and shared by every node, so an epoch minted by *another* node
//! before the store lost its data still bounds the next one from below,
//! whatever the wall clock says. It is kept *ahead* of every minted epoch:
//! an epoch beyond what this node last wrote raises it to the next
//! multiple of [`EpochFloor::MARK_STEP`] (one minute of epochs), so a node
//! placing ids steadily writes it about once a minute, not per placement;
//! after a loss new epochs may start up to that far ahead of the wall
//! clock, which costs nothing. It is read
//! before the first claim and again after each store loss
//! ([`EpochFloor::reload_durable`]), the only times an epoch can be
//! missing from the store (while the store keeps its rows, an id's stored
//! epoch bounds its next one). A warm route never touches it.

#[cfg(test)]
pub(crate) mod fake;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use futures_util::future::BoxFuture;

/// A point in time as pinboard's decisions see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Unix wall clock, milliseconds.
    pub wall_ms: u64,
    /// Monotonic milliseconds since an arbitrary origin.
    pub mono_ms: u64,
}

impl Now {
    /// Wall clock in fractional seconds (attestation `iat`).
    pub fn wall_secs(self) -> f64 {
        self.wall_ms as f64 / 1000.0
    }
}

/// Source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall and monotonic time.
    fn now(&self) -> Now;

    /// Monotonic milliseconds alone, for callers that need nothing else
    /// (the proxy's per-request checks: one clock read, not two).
    fn mono_ms(&self) -> u64 {
        self.now().mono_ms
    }

    /// Wall-clock milliseconds alone, as [`mono_ms`](Self::mono_ms).
    fn wall_ms(&self) -> u64 {
        self.now().wall_ms
    }
}

/// The real clock: `SystemTime` for wall, tokio's `Instant` for monotonic
/// (so paused-time tests move it).
#[derive(Debug)]
pub struct SystemClock {
    origin: tokio::time::Instant,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Now {
        Now {
            wall_ms: self.wall_ms(),
            mono_ms: self.mono_ms(),
        }
    }

    fn mono_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// Source of randomness.
pub trait Entropy: Send + Sync + 'static {
    /// A uniformly random `u64`.
    fn next_u64(&self) -> u64;

    /// `bytes` random bytes as lowercase hex.
    fn token_hex(&self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes * 2);
        let mut left = bytes;
        while left > 0 {
            let word = self.next_u64().to_le_bytes();
            let take = left.min(8);
            out.push_str(&hex::encode(&word[..take]));
            left -= take;
        }
        out
    }
}

/// A seedable pseudo-random source (OS-seeded by default).
#[derive(Debug)]
pub struct SeededEntropy {
    rng: Mutex<StdRng>,
}

impl SeededEntropy {
    /// Seeded from the operating system.
    pub fn from_os() -> Self {
        Self {
            rng: Mutex::new(StdRng::from_os_rng()),
        }
    }

    /// Deterministic, for tests and simulations.
    pub fn seeded(seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        self.rng.lock().random()
    }
}

/// Why a [`DurableMark`] could not be read or raised.
#[derive(Debug, thiserror::Error)]
#[error("durable epoch mark: {0}")]
pub struct MarkError(pub String);

/// A high-water mark of minted epochs that outlives the placement store
/// (a durable store every node reads).
pub trait DurableMark: Send + Sync + 'static {
    /// The highest epoch recorded.
    ///
    /// # Errors
    ///
    /// [`MarkError`] when the durable store cannot be read.
    fn load(&self) -> BoxFuture<'_, Result<u64, MarkError>>;

    /// Record `epoch` (the mark never goes down).
    ///
    /// # Errors
    ///
    /// [`MarkError`] when the durable store cannot be written.
    fn raise(&self, epoch: u64) -> BoxFuture<'_, Result<(), MarkError>>;
}

/// Lower bound for new epochs; never moves backwards.
#[derive(Default)]
pub struct EpochFloor {
    high_water: AtomicU64,
    durable: Option<Arc<dyn DurableMark>>,
    /// The durable mark must be read before the next claim.
    durable_stale: AtomicBool,
    /// The highest value this node wrote to the durable mark.
    raised: AtomicU64,
}

impl std::fmt::Debug for EpochFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochFloor")
            .field("high_water", &self.high_water)
            .field("durable", &self.durable.is_some())
            .finish()
    }
}

impl EpochFloor {
    /// Units of epoch per wall millisecond.
    pub const PER_MS: u64 = 1000;

    /// The durable mark is raised in steps of this many epochs (one
    /// minute of wall clock; see the module doc).
    pub const MARK_STEP: u64 = 60_000 * Self::PER_MS;

    /// The floor for an epoch minted at `now`: `wall_ms * 1000`, or the
    /// highest floor handed out before if the clock stepped back.
    pub fn floor(&self, now: Now) -> u64 {
        let candidate = now.wall_ms.saturating_mul(Self::PER_MS);
        let prev = self.high_water.fetch_max(candidate, Ordering::AcqRel);
        prev.max(candidate)
    }

    /// Record an epoch seen in the store so later floors stay above it.
    pub fn observe(&self, epoch: u64) {
        self.high_water.fetch_max(epoch, Ordering::AcqRel);
    }

    /// A floor that also keeps to `mark` (see the module doc).
    pub fn with_durable(mark: Arc<dyn DurableMark>) -> Self {
        Self {
            high_water: AtomicU64::new(0),
            durable: Some(mark),
            durable_stale: AtomicBool::new(true),
            raised: AtomicU64::new(0),
        }
    }

    /// The placement store lost its data: read the durable mark again
    /// before the next claim.
    pub fn reload_durable(&self) {
        self.durable_stale.store(true, Ordering::Release);
    }

    /// The floor for a claim at `now`: [`floor`](Self::floor), raised past
    /// the durable mark when there is one and it is due a read (see the
    /// module doc). A mark that cannot be read is logged, the local floor
    /// used, and the read tried again on the next claim.
    pub async fn floor_for_claim(&self, now: Now) -> u64 {
        let due = self.durable_stale.load(Ordering::Acquire);
        if let Some(mark) = self.durable.as_ref().filter(|_| due) {
            match mark.load().await {
                Ok(high) => {
                    self.observe(high.saturating_add(1));
                    self.durable_stale.store(false, Ordering::Release);
                }
                Err(error) => {
                    if let Some(seen) = pinned_edge::logging::repeats().failed(
                        "pinboard epoch mark",
                        "load",
                        &error.0,
                    ) {
                        tracing::warn!(target: "pinboard::placement", error = %seen, failures = seen.failures, "durable epoch mark unreadable; using this node's floor");
                    }
                }
            }
        }
        self.floor(now)
    }

    /// Record an epoch this node minted: locally, and in the durable mark
    /// when `epoch` is beyond what this node last wrote there (then the
    /// mark goes to the next multiple of [`MARK_STEP`](Self::MARK_STEP)).
    pub async fn minted(&self, epoch: u64) {
        self.observe(epoch);
        let Some(mark) = &self.durable else { return };
        if epoch < self.raised.load(Ordering::Acquire) {
            return;
        }
        let target = (epoch / Self::MARK_STEP)
            .saturating_add(1)
            .saturating_mul(Self::MARK_STEP);
        match mark.raise(target).await {
            Ok(()) => {
                self.raised.fetch_max(target, Ordering::AcqRel);
            }
            Err(error) => {
                if let Some(seen) =
                    pinned_edge::logging::repeats().failed("pinboard epoch mark", "raise", &error.0)
                {
                    tracing::warn!(target: "pinboard::placement", error = %seen, failures = seen.failures, epoch, "could not raise the durable epoch mark");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_never_follows_the_clock_back() {
        let f = EpochFloor::default();
        let a = f.floor(Now {
            wall_ms: 2000,
            mono_ms: 0,
        });
        assert_eq!(a, 2_000_000);
        let b = f.floor(Now {
            wall_ms: 1000,
            mono_ms: 1,
        });
        assert_eq!(b, 2_000_000);
        f.observe(5_000_000);
        assert_eq!(
            f.floor(Now {
                wall_ms: 3000,
                mono_ms: 2
            }),
            5_000_000
        );
    }

    /// A mark shared by two floors, as two nodes share a durable store.
    #[derive(Default)]
    struct Shared(AtomicU64);

    impl DurableMark for Shared {
        fn load(&self) -> BoxFuture<'_, Result<u64, MarkError>> {
            let v = self.0.load(Ordering::Acquire);
            Box::pin(async move { Ok(v) })
        }

        fn raise(&self, epoch: u64) -> BoxFuture<'_, Result<(), MarkError>> {
            self.0.fetch_max(epoch, Ordering::AcqRel);
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test]
    async fn a_durable_mark_lifts_another_nodes_floor_past_a_clock_rollback() {
        let mark = Arc::new(Shared::default());
        let a = EpochFloor::with_durable(mark.clone());
        let b = EpochFloor::with_durable(mark);
        let late = Now {
            wall_ms: 100_000,
            mono_ms: 0,
        };
        let minted = a.floor_for_claim(late).await;
        a.minted(minted).await;
        // Node b never saw that epoch and its clock is a minute behind.
        let early = Now {
            wall_ms: 100_000 - 60_000,
            mono_ms: 1,
        };
        assert!(b.floor_for_claim(early).await > minted);
        // Without the mark it would have gone back.
        assert!(EpochFloor::default().floor(early) < minted);
    }

    #[tokio::test]
    async fn the_durable_mark_is_written_ahead_in_steps_not_per_epoch() {
        #[derive(Default)]
        struct Counting(Shared, AtomicU64);
        impl DurableMark for Counting {
            fn load(&self) -> BoxFuture<'_, Result<u64, MarkError>> {
                self.0.load()
            }
            fn raise(&self, epoch: u64) -> BoxFuture<'_, Result<(), MarkError>> {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.0.raise(epoch)
            }
        }
        let mark = Arc::new(Counting::default());
        let floor = EpochFloor::with_durable(mark.clone());
        let base = 1_800_000_000_000 * EpochFloor::PER_MS;
        for i in 0..1000 {
            floor.minted(base + i * 1000).await;
        }
        assert_eq!(
            mark.1.load(Ordering::Relaxed),
            1,
            "one write for a minute of epochs"
        );
        let high = mark.0 .0.load(Ordering::Relaxed);
        assert!(
            high > base + 999 * 1000,
            "the mark is ahead of every epoch minted"
        );
        assert_eq!(high % EpochFloor::MARK_STEP, 0);
    }

    #[test]
    fn token_hex_has_the_asked_length() {
        let e = SeededEntropy::seeded(7);
        assert_eq!(e.token_hex(16).len(), 32);
        assert_eq!(e.token_hex(3).len(), 6);
        assert_ne!(e.token_hex(16), e.token_hex(16));
    }
}
