//! Header names shared by the worker and pinboard (wire.md §2).
//!
//! This module owns the names and the few fixed values that travel in them.
//! It never reads or writes a request itself.
//!
//! Invariant: every name is lowercase (the reference defines them lowercase;
//! HTTP header names are case-insensitive), so they can be built with
//! [`HeaderName::from_static`] and compared directly.

use http::HeaderName;

/// `pinboard-attestation`: the HS256 token pinboard (or the worker itself, for
/// in-process cluster calls) puts on every forwarded instance request.
pub const ATTESTATION: HeaderName = HeaderName::from_static("pinboard-attestation");

/// `pinboard-epoch`: the placement epoch pinboard resolved, decimal digits.
/// Not covered by the attestation signature.
pub const EPOCH: HeaderName = HeaderName::from_static("pinboard-epoch");

/// `pinboard-proxy-secret`: the worker's raw registration secret, sent only on
/// `/_pinned/challenge` and `/_pinned/stats` probes, never on data-plane calls.
pub const PROXY_SECRET: HeaderName = HeaderName::from_static("pinboard-proxy-secret");

/// `pinboard-from`: the calling instance path `<ns>/<id>` of a cluster call.
pub const FROM: HeaderName = HeaderName::from_static("pinboard-from");

/// `pinboard-session`: the calling worker's current session id.
pub const SESSION: HeaderName = HeaderName::from_static("pinboard-session");

/// `pinboard-session-secret`: the calling worker's registration secret.
pub const SESSION_SECRET: HeaderName = HeaderName::from_static("pinboard-session-secret");

/// `pinboard-subrequest-depth`: decimal depth of a cluster call (caller + 1).
pub const SUBREQUEST_DEPTH: HeaderName = HeaderName::from_static("pinboard-subrequest-depth");

/// `pinboard-hostname`: the registered hostname when Host stays the pinboard
/// host (JS flavour only; the Python reference never sends it).
pub const HOSTNAME: HeaderName = HeaderName::from_static("pinboard-hostname");

/// `pinned-refusal`: marks a worker 503 that pinboard should re-place rather
/// than relay. Its only value is [`LEASE_UNHEALTHY`].
pub const REFUSAL: HeaderName = HeaderName::from_static("pinned-refusal");

/// The [`REFUSAL`] value on the 503 refusing a new activation while the lease
/// is unhealthy.
pub const LEASE_UNHEALTHY: &str = "lease-unhealthy";

/// The `Retry-After` value on every retryable worker-minted 503.
pub const RETRY_AFTER_VALUE: &str = "1";

/// The deepest allowed cluster call: a call whose depth would exceed this
/// fails locally and nothing is sent.
pub const MAX_SUBREQUEST_DEPTH: u32 = 50;

/// Whether `name` is in the `pinboard-` family that cluster calls strip from
/// outgoing requests (together with `host`) before adding their own.
#[must_use]
pub fn is_pinboard_header(name: &HeaderName) -> bool {
    // `HeaderName` is always stored lowercase.
    name.as_str().starts_with("pinboard-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_reference_spellings() {
        let all = [
            (ATTESTATION, "pinboard-attestation"),
            (EPOCH, "pinboard-epoch"),
            (PROXY_SECRET, "pinboard-proxy-secret"),
            (FROM, "pinboard-from"),
            (SESSION, "pinboard-session"),
            (SESSION_SECRET, "pinboard-session-secret"),
            (SUBREQUEST_DEPTH, "pinboard-subrequest-depth"),
            (HOSTNAME, "pinboard-hostname"),
            (REFUSAL, "pinned-refusal"),
        ];
        for (name, text) in all {
            assert_eq!(name.as_str(), text);
        }
    }

    #[test]
    fn pinboard_family() {
        assert!(is_pinboard_header(&ATTESTATION));
        assert!(is_pinboard_header(&HeaderName::from_static(
            "pinboard-anything"
        )));
        assert!(is_pinboard_header(
            &HeaderName::from_bytes(b"Pinboard-Epoch").expect("valid name")
        ));
        assert!(!is_pinboard_header(&REFUSAL));
        assert!(!is_pinboard_header(&http::header::HOST));
        assert!(!is_pinboard_header(&HeaderName::from_static("pinboard")));
        assert!(!is_pinboard_header(&HeaderName::from_static(
            "x-pinboard-epoch"
        )));
    }
}
