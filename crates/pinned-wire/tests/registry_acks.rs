//! Decodes representative registry answers the way the worker reads them:
//! `registry::received` (lenient acks and control messages) and the lenient
//! `HeartbeatNack`.

use pinned_wire::registry::received::{
    ControlMessage, DrainEcho, Entry, Field, HeartbeatAck, RegisterAck,
};
use pinned_wire::registry::{self, Duplicate, HeartbeatNack};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// An answer body as the worker holds it (a JSON object).
fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn register(value: Value) -> Result<RegisterAck, serde_json::Error> {
    RegisterAck::deserialize(&object(value))
}

fn heartbeat(value: Value) -> Result<HeartbeatAck, serde_json::Error> {
    HeartbeatAck::deserialize(&object(value))
}

fn nack(value: Value) -> HeartbeatNack {
    HeartbeatNack::deserialize(&object(value)).expect("a nack always decodes")
}

fn dup(ns: &str, id: &str) -> Entry<Duplicate> {
    Entry::Valid(Duplicate {
        ns: ns.into(),
        id: id.into(),
    })
}

#[test]
fn register_ack_with_duplicates_and_unknown_fields() {
    let ack = register(json!({
        "sessionId": "s1",
        "expiresInMs": 10000,
        "duplicates": [
            {"ns": "/counter", "id": "a", "owner": "ignored"},
            {"ns": "/counter"},
            {"ns": 5, "id": "b"},
            ["/counter", "c"],
            null,
            "d"
        ],
        "messages": [{"type": "wind_down"}],
        "somethingNew": {"nested": true}
    }))
    .expect("valid ack");
    assert_eq!(ack.session_id, "s1");
    assert_eq!(ack.expires_in_ms, 10000.0);
    assert_eq!(
        ack.duplicates,
        Field::Valid(vec![
            dup("/counter", "a"),
            Entry::Invalid(json!({"ns": "/counter"})),
            Entry::Invalid(json!({"ns": 5, "id": "b"})),
            Entry::Invalid(json!(["/counter", "c"])),
            Entry::Invalid(Value::Null),
            Entry::Invalid(json!("d")),
        ])
    );
    assert_eq!(ack.echo, DrainEcho::default());
}

#[test]
fn register_ack_duplicates_absent_null_or_not_an_array() {
    let base = || json!({"sessionId": "s", "expiresInMs": 1});
    assert_eq!(register(base()).expect("ack").duplicates, Field::Absent);
    let mut with = base();
    with["duplicates"] = Value::Null;
    assert_eq!(register(with).expect("ack").duplicates, Field::Null);
    let mut with = base();
    with["duplicates"] = json!({"ns": "/c", "id": "a"});
    assert_eq!(
        register(with).expect("ack").duplicates,
        Field::Invalid(json!({"ns": "/c", "id": "a"}))
    );
}

#[test]
fn expires_in_ms_is_any_json_number() {
    let ack = register(json!({"sessionId": "s", "expiresInMs": 1500.5})).expect("float");
    assert_eq!(ack.expires_in_ms, 1500.5);
    let ack = register(json!({"sessionId": "s", "expiresInMs": -3})).expect("negative");
    assert_eq!(ack.expires_in_ms, -3.0);
    let ack = heartbeat(json!({"expiresInMs": 2.5e3})).expect("exponent");
    assert_eq!(ack.expires_in_ms, 2500.0);
    let ack = heartbeat(json!({"expiresInMs": u64::MAX})).expect("huge");
    assert_eq!(ack.expires_in_ms, u64::MAX as f64);
}

#[test]
fn malformed_acks_fail_to_decode() {
    for bad in [
        json!({}),
        json!({"expiresInMs": 1000}),
        json!({"sessionId": null, "expiresInMs": 1000}),
        json!({"sessionId": 7, "expiresInMs": 1000}),
        json!({"sessionId": "s"}),
        json!({"sessionId": "s", "expiresInMs": null}),
        json!({"sessionId": "s", "expiresInMs": true}),
        json!({"sessionId": "s", "expiresInMs": "1000"}),
    ] {
        assert!(register(bad.clone()).is_err(), "register {bad}");
    }
    for bad in [
        json!({}),
        json!({"expiresInMs": false}),
        json!({"expiresInMs": "2000"}),
        json!({"expiresInMs": [2000]}),
    ] {
        assert!(heartbeat(bad.clone()).is_err(), "heartbeat {bad}");
    }
}

#[test]
fn heartbeat_ack_with_drain_echo() {
    let ack = heartbeat(json!({"expiresInMs": 2000, "draining": true, "drainDeadline": 12.5}))
        .expect("ack");
    assert_eq!(ack.echo.draining, Field::Valid(true));
    assert_eq!(ack.echo.drain_deadline, Field::Valid(12.5));
    assert_eq!(ack.messages, Field::Absent);

    let ack = heartbeat(json!({"expiresInMs": 2000, "draining": true, "drainDeadline": null}))
        .expect("null deadline");
    assert_eq!(ack.echo.drain_deadline, Field::Null);

    let ack = heartbeat(json!({"expiresInMs": 2000, "draining": true, "drainDeadline": -1}))
        .expect("negative deadline is the worker's call");
    assert_eq!(ack.echo.drain_deadline, Field::Valid(-1.0));

    let ack = heartbeat(json!({"expiresInMs": 2000, "draining": true, "drainDeadline": "soon"}))
        .expect("bad deadline");
    assert_eq!(ack.echo.drain_deadline, Field::Invalid(json!("soon")));

    // `draining` is honoured only as a bool; anything else stays raw.
    let ack = heartbeat(json!({"expiresInMs": 2000, "draining": 1, "drainDeadline": 3}))
        .expect("non-bool draining");
    assert_eq!(ack.echo.draining, Field::Invalid(json!(1)));
    let ack = heartbeat(json!({"expiresInMs": 2000, "draining": "true"})).expect("string");
    assert_eq!(ack.echo.draining, Field::Invalid(json!("true")));
    let ack = register(json!({"sessionId": "s", "expiresInMs": 1, "draining": false}))
        .expect("register echo");
    assert_eq!(ack.echo.draining, Field::Valid(false));
    assert_eq!(ack.echo.drain_deadline, Field::Absent);
}

#[test]
fn control_message_batch_with_malformed_entries() {
    let ack = heartbeat(json!({
        "expiresInMs": 2000,
        "messages": [
            {"type": "wind_down", "id": "a", "ns": "/c", "deadline": 5, "msgId": "1", "extra": [1]},
            7,
            {"type": "wind_down", "id": "b", "deadline": null, "msgId": 2},
            {"type": "drain", "id": 3, "ns": false, "deadline": true},
            ["wind_down", "z", "/c", 1, "4"]
        ]
    }))
    .expect("ack");
    let Field::Valid(messages) = ack.messages else {
        panic!("messages: {:?}", ack.messages);
    };
    assert_eq!(messages.len(), 5);

    let Entry::Valid(first) = &messages[0] else {
        panic!("first: {:?}", messages[0]);
    };
    assert_eq!(first.kind, Field::Valid("wind_down".into()));
    assert_eq!(first.id, Field::Valid("a".into()));
    assert_eq!(first.ns, Field::Valid("/c".into()));
    assert_eq!(first.deadline, Field::Valid(5.0));
    assert_eq!(first.msg_id, Field::Valid("1".into()));
    // Display is the object as received, unknown members included.
    assert_eq!(
        first.to_string(),
        r#"{"deadline":5,"extra":[1],"id":"a","msgId":"1","ns":"/c","type":"wind_down"}"#
    );

    assert_eq!(messages[1], Entry::Invalid(json!(7)));

    let Entry::Valid(second) = &messages[2] else {
        panic!("second: {:?}", messages[2]);
    };
    assert_eq!(second.ns, Field::Absent);
    assert_eq!(second.deadline, Field::Null);
    assert_eq!(second.msg_id, Field::Invalid(json!(2)));

    let Entry::Valid(third) = &messages[3] else {
        panic!("third: {:?}", messages[3]);
    };
    assert_eq!(third.kind, Field::Valid("drain".into()));
    assert_eq!(third.id, Field::Invalid(json!(3)));
    assert_eq!(third.ns, Field::Invalid(json!(false)));
    assert_eq!(third.deadline, Field::Invalid(json!(true)));
    assert_eq!(third.msg_id, Field::Absent);

    // An array never stands in for a message object.
    assert_eq!(
        messages[4],
        Entry::Invalid(json!(["wind_down", "z", "/c", 1, "4"]))
    );
}

#[test]
fn messages_absent_null_or_not_an_array() {
    assert_eq!(
        heartbeat(json!({"expiresInMs": 1, "messages": null}))
            .expect("null")
            .messages,
        Field::Null
    );
    assert_eq!(
        heartbeat(json!({"expiresInMs": 1, "messages": {"type": "wind_down"}}))
            .expect("object")
            .messages,
        Field::Invalid(json!({"type": "wind_down"}))
    );
    assert!(ControlMessage::deserialize(&json!("wind_down")).is_err());
}

#[test]
fn superseded_and_reregister_nacks() {
    let superseded = nack(json!({"superseded": true, "error": "epoch 3 took over"}));
    assert!(superseded.superseded && !superseded.reregister);
    assert_eq!(superseded.error.as_deref(), Some("epoch 3 took over"));

    let reregister = nack(json!({"reregister": true}));
    assert!(reregister.reregister && !reregister.superseded);
    assert_eq!(reregister.error, None);

    // Python truthiness, a non-string error, unknown fields.
    let odd = nack(json!({"superseded": "yes", "reregister": 0, "error": 5, "detail": "x"}));
    assert!(odd.superseded && !odd.reregister);
    assert_eq!(odd.error, None);
    for (value, truthy) in [
        (json!(null), false),
        (json!(false), false),
        (json!(true), true),
        (json!(0), false),
        (json!(0.0), false),
        (json!(-1), true),
        (json!(0.5), true),
        (json!(""), false),
        (json!("x"), true),
        (json!([]), false),
        (json!([0]), true),
        (json!({}), false),
        (json!({"a": 1}), true),
    ] {
        assert_eq!(
            nack(json!({ "reregister": value })).reregister,
            truthy,
            "{value}"
        );
    }
    // Any other refusal body reads as no flag at all.
    assert_eq!(
        nack(json!({"detail": "unknown session"})),
        HeartbeatNack::default()
    );
}

#[test]
fn pinboards_own_encoding_decodes() {
    let sent = registry::HeartbeatAck {
        expires_in_ms: 2000,
        messages: vec![registry::ControlMessage {
            kind: "wind_down".into(),
            id: "a".into(),
            ns: Some("/c".into()),
            deadline: None,
            msg_id: Some("9".into()),
        }],
        draining: Some(true),
        drain_deadline: Some(Some(4.0)),
    };
    let ack = heartbeat(serde_json::to_value(&sent).expect("json")).expect("decodes");
    assert_eq!(ack.expires_in_ms, 2000.0);
    assert_eq!(ack.echo.draining, Field::Valid(true));
    assert_eq!(ack.echo.drain_deadline, Field::Valid(4.0));
    let Field::Valid(messages) = &ack.messages else {
        panic!("messages: {:?}", ack.messages);
    };
    let [Entry::Valid(message)] = messages.as_slice() else {
        panic!("one message: {messages:?}");
    };
    assert_eq!(message.deadline, Field::Null);
    assert_eq!(message.msg_id.valid().map(String::as_str), Some("9"));

    let sent = registry::RegisterAck {
        session_id: "s".into(),
        expires_in_ms: 5000,
        duplicates: vec![Duplicate {
            ns: "/c".into(),
            id: "x".into(),
        }],
        draining: None,
        drain_deadline: None,
    };
    let ack = register(serde_json::to_value(&sent).expect("json")).expect("decodes");
    assert_eq!(ack.duplicates, Field::Valid(vec![dup("/c", "x")]));

    let sent = HeartbeatNack {
        reregister: false,
        superseded: true,
        error: Some("displaced".into()),
    };
    assert_eq!(nack(serde_json::to_value(&sent).expect("json")), sent);
}
