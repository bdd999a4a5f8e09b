//! Bad input never crashes pinboard: wrong tokens, malformed bodies, unknown
//! sessions, invalid ids and advertise URLs that fail the challenge each get
//! a clear 4xx or 503.

mod support;

use std::process::Command;

use serde_json::{json, Value};
use support::{bearer, client, pinboard, python_worker, unreachable_url, wait_workers};

fn register_body(advertise: &str) -> Value {
    json!({
        "clientId": "c0ffee", "secret": "s3cret", "namespaces": ["/counter"],
        "advertiseUrl": advertise, "headroom": 100, "draining": false,
        "challenge": "abc", "challengeValue": "def"
    })
}

async fn post(
    c: &reqwest::Client,
    url: String,
    auth: Option<&str>,
    body: &str,
) -> (u16, Option<String>, Value) {
    let mut req = c
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let res = req.send().await.expect("send");
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let v = res.json().await.unwrap_or(Value::Null);
    (status, retry, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_refuses_bad_tokens_bodies_and_sessions() {
    let pb = pinboard().start();
    let c = client();
    let ok = bearer();
    let good = register_body("http://127.0.0.1:9").to_string();

    for auth in [None, Some("Bearer wrong"), Some("test-token")] {
        for path in [
            "register",
            "heartbeat",
            "release",
            "deregister",
            "tag",
            "push",
        ] {
            let (s, _, _) = post(&c, format!("{}/registry/{path}", pb.url), auth, &good).await;
            assert_eq!(s, 401, "{path} with {auth:?}");
        }
    }
    let res = c
        .get(format!("{}/registry/workers", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 401);

    for path in [
        "register",
        "heartbeat",
        "release",
        "deregister",
        "tag",
        "push",
    ] {
        for body in ["{", "[]", "{}", "null", r#"{"sessionId": 5}"#] {
            let (s, _, v) = post(&c, format!("{}/registry/{path}", pb.url), Some(&ok), body).await;
            let allowed = if path == "release" && body == "[]" {
                200
            } else {
                400
            };
            assert_eq!(s, allowed, "{path} {body}: {v}");
            if s == 400 {
                assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()), "{v}");
            }
        }
    }

    let mut bad_ns = register_body("http://127.0.0.1:9");
    bad_ns["namespaces"] = json!(["counter"]);
    let (s, _, v) = post(
        &c,
        format!("{}/registry/register", pb.url),
        Some(&ok),
        &bad_ns.to_string(),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    let (s, _, v) = post(
        &c,
        format!("{}/registry/register", pb.url),
        Some(&ok),
        &register_body("ftp://x").to_string(),
    )
    .await;
    assert_eq!(s, 400, "{v}");

    let (s, _, v) = post(
        &c,
        format!("{}/registry/heartbeat", pb.url),
        Some(&ok),
        r#"{"sessionId":"unknown","headroom":1,"draining":false,"challenge":"a","challengeValue":"b"}"#,
    )
    .await;
    assert_eq!((s, v), (409, json!({"reregister": true})));

    let (s, _, _) = post(
        &c,
        format!("{}/registry/push", pb.url),
        Some(&ok),
        r#"{"sessionId":"unknown","type":"drain","deadline":null}"#,
    )
    .await;
    assert_eq!(s, 404);
    let (s, _, _) = post(
        &c,
        format!("{}/registry/push", pb.url),
        Some(&ok),
        r#"{"sessionId":"unknown","type":"explode"}"#,
    )
    .await;
    assert_eq!(s, 400);
    let (s, _, _) = post(
        &c,
        format!("{}/registry/release", pb.url),
        Some(&ok),
        r#"[{"sessionId":"s","namespace":"/counter","id":"a","epoch":"12x"}]"#,
    )
    .await;
    assert_eq!(s, 400);
    let (s, _, _) = post(
        &c,
        format!("{}/registry/deregister", pb.url),
        Some(&ok),
        r#"{"sessionId":"unknown"}"#,
    )
    .await;
    assert_eq!(s, 200, "deregister is idempotent");

    let res = c
        .get(format!("{}/healthz", pb.url))
        .send()
        .await
        .expect("healthz");
    assert_eq!(res.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advertise_urls_that_fail_the_challenge_are_refused() {
    let pb = pinboard().start();
    let c = client();
    let ok = bearer();
    // Nothing listens there: not reachable yet, 503 + Retry-After.
    let nobody = unreachable_url();
    let (s, retry, v) = post(
        &c,
        format!("{}/registry/register", pb.url),
        Some(&ok),
        &register_body(&nobody).to_string(),
    )
    .await;
    assert_eq!((s, retry.as_deref()), (503, Some("1")), "{v}");

    // A live worker that does not know this secret/challenge: 403.
    let w = python_worker(&pb.url).start();
    wait_workers(&c, &pb.url, 1).await;
    let (s, _, v) = post(
        &c,
        format!("{}/registry/register", pb.url),
        Some(&ok),
        &register_body(&w.url).to_string(),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("challenge")),
        "{v}"
    );
    // The real worker stays registered.
    assert_eq!(wait_workers(&c, &pb.url, 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_refuses_invalid_ids_and_unhosted_namespaces() {
    let pb = pinboard().start();
    let c = client();
    let long = "a".repeat(257);
    for (path, detail) in [
        ("/counter//hit", "id must be non-empty"),
        ("/counter/a%20b/hit", "id must contain only [A-Za-z0-9._~-]"),
        ("/counter/a$b", "id must contain only [A-Za-z0-9._~-]"),
        (
            &format!("/counter/{long}/hit") as &str,
            "id must be at most 256 characters",
        ),
    ] {
        let res = c
            .get(format!("{}{path}", pb.url))
            .send()
            .await
            .expect("send");
        assert_eq!(res.status(), 400, "{path}");
        assert_eq!(
            res.json::<Value>().await.expect("json"),
            json!({"detail": detail})
        );
    }
    let res = c
        .get(format!("{}/nobody/x/hit", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    let res = c
        .get(format!("{}/counter", pb.url))
        .send()
        .await
        .expect("send");
    assert_eq!(res.status(), 404);
}

#[test]
fn pinboard_refuses_to_start_without_a_token() {
    let out = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("PINBOARD_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
    let out = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args(["--listen", "127.0.0.1:0", "--token", " "])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
}
