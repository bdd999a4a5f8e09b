//! Retry classification: what a worker's answer (or a failed connect) means
//! for the proxy (and the sweeper). Pure: status, headers and detail in, a [`Verdict`] out.
//!
//! Owns the table below; never performs the retry itself.
//!
//! | worker answer | verdict |
//! | --- | --- |
//! | any status with `Pinned-Refusal` | place elsewhere now (the owner never activated it) |
//! | 503 `lease unhealthy…`, `host draining; retry`, `instance capacity reached; retry` | place elsewhere now, excluding that worker |
//! | 503 `released placement epoch; retry` | re-place above the released epoch |
//! | 503 `stale placement epoch; retry` | re-read the placement (our cached epoch is old) |
//! | 503 `instance closing; retry`, `instance past its wind-down deadline; retry` | re-read after a short backoff (the release is in flight) |
//! | 503 `lease expired; not serving` | re-read after a backoff (the record lapses soon) |
//! | 403 `invalid attestation` (inferred) | our view of the worker's session is stale (it re-registered): refresh workers and re-read; if it persists the client gets 503 + `Retry-After`, not the 403 |
//! | connect failure before the request was sent | re-read after a backoff |
//! | connection lost after the request went out, before any answer | 502 `worker connection failed mid-request`, never re-sent here: an idempotent method (RFC 9110 §9.2.2) was already sent once more on a new connection by the worker's pool (`upstream::Pool::send`: the keep-alive race), and the worker may have started it |
//! | a malformed or cut-short answer (bad framing, an oversized head) | 502 `worker connection failed mid-request`, never re-sent (the worker took the request; nginx's `proxy_next_upstream` leaves `invalid_header` out by default) |
//! | no response head within `--upstream-timeout-ms` | 504 `worker did not answer in time`, route dropped, never re-sent (decided in the proxy's send phase, not here: the worker may still be working on it, and a frozen one would cost the whole budget again per retry) |
//! | the client's body broke or stalled | the client's fault (400 / 408), route kept (decided in the proxy's send phase, before this table) |
//! | anything else (incl. `activation queue full; retry`, `instance aborted`) | relay as is |

use http::StatusCode;
use pinned_wire::refusal::Refusal;

/// Largest refusal body read to classify it (a larger answer is relayed
/// unread).
pub const MAX_REFUSAL_BODY: u64 = 4096;

/// What to do before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAction {
    /// Drop the cached route and resolve again from the store.
    Reread,
    /// Drop the cached route and refresh the worker list first.
    RefreshWorkers,
    /// Treat the current `(session, epoch)` as vacant and place again.
    Replace,
    /// As `Replace`, and do not pick the refusing worker again.
    MoveAway,
}

/// The classification of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the answer to the client.
    Relay,
    /// Retry after `delay_ms`.
    Retry {
        /// What to change before retrying.
        action: RetryAction,
        /// Backoff before the next attempt.
        delay_ms: u64,
    },
}

/// Whether a response with this status may be a retryable refusal worth
/// reading the (small) body of.
pub fn worth_reading(status: StatusCode, has_refusal_header: bool) -> bool {
    has_refusal_header
        || status == StatusCode::SERVICE_UNAVAILABLE
        || status == StatusCode::FORBIDDEN
}

/// Longest single backoff between attempts.
const MAX_BACKOFF_MS: u64 = 250;

fn backoff(attempt: u32, base_ms: u64) -> u64 {
    (base_ms << attempt.min(5)).min(MAX_BACKOFF_MS)
}

/// Classify a worker's answer on attempt `attempt` (0-based).
pub fn classify(
    status: StatusCode,
    has_refusal_header: bool,
    detail: Option<&str>,
    attempt: u32,
) -> Verdict {
    let retry = |action, delay_ms| Verdict::Retry { action, delay_ms };
    if has_refusal_header {
        return retry(RetryAction::MoveAway, 0);
    }
    if status == StatusCode::FORBIDDEN {
        return match detail {
            Some(pinned_wire::refusal::INVALID_ATTESTATION_DETAIL) => {
                retry(RetryAction::RefreshWorkers, backoff(attempt, 20))
            }
            _ => Verdict::Relay,
        };
    }
    if status != StatusCode::SERVICE_UNAVAILABLE {
        return Verdict::Relay;
    }
    match detail.and_then(Refusal::from_detail) {
        Some(Refusal::LeaseUnhealthy | Refusal::Draining | Refusal::Capacity) => {
            retry(RetryAction::MoveAway, 0)
        }
        Some(Refusal::ReleasedEpoch) => retry(RetryAction::Replace, 0),
        Some(Refusal::StaleEpoch) => retry(RetryAction::Reread, 0),
        Some(Refusal::Closing | Refusal::PastWindDown) => {
            retry(RetryAction::Reread, backoff(attempt, 25))
        }
        Some(Refusal::LeaseExpired) => retry(RetryAction::Reread, backoff(attempt, 100)),
        Some(Refusal::ActivationQueueFull | Refusal::Aborted) | None => Verdict::Relay,
    }
}

/// Whether an answer says the worker did not activate the id (it refused
/// to take it on): `Pinned-Refusal`, or a 503 for an unhealthy lease, a
/// drain, full capacity or a full activation queue. A placement claimed
/// for the request and answered so is handed back (`routes::claim`).
pub fn never_activated(status: StatusCode, has_refusal_header: bool, detail: Option<&str>) -> bool {
    has_refusal_header
        || (status == StatusCode::SERVICE_UNAVAILABLE
            && matches!(
                detail.and_then(Refusal::from_detail),
                Some(
                    Refusal::LeaseUnhealthy
                        | Refusal::Draining
                        | Refusal::Capacity
                        | Refusal::ActivationQueueFull
                )
            ))
}

/// Classify a transport failure. `resend_safe` is true when sending the
/// request again cannot repeat anything: the connection failed before any
/// byte of the request left. (A request that went out and met a closed
/// connection is the pool's to re-send, once, when its method is
/// idempotent: see `upstream::Pool::send`.)
pub fn classify_transport(resend_safe: bool, attempt: u32) -> Verdict {
    if resend_safe {
        Verdict::Retry {
            action: RetryAction::Reread,
            delay_ms: backoff(attempt, 50),
        }
    } else {
        Verdict::Relay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: StatusCode = StatusCode::SERVICE_UNAVAILABLE;

    #[test]
    fn refusals_map_to_actions() {
        assert_eq!(
            classify(U, true, None, 0),
            Verdict::Retry {
                action: RetryAction::MoveAway,
                delay_ms: 0
            }
        );
        assert_eq!(
            classify(U, false, Some("host draining; retry"), 0),
            Verdict::Retry {
                action: RetryAction::MoveAway,
                delay_ms: 0
            }
        );
        assert_eq!(
            classify(U, false, Some("released placement epoch; retry"), 1),
            Verdict::Retry {
                action: RetryAction::Replace,
                delay_ms: 0
            }
        );
        assert_eq!(
            classify(U, false, Some("instance closing; retry"), 2),
            Verdict::Retry {
                action: RetryAction::Reread,
                delay_ms: 100
            }
        );
        assert_eq!(
            classify(U, false, Some("instance aborted"), 0),
            Verdict::Relay
        );
        assert_eq!(
            classify(U, false, Some("something else"), 0),
            Verdict::Relay
        );
        assert_eq!(classify(StatusCode::OK, false, None, 0), Verdict::Relay);
        assert!(matches!(
            classify(StatusCode::FORBIDDEN, false, Some("invalid attestation"), 0),
            Verdict::Retry {
                action: RetryAction::RefreshWorkers,
                ..
            }
        ));
        assert_eq!(
            classify(StatusCode::FORBIDDEN, false, Some("nope"), 0),
            Verdict::Relay
        );
    }

    #[test]
    fn refusals_to_activate_are_told_apart() {
        assert!(never_activated(U, true, None));
        assert!(never_activated(StatusCode::OK, true, None));
        for detail in [
            "instance capacity reached; retry",
            "host draining; retry",
            "activation queue full; retry",
        ] {
            assert!(never_activated(U, false, Some(detail)), "{detail}");
        }
        for detail in ["instance closing; retry", "stale placement epoch; retry"] {
            assert!(!never_activated(U, false, Some(detail)), "{detail}");
        }
        assert!(!never_activated(
            StatusCode::OK,
            false,
            Some("host draining; retry")
        ));
    }

    #[test]
    fn transport_failures_retry_only_before_send() {
        assert!(matches!(classify_transport(true, 0), Verdict::Retry { .. }));
        assert_eq!(classify_transport(false, 0), Verdict::Relay);
    }
}
