//! The worker's side of re-registration against a scripted pinboard on a
//! real socket: a heartbeat answered `reregister` keeps every instance and
//! resubmits them with `prevSessionId`; the ack's `duplicates` (ids another
//! session owns) are aborted here and counted in `pinned_duplicate_quits`,
//! malformed entries skipped and counted as `register/malformed_duplicates`.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use pinned::Options;
use serde_json::{json, Value};
use support::{eventually, Counter, PATIENCE};
use test_support::metrics;

/// What the scripted pinboard heard and how it answers.
#[derive(Default)]
struct Script {
    /// Every register body, in order.
    registers: Mutex<Vec<Value>>,
    /// Answer the next heartbeats `409 {"reregister": true}`.
    forget_sessions: AtomicBool,
}

async fn register(State(script): State<Arc<Script>>, Json(body): Json<Value>) -> Json<Value> {
    let mut registers = script.registers.lock().expect("registers");
    registers.push(body);
    script.forget_sessions.store(false, Ordering::SeqCst);
    Json(match registers.len() {
        1 => json!({ "sessionId": "s1", "expiresInMs": 60_000 }),
        // The re-registration: one id is owned elsewhere, two entries are
        // not `{ns, id}` at all.
        _ => json!({
            "sessionId": "s2",
            "expiresInMs": 60_000,
            "duplicates": [{ "ns": "/counter", "id": "dup" }, { "ns": 5 }, "junk"],
        }),
    })
}

async fn heartbeat(State(script): State<Arc<Script>>) -> (StatusCode, Json<Value>) {
    if script.forget_sessions.load(Ordering::SeqCst) {
        (StatusCode::CONFLICT, Json(json!({ "reregister": true })))
    } else {
        (StatusCode::OK, Json(json!({ "expiresInMs": 60_000 })))
    }
}

#[tokio::test]
async fn a_reregistration_aborts_the_duplicates_it_is_told_of_and_keeps_the_rest() {
    let script = Arc::new(Script::default());
    let pinboard = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let pinboard_url = format!("http://{}", pinboard.local_addr().expect("addr"));
    let app = Router::new()
        .route("/registry/register", post(register))
        .route("/registry/heartbeat", post(heartbeat))
        .with_state(script.clone());
    tokio::spawn(async move { axum::serve(pinboard, app).await });

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let worker = Options::new()
        .host::<Counter>("/counter")
        .pinboard(&pinboard_url, "t", &url)
        .heartbeat_interval(Duration::from_millis(50))
        .env_vars(Vec::<(String, String)>::new())
        .build()
        .expect("options");
    let before = metrics::parse(&worker.metrics());
    let router = worker.router();
    worker.start();
    tokio::spawn(async move { axum::serve(listener, router).await });
    eventually("the first registration", PATIENCE, || async {
        worker.registration()?.session_id.filter(|s| s == "s1")
    })
    .await;

    // Two instances, reached as pinboard would (attested for session s1).
    let client = reqwest::Client::new();
    for id in ["dup", "kept"] {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let token = pinned_wire::attestation::mint(worker.secret(), "s1", now, None, None);
        let res = client
            .post(format!("{url}/counter/{id}/increment"))
            .header("pinboard-attestation", token)
            .header("pinboard-epoch", "7")
            .send()
            .await
            .expect("increment");
        assert_eq!(
            res.status(),
            200,
            "{id}: {}",
            res.text().await.unwrap_or_default()
        );
    }

    script.forget_sessions.store(true, Ordering::SeqCst);
    eventually("the re-registration", PATIENCE, || async {
        worker.registration()?.session_id.filter(|s| s == "s2")
    })
    .await;
    let again = script.registers.lock().expect("registers")[1].clone();
    assert_eq!(again["prevSessionId"], "s1", "{again}");
    let mut resubmitted: Vec<&str> = again["instances"]["/counter"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    resubmitted.sort_unstable();
    assert_eq!(resubmitted, ["dup", "kept"], "{again}");

    let stats = |worker: &pinned::Worker| {
        let client = client.clone();
        let (url, secret) = (url.clone(), worker.secret().to_owned());
        async move {
            let stats: Value = client
                .get(format!("{url}/_pinned/stats"))
                .header("pinboard-proxy-secret", secret)
                .send()
                .await
                .expect("stats")
                .json()
                .await
                .expect("stats json");
            let mut ids: Vec<String> = stats["instances"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|row| row["id"].as_str().map(str::to_owned))
                .collect();
            ids.sort_unstable();
            ids
        }
    };
    eventually(
        "the duplicate aborted, the other kept",
        PATIENCE,
        || async { (stats(&worker).await == ["kept"]).then_some(()) },
    )
    .await;
    let after = metrics::parse(&worker.metrics());
    assert_eq!(
        metrics::moved(&before, &after, "pinned_duplicate_quits"),
        1.0
    );
    assert_eq!(
        metrics::moved(
            &before,
            &after,
            r#"pinned_control_plane_failures{operation="register",reason="malformed_duplicates"}"#
        ),
        2.0
    );
}
