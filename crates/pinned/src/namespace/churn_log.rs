//! The log lines of instance churn: activations, evictions (idle or at
//! capacity), hibernations and aborts, each a lifecycle event at `info`.
//!
//! Ids are chosen by clients, so churn is driven from outside: a scanner
//! asking for random ids would write a line per id, as fast as it can send.
//! So each namespace writes at most a budget of churn lines a second at
//! `info` ([`HostOptions::churn_lines_per_second`], 20 by default); past
//! it, a line goes to `debug` (a console at `debug` still sees every one)
//! and is counted, and one `info` line per second of overflow says how many
//! of each kind went unwritten. A quiet namespace logs every event as
//! before.
//!
//! The budget is also what keeps a new id cheap with the examples' default
//! logging: a formatted line costs about 9 700 instructions, and an id that
//! comes and goes writes two (`worker-bench`, new ids at `info`).
//!
//! Owns the budget and the counts; never decides what a line about one
//! instance says (its callers do, through [`churn_line!`]).
//!
//! [`HostOptions::churn_lines_per_second`]: crate::HostOptions::churn_lines_per_second

use parking_lot::Mutex;

/// The span of one budget, in the namespace's milliseconds.
const WINDOW_MS: u64 = 1_000;

/// A kind of churn line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Churn {
    /// An instance went live.
    Activated,
    /// An idle instance was evicted.
    Evicted,
    /// An idle instance was evicted to make room for a new id.
    EvictedAtCapacity,
    /// An idle instance with open sockets was evicted; its sockets stay.
    Hibernated,
    /// An instance was aborted (a drain's deadline, a wind-down).
    Aborted,
}

impl Churn {
    #[cfg(test)]
    const ALL: [Churn; 5] = [
        Churn::Activated,
        Churn::Evicted,
        Churn::EvictedAtCapacity,
        Churn::Hibernated,
        Churn::Aborted,
    ];

    fn index(self) -> usize {
        match self {
            Churn::Activated => 0,
            Churn::Evicted => 1,
            Churn::EvictedAtCapacity => 2,
            Churn::Hibernated => 3,
            Churn::Aborted => 4,
        }
    }
}

/// One namespace's churn-line budget.
#[derive(Debug)]
pub(crate) struct ChurnLog {
    budget: u32,
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    started_ms: u64,
    written: u32,
    unwritten: [u64; 5],
}

/// The lines a closed window did not write at `info`, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overflow {
    unwritten: [u64; 5],
}

impl Overflow {
    /// How many lines of `kind` went to `debug` only.
    pub(crate) fn of(&self, kind: Churn) -> u64 {
        self.unwritten[kind.index()]
    }

    /// The `info` line that stands for them.
    pub(crate) fn log(&self, namespace: &str) {
        tracing::info!(
            namespace,
            activated = self.of(Churn::Activated),
            evicted = self.of(Churn::Evicted),
            evicted_at_capacity = self.of(Churn::EvictedAtCapacity),
            hibernated = self.of(Churn::Hibernated),
            aborted = self.of(Churn::Aborted),
            "instance churn over the log budget: these were logged at debug only"
        );
    }
}

impl Window {
    /// Closes the window if `now_ms` is past it, answering its overflow.
    fn roll(&mut self, now_ms: u64) -> Option<Overflow> {
        if now_ms.saturating_sub(self.started_ms) < WINDOW_MS {
            return None;
        }
        let overflow = Overflow {
            unwritten: std::mem::take(&mut self.unwritten),
        };
        self.started_ms = now_ms;
        self.written = 0;
        overflow
            .unwritten
            .iter()
            .any(|&n| n > 0)
            .then_some(overflow)
    }
}

impl ChurnLog {
    /// At most `budget` lines a second at `info`.
    pub(crate) fn new(budget: u32) -> Self {
        Self {
            budget,
            window: Mutex::new(Window::default()),
        }
    }

    /// Whether a line of `kind` at `now_ms` is written at `info` (else at
    /// `debug`), and the overflow of the window it closed, if any, for the
    /// caller to log.
    pub(crate) fn admit(&self, kind: Churn, now_ms: u64) -> (bool, Option<Overflow>) {
        let mut window = self.window.lock();
        let overflow = window.roll(now_ms);
        let loud = window.written < self.budget;
        if loud {
            window.written += 1;
        } else {
            window.unwritten[kind.index()] += 1;
        }
        (loud, overflow)
    }

    /// The overflow of a window that closed with no line since (the idle
    /// sweep asks, so the last burst's count is not held back forever).
    pub(crate) fn flush(&self, now_ms: u64) -> Option<Overflow> {
        self.window.lock().roll(now_ms)
    }
}

/// One churn line about an instance: at `info` within the namespace's
/// budget, else at `debug` (and counted).
///
/// `churn_line!(host, Churn::Activated, id, "activated instance")`, where
/// `host` is the [`Namespace`](crate::namespace::Namespace); a trailing
/// `at now_ms` gives the time when the caller has read it already, and
/// `name = value` pairs after it are more fields of the line (evaluated
/// only when it is written).
macro_rules! churn_line {
    ($host:expr, $kind:expr, $id:expr, $message:literal) => {
        churn_line!($host, $kind, $id, $message, at $host.elapsed_ms())
    };
    ($host:expr, $kind:expr, $id:expr, $message:literal, at $now:expr $(, $field:ident = $value:expr)*) => {{
        let host = &$host;
        if tracing::level_enabled!(tracing::Level::INFO) {
            let (loud, overflow) = host.churn.admit($kind, $now);
            if let Some(overflow) = overflow {
                overflow.log(&host.ns);
            }
            if loud {
                tracing::info!(namespace = %host.ns, id = %$id, $($field = $value,)* $message);
            } else {
                tracing::debug!(namespace = %host.ns, id = %$id, $($field = $value,)* $message);
            }
        }
    }};
}
pub(crate) use churn_line;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_writes_its_budget_and_counts_the_rest() {
        let log = ChurnLog::new(2);
        assert_eq!(log.admit(Churn::Activated, 0), (true, None));
        assert_eq!(log.admit(Churn::Evicted, 10), (true, None));
        assert_eq!(log.admit(Churn::Activated, 20), (false, None));
        assert_eq!(log.admit(Churn::Aborted, 999), (false, None));
        // The next window writes again and hands back the last one's count.
        let (loud, overflow) = log.admit(Churn::Activated, 1_000);
        assert!(loud);
        let overflow = overflow.expect("the first window overflowed");
        assert_eq!(overflow.of(Churn::Activated), 1);
        assert_eq!(overflow.of(Churn::Aborted), 1);
        assert_eq!(overflow.of(Churn::Evicted), 0);
        // A window within its budget has nothing to say.
        assert_eq!(log.flush(5_000), None);
    }

    #[test]
    fn a_flush_reports_a_closed_window_once() {
        let log = ChurnLog::new(0);
        for kind in Churn::ALL {
            assert_eq!(log.admit(kind, 100), (false, None));
        }
        assert_eq!(log.flush(500), None, "the window is still open");
        let overflow = log.flush(1_100).expect("closed with an overflow");
        for kind in Churn::ALL {
            assert_eq!(overflow.of(kind), 1, "{kind:?}");
        }
        assert_eq!(log.flush(5_000), None, "reported once");
    }
}
