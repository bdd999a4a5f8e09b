//! The sweeper's decisions, sans IO: what a worker's answer to `_alarm` /
//! `_wake` means ([`classify_answer`]), which ids a lap may call
//! ([`Ledger`]), and whether this node holds the sweeper lease
//! ([`LeaseKeeper`]). Time comes in as monotonic milliseconds; nothing here
//! sleeps, reads a clock or does I/O.

use std::collections::{HashMap, HashSet};

use http::StatusCode;
use serde_json::Value;

use crate::proxy::classify::{classify, RetryAction, Verdict};

/// Which durable call a row asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// `POST /<ns>/<id>/_alarm` (with the proxy secret).
    Alarm,
    /// `POST /<ns>/<id>/_wake` (never with the proxy secret).
    Wake,
}

impl Call {
    /// The route segment appended to `/<ns>/<id>`.
    pub fn route(self) -> &'static str {
        match self {
            Call::Alarm => "/_alarm",
            Call::Wake => "/_wake",
        }
    }

    /// A label for logs.
    pub fn name(self) -> &'static str {
        match self {
            Call::Alarm => "alarm",
            Call::Wake => "wake",
        }
    }
}

/// One call the sweeper may make: the kind and the instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// `_alarm` or `_wake`.
    pub call: Call,
    /// Namespace with its slash.
    pub ns: String,
    /// Instance id.
    pub id: String,
}

/// How the next lap must resolve an id whose last call asked for a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replan {
    /// What to change before the next call.
    pub action: RetryAction,
    /// The session that was called.
    pub session: String,
    /// The epoch it was called with.
    pub epoch: u64,
}

/// What one answer means for the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 200: the alarm ran, or nothing was due (`fired`); the wake found the
    /// instance resident (`fired` is `None`). Done for this lap.
    Done {
        /// `{"fired": bool}` of an `_alarm` answer, when present.
        fired: Option<bool>,
    },
    /// 202: a run is in progress / the instance is activating. Call again
    /// next lap over the same route.
    Pending,
    /// Re-resolve next lap as `RetryAction` says (refusals, fence loss,
    /// a stale view of the worker, an unreachable worker).
    Retry(RetryAction),
    /// 404 / 405: the worker has no such route (a worker without alarm
    /// support, such as the Python reference for `_alarm`). Skip that worker
    /// for this kind of call from now on.
    Unsupported,
    /// 500: the handler (or activation) failed. The row stays; next lap
    /// calls again (at-least-once).
    HandlerFailed,
    /// 503 [`PAUSED_DETAIL`](pinned_wire::refusal::PAUSED_DETAIL): an
    /// operator paused the id. No failure; next lap calls again.
    Paused,
    /// Any other answer: logged; next lap calls again.
    Unexpected,
}

/// Classify a worker's answer to `call`. `detail` is the body's `detail`
/// string, `body` the parsed JSON body when there was a small one.
pub fn classify_answer(
    call: Call,
    status: StatusCode,
    has_refusal_header: bool,
    body: Option<&Value>,
) -> Outcome {
    let detail = body.and_then(|b| b.get("detail")).and_then(Value::as_str);
    if has_refusal_header {
        return Outcome::Retry(RetryAction::MoveAway);
    }
    match status {
        StatusCode::OK => Outcome::Done {
            fired: match call {
                Call::Alarm => body.and_then(|b| b.get("fired")).and_then(Value::as_bool),
                Call::Wake => None,
            },
        },
        StatusCode::ACCEPTED => Outcome::Pending,
        // The store holds a newer epoch than the one we sent: mint a new
        // placement above it (or learn the newer owner from the store).
        StatusCode::CONFLICT => Outcome::Retry(RetryAction::Replace),
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Outcome::Unsupported,
        StatusCode::INTERNAL_SERVER_ERROR => Outcome::HandlerFailed,
        // A wrong token or proxy secret means our copy of the worker's
        // record is stale (it re-registered): refresh the worker list.
        StatusCode::FORBIDDEN => match detail {
            Some(
                pinned_wire::refusal::INVALID_ATTESTATION_DETAIL
                | pinned_wire::refusal::INVALID_PROXY_SECRET_DETAIL,
            ) => Outcome::Retry(RetryAction::RefreshWorkers),
            _ => Outcome::Unexpected,
        },
        StatusCode::SERVICE_UNAVAILABLE if detail == Some(pinned_wire::refusal::PAUSED_DETAIL) => {
            Outcome::Paused
        }
        StatusCode::SERVICE_UNAVAILABLE => match classify(status, false, detail, 0) {
            Verdict::Retry { action, .. } => Outcome::Retry(action),
            // Refusals the proxy relays (`activation queue full`, `instance
            // aborted`, unknown 503s): the sweeper re-reads and calls again.
            Verdict::Relay => Outcome::Retry(RetryAction::Reread),
        },
        _ => Outcome::Unexpected,
    }
}

/// What a failed connection (or a timed-out call) means: the worker may be
/// gone; drop the cached route and call again next lap (its record lapses
/// and the id is re-placed).
pub fn classify_transport() -> RetryAction {
    RetryAction::Reread
}

/// The sweeper's memory between laps: calls in flight, calls finished while
/// the current scan ran, retry plans, and workers without a route.
///
/// Invariants: a key is called at most once at a time, and at most once per
/// lap; a row a scan returned is not called if its previous call finished
/// after the scan began (the row may already be gone, e.g. the alarm fired).
#[derive(Debug, Default)]
pub struct Ledger {
    in_flight: HashSet<Key>,
    finished_during_scan: HashSet<Key>,
    replans: HashMap<Key, Replan>,
    unsupported: HashSet<(Call, String)>,
}

impl Ledger {
    /// A scan is about to read the store. Scans run one at a time.
    pub fn begin_scan(&mut self) {
        self.finished_during_scan.clear();
    }

    /// Calls in flight of this kind.
    pub fn busy(&self, call: Call) -> usize {
        self.in_flight.iter().filter(|k| k.call == call).count()
    }

    /// May `key` (returned by the current scan) be called now? On `Some`,
    /// the key is in flight until [`Ledger::finish`]; the inner value is the
    /// plan a previous answer left for it.
    pub fn admit(&mut self, key: &Key) -> Option<Option<Replan>> {
        if self.in_flight.contains(key) || self.finished_during_scan.contains(key) {
            return None;
        }
        self.in_flight.insert(key.clone());
        Some(self.replans.remove(key))
    }

    /// The call for `key` ended; `replan` is what the next call must change.
    pub fn finish(&mut self, key: &Key, replan: Option<Replan>) {
        self.in_flight.remove(key);
        self.finished_during_scan.insert(key.clone());
        match replan {
            Some(r) => {
                self.replans.insert(key.clone(), r);
            }
            None => {
                self.replans.remove(key);
            }
        }
    }

    /// Remember that `session` answered 404/405 to `call`; `true` the first
    /// time (log it once).
    pub fn mark_unsupported(&mut self, call: Call, session: &str) -> bool {
        self.unsupported.insert((call, session.to_owned()))
    }

    /// Whether `session` lacks the `call` route.
    pub fn is_unsupported(&self, call: Call, session: &str) -> bool {
        self.unsupported.contains(&(call, session.to_owned()))
    }

    /// Sessions lacking the `call` route (never chosen for new placements
    /// made on behalf of that call).
    pub fn unsupported_sessions(&self, call: Call) -> Vec<String> {
        self.unsupported
            .iter()
            .filter(|(c, _)| *c == call)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// Forget retry plans for keys no scan returned in a while: keeps the
    /// map bounded by the rows that are still due or marked.
    pub fn retain_replans(&mut self, keep: impl Fn(&Key) -> bool) {
        self.replans.retain(|k, _| keep(k));
    }
}

/// The lease TTL for a sweep interval: three laps, so one slow or lost
/// renewal does not hand the sweep to another node, and a dead holder is
/// replaced within about three intervals.
pub fn lease_ttl_ms(interval_ms: u64) -> u64 {
    interval_ms.saturating_mul(3)
}

/// A store operation on the sweeper lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp {
    /// `SET NX PX`: take a free lease.
    Acquire,
    /// Compare-and-set: extend our own lease.
    Renew,
}

/// This node's view of the sweeper lease.
///
/// The lease counts as held until `ttl` after the moment the granting
/// request was *sent* (earlier than the store saw it, so this node stops
/// before the store could hand the lease to another node). A failed or
/// refused operation drops it at once.
#[derive(Debug, Clone)]
pub struct LeaseKeeper {
    ttl_ms: u64,
    held_until_mono_ms: Option<u64>,
}

impl LeaseKeeper {
    /// A keeper that holds nothing yet.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            held_until_mono_ms: None,
        }
    }

    /// The lease TTL.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// The first operation of a lap: renew what we believe we hold, else
    /// acquire. After a refused renewal, [`LeaseKeeper::after`] says whether
    /// to try acquiring in the same lap.
    pub fn first_op(&self) -> LeaseOp {
        if self.held_until_mono_ms.is_some() {
            LeaseOp::Renew
        } else {
            LeaseOp::Acquire
        }
    }

    /// Record the answer to `op` sent at `sent_mono_ms` (`None` = the store
    /// failed). Returns the next operation to try in this lap, if any.
    pub fn after(
        &mut self,
        op: LeaseOp,
        granted: Option<bool>,
        sent_mono_ms: u64,
    ) -> Option<LeaseOp> {
        match granted {
            Some(true) => {
                self.held_until_mono_ms = Some(sent_mono_ms.saturating_add(self.ttl_ms));
                None
            }
            Some(false) => {
                self.held_until_mono_ms = None;
                // Our lease lapsed (a slow lap): it may be free again.
                (op == LeaseOp::Renew).then_some(LeaseOp::Acquire)
            }
            None => {
                self.held_until_mono_ms = None;
                None
            }
        }
    }

    /// Whether this node may sweep at `now_mono_ms`.
    pub fn holds(&self, now_mono_ms: u64) -> bool {
        self.held_until_mono_ms.is_some_and(|t| now_mono_ms < t)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const U: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

    fn answer(call: Call, status: u16, refusal: bool, body: Value) -> Outcome {
        classify_answer(
            call,
            StatusCode::from_u16(status).expect("status"),
            refusal,
            Some(&body),
        )
    }

    #[test]
    fn alarm_answers() {
        let a = Call::Alarm;
        assert_eq!(
            answer(a, 200, false, json!({"fired": true})),
            Outcome::Done { fired: Some(true) }
        );
        assert_eq!(
            answer(a, 200, false, json!({"fired": false})),
            Outcome::Done { fired: Some(false) }
        );
        assert_eq!(
            answer(a, 202, false, json!({"fired": false, "running": true})),
            Outcome::Pending
        );
        assert_eq!(
            answer(a, 409, false, json!({})),
            Outcome::Retry(RetryAction::Replace)
        );
        assert_eq!(answer(a, 500, false, json!({})), Outcome::HandlerFailed);
        assert_eq!(answer(a, 404, false, json!({})), Outcome::Unsupported);
        assert_eq!(answer(a, 405, false, json!({})), Outcome::Unsupported);
        assert_eq!(
            answer(a, 403, false, json!({"detail": "invalid proxy secret"})),
            Outcome::Retry(RetryAction::RefreshWorkers)
        );
        assert_eq!(answer(a, 400, false, json!({})), Outcome::Unexpected);
        assert_eq!(
            classify_answer(a, StatusCode::OK, false, None),
            Outcome::Done { fired: None }
        );
    }

    #[test]
    fn wake_answers_and_refusals() {
        let w = Call::Wake;
        assert_eq!(
            answer(w, 200, false, json!({"ok": true})),
            Outcome::Done { fired: None }
        );
        assert_eq!(
            answer(w, 202, false, json!({"activating": true})),
            Outcome::Pending
        );
        for call in [w, Call::Alarm] {
            let paused = json!({"detail": pinned_wire::refusal::PAUSED_DETAIL});
            assert_eq!(answer(call, 503, false, paused), Outcome::Paused);
        }
        assert_eq!(
            answer(
                w,
                503,
                true,
                json!({"detail": "lease unhealthy; refusing new activations"})
            ),
            Outcome::Retry(RetryAction::MoveAway)
        );
        assert_eq!(
            answer(w, 503, false, json!({"detail": "host draining; retry"})),
            Outcome::Retry(RetryAction::MoveAway)
        );
        assert_eq!(
            answer(
                w,
                503,
                false,
                json!({"detail": "released placement epoch; retry"})
            ),
            Outcome::Retry(RetryAction::Replace)
        );
        assert_eq!(
            answer(
                w,
                503,
                false,
                json!({"detail": "stale placement epoch; retry"})
            ),
            Outcome::Retry(RetryAction::Reread)
        );
        assert_eq!(
            answer(
                w,
                503,
                false,
                json!({"detail": "activation queue full; retry"})
            ),
            Outcome::Retry(RetryAction::Reread)
        );
        assert_eq!(
            classify_answer(w, U, false, None),
            Outcome::Retry(RetryAction::Reread)
        );
        assert_eq!(
            answer(w, 403, false, json!({"detail": "invalid attestation"})),
            Outcome::Retry(RetryAction::RefreshWorkers)
        );
        assert_eq!(classify_transport(), RetryAction::Reread);
    }

    fn key(call: Call, id: &str) -> Key {
        Key {
            call,
            ns: "/n".into(),
            id: id.into(),
        }
    }

    #[test]
    fn ledger_calls_each_key_once_at_a_time_and_once_per_lap() {
        let mut l = Ledger::default();
        let a = key(Call::Alarm, "a");
        l.begin_scan();
        assert_eq!(l.admit(&a), Some(None));
        assert_eq!(l.admit(&a), None, "in flight");
        assert_eq!(l.busy(Call::Alarm), 1);
        assert_eq!(l.busy(Call::Wake), 0);
        // The next lap's scan starts while the call is in flight, and the
        // call finishes (the alarm fired, its row is gone) before the scan's
        // rows are admitted: the stale row is not called again.
        l.begin_scan();
        l.finish(&a, None);
        assert_eq!(l.admit(&a), None, "finished during this scan");
        // A fresh scan may call it again.
        l.begin_scan();
        assert_eq!(l.admit(&a), Some(None));
        let plan = Replan {
            action: RetryAction::MoveAway,
            session: "s".into(),
            epoch: 7,
        };
        l.finish(&a, Some(plan.clone()));
        l.begin_scan();
        assert_eq!(
            l.admit(&a),
            Some(Some(plan)),
            "the plan is handed over once"
        );
        l.finish(&a, None);
        l.begin_scan();
        assert_eq!(l.admit(&a), Some(None));
        // The same instance's wake is a different key.
        assert_eq!(l.admit(&key(Call::Wake, "a")), Some(None));
    }

    #[test]
    fn ledger_remembers_unsupported_workers_per_call() {
        let mut l = Ledger::default();
        assert!(l.mark_unsupported(Call::Alarm, "py"));
        assert!(!l.mark_unsupported(Call::Alarm, "py"), "logged once");
        assert!(l.is_unsupported(Call::Alarm, "py"));
        assert!(!l.is_unsupported(Call::Wake, "py"));
        assert_eq!(l.unsupported_sessions(Call::Alarm), vec!["py".to_owned()]);
        assert!(l.unsupported_sessions(Call::Wake).is_empty());
    }

    #[test]
    fn lease_is_held_until_ttl_after_the_grant_was_sent() {
        let mut k = LeaseKeeper::new(lease_ttl_ms(100));
        assert_eq!(k.ttl_ms(), 300);
        assert!(!k.holds(0));
        assert_eq!(k.first_op(), LeaseOp::Acquire);
        // Another node holds it: nothing more to try this lap.
        assert_eq!(k.after(LeaseOp::Acquire, Some(false), 0), None);
        assert!(!k.holds(0));
        // Granted at 100: held until 400 (exclusive).
        assert_eq!(k.after(LeaseOp::Acquire, Some(true), 100), None);
        assert!(k.holds(399));
        assert!(!k.holds(400), "a lap that ran past the TTL stops sweeping");
        assert_eq!(k.first_op(), LeaseOp::Renew);
        assert_eq!(k.after(LeaseOp::Renew, Some(true), 200), None);
        assert!(k.holds(499));
        // The renewal is refused (it lapsed and another node took it):
        // try acquiring once in the same lap.
        assert_eq!(
            k.after(LeaseOp::Renew, Some(false), 600),
            Some(LeaseOp::Acquire)
        );
        assert!(!k.holds(600));
        assert_eq!(k.after(LeaseOp::Acquire, Some(false), 600), None);
        assert_eq!(k.first_op(), LeaseOp::Acquire);
        // A store failure drops the lease at once.
        assert_eq!(k.after(LeaseOp::Acquire, Some(true), 700), None);
        assert_eq!(k.after(LeaseOp::Renew, None, 800), None);
        assert!(!k.holds(801));
    }
}
