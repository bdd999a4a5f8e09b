//! The worker's side of pinboard's control messages (wire spec §6.5,
//! §9.1), against a scripted stand-in pinboard on a real socket: every
//! message of a batch is applied in order; only the contiguous prefix
//! applied without error is confirmed (a failing entry stops confirmation
//! of itself and every later one, which are still applied; entries that are
//! not objects or carry no `msgId` neither confirm nor break the prefix);
//! confirmations ride the *next* heartbeat's `acks` and are dropped once a
//! heartbeat carrying them was answered 200. Malformed batches and entries
//! are counted.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use parking_lot::Mutex;
use pinned::Options;
use serde_json::{json, Value};
use support::{eventually, Counter, PATIENCE};
use test_support::metrics;
use tokio::net::TcpListener;

const SESSION: &str = "s1";

/// What the stand-in heard and what it still has to say.
#[derive(Default)]
struct Script {
    /// Set once the test's instances are resident: from then on every
    /// heartbeat's `acks` are recorded and answered with the next batch.
    armed: bool,
    /// `acks` of each heartbeat since armed, in order.
    heard: Vec<Vec<String>>,
    /// The `messages` field of each answer since armed (`None`: absent).
    batches: VecDeque<Option<Value>>,
}

/// A stand-in pinboard: registers anyone as [`SESSION`] with a one-minute
/// lease and answers heartbeats from the script.
async fn stand_in(script: Arc<Mutex<Script>>) -> String {
    let app = Router::new()
        .route(
            "/registry/register",
            post(|| async { Json(json!({ "sessionId": SESSION, "expiresInMs": 60_000 })) }),
        )
        .route(
            "/registry/heartbeat",
            post(move |Json(body): Json<Value>| {
                let script = script.clone();
                async move {
                    let mut script = script.lock();
                    let mut ack = json!({ "expiresInMs": 60_000 });
                    if script.armed {
                        let acks = body["acks"]
                            .as_array()
                            .map(|acks| {
                                acks.iter()
                                    .filter_map(|a| a.as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default();
                        script.heard.push(acks);
                        if let Some(Some(messages)) = script.batches.pop_front() {
                            ack["messages"] = messages;
                        }
                    }
                    Json(ack)
                }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn wind_down(id: &str, deadline: Value, msg_id: Option<&str>) -> Value {
    let mut message =
        json!({ "type": "wind_down", "ns": "/counter", "id": id, "deadline": deadline });
    if let Some(msg_id) = msg_id {
        message["msgId"] = json!(msg_id);
    }
    message
}

#[tokio::test]
async fn only_the_contiguous_prefix_is_confirmed_on_the_next_heartbeat() {
    let script = Arc::new(Mutex::new(Script::default()));
    let pinboard = stand_in(script.clone()).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let worker = Options::new()
        .env_vars(Vec::<(String, String)>::new())
        .host::<Counter>("/counter")
        .pinboard(&pinboard, "t", &url)
        .heartbeat_interval(Duration::from_millis(50))
        .build()
        .expect("options");
    let before = metrics::parse(&worker.metrics());
    let app = worker.router();
    worker.start();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    eventually("registration", PATIENCE, || async {
        worker.ready().then_some(())
    })
    .await;

    // Three resident instances, attested as pinboard would.
    let token = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        pinned_wire::attestation::mint(worker.secret(), SESSION, now, None, None)
    };
    for id in ["a", "b", "c"] {
        let answer = client
            .post(format!("{url}/counter/{id}/increment"))
            .header("pinboard-attestation", token())
            .send()
            .await
            .expect("increment");
        assert_eq!(answer.status(), 200, "{id}");
    }

    {
        let mut script = script.lock();
        script.batches = VecDeque::from([
            // Delivered with the first armed heartbeat's ack.
            Some(json!([
                wind_down("a", json!(0), Some("m1")),
                "not an object",
                // No msgId: applied (a revocation), neither confirmed nor
                // breaking the prefix.
                wind_down("b", Value::Null, None),
                // Not resident: a no-op, confirmed.
                wind_down("gone", json!(0), Some("m2")),
                // Fails: neither it nor anything after it is confirmed...
                json!({ "type": "drain", "msgId": "m3" }),
                // ...but this one is still applied.
                wind_down("c", json!(0), Some("m4")),
            ])),
            // pinboard re-delivers the unconfirmed suffix, in order.
            Some(json!([
                json!({ "type": "drain", "msgId": "m3" }),
                wind_down("c", json!(0), Some("m4")),
            ])),
            // The operator withdrew the bad one.
            Some(json!([wind_down("c", json!(0), Some("m4"))])),
            None,
            Some(json!({ "not": "an array" })),
            None,
        ]);
        script.armed = true;
    }
    let heard = eventually("six heartbeats since armed", PATIENCE, || async {
        let script = script.lock();
        (script.heard.len() >= 6).then(|| script.heard.clone())
    })
    .await;
    let strings = |acks: &[&str]| acks.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        heard[..6],
        [
            strings(&[]),
            // The first batch's prefix, on the heartbeat after it.
            strings(&["m1", "m2"]),
            // Dropped once carried; m3 still fails, so m4 waits.
            strings(&[]),
            strings(&["m4"]),
            strings(&[]),
            strings(&[]),
        ],
        "acks per heartbeat"
    );

    // Every wind_down was applied, the unconfirmed `c` included.
    let stats = worker_stats(&client, &url, &worker).await;
    let resident: Vec<&str> = stats["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|row| row["id"].as_str())
        .collect();
    assert_eq!(resident, ["b"], "{stats}");
    let after = metrics::parse(&worker.metrics());
    let failures = |reason: &str| {
        metrics::moved(
            &before,
            &after,
            &format!(
                r#"pinned_control_plane_failures{{operation="control_message",reason="{reason}"}}"#
            ),
        )
    };
    assert_eq!(failures("callback"), 2.0);
    assert_eq!(failures("malformed"), 1.0);
    assert_eq!(failures("malformed_batch"), 1.0);
}

async fn worker_stats(client: &reqwest::Client, url: &str, worker: &pinned::Worker) -> Value {
    eventually("the wound-down instances to close", PATIENCE, || async {
        let stats: Value = client
            .get(format!("{url}/_pinned/stats"))
            .header("pinboard-proxy-secret", worker.secret())
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("stats json");
        (stats["instances"].as_array().map(Vec::len) == Some(1)).then_some(stats)
    })
    .await
}
