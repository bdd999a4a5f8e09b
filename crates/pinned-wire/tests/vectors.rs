//! Replays the vectors generated from the Python reference by
//! `tests/vectors/generate.py` (attestation.json, ids.json).

use std::collections::BTreeSet;

use pinned_wire::attestation::{self, Account, Caller, Claims};
use pinned_wire::epoch::parse_epoch;
use pinned_wire::ids::{decode_id_segment, validate_id, validate_namespace};
use pinned_wire::refusal::detail_body;
use serde_json::{Map, Value};

fn load(name: &str) -> Value {
    let path = format!("{}/tests/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("vector file readable");
    serde_json::from_str(&text).expect("vector file is JSON")
}

fn cases<'a>(doc: &'a Value, key: &str) -> &'a [Value] {
    let list = doc[key].as_array().expect("case list");
    assert!(!list.is_empty(), "no {key} cases");
    list
}

fn s(v: &Value) -> &str {
    v.as_str().expect("string field")
}

fn opt_s(v: &Value) -> Option<&str> {
    v.as_str()
}

/// `now` is stored as Python's `repr(float)`, which round-trips exactly.
fn now(v: &Value) -> f64 {
    s(v).parse().expect("float repr")
}

fn int(v: &Value) -> i64 {
    v.as_i64().expect("i64 field")
}

fn object(v: &Value) -> Map<String, Value> {
    v.as_object().expect("object field").clone()
}

fn expected_claims(v: &Value) -> Option<Claims> {
    if v.is_null() {
        return None;
    }
    Some(Claims {
        aud: s(&v["aud"]).to_owned(),
        iat: int(&v["iat"]),
        exp: int(&v["exp"]),
        caller: v.get("caller").map(|c| s(c).to_owned()),
        depth: v.get("depth").map(int),
        acct: v.get("acct").map(|a| Account {
            sub: s(&a["sub"]).to_owned(),
            scopes: a["scopes"]
                .as_array()
                .expect("scopes")
                .iter()
                .map(|x| s(x).to_owned())
                .collect(),
            claims: object(&a["claims"]),
        }),
    })
}

fn expected_caller(v: &Value) -> Option<Caller> {
    match v.get("kind").map(s) {
        None => None,
        Some("instance") => Some(Caller::Instance {
            ns: s(&v["ns"]).to_owned(),
            id: s(&v["id"]).to_owned(),
            depth: int(&v["depth"]),
        }),
        Some(_) => Some(Caller::Account {
            sub: s(&v["sub"]).to_owned(),
            claims: object(&v["claims"]),
            scopes: v["scopes"]
                .as_array()
                .expect("scopes")
                .iter()
                .map(|x| s(x).to_owned())
                .collect::<BTreeSet<_>>(),
        }),
    }
}

#[test]
fn mint_matches_reference() {
    let doc = load("attestation.json");
    for case in cases(&doc, "mint") {
        let token = attestation::mint(
            s(&case["secret"]),
            s(&case["aud"]),
            now(&case["now"]),
            opt_s(&case["caller"]),
            case["depth"].as_i64(),
        );
        assert_eq!(token, s(&case["token"]), "mint case {case}");
        // What we mint, we accept.
        let aud = s(&case["aud"]);
        let claims =
            attestation::verify(&token, s(&case["secret"]), |a| a == aud, now(&case["now"]));
        assert!(claims.is_some(), "minted token refused: {case}");
    }
}

#[test]
fn verify_matches_reference() {
    let doc = load("attestation.json");
    let mut accepted = 0;
    for case in cases(&doc, "verify") {
        let name = s(&case["name"]);
        let audiences: Vec<&str> = case["audiences"]
            .as_array()
            .expect("audiences")
            .iter()
            .map(s)
            .collect();
        let got = attestation::verify(
            s(&case["token"]),
            s(&case["secret"]),
            |a| audiences.contains(&a),
            now(&case["now"]),
        );
        let want = expected_claims(&case["claims"]);
        assert_eq!(
            got, want,
            "verify case {name:?} (python: {})",
            case["python"]
        );
        let key = attestation::Key::new(s(&case["secret"]));
        let again = key.verify(
            s(&case["token"]),
            |a| audiences.contains(&a),
            now(&case["now"]),
        );
        assert_eq!(again, want, "Key::verify case {name:?}");
        if let Some(claims) = &got {
            accepted += 1;
            assert_eq!(
                attestation::attested_caller(claims),
                expected_caller(&case["caller"]),
                "caller of case {name:?}"
            );
        }
    }
    assert!(accepted > 20, "too few accepted cases: {accepted}");
}

#[test]
fn ids_match_reference() {
    let doc = load("ids.json");
    for case in cases(&doc, "ids") {
        let got = validate_id(s(&case["id"])).err().map(|e| e.to_string());
        assert_eq!(got.as_deref(), opt_s(&case["detail"]), "id {case}");
    }
}

#[test]
fn segments_match_reference() {
    let doc = load("ids.json");
    for case in cases(&doc, "segments") {
        let got = decode_id_segment(s(&case["raw"]));
        match &got {
            Ok(id) => assert_eq!(&**id, s(&case["decoded"]), "segment {case}"),
            Err(e) => assert_eq!(
                Some(e.to_string().as_str()),
                opt_s(&case["detail"]),
                "segment {case}"
            ),
        }
        assert_eq!(got.is_ok(), case["detail"].is_null(), "segment {case}");
    }
}

#[test]
fn namespaces_match_reference() {
    let doc = load("ids.json");
    for case in cases(&doc, "namespaces") {
        let got = validate_namespace(s(&case["ns"]))
            .err()
            .map(|e| e.to_string());
        assert_eq!(got.as_deref(), opt_s(&case["error"]), "namespace {case}");
    }
}

#[test]
fn epochs_match_reference() {
    let doc = load("ids.json");
    for case in cases(&doc, "epochs") {
        let bytes: Vec<u8> = case["value"]
            .as_array()
            .expect("bytes")
            .iter()
            .map(|b| u8::try_from(b.as_u64().expect("byte")).expect("byte range"))
            .collect();
        let got = parse_epoch(&bytes);
        match &case["python"] {
            // Python has no upper bound; beyond u64 we refuse (documented).
            Value::Number(n) => assert_eq!(got.ok(), n.as_u64(), "epoch {case}"),
            detail => assert_eq!(
                got.err().map(|e| e.to_string()).as_deref(),
                opt_s(detail),
                "epoch {case}"
            ),
        }
    }
}

#[test]
fn detail_bodies_match_reference() {
    let doc = load("ids.json");
    for case in cases(&doc, "detail_bodies") {
        assert_eq!(
            detail_body(s(&case["detail"])),
            s(&case["body"]),
            "body {case}"
        );
    }
}
