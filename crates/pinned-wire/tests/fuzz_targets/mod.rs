//! Fuzz targets for every parser of the wire crate: each takes arbitrary
//! bytes, must never panic, and checks what must hold of whatever the
//! parser accepts. The same functions run on stable as property tests
//! (`tests/fuzz_stable.rs`, arbitrary bytes from proptest, in CI) and under
//! libFuzzer on nightly (`fuzz/` at the workspace root, `cargo fuzz run
//! <target>`), so a crash found by either is one function to debug.
//!
//! A target never allocates without bound and never loops on input; it
//! owns no state between calls.
#![allow(dead_code, unreachable_pub)]

use pinned_wire::attestation::{self, Key};
use pinned_wire::epoch::parse_epoch;
use pinned_wire::ids::{decode_id_segment, validate_id, validate_namespace, MAX_ID_CHARS};
use pinned_wire::refusal::Refusal;
use pinned_wire::registry::{
    self, received, DeregisterRequest, HeartbeatNack, HeartbeatRequest, PushRequest,
    RegisterRequest, ReleaseItem, TagRequest,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The bytes as text: UTF-8 when they are, else Latin-1 (how a header value
/// that is not UTF-8 reaches the parsers).
fn text(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(s) => s.to_owned(),
        Err(_) => data.iter().map(|&b| char::from(b)).collect(),
    }
}

/// An attestation token: verification under a fixed key never panics,
/// refuses anything not minted by that key, and what it accepts re-verifies
/// identically.
pub fn attestation(data: &[u8]) {
    let key = Key::new("fuzz-secret");
    let token = text(data);
    for now in [0.0, 1.7e9, f64::NAN, f64::INFINITY, -1.0] {
        if let Some(claims) = key.verify(&token, |_| true, now) {
            assert_eq!(key.verify(&token, |_| true, now), Some(claims.clone()));
            let _ = attestation::attested_caller(&claims);
            // Another key never accepts the same token.
            assert!(Key::new("other").verify(&token, |_| true, now).is_none());
        }
    }
    // The bytes as audience, caller and secret of a minted token: it
    // verifies under its key with exactly those claims.
    let aud = text(data);
    let minted = Key::new(&aud).mint(&aud, 1.7e9, Some(&aud), Some(data.len() as i64));
    let claims = Key::new(&aud)
        .verify(&minted, |a| a == aud, 1.7e9)
        .expect("a fresh token verifies under its key");
    assert_eq!(claims.aud, aud);
    assert_eq!(claims.caller.as_deref(), Some(aud.as_str()));
}

/// Ids and namespaces: validation never panics, an accepted id is within
/// the limits, and decoding a segment agrees with validating the decoded id.
pub fn ids(data: &[u8]) {
    let raw = text(data);
    if validate_id(&raw).is_ok() {
        assert!(!raw.is_empty() && raw.chars().count() <= MAX_ID_CHARS);
        assert!(raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._~-".contains(&b)));
        // An id needs no escaping: the segment decodes to itself.
        assert_eq!(decode_id_segment(&raw).as_deref(), Ok(raw.as_str()));
    }
    if let Ok(decoded) = decode_id_segment(&raw) {
        assert_eq!(validate_id(&decoded), Ok(()));
    }
    if validate_namespace(&raw).is_ok() {
        assert!(raw.starts_with('/') && raw.len() > 1 && !raw[1..].contains('/'));
    }
}

/// `Pinboard-Epoch` values: accepted exactly when they are decimal digits
/// fitting a `u64`, and then the number prints back (leading zeros aside).
pub fn epoch(data: &[u8]) {
    match parse_epoch(data) {
        Ok(epoch) => {
            assert!(!data.is_empty() && data.iter().all(u8::is_ascii_digit));
            let digits = text(data);
            let significant = digits.trim_start_matches('0');
            let expected = if significant.is_empty() {
                "0"
            } else {
                significant
            };
            assert_eq!(epoch.to_string(), expected);
        }
        Err(_) => {
            let all_digits = !data.is_empty() && data.iter().all(u8::is_ascii_digit);
            // Refused digits can only be an overflow.
            assert!(!all_digits || data.len() >= 20, "{data:?} refused");
        }
    }
    let _ = Refusal::from_detail(&text(data));
}

/// Decodes `data` as `T`; what decodes re-encodes, and that decodes again.
/// (Not compared for equality: serde_json's default float parsing may move
/// a 17-digit float by one ulp; `tests/props_roundtrip.rs` compares values
/// whose floats parse exactly.)
fn round_trips<T>(data: &[u8])
where
    T: DeserializeOwned + Serialize,
{
    if let Ok(value) = serde_json::from_slice::<T>(data) {
        let again = serde_json::to_vec(&value).expect("a decoded body re-encodes");
        assert!(
            serde_json::from_slice::<T>(&again).is_ok(),
            "a re-encoded body decodes"
        );
    }
}

/// Every registry body pinboard decodes: never a panic, and what decodes
/// survives an encode and decode unchanged.
pub fn registry_bodies(data: &[u8]) {
    round_trips::<RegisterRequest>(data);
    round_trips::<HeartbeatRequest>(data);
    round_trips::<Vec<ReleaseItem>>(data);
    round_trips::<DeregisterRequest>(data);
    round_trips::<TagRequest>(data);
    round_trips::<PushRequest>(data);
    round_trips::<registry::ControlMessage>(data);
}

/// Everything the worker decodes from the registry (acks, nacks, control
/// messages): lenient views never panic; a nack always decodes from an
/// object.
pub fn control_messages(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = received::RegisterAck::deserialize(&value);
    let _ = received::HeartbeatAck::deserialize(&value);
    let _ = received::ControlMessage::deserialize(&value);
    if let serde_json::Value::Object(map) = &value {
        assert!(
            HeartbeatNack::deserialize(map).is_ok(),
            "a nack object always decodes"
        );
    }
}
