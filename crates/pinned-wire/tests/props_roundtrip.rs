//! Valid values round-trip through every wire parser: ids and namespaces
//! validate, epochs print and parse back, minted attestations verify with
//! their claims, and registry bodies encode and decode to themselves
//! (including the worker's lenient view of a control message). The
//! arbitrary-bytes side of the same parsers is `tests/fuzz_stable.rs`.

use std::collections::BTreeMap;

use pinned_wire::attestation::{attested_caller, Caller, Key};
use pinned_wire::epoch::parse_epoch;
use pinned_wire::ids::{decode_id_segment, validate_id, validate_namespace, InvalidId};
use pinned_wire::registry::received::{self, Field};
use pinned_wire::registry::{
    ControlMessage, HeartbeatRequest, PushRequest, RegisterRequest, ReleaseItem, TagRequest,
    Takeover,
};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

const ID: &str = "[A-Za-z0-9._~-]{1,256}";
const NS: &str = "/[A-Za-z0-9_.-]{1,16}";

fn round_trip<T>(value: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = serde_json::to_vec(value).expect("encode");
    let back: T = serde_json::from_slice(&bytes).expect("decode");
    assert_eq!(&back, value);
}

/// Deadlines as the registry carries them: seconds with millisecond
/// digits. (serde_json's default float parsing may move a 17-digit float by
/// one ulp, so arbitrary floats would not compare equal after a trip.)
fn finite() -> impl Strategy<Value = f64> {
    (0u64..10_000_000_000).prop_map(|ms| ms as f64 / 1000.0)
}

fn takeover() -> impl Strategy<Value = Option<Takeover>> {
    prop::option::of(prop_oneof![Just(Takeover::WindDown), Just(Takeover::Deny)])
}

prop_compose! {
    fn register_request()(
        client_id in "[0-9a-f]{32}",
        secret in "[0-9a-f]{64}",
        namespaces in prop::collection::vec(NS, 0..4),
        advertise_url in "http://127\\.0\\.0\\.1:[0-9]{1,5}",
        headroom in any::<i64>(),
        draining in any::<bool>(),
        challenge in "[0-9a-f]{0,32}",
        challenge_value in ".{0,32}",
        hostname in prop::option::of(".{0,16}"),
        env in prop::option::of(".{0,8}"),
        envs in prop::option::of(prop::collection::btree_map(NS, ".{0,8}", 0..3)),
        takeover in takeover(),
        epoch in prop::option::of(any::<u64>()),
        prev_session_id in prop::option::of("[0-9a-f]{0,32}"),
        instances in prop::option::of(
            prop::collection::btree_map(NS, prop::collection::vec(ID, 0..3), 0..3)
        ),
    ) -> RegisterRequest {
        RegisterRequest {
            client_id, secret, namespaces, advertise_url, headroom, draining, challenge,
            challenge_value, hostname, env, envs, takeover, epoch, prev_session_id, instances,
        }
    }
}

prop_compose! {
    fn control_message()(
        kind in "[a-z_]{1,12}",
        id in ID,
        ns in prop::option::of(NS),
        deadline in prop::option::of(finite()),
        msg_id in prop::option::of("[0-9a-z-]{1,24}"),
    ) -> ControlMessage {
        ControlMessage { kind, id, ns, deadline, msg_id }
    }
}

fn push_request() -> impl Strategy<Value = PushRequest> {
    prop_oneof![
        ("[0-9a-f]{1,32}", prop::option::of(finite())).prop_map(|(session_id, deadline)| {
            PushRequest::Drain {
                session_id,
                deadline,
            }
        }),
        "[0-9a-f]{1,32}".prop_map(|session_id| PushRequest::Undrain { session_id }),
        ("[0-9a-f]{1,32}", NS, ID, prop::option::of(finite())).prop_map(
            |(session_id, ns, id, deadline)| PushRequest::WindDown {
                session_id,
                ns,
                id,
                deadline
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn valid_ids_validate_and_decode_to_themselves(id in ID) {
        prop_assert_eq!(validate_id(&id), Ok(()));
        let decoded = decode_id_segment(&id);
        prop_assert_eq!(decoded.as_deref(), Ok(id.as_str()));
        // Percent-encoding every byte decodes back to the same id.
        let escaped: String = id.bytes().map(|b| format!("%{b:02X}")).collect();
        let decoded = decode_id_segment(&escaped);
        prop_assert_eq!(decoded.as_deref(), Ok(id.as_str()));
    }

    #[test]
    fn ids_past_the_limit_are_refused_as_too_long(id in "[a-z]{257,300}") {
        prop_assert_eq!(validate_id(&id), Err(InvalidId::TooLong));
    }

    #[test]
    fn valid_namespaces_validate(ns in NS) {
        prop_assert!(validate_namespace(&ns).is_ok());
        let nested = format!("{ns}/x");
        prop_assert!(validate_namespace(&nested).is_err());
    }

    #[test]
    fn epochs_print_and_parse_back(epoch in any::<u64>(), zeros in 0usize..4) {
        let text = format!("{}{epoch}", "0".repeat(zeros));
        prop_assert_eq!(parse_epoch(text.as_bytes()), Ok(epoch));
    }

    #[test]
    fn minted_attestations_verify_with_their_claims(
        secret in ".{0,80}",
        aud in ".{0,40}",
        caller in prop::option::of((NS, ID)),
        depth in prop::option::of(0i64..64),
        now in 0.0f64..4.0e9,
        skew in -29i64..29,
    ) {
        let key = Key::new(&secret);
        let path = caller.as_ref().map(|(ns, id)| format!("{ns}/{id}"));
        let token = key.mint(&aud, now, path.as_deref(), depth);
        let later = now.trunc() + skew as f64;
        let claims = key.verify(&token, |a| a == aud, later);
        let claims = claims.expect("a fresh token verifies");
        prop_assert_eq!(&claims.aud, &aud);
        prop_assert_eq!(claims.iat, now as i64);
        prop_assert_eq!(claims.exp, now as i64 + 30);
        prop_assert_eq!(claims.depth, depth);
        match (&caller, attested_caller(&claims)) {
            (Some((ns, id)), Some(Caller::Instance { ns: n, id: i, depth: d })) => {
                prop_assert_eq!((&n, &i, d), (ns, id, depth.unwrap_or(0)));
            }
            (None, None) => {}
            (expected, got) => prop_assert!(false, "caller {:?}, got {:?}", expected, got),
        }
        // Another audience, another key, or a flipped byte: refused.
        prop_assert!(key.verify(&token, |_| false, later).is_none());
        let other = Key::new(&format!("{secret}x"));
        prop_assert!(other.verify(&token, |_| true, later).is_none());
        let mut tampered = token.into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).expect("ascii token");
        prop_assert!(key.verify(&tampered, |_| true, later).is_none());
    }

    #[test]
    fn register_requests_round_trip(request in register_request()) {
        round_trip(&request);
    }

    #[test]
    fn heartbeats_releases_and_tags_round_trip(
        session_id in "[0-9a-f]{1,32}",
        headroom in any::<i64>(),
        draining in any::<bool>(),
        acks in prop::collection::vec("[0-9a-z-]{1,24}", 0..4),
        ns in NS,
        id in ID,
        epoch in prop::option::of(any::<u64>()),
        tag in ".{0,16}",
    ) {
        round_trip(&HeartbeatRequest {
            session_id: session_id.clone(),
            headroom,
            draining,
            challenge: None,
            challenge_value: None,
            acks,
        });
        let epoch = epoch.map(|e| e.to_string());
        round_trip(&vec![ReleaseItem {
            session_id: session_id.clone(),
            namespace: ns.clone(),
            id: id.clone(),
            epoch: epoch.clone(),
        }]);
        round_trip(&TagRequest { session_id, namespace: ns, id, epoch, tag });
    }

    #[test]
    fn push_requests_round_trip(push in push_request()) {
        round_trip(&push);
    }

    #[test]
    fn control_messages_round_trip_and_read_alike_on_the_worker(message in control_message()) {
        round_trip(&message);
        let bytes = serde_json::to_vec(&message).expect("encode");
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        let seen = received::ControlMessage::deserialize(&value).expect("lenient decode");
        prop_assert_eq!(seen.kind, Field::Valid(message.kind.clone()));
        prop_assert_eq!(seen.id, Field::Valid(message.id.clone()));
        prop_assert_eq!(
            seen.deadline,
            message.deadline.map_or(Field::Null, Field::Valid)
        );
        let ns = message.ns.clone().map_or(Field::Null, Field::Valid);
        prop_assert_eq!(seen.ns, ns);
    }
}

#[test]
fn an_empty_instances_map_round_trips() {
    let request = RegisterRequest {
        client_id: "c".into(),
        secret: "s".into(),
        namespaces: vec!["/counter".into()],
        advertise_url: "http://127.0.0.1:1".into(),
        headroom: 0,
        draining: false,
        challenge: String::new(),
        challenge_value: String::new(),
        hostname: None,
        env: None,
        envs: None,
        takeover: None,
        epoch: None,
        prev_session_id: None,
        instances: Some(BTreeMap::new()),
    };
    round_trip(&request);
}
