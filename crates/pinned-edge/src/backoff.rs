//! What the accept loop does when `accept` fails or a connection is turned
//! away: pause (out of file descriptors, say) and log once per period, not
//! once per failure.
//!
//! Owns the pause length and the log throttle; never touches a socket. Pure
//! but for the clock reads handed in, so it is tested on paused time.
//!
//! A failure that concerns one connection only (it was reset or aborted
//! before we took it) is retried at once. Any other failure (`EMFILE`,
//! `ENFILE`, `ENOBUFS`, `ENOMEM`) persists until something is freed, so the
//! loop sleeps [`MIN_PAUSE`], doubling up to [`MAX_PAUSE`], until an accept
//! succeeds again: a persistent failure costs a few wake-ups a second, not
//! a hot loop.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::time::Instant;

/// First pause after a persistent accept failure.
pub const MIN_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause between two accepts while failures persist.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// At most one log line per this period for a repeating condition.
pub const LOG_PERIOD: Duration = Duration::from_secs(10);

/// At most one log line per [`LOG_PERIOD`]; counts what it held back.
#[derive(Debug, Default)]
pub struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// Record one occurrence at `now`: `Some(n)` when it should be logged,
    /// `n` being the occurrences held back since the last line (this one
    /// excluded).
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < LOG_PERIOD => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }

    /// Occurrences held back since the last line, cleared.
    pub fn take_held(&mut self) -> u64 {
        self.last = None;
        std::mem::take(&mut self.held)
    }
}

/// The accept loop's reaction to failures.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    pause: Option<Duration>,
    failures: u64,
    log: Throttle,
}

impl AcceptBackoff {
    /// After a failed accept: logs `error` when the throttle lets it
    /// through, then waits the pause [`failed`](Self::failed) sets, unless
    /// `shutdown` completes first. False when it did (stop accepting).
    pub async fn wait_after<F: Future<Output = ()> + Unpin>(
        &mut self,
        error: &io::Error,
        shutdown: &mut F,
    ) -> bool {
        let reaction = self.failed(error, Instant::now());
        if let Some(held) = reaction.log {
            tracing::warn!(
                %error,
                pause_ms = u64::try_from(reaction.pause.as_millis()).unwrap_or(u64::MAX),
                failures_since_last_line = held,
                "accept failed; pausing accepts"
            );
        }
        if reaction.pause.is_zero() {
            return true;
        }
        tokio::select! {
            biased;
            () = shutdown => false,
            () = tokio::time::sleep(reaction.pause) => true,
        }
    }
}

/// The accept side of a listener, as both binaries run it: accepts that
/// pause after failures ([`AcceptBackoff`]) and a cap on open connections
/// whose refusals are logged at most once per [`LOG_PERIOD`].
#[derive(Debug)]
pub struct Acceptor {
    backoff: AcceptBackoff,
    refusals: Throttle,
    max_connections: usize,
}

impl Acceptor {
    /// An acceptor holding at most `max_connections` open.
    pub fn new(max_connections: usize) -> Self {
        Self {
            backoff: AcceptBackoff::default(),
            refusals: Throttle::default(),
            max_connections,
        }
    }

    /// The next connection from `listener`; `None` once `shutdown`
    /// completed. `failed` runs for each failed accept (a counter, say).
    pub async fn next<F: Future<Output = ()> + Unpin>(
        &mut self,
        listener: &tokio::net::TcpListener,
        shutdown: &mut F,
        failed: impl Fn(),
    ) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
        loop {
            tokio::select! {
                biased;
                () = &mut *shutdown => return None,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => {
                        if let Some(failures) = self.backoff.succeeded() {
                            tracing::info!(failures, "accepting again");
                        }
                        return Some(accepted);
                    }
                    Err(error) => {
                        failed();
                        if !self.backoff.wait_after(&error, shutdown).await {
                            return None;
                        }
                    }
                },
            }
        }
    }

    /// Whether one more connection fits beside `open` ones; at the cap it
    /// logs (throttled) and answers false: the caller closes the socket
    /// before reading a byte.
    pub fn admits(&mut self, open: usize) -> bool {
        if open < self.max_connections {
            return true;
        }
        if let Some(held) = self.refusals.hit(Instant::now()) {
            tracing::warn!(
                max_connections = self.max_connections,
                refused_since_last_line = held,
                "connection cap reached; closing new connections"
            );
        }
        false
    }
}

/// What to do after a failed accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaction {
    /// Sleep this long before the next accept (zero: at once).
    pub pause: Duration,
    /// Log this failure, with this many failures held back before it.
    pub log: Option<u64>,
}

/// Whether `error` concerns one connection only, so the next accept may
/// well succeed.
pub fn transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

impl AcceptBackoff {
    /// An accept failed with `error` at `now`.
    pub fn failed(&mut self, error: &io::Error, now: Instant) -> Reaction {
        self.failures += 1;
        let log = self.log.hit(now);
        if transient(error) {
            return Reaction {
                pause: Duration::ZERO,
                log,
            };
        }
        let pause = self.pause.map_or(MIN_PAUSE, |p| (p * 2).min(MAX_PAUSE));
        self.pause = Some(pause);
        Reaction { pause, log }
    }

    /// An accept succeeded: `Some(n)` when it ends a run of `n` failures.
    pub fn succeeded(&mut self) -> Option<u64> {
        self.pause = None;
        self.log.take_held();
        (self.failures > 0).then(|| std::mem::take(&mut self.failures))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::other("Too many open files")
    }

    #[tokio::test(start_paused = true)]
    async fn persistent_failures_back_off_and_log_once_per_period() {
        let mut b = AcceptBackoff::default();
        let mut pauses = Vec::new();
        let mut logged = 0;
        let start = Instant::now();
        for _ in 0..300 {
            let r = b.failed(&emfile(), Instant::now());
            logged += usize::from(r.log.is_some());
            pauses.push(r.pause);
            tokio::time::advance(r.pause).await;
        }
        assert_eq!(pauses[0], MIN_PAUSE);
        assert_eq!(pauses[1], MIN_PAUSE * 2);
        assert!(pauses.iter().all(|p| *p <= MAX_PAUSE));
        assert_eq!(*pauses.last().expect("pauses"), MAX_PAUSE);
        let elapsed = start.elapsed();
        // One line per period, plus the first.
        let periods = (elapsed.as_secs() / LOG_PERIOD.as_secs()) as usize + 1;
        assert!(logged <= periods, "{logged} lines over {elapsed:?}");
        assert_eq!(b.succeeded(), Some(300));
        assert_eq!(b.succeeded(), None);
        assert_eq!(b.failed(&emfile(), Instant::now()).pause, MIN_PAUSE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_reset_before_accept_is_retried_at_once() {
        let mut b = AcceptBackoff::default();
        let r = b.failed(
            &io::Error::from(io::ErrorKind::ConnectionAborted),
            Instant::now(),
        );
        assert_eq!(r.pause, Duration::ZERO);
        assert_eq!(r.log, Some(0));
    }
}
