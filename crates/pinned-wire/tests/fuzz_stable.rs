//! The fuzz targets of `tests/fuzz_targets` on stable: proptest feeds each
//! arbitrary bytes, and bytes shaped like its input (tokens, digits, JSON
//! bodies with random members), so the checks reach past the first byte.
//! cargo-fuzz needs nightly; the same targets run under it from `fuzz/`.

mod fuzz_targets;

use proptest::prelude::*;
use serde_json::{json, Value};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    }
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        any::<u64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A JSON object with the registry's member names and random values.
fn registry_shaped() -> impl Strategy<Value = Vec<u8>> {
    const NAMES: &[&str] = &[
        "sessionId",
        "clientId",
        "secret",
        "namespaces",
        "advertiseUrl",
        "headroom",
        "draining",
        "challenge",
        "challengeValue",
        "hostname",
        "env",
        "envs",
        "takeover",
        "epoch",
        "prevSessionId",
        "instances",
        "acks",
        "namespace",
        "id",
        "tag",
        "type",
        "ns",
        "deadline",
        "msgId",
        "expiresInMs",
        "duplicates",
        "messages",
        "drainDeadline",
    ];
    prop::collection::vec((prop::sample::select(NAMES), any_json()), 0..10).prop_map(|members| {
        let object: serde_json::Map<String, Value> = members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        serde_json::to_vec(&Value::Object(object)).expect("encode")
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn attestation_never_panics(data in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzz_targets::attestation(&data);
    }

    #[test]
    fn attestation_shaped_tokens_never_panic(
        parts in prop::collection::vec("[A-Za-z0-9_=+/-]{0,64}", 0..5)
    ) {
        fuzz_targets::attestation(parts.join(".").as_bytes());
    }

    #[test]
    fn ids_never_panic(data in prop::collection::vec(any::<u8>(), 0..300)) {
        fuzz_targets::ids(&data);
    }

    #[test]
    fn id_shaped_segments_never_panic(segment in "[A-Za-z0-9._~%/ -]{0,300}") {
        fuzz_targets::ids(segment.as_bytes());
    }

    #[test]
    fn epochs_never_panic(data in prop::collection::vec(any::<u8>(), 0..32)) {
        fuzz_targets::epoch(&data);
    }

    #[test]
    fn digit_runs_parse_exactly(digits in "[0-9]{1,24}") {
        fuzz_targets::epoch(digits.as_bytes());
    }

    #[test]
    fn registry_bodies_never_panic(data in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzz_targets::registry_bodies(&data);
        fuzz_targets::control_messages(&data);
    }

    #[test]
    fn registry_shaped_bodies_never_panic(body in registry_shaped()) {
        fuzz_targets::registry_bodies(&body);
        fuzz_targets::control_messages(&body);
    }
}
