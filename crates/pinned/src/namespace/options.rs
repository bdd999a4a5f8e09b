//! Per-namespace hosting options, with the Python reference's defaults.

use std::time::Duration;

/// Default idle timeout: an instance with nothing in flight for this long is
/// evicted.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default cap on instance records per namespace.
pub const DEFAULT_MAX_INSTANCES: usize = 10_000;
/// Default period of the idle sweep.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Default budget of instance churn lines (activations, evictions,
/// hibernations, aborts) a namespace logs at `info` each second.
pub const DEFAULT_CHURN_LINES_PER_SECOND: u32 = 20;
/// Default detached timeout: an instance with no client request or open
/// stream for this long is wound down, whatever background work it holds.
pub const DEFAULT_DETACHED_TIMEOUT: Duration = Duration::from_secs(86_400);

/// How one namespace hosts its object.
///
/// ```
/// use std::time::Duration;
/// let opts = pinned::HostOptions::default()
///     .idle_timeout(Duration::from_secs(60))
///     .max_instances(50_000)
///     .exclusive(true);
/// assert!(opts.is_exclusive());
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct HostOptions {
    pub(crate) idle_timeout: Duration,
    pub(crate) max_instances: usize,
    pub(crate) sweep_interval: Duration,
    pub(crate) release_placement_on_idle: bool,
    pub(crate) exclusive: bool,
    pub(crate) env: Option<String>,
    pub(crate) detached_timeout: Duration,
    pub(crate) evict_idle_at_capacity: bool,
    pub(crate) sockets: crate::namespace::sockets::SocketOptions,
    pub(crate) churn_lines_per_second: u32,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_instances: DEFAULT_MAX_INSTANCES,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            release_placement_on_idle: true,
            exclusive: false,
            env: None,
            detached_timeout: DEFAULT_DETACHED_TIMEOUT,
            evict_idle_at_capacity: true,
            sockets: crate::namespace::sockets::SocketOptions::default(),
            churn_lines_per_second: DEFAULT_CHURN_LINES_PER_SECOND,
        }
    }
}

impl HostOptions {
    /// Evict an instance after this long with no request, open stream, open
    /// WebSocket or pending tracked work (default 300 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// At most this many instance records at once (default 10 000); further
    /// activations answer 503 `instance capacity reached; retry` while the
    /// existing instances keep serving. Must be at least 1.
    pub fn max_instances(mut self, max: usize) -> Self {
        self.max_instances = max;
        self
    }

    /// Wind down (and abort at once) an instance that has had no client
    /// request and no open stream for this long, whatever background work
    /// keeps it busy (default 86 400 s): a dead instance must not hold a
    /// slot forever. Must be non-zero.
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        self.detached_timeout = timeout;
        self
    }

    /// At `max_instances`, make room for a new id by evicting the
    /// least recently used idle instance (the oldest in the sweep's index of
    /// idle deadlines, to within a sweep interval), and refuse with 503
    /// `instance capacity reached; retry` only when none is idle (default
    /// true; false refuses at capacity, as the reference does).
    pub fn evict_idle_at_capacity(mut self, evict: bool) -> Self {
        self.evict_idle_at_capacity = evict;
        self
    }

    /// How often the idle sweep runs (default 5 s). Must be non-zero. A pass
    /// looks only at the instances whose idle or detached deadline came in
    /// the interval (and at those touched since, once), so its cost does not
    /// grow with the instances resident; the interval is also the grain of
    /// the idle deadlines.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Release the placement when an idle instance is evicted (default
    /// true). Only meaningful behind pinboard.
    pub fn release_placement_on_idle(mut self, release: bool) -> Self {
        self.release_placement_on_idle = release;
        self
    }

    /// Turn-based mode: one request at a time per instance, as Orleans
    /// grains and Dapr actors run. A turn lasts until the handler returns its
    /// response (a streaming body or WebSocket keeps running after the turn).
    pub fn exclusive(mut self, exclusive: bool) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// The namespace's own placement world (`envs` in the register body),
    /// overriding the worker's `env` for this namespace.
    pub fn env(mut self, env: impl Into<String>) -> Self {
        self.env = Some(env.into());
        self
    }

    /// The bounds, deadlines and auto-response of the namespace's
    /// hibernatable sockets ([`WebSocketUpgrade::accept`]); see
    /// [`SocketOptions`](crate::ws::SocketOptions) for the defaults.
    ///
    /// [`WebSocketUpgrade::accept`]: crate::ws::WebSocketUpgrade::accept
    pub fn sockets(mut self, sockets: crate::namespace::sockets::SocketOptions) -> Self {
        self.sockets = sockets;
        self
    }

    /// Log at most this many instance churn lines (`activated instance`,
    /// `evicted instance`, at-capacity evictions, hibernations, aborts) a
    /// second at `info` (default 20). Past it, each line is logged at
    /// `debug` only and counted, and one `info` line a second gives the
    /// counts: ids are chosen by clients, and a scanner asking for random
    /// ids must not write a line per id. `u32::MAX` logs every one at
    /// `info`.
    pub fn churn_lines_per_second(mut self, lines: u32) -> Self {
        self.churn_lines_per_second = lines;
        self
    }

    /// Whether the namespace runs one request at a time per instance.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }
}
