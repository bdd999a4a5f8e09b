//! The operator's side of the registry: its own credential (apart from the
//! workers'), token lists for rotation, the fallback when no operator token
//! is set, and operator input that is refused (absurd deadlines).

mod support;

use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::fake::{fake, Mode};
use support::{client, pinboard, TOKEN};

async fn get_status(c: &reqwest::Client, url: String, token: Option<&str>) -> u16 {
    let mut req = c.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("send").status().as_u16()
}

async fn post(c: &reqwest::Client, url: String, token: &str, body: &Value) -> (u16, Value) {
    let res = c
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("send");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_and_worker_tokens_are_separate_and_each_takes_a_rotation_list() {
    let worker_tokens = format!("worker-next,{TOKEN}");
    let pb = pinboard()
        .args(&[
            "--token",
            &worker_tokens,
            "--operator-token",
            "op-next, op-old",
        ])
        .start();
    let c = client();
    // A worker registers with one token of the list (the fake uses TOKEN)...
    let (_w, session) = fake(&pb.url, "w", Mode::Serve).await;
    // ...and the other entry is accepted too: this registration gets past
    // the token check and fails only at the challenge (nothing listens).
    let body = json!({
        "clientId": "c", "secret": "s", "namespaces": ["/counter"],
        "advertiseUrl": "http://127.0.0.1:9", "headroom": 1, "draining": false,
        "challenge": "a", "challengeValue": "b",
    });
    let register = format!("{}/registry/register", pb.url);
    let (status, _) = post(&c, register.clone(), "worker-next", &body).await;
    assert_eq!(status, 503, "worker-next is a worker token");
    // The operator token does not register a worker.
    let (status, _) = post(&c, register, "op-next", &body).await;
    assert_eq!(status, 401);
    let heartbeat = format!("{}/registry/heartbeat", pb.url);
    let beat = json!({"sessionId": session, "headroom": 1, "draining": false});
    assert_eq!(post(&c, heartbeat.clone(), "op-old", &beat).await.0, 401);
    for path in ["release", "deregister", "tag"] {
        let url = format!("{}/registry/{path}", pb.url);
        assert_eq!(post(&c, url, "op-old", &json!({})).await.0, 401, "{path}");
    }

    // The operator endpoints take either operator token, and no worker token.
    for path in ["workers", "overview"] {
        let url = format!("{}/registry/{path}", pb.url);
        for token in [None, Some(TOKEN), Some("worker-next"), Some("op")] {
            assert_eq!(
                get_status(&c, url.clone(), token).await,
                401,
                "{path} {token:?}"
            );
        }
        for token in ["op-next", "op-old"] {
            assert_eq!(
                get_status(&c, url.clone(), Some(token)).await,
                200,
                "{path} {token}"
            );
        }
    }
    let push = format!("{}/registry/push", pb.url);
    let drain = json!({"sessionId": session, "type": "drain", "deadline": 30});
    assert_eq!(post(&c, push.clone(), TOKEN, &drain).await.0, 401);
    assert_eq!(post(&c, push.clone(), "op-old", &drain).await.0, 200);
    let undrain = json!({"sessionId": session, "type": "undrain"});
    assert_eq!(post(&c, push, "op-next", &undrain).await.0, 200);
    let listed: Value = c
        .get(format!("{}/registry/workers", pb.url))
        .bearer_auth("op-next")
        .send()
        .await
        .expect("workers")
        .json()
        .await
        .expect("json");
    assert_eq!(listed["workers"][0]["sessionId"], session.as_str());
    assert!(
        !pb.log_text().contains("no --operator-token"),
        "warned although an operator token is set"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_operator_token_the_worker_token_opens_the_operator_endpoints() {
    let pb = pinboard().start();
    let c = client();
    let url = format!("{}/registry/workers", pb.url);
    assert_eq!(get_status(&c, url.clone(), Some(TOKEN)).await, 200);
    assert_eq!(get_status(&c, url, Some("other")).await, 401);
    support::eventually(
        "the start-up warning",
        std::time::Duration::from_secs(5),
        || async { pb.log_text().contains("no --operator-token").then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_deadlines_beyond_a_year_answer_400() {
    let pb = pinboard().args(&["--operator-token", "op"]).start();
    let c = client();
    let (_w, session) = fake(&pb.url, "w", Mode::Serve).await;
    let push = format!("{}/registry/push", pb.url);
    let wind_down = |deadline: Value| json!({"sessionId": session, "type": "wind_down", "ns": "/counter", "id": "x", "deadline": deadline});
    let drain =
        |deadline: Value| json!({"sessionId": session, "type": "drain", "deadline": deadline});
    for body in [
        wind_down(json!(1e19)),
        wind_down(json!(31_536_001)),
        drain(json!(1e17)),
        drain(json!(31_536_000.5)),
    ] {
        let (status, v) = post(&c, push.clone(), "op", &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(
            v["detail"], "deadline must be at most 31536000 seconds (one year)",
            "{body}"
        );
    }
    // A year exactly is accepted, and the drain echo carries it.
    let (status, v) = post(&c, push.clone(), "op", &wind_down(json!(31_536_000))).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["msgId"].is_string(), "{v}");
    let (status, v) = post(&c, push, "op", &drain(json!(31_536_000))).await;
    assert_eq!(status, 200, "{v}");
}

#[test]
fn an_empty_entry_in_a_token_list_is_a_configuration_error() {
    for args in [
        ["--token", "a,,b", "--operator-token", "op"],
        ["--token", "a", "--operator-token", "op,"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pinboard"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run pinboard");
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("empty entry"), "{args:?}: {stderr}");
    }
}
