//! Refusals the worker mints itself, and the fixed error bodies (wire.md §5).
//!
//! This module owns the one place where each refusal maps to its status, its
//! exact `detail` string, and whether it carries `Retry-After: 1` and
//! `Pinned-Refusal`. It never builds a response type: callers add the headers
//! and send [`Refusal::body`] as `application/json`.
//!
//! Invariants: every refusal is a 503; every one except [`Refusal::Aborted`]
//! is retryable and carries `Retry-After: 1`; only
//! [`Refusal::LeaseUnhealthy`] carries `Pinned-Refusal: lease-unhealthy`.

use std::fmt::Write as _;

use http::StatusCode;

use crate::headers::LEASE_UNHEALTHY;

/// The reference's plain-text 500 body (`text/plain; charset=utf-8`) for
/// unhandled failures.
pub const INTERNAL_ERROR_BODY: &str = "Internal Server Error";

/// `detail` of the 400 answer to a malformed `Pinboard-Epoch`.
pub const MALFORMED_EPOCH_DETAIL: &str = "malformed placement epoch";

/// `detail` of the 403 answer to an instance request without a valid token.
pub const INVALID_ATTESTATION_DETAIL: &str = "invalid attestation";

/// `detail` of the 403 answer to a `/_pinned/*` probe without secret or token.
pub const INVALID_PROXY_SECRET_DETAIL: &str = "invalid proxy secret";

/// The 503 `detail` of a request (or a wake, an alarm) to an id an operator
/// paused (pinboard's storage inspector): not a refusal to re-place, the
/// id is refused wherever it goes until resumed.
pub const PAUSED_DETAIL: &str = "instance paused by an operator; resume it to serve";

/// `detail` of the 404 answer to a challenge value that does not match.
pub const UNKNOWN_CHALLENGE_DETAIL: &str = "unknown challenge";

/// `detail` of the 503 (no `Retry-After`) answer when the app's authorizer
/// raised an unexpected error. Not a [`Refusal`]: the app, not the host,
/// caused it.
pub const AUTHORIZATION_FAILED_DETAIL: &str = "authorization failed";

/// A 503 the worker mints itself (wire.md §5.1 and `instance aborted` of §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The lease is past its expiry; every request and wake is refused.
    LeaseExpired,
    /// `Pinboard-Epoch` is below the highest epoch admitted for the id.
    StaleEpoch,
    /// `Pinboard-Epoch` equals the highest admitted epoch, which was released.
    ReleasedEpoch,
    /// The id is not resident and the lease is unhealthy (not yet expired).
    /// The in-band "re-place me" NACK for pinboard.
    LeaseUnhealthy,
    /// The id is not resident and the host is draining.
    Draining,
    /// The id is not resident and the host holds `max_instances` records.
    Capacity,
    /// The resident instance's wind-down deadline has passed.
    PastWindDown,
    /// The instance is closing (a placement release is pending).
    Closing,
    /// A cold request waited too long for an activation slot.
    ActivationQueueFull,
    /// The request's handler, or the activation it waited on, was cancelled
    /// by an abort or close. Not retryable.
    Aborted,
}

impl Refusal {
    /// Every refusal, in wire.md order.
    pub const ALL: [Refusal; 10] = [
        Refusal::LeaseExpired,
        Refusal::StaleEpoch,
        Refusal::ReleasedEpoch,
        Refusal::LeaseUnhealthy,
        Refusal::Draining,
        Refusal::Capacity,
        Refusal::PastWindDown,
        Refusal::Closing,
        Refusal::ActivationQueueFull,
        Refusal::Aborted,
    ];

    /// The exact `detail` string of the body.
    #[must_use]
    pub fn detail(&self) -> &'static str {
        match self {
            Self::LeaseExpired => "lease expired; not serving",
            Self::StaleEpoch => "stale placement epoch; retry",
            Self::ReleasedEpoch => "released placement epoch; retry",
            Self::LeaseUnhealthy => "lease unhealthy; refusing new activations",
            Self::Draining => "host draining; retry",
            Self::Capacity => "instance capacity reached; retry",
            Self::PastWindDown => "instance past its wind-down deadline; retry",
            Self::Closing => "instance closing; retry",
            Self::ActivationQueueFull => "activation queue full; retry",
            Self::Aborted => "instance aborted",
        }
    }

    /// The HTTP status: always 503.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        StatusCode::SERVICE_UNAVAILABLE
    }

    /// Whether the answer carries `Retry-After: 1`
    /// ([`crate::headers::RETRY_AFTER_VALUE`]); also whether a client may retry.
    #[must_use]
    pub fn retry_after(&self) -> bool {
        !matches!(self, Self::Aborted)
    }

    /// The `Pinned-Refusal` value to send, if any.
    #[must_use]
    pub fn pinned_refusal(&self) -> Option<&'static str> {
        match self {
            Self::LeaseUnhealthy => Some(LEASE_UNHEALTHY),
            _ => None,
        }
    }

    /// The refusal whose [`detail`](Self::detail) is exactly `s`.
    #[must_use]
    pub fn from_detail(s: &str) -> Option<Refusal> {
        Self::ALL.into_iter().find(|r| r.detail() == s)
    }

    /// The JSON body, `{"detail":"<detail>"}`.
    #[must_use]
    pub fn body(&self) -> String {
        detail_body(self.detail())
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.detail())
    }
}

impl std::error::Error for Refusal {}

/// The reference's error body for `detail`: `{"detail":"..."}` exactly as its
/// framework serializes it (compact separators, non-ASCII kept as UTF-8; `"`,
/// `\` and control characters below U+0020 escaped; U+007F kept raw).
#[must_use]
pub fn detail_body(detail: &str) -> String {
    let mut out = String::with_capacity(detail.len() + 14);
    out.push_str("{\"detail\":\"");
    for c in detail.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push_str("\"}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        for r in Refusal::ALL {
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(Refusal::from_detail(r.detail()), Some(r));
            assert_eq!(r.retry_after(), r != Refusal::Aborted);
            assert_eq!(r.pinned_refusal().is_some(), r == Refusal::LeaseUnhealthy);
            assert_eq!(r.to_string(), r.detail());
        }
        assert_eq!(
            Refusal::LeaseUnhealthy.pinned_refusal(),
            Some("lease-unhealthy")
        );
        assert_eq!(Refusal::from_detail("authorization failed"), None);
        assert_eq!(Refusal::from_detail("instance closing"), None);
    }

    #[test]
    fn bodies() {
        assert_eq!(
            Refusal::StaleEpoch.body(),
            r#"{"detail":"stale placement epoch; retry"}"#
        );
        assert_eq!(detail_body(""), r#"{"detail":""}"#);
        assert_eq!(
            detail_body("a\"\\\n\u{1}\u{7f}é😀"),
            "{\"detail\":\"a\\\"\\\\\\n\\u0001\u{7f}é😀\"}"
        );
    }
}
