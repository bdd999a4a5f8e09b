//! [`Domain`]: the one place a worker and its instances meet the outside
//! world besides requests: wall time, timers, spawned tasks, randomness.
//! It is the worker's only public time source: the wall clock it reads
//! ([`Wall`]) is private to it, so no part of the worker can read another.
//!
//! Every part of the worker reads the time, starts tasks and draws random
//! bytes through the domain it was built with, so one value decides whether
//! an instance runs on the machine's clock and entropy (the default) or
//! under a test's paused tokio clock with seeded randomness (a simulation
//! replays the same run from the same seed).
//!
//! The domain never owns a runtime: tasks go to the tokio runtime it names
//! (or the current one), and its timers are that runtime's, which is what
//! `tokio::time::pause` stops and advances.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

/// Where a worker's instances get their time, timers, tasks and randomness.
/// [`Domain::system`] by default; set another with
/// [`Options::domain`](crate::Options::domain), and reach it from an
/// instance with [`Context::domain`](crate::Context::domain).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A test or simulation: tokio's (paused) clock, seeded randomness.
/// let a = pinned::Domain::simulated(7);
/// let b = pinned::Domain::simulated(7);
/// assert_eq!(a.random_u64(), b.random_u64(), "one seed, one sequence");
/// let before = a.now();
/// a.sleep(std::time::Duration::from_secs(60)).await; // no real time passes
/// assert_eq!(a.now().duration_since(before).unwrap().as_secs(), 60);
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Domain {
    clock: Wall,
    /// `None`: the runtime current where a task is spawned.
    runtime: Option<tokio::runtime::Handle>,
    entropy: Entropy,
}

/// Where a domain reads wall time.
#[derive(Clone, Debug, Default)]
enum Wall {
    /// The operating system's wall clock.
    #[default]
    System,
    /// `wall` at `start`, advanced by tokio's clock since.
    Tokio { wall: SystemTime, start: Instant },
}

#[derive(Clone, Default)]
enum Entropy {
    /// The operating system's generator (thread-local, reseeded).
    #[default]
    System,
    /// One seeded generator shared by the whole worker: the same seed and
    /// the same order of draws give the same bytes.
    Seeded(Arc<Mutex<StdRng>>),
}

impl std::fmt::Debug for Entropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::System => f.write_str("System"),
            Self::Seeded(_) => f.write_str("Seeded"),
        }
    }
}

impl Domain {
    /// The machine: the system wall clock, the current tokio runtime, the
    /// operating system's randomness.
    pub fn system() -> Self {
        Self::default()
    }

    /// A simulation: wall time from tokio's clock (see
    /// [`with_tokio_clock`](Self::with_tokio_clock)), the current runtime,
    /// and randomness from `seed`. Needs a tokio runtime (its clock is read
    /// now).
    pub fn simulated(seed: u64) -> Self {
        Self::system().with_tokio_clock().with_seed(seed)
    }

    /// The same domain reading wall time from tokio's clock: the wall time
    /// at this call, advanced by tokio's clock from then on. Under
    /// `tokio::time::pause` it stands still and moves only as tokio's time
    /// does, so alarms come due and attestations expire on paused time.
    /// Needs a tokio runtime (its clock is read now).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let domain = pinned::Domain::system().with_tokio_clock();
    /// let before = domain.now();
    /// tokio::time::advance(std::time::Duration::from_secs(60)).await;
    /// assert_eq!(domain.now().duration_since(before).unwrap().as_secs(), 60);
    /// # }
    /// ```
    #[must_use]
    pub fn with_tokio_clock(mut self) -> Self {
        self.clock = Wall::Tokio {
            wall: SystemTime::now(),
            start: Instant::now(),
        };
        self
    }

    /// The same domain spawning its tasks on `runtime` (default: the
    /// runtime current where each task is started).
    #[must_use]
    pub fn with_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The same domain drawing randomness from a generator seeded with
    /// `seed`. Worker secrets come from it too: seed only tests and
    /// simulations.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.entropy = Entropy::Seeded(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))));
        self
    }

    /// The current wall time.
    pub fn now(&self) -> SystemTime {
        match &self.clock {
            Wall::System => SystemTime::now(),
            Wall::Tokio { wall, start } => *wall + start.elapsed(),
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

    /// A monotonic deadline as wall time on this domain's clock.
    pub(crate) fn wall_at(&self, at: Instant) -> SystemTime {
        let now = Instant::now();
        let wall_now = self.now();
        let wall = if at >= now {
            wall_now.checked_add(at - now)
        } else {
            wall_now.checked_sub(now - at)
        };
        wall.unwrap_or(wall_now)
    }

    /// Waits `duration` on the runtime's clock (paused time skips it).
    pub fn sleep(&self, duration: Duration) -> Sleep {
        tokio::time::sleep(duration)
    }

    /// Waits until `deadline` on the runtime's clock.
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        tokio::time::sleep_until(deadline)
    }

    /// Whether the domain names a runtime of its own for its tasks
    /// ([`with_runtime`](Self::with_runtime)).
    pub(crate) fn has_runtime(&self) -> bool {
        self.runtime.is_some()
    }

    /// Starts `work` as a task of the domain's runtime.
    ///
    /// # Panics
    ///
    /// Without a runtime of its own, when called outside a tokio runtime
    /// (as `tokio::spawn` does).
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime.spawn(work),
            None => tokio::spawn(work),
        }
    }

    /// Starts `work` if there is a runtime to start it on; `None` otherwise
    /// (a guard dropped during runtime shutdown has nothing left to do).
    pub(crate) fn try_spawn<F>(&self, work: F) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => Some(runtime.spawn(work)),
            None => tokio::runtime::Handle::try_current()
                .ok()
                .map(|runtime| runtime.spawn(work)),
        }
    }

    /// Fills `bytes` with random bytes.
    pub fn fill_bytes(&self, bytes: &mut [u8]) {
        match &self.entropy {
            Entropy::System => rand::rng().fill_bytes(bytes),
            Entropy::Seeded(rng) => rng.lock().fill_bytes(bytes),
        }
    }

    /// A random `u64`.
    pub fn random_u64(&self) -> u64 {
        let mut bytes = [0u8; 8];
        self.fill_bytes(&mut bytes);
        u64::from_le_bytes(bytes)
    }

    /// A random fraction in `[low, high)` (retry jitter).
    pub(crate) fn random_between(&self, low: f64, high: f64) -> f64 {
        match &self.entropy {
            Entropy::System => rand::rng().random_range(low..high),
            Entropy::Seeded(rng) => rng.lock().random_range(low..high),
        }
    }

    /// `bytes` random bytes, hex-encoded (ids, secrets, challenges).
    pub(crate) fn random_hex(&self, bytes: usize) -> String {
        let mut buf = vec![0u8; bytes];
        self.fill_bytes(&mut buf);
        hex::encode(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence_and_another_seed_another() {
        let a = Domain::system().with_seed(1);
        let b = Domain::system().with_seed(1);
        let c = Domain::system().with_seed(2);
        let draws = |d: &Domain| (0..4).map(|_| d.random_u64()).collect::<Vec<_>>();
        let first = draws(&a);
        assert_eq!(first, draws(&b));
        assert_ne!(first, draws(&c));
        let jitter = a.random_between(0.3, 1.0);
        assert!((0.3..1.0).contains(&jitter));
    }

    #[tokio::test(start_paused = true)]
    async fn a_simulated_domain_runs_on_paused_time() {
        let domain = Domain::simulated(0);
        let before = domain.now();
        let task = domain.spawn({
            let domain = domain.clone();
            async move { domain.sleep(Duration::from_secs(3_600)).await }
        });
        task.await.expect("the task ran");
        let elapsed = domain.now().duration_since(before).expect("forward");
        assert_eq!(elapsed.as_secs(), 3_600);
    }
}
