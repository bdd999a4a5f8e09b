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
//!
//! At the connection cap, [`Acceptor::admit`] makes room by asking the
//! longest idle connection to close ([`roster`](crate::roster)) and turns
//! the new one away only when every open connection is busy.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::roster::Roster;

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

/// Least time a connection must have been idle to be closed to make room.
/// A connection that has just had an answer is likely about to carry the
/// next request of a pooled client, and a request sent on a connection as
/// it closes fails (clients re-send only what never left); a connection
/// accepted this recently may have its first request in flight. One that
/// has waited this long is a browser's spare, a pool's surplus or a silent
/// client.
pub const MIN_IDLE: Duration = Duration::from_secs(1);

/// Most idle connections asked to close and not closed yet: each still
/// holds its descriptor beside the connection admitted in its place, and
/// twice this many fit in the descriptors the cap keeps aside
/// ([`cap::RESERVED_FDS`](crate::cap::RESERVED_FDS)).
pub const MAX_ASKED: usize = 16;

/// The accept side of a listener, as both binaries run it: accepts that
/// pause after failures ([`AcceptBackoff`]) and a cap on open connections
/// that closes the longest idle one to admit a new one, refusing only
/// when none is idle; each logged at most once per [`LOG_PERIOD`].
#[derive(Debug)]
pub struct Acceptor {
    backoff: AcceptBackoff,
    refusals: Throttle,
    reclaims: Throttle,
    max_connections: usize,
}

/// What the cap says about one more connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Under the cap.
    Admitted,
    /// At the cap: the longest idle connection was asked to close, and
    /// the new one takes its place.
    Reclaimed,
    /// At the cap with no idle connection: close the new one before reading
    /// a byte.
    Refused,
}

impl Acceptor {
    /// An acceptor holding at most `max_connections` open.
    pub fn new(max_connections: usize) -> Self {
        Self {
            backoff: AcceptBackoff::default(),
            refusals: Throttle::default(),
            reclaims: Throttle::default(),
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

    /// Whether one more connection fits beside those the `rosters` hold
    /// (one per I/O thread, or one). Connections asked to close count as
    /// gone. At the cap, the longest idle connection of all the rosters is
    /// asked to close and the new one admitted in its place, as nginx does
    /// with idle keep-alive connections, provided it has idled at least
    /// [`MIN_IDLE`]; with none such (or [`MAX_ASKED`] closes still
    /// pending) the new one is refused. Both are logged at most once per
    /// [`LOG_PERIOD`].
    pub fn admit(&mut self, rosters: &[Arc<Roster>]) -> Admission {
        let (open, asked) = rosters
            .iter()
            .fold((0, 0), |(o, a), r| (o + r.open(), a + r.asked()));
        if open.saturating_sub(asked) < self.max_connections {
            return Admission::Admitted;
        }
        if asked < MAX_ASKED {
            let now = Instant::now();
            let oldest = rosters
                .iter()
                .filter_map(|r| Some((r.oldest_idle()?, r)))
                .min_by_key(|(since, _)| *since)
                .filter(|(since, _)| now.saturating_duration_since(*since) >= MIN_IDLE);
            if let Some((_, roster)) = oldest {
                if roster.ask_oldest() {
                    if let Some(held) = self.reclaims.hit(now) {
                        tracing::warn!(
                            max_connections = self.max_connections,
                            closed_since_last_line = held,
                            "connection cap reached; closing the longest idle connections to admit new ones"
                        );
                    }
                    return Admission::Reclaimed;
                }
            }
        }
        if let Some(held) = self.refusals.hit(Instant::now()) {
            tracing::warn!(
                max_connections = self.max_connections,
                refused_since_last_line = held,
                "connection cap reached with no idle connection; closing new connections"
            );
        }
        Admission::Refused
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
    async fn at_the_cap_the_longest_idle_of_all_rosters_makes_room() {
        let rosters = [Roster::new(), Roster::new()];
        let mut acceptor = Acceptor::new(3);
        let a = rosters[0].seat();
        let b = rosters[1].seat();
        assert_eq!(acceptor.admit(&rosters), Admission::Admitted);
        let c = rosters[1].seat();
        // All three busy: the fourth is refused.
        assert_eq!(acceptor.admit(&rosters), Admission::Refused);
        c.idle(Instant::now());
        tokio::time::advance(Duration::from_millis(5)).await;
        a.idle(Instant::now());
        // Not idle long enough yet: a pooled client may be about to use it.
        tokio::time::advance(MIN_IDLE - Duration::from_millis(10)).await;
        assert_eq!(acceptor.admit(&rosters), Admission::Refused);
        tokio::time::advance(Duration::from_millis(10)).await;
        // `c` (the other roster) idled first: it is asked, and the newcomer
        // admitted in its place; `c` counts as gone while it closes.
        assert_eq!(acceptor.admit(&rosters), Admission::Reclaimed);
        assert_eq!(rosters[1].asked(), 1);
        let d = rosters[0].seat();
        assert_eq!(acceptor.admit(&rosters), Admission::Reclaimed);
        assert_eq!(rosters[0].asked(), 1);
        let e = rosters[0].seat();
        // Nobody idle any more (`b`, `d`, `e` busy).
        assert_eq!(acceptor.admit(&rosters), Admission::Refused);
        drop((a, c));
        assert_eq!(acceptor.admit(&rosters), Admission::Refused);
        drop(b);
        assert_eq!(acceptor.admit(&rosters), Admission::Admitted);
        drop((d, e));
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
